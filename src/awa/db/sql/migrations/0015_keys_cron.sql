-- 0015: a cron schedule may carry a concurrency key and max_in_flight
-- (docs/guide/concurrency-keys.md): every job it fires is inserted with them,
-- as `insert(..., concurrency_key=..., max_in_flight=...)` would. NULL: none.
-- The checks are the jobs table's own (migration 0011).

ALTER TABLE awa.cron_jobs
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD CONSTRAINT cron_jobs_concurrency_key_len CHECK (length(concurrency_key) BETWEEN 1 AND 200),
    ADD CONSTRAINT cron_jobs_concurrency_limit CHECK (concurrency_limit BETWEEN 1 AND 1000000),
    ADD CONSTRAINT cron_jobs_concurrency_limit_key
        CHECK (concurrency_limit IS NULL OR concurrency_key IS NOT NULL);
