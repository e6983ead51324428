-- Reads of the web UI. None counts or scans a whole table: counts are capped
-- at $1 and use the partial indexes of their state; lists read a bounded
-- window of ids (newest first) and filter inside it.

-- name: ui_is_read_only
-- A replica, a read-only default, or a role that may not change jobs.
SELECT pg_is_in_recovery() OR current_setting('default_transaction_read_only') = 'on'
    OR NOT has_table_privilege('awa.jobs', 'UPDATE')

-- name: ui_state_counts
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'available' LIMIT $1) s)
        AS available,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'scheduled' LIMIT $1) s)
        AS scheduled,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'retryable' LIMIT $1) s)
        AS retryable,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'running' LIMIT $1) s)
        AS running,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'waiting_external' LIMIT $1) s)
        AS waiting_external,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs_done WHERE state = 'failed' LIMIT $1) s)
        AS failed,
    (SELECT count(*) FROM (SELECT 1 FROM awa.dlq LIMIT $1) s) AS dlq,
    (SELECT coalesce(sum(completed), 0) FROM awa.queue_throughput
     WHERE minute > now() - interval '1 hour')::bigint AS completed_last_hour,
    (SELECT coalesce(sum(failed), 0) FROM awa.queue_throughput
     WHERE minute > now() - interval '1 hour')::bigint AS failed_last_hour

-- name: ui_series
-- Per-minute outcomes and pickup latency over the last $1 minutes (all queues
-- when $2 is null).
SELECT minute, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
       sum(wait_count)::bigint AS wait_count, sum(wait_ms_sum) AS wait_ms_sum,
       max(wait_ms_max) AS wait_ms_max
FROM awa.queue_throughput
WHERE minute > date_trunc('minute', now()) - make_interval(mins => $1)
  AND ($2::text IS NULL OR queue = $2)
GROUP BY minute ORDER BY minute

-- name: ui_queue_names
-- Known queues without scanning jobs: configured, recently active, served by a
-- live worker, or holding available work (a skip scan over the claim index).
WITH RECURSIVE avail(queue) AS (
    (SELECT queue FROM awa.jobs WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM awa.jobs j
            WHERE j.state = 'available' AND j.queue > a.queue ORDER BY j.queue LIMIT 1)
    FROM avail a WHERE a.queue IS NOT NULL
)
SELECT queue FROM avail WHERE queue IS NOT NULL
UNION SELECT queue FROM awa.queues
UNION SELECT DISTINCT queue FROM awa.queue_throughput WHERE minute > now() - interval '1 day'
UNION SELECT jsonb_object_keys(queues) FROM awa.runtime_instances
UNION SELECT DISTINCT queue FROM awa.jobs WHERE state = 'running'
ORDER BY 1

-- name: ui_queue_detail
-- One queue: capped depth, lag of its oldest available job (one short index
-- probe per priority), recent rate, pause state and DLQ depth.
SELECT
    $1::text AS queue,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs
                           WHERE state = 'available' AND queue = $1 LIMIT $2) s) AS available,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs
                           WHERE state = 'running' AND queue = $1 LIMIT $2) s) AS running,
    (SELECT CASE WHEN isfinite(t) THEN date_part('epoch', now()) - date_part('epoch', t) END
     FROM (SELECT min((SELECT run_at FROM awa.jobs
                       WHERE state = 'available' AND queue = $1 AND priority = p
                         AND (concurrency_key IS NULL) = unkeyed
                       ORDER BY run_at LIMIT 1)) AS t
           FROM generate_series(1, 4) p, (VALUES (true), (false)) k(unkeyed)) oldest)
        AS lag_seconds,
    (SELECT coalesce(sum(completed), 0) FROM awa.queue_throughput
     WHERE queue = $1 AND minute > now() - interval '5 minutes')::float8 / 5 AS completed_per_min,
    (SELECT coalesce(sum(failed), 0) FROM awa.queue_throughput
     WHERE queue = $1 AND minute > now() - interval '1 hour')::bigint AS failed_last_hour,
    (SELECT count(*) FROM (SELECT 1 FROM awa.dlq WHERE queue = $1 LIMIT $2) s) AS dlq,
    coalesce((SELECT paused FROM awa.queues WHERE queue = $1), false) AS paused,
    (SELECT paused_by FROM awa.queues WHERE queue = $1) AS paused_by

-- name: ui_jobs_active
-- A page of active jobs, newest first, below cursor $1: a window of at most $8
-- rows (of state $2) is read, then filtered; scanned_to says where it stopped.
WITH win AS (
    SELECT * FROM awa.jobs
    WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2)
    ORDER BY id DESC LIMIT $8
)
SELECT w.*, (SELECT min(id) FROM win) AS scanned_to, (SELECT count(*) FROM win) AS scanned FROM win w
WHERE awa.ui_matches(w.queue, w.kind, w.tags, w.args, $3, $4, $5, $6)
ORDER BY w.id DESC LIMIT $7

-- name: ui_jobs_done
-- As ui_jobs_active, over finished jobs.
WITH win AS (
    SELECT * FROM awa.jobs_done
    WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2)
    ORDER BY id DESC LIMIT $8
)
SELECT w.*, (SELECT min(id) FROM win) AS scanned_to, (SELECT count(*) FROM win) AS scanned FROM win w
WHERE awa.ui_matches(w.queue, w.kind, w.tags, w.args, $3, $4, $5, $6)
ORDER BY w.id DESC LIMIT $7

-- name: ui_jobs_all
-- As ui_jobs_active, over every job (active, finished, dead-lettered).
WITH win AS (
    SELECT * FROM awa.jobs_all
    WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2)
    ORDER BY id DESC LIMIT $8
)
SELECT w.*, (SELECT min(id) FROM win) AS scanned_to, (SELECT count(*) FROM win) AS scanned FROM win w
WHERE awa.ui_matches(w.queue, w.kind, w.tags, w.args, $3, $4, $5, $6)
ORDER BY w.id DESC LIMIT $7

-- name: ui_recent_failures
SELECT id, kind, queue, attempt, max_attempts, finalized_at, errors -> -1 AS last_error
FROM awa.jobs_done WHERE state = 'failed' ORDER BY id DESC LIMIT $1

-- name: ui_runtime
SELECT r.*, extract(epoch FROM now() - r.last_seen_at)::float8 AS seen_seconds_ago
FROM awa.runtime_instances r ORDER BY r.started_at

-- name: ui_leader
SELECT holder, expires_at, expires_at > now() AS live FROM awa.leader
