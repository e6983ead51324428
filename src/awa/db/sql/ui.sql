-- Reads of the web UI. None counts or scans a whole table: counts are capped
-- at $1 and use the partial indexes of their state; lists read a bounded
-- window of ids (newest first) and filter inside it. Active jobs are read in
-- both lanes: awa.jobs_active (the mutable lane's rows and the ring's
-- available and running jobs), or awa.ring_available where a count of one
-- queue's available jobs is capped (it walks only the rows past the claim
-- cursors).

-- name: ui_is_read_only
-- A replica, a read-only default, or a role that may not change jobs.
SELECT pg_is_in_recovery() OR current_setting('default_transaction_read_only') = 'on'
    OR NOT has_table_privilege('awa.jobs', 'UPDATE')

-- name: ui_state_counts
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs_active WHERE state = 'available' LIMIT $1) s)
        AS available,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'scheduled' LIMIT $1) s)
        AS scheduled,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = 'retryable' LIMIT $1) s)
        AS retryable,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs_active WHERE state = 'running' LIMIT $1) s)
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
-- live worker, or holding available or running work (a skip scan over the
-- claim index, and one over the ring's lane index, whose queues count while
-- their claim cursors have a job left).
WITH RECURSIVE avail(queue) AS (
    (SELECT queue FROM awa.jobs WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM awa.jobs j
            WHERE j.state = 'available' AND j.queue > a.queue ORDER BY j.queue LIMIT 1)
    FROM avail a WHERE a.queue IS NOT NULL
), ring(queue) AS (
    (SELECT queue FROM awa.ready ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM awa.ready w WHERE w.queue > r.queue ORDER BY w.queue LIMIT 1)
    FROM ring r WHERE r.queue IS NOT NULL
)
SELECT queue::text FROM avail WHERE queue IS NOT NULL
UNION SELECT queue::text FROM ring WHERE queue IS NOT NULL AND awa.ring_available(queue, 1) > 0
UNION SELECT queue FROM awa.queues
UNION SELECT DISTINCT queue FROM awa.queue_throughput WHERE minute > now() - interval '1 day'
UNION SELECT jsonb_object_keys(queues) FROM awa.presence
UNION SELECT DISTINCT queue FROM awa.jobs_active WHERE state = 'running'
ORDER BY 1

-- name: ui_queue_detail
-- One queue: capped depth (the ring's counted from its claim cursors), lag of
-- its oldest available job (one short index probe per priority in the mutable
-- lane; the ring's available rows of the queue, which its rotation keeps
-- bounded), recent rate, pause state and DLQ depth.
SELECT
    $1::text AS queue,
    (SELECT least($2::int, m.n + CASE WHEN m.n < $2::int
                                     THEN awa.ring_available($1::text, $2::int - m.n::int)
                                     ELSE 0 END)
     FROM (SELECT count(*) AS n FROM (SELECT 1 FROM awa.jobs
                                      WHERE state = 'available' AND queue = $1
                                      LIMIT $2::int) s) m) AS available,
    (SELECT count(*) FROM (SELECT 1 FROM awa.jobs_active
                           WHERE state = 'running' AND queue = $1 LIMIT $2::int) s) AS running,
    (SELECT CASE WHEN isfinite(t) THEN date_part('epoch', now()) - date_part('epoch', t) END
     FROM (SELECT least(
               (SELECT min((SELECT run_at FROM awa.jobs
                            WHERE state = 'available' AND queue = $1 AND priority = p
                              AND (concurrency_key IS NULL) = unkeyed
                            ORDER BY run_at LIMIT 1))
                FROM generate_series(1, 4) p, (VALUES (true), (false)) k(unkeyed)),
               (SELECT min(run_at) FROM awa.ring_jobs_available WHERE queue = $1)) AS t)
           oldest)
        AS lag_seconds,
    (SELECT coalesce(sum(completed), 0) FROM awa.queue_throughput
     WHERE queue = $1 AND minute > now() - interval '5 minutes')::float8 / 5 AS completed_per_min,
    (SELECT coalesce(sum(failed), 0) FROM awa.queue_throughput
     WHERE queue = $1 AND minute > now() - interval '1 hour')::bigint AS failed_last_hour,
    (SELECT count(*) FROM (SELECT 1 FROM awa.dlq WHERE queue = $1 LIMIT $2::int) s) AS dlq,
    coalesce((SELECT paused FROM awa.queues WHERE queue = $1), false) AS paused,
    (SELECT paused_by FROM awa.queues WHERE queue = $1) AS paused_by

-- name: ui_jobs_active
-- A page of active jobs of either lane, newest first, below cursor $1: a
-- window of at most $8 rows (of state $2) is read, then filtered; scanned_to
-- says where it stopped. The window is the newest $8 of awa.jobs and of each
-- of the ring's views (migration 0021), merged: each an ordered index scan.
WITH win AS (
    SELECT * FROM (
        (SELECT * FROM awa.jobs WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT * FROM awa.ring_jobs_available WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT * FROM awa.ring_jobs_running WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
    ) a
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
-- As ui_jobs_active, over every job (the rows of awa.jobs_all: active,
-- finished, dead-lettered), each table or view it unions read the same way.
WITH win AS (
    SELECT * FROM (
        (SELECT * FROM awa.jobs WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT * FROM awa.ring_jobs_available WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT * FROM awa.ring_jobs_running WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
                run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
                coalesce(tags, '{}'), coalesce(metadata, '{}'), errors, progress, output,
                unique_key, unique_states, ordering_key, callback_id, callback_timeout_at,
                concurrency_key, concurrency_limit, concurrency_slot
         FROM awa.jobs_done WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
        UNION ALL
        (SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
                run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
                tags, metadata, errors, progress, output, unique_key, unique_states,
                ordering_key, callback_id, callback_timeout_at,
                concurrency_key, concurrency_limit, concurrency_slot
         FROM awa.dlq WHERE id < $1 AND ($2::awa.job_state IS NULL OR state = $2) ORDER BY id DESC LIMIT $8)
    ) a
    ORDER BY id DESC LIMIT $8
)
SELECT w.*, (SELECT min(id) FROM win) AS scanned_to, (SELECT count(*) FROM win) AS scanned FROM win w
WHERE awa.ui_matches(w.queue, w.kind, w.tags, w.args, $3, $4, $5, $6)
ORDER BY w.id DESC LIMIT $7

-- name: ui_recent_failures
-- Through the partial index of the jobs that did not complete (as job_list_unsuccessful).
SELECT id, kind, queue, attempt, max_attempts, finalized_at, errors -> -1 AS last_error
FROM awa.jobs_done WHERE state = 'failed' AND state <> 'completed' ORDER BY id DESC LIMIT $1

-- name: ui_runtime
SELECT r.*, extract(epoch FROM now() - r.last_seen_at)::float8 AS seen_seconds_ago
FROM awa.presence r ORDER BY r.started_at

-- name: ui_leader
SELECT holder, expires_at, expires_at > now() AS live FROM awa.leadership
