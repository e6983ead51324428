-- Statements on cron schedules (docs/guide/cron.md).

-- name: cron_upsert
-- Additive: declaring a schedule never removes another deployment's. A new
-- schedule has no last fire: the leader fires its latest fire time if it was at
-- most a minute ago (see CronService), then goes on from there; a changed one
-- keeps its last fire.
INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args, priority, max_attempts,
                           tags, metadata, missed_fire_policy, last_fire_at,
                           concurrency_key, concurrency_limit)
VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10::text::jsonb, $11, NULL, $12, $13)
ON CONFLICT (name) DO UPDATE
SET cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind,
    queue = EXCLUDED.queue, args = EXCLUDED.args, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, tags = EXCLUDED.tags, metadata = EXCLUDED.metadata,
    missed_fire_policy = EXCLUDED.missed_fire_policy,
    concurrency_key = EXCLUDED.concurrency_key, concurrency_limit = EXCLUDED.concurrency_limit,
    updated_at = now()

-- name: cron_list
SELECT *, now() AS db_now FROM awa.cron_jobs ORDER BY name

-- name: cron_get
SELECT * FROM awa.cron_jobs WHERE name = $1

-- name: cron_delete
DELETE FROM awa.cron_jobs WHERE name = $1

-- name: cron_set_paused
-- Resuming starts again from now: fires missed while paused are not made up.
UPDATE awa.cron_jobs
SET paused = $2, updated_at = now(),
    last_fire_at = CASE WHEN NOT $2 AND paused THEN now() ELSE last_fire_at END
WHERE name = $1
RETURNING name

-- name: cron_advance
-- Compare-and-set of the last fire time; only one leader wins a fire time.
UPDATE awa.cron_jobs SET last_fire_at = $2
WHERE name = $1 AND last_fire_at IS NOT DISTINCT FROM $3 AND NOT paused
RETURNING name

-- name: db_now
SELECT now()
