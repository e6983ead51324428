-- Operator views (web UI, CLI): live worker processes and pickup latency.

-- One row per running worker process, upserted every few seconds by its
-- presence service and deleted at shutdown; rows that stop being refreshed
-- show as stale and are removed after an hour.
CREATE TABLE awa.runtime_instances (
    instance_id  text PRIMARY KEY,
    hostname     text NOT NULL,
    pid          integer NOT NULL,
    version      text NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    is_leader    boolean NOT NULL DEFAULT false,
    listening    boolean NOT NULL DEFAULT false,
    in_flight    integer NOT NULL DEFAULT 0,
    claimed      bigint NOT NULL DEFAULT 0,
    completed    bigint NOT NULL DEFAULT 0,
    queues       jsonb NOT NULL DEFAULT '{}'   -- name -> {max_workers, in_flight}
);

-- Pickup latency (claim time minus due time) per queue and minute, next to
-- the outcome counts, so charts read a small rollup instead of job history.
ALTER TABLE awa.queue_throughput
    ADD COLUMN wait_count  bigint NOT NULL DEFAULT 0,
    ADD COLUMN wait_ms_sum float8 NOT NULL DEFAULT 0,
    ADD COLUMN wait_ms_max float8 NOT NULL DEFAULT 0;
