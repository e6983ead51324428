-- Statements on queues: pause switches, drain, stats.

-- name: queue_pause
INSERT INTO awa.queues (queue, paused, paused_by, paused_at)
VALUES ($1, true, $2, now())
ON CONFLICT (queue) DO UPDATE
SET paused = true, paused_by = EXCLUDED.paused_by, paused_at = EXCLUDED.paused_at

-- name: queue_known
-- Whether anything knows queue $1: a switch row (every queue a worker has
-- served has one), active jobs, failed or recently finished jobs, dead
-- letters, an override, a descriptor, a worker's queue list or a cron
-- schedule. Cheap probes first; completed and cancelled history past the
-- throughput rollup's week is not scanned (it has no queue index).
SELECT EXISTS (SELECT 1 FROM awa.queues WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.queue_overrides WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.descriptors WHERE scope = 'queue' AND name = $1)
    OR EXISTS (SELECT 1 FROM awa.presence WHERE queues ? $1)
    OR EXISTS (SELECT 1 FROM awa.cron_jobs WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.jobs WHERE state = 'available' AND queue = $1)
    OR EXISTS (SELECT 1 FROM awa.jobs WHERE state = 'running' AND queue = $1)
    OR EXISTS (SELECT 1 FROM awa.queue_throughput WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.jobs_done WHERE state = 'failed' AND queue = $1)
    OR EXISTS (SELECT 1 FROM awa.dlq WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.jobs WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM awa.ready WHERE queue = $1)

-- name: queue_resume
UPDATE awa.queues SET paused = false, paused_by = NULL, paused_at = NULL WHERE queue = $1

-- name: queue_drain
-- Cancel every job of the queue that is waiting: to run, or on a callback. A
-- parked job whose unique states exclude waiting_external released its key, and
-- another job may hold it now: it stays parked (its callback timeout still ends
-- it) when cancelling it would take that key; of two sharing a key, the first goes.
WITH parked AS (
    SELECT j.id,
           j.unique_key IS NULL
           OR (j.unique_states & awa.state_bit('cancelled')) = 0
           OR (NOT EXISTS (SELECT 1 FROM awa.unique_claims c
                           WHERE c.unique_key = j.unique_key AND c.job_id <> j.id)
               AND row_number() OVER (PARTITION BY j.unique_key ORDER BY j.id) = 1) AS free
    FROM awa.jobs j
    WHERE j.queue = $1 AND j.state = 'waiting_external'
), moved AS (
    DELETE FROM awa.jobs j
    WHERE j.queue = $1
      AND (j.state IN ('scheduled', 'available', 'retryable')
           OR j.id IN (SELECT id FROM parked WHERE free))
    RETURNING j
)
INSERT INTO awa.jobs_done
SELECT f.* FROM moved m, LATERAL awa.finished(m.j, 'cancelled', $2::interval) f

-- name: queue_stats
-- Active counts come from awa.active_counts() (migration 0024: both lanes'
-- active jobs, joined by hashing whatever plan is cached); failures from a
-- small partial index; completions from the per-minute rollup. No history scans.
WITH active AS (
    SELECT queue,
           sum(n) FILTER (WHERE state = 'scheduled')::bigint AS scheduled,
           sum(n) FILTER (WHERE state = 'available')::bigint AS available,
           sum(n) FILTER (WHERE state = 'retryable')::bigint AS retryable,
           sum(n) FILTER (WHERE state = 'running')::bigint AS running,
           sum(n) FILTER (WHERE state = 'waiting_external')::bigint AS waiting_external,
           min(oldest) FILTER (WHERE state = 'available') AS oldest_available
    FROM awa.active_counts() GROUP BY queue
), failed AS (
    SELECT queue, count(*) AS failed FROM awa.jobs_done WHERE state = 'failed' GROUP BY queue
), completed AS (
    SELECT queue, sum(completed)::bigint AS completed FROM awa.queue_throughput
    WHERE minute > now() - interval '1 hour' GROUP BY queue
), names AS (
    SELECT queue FROM active UNION SELECT queue FROM failed
    UNION SELECT queue FROM completed UNION SELECT queue FROM awa.queues
)
SELECT n.queue,
       coalesce(a.scheduled, 0) AS scheduled, coalesce(a.available, 0) AS available,
       coalesce(a.retryable, 0) AS retryable, coalesce(a.running, 0) AS running,
       coalesce(a.waiting_external, 0) AS waiting_external,
       coalesce(f.failed, 0) AS failed, coalesce(c.completed, 0) AS completed_last_hour,
       CASE WHEN isfinite(a.oldest_available)
            THEN date_part('epoch', now()) - date_part('epoch', a.oldest_available)
       END AS lag_seconds,
       coalesce(q.paused, false) AS paused
FROM names n
LEFT JOIN active a ON a.queue = n.queue
LEFT JOIN failed f ON f.queue = n.queue
LEFT JOIN completed c ON c.queue = n.queue
LEFT JOIN awa.queues q ON q.queue = n.queue
ORDER BY n.queue

-- name: queue_available_counts
-- Available jobs of each queue of $1 that has any: the mutable lane's, plus
-- the ring's counted from its claim cursors (awa.ring_available, which never
-- walks spent rows).
SELECT queue, n FROM (
    SELECT q AS queue,
           (SELECT count(*) FROM awa.jobs j WHERE j.state = 'available' AND j.queue = q)
           + awa.ring_available(q, 2147483647) AS n
    FROM unnest($1::text[]) AS q
) c
WHERE n > 0

-- name: queue_depth_lag
-- The awa.queue.depth and awa.queue.lag gauges: active jobs by queue and
-- state, and the age of each queue's oldest available job. One pass over the
-- active jobs of both lanes (awa.active_counts(); finished jobs live
-- elsewhere), run by the leader every ~15 s.
SELECT queue, state::text AS state, n AS depth,
       CASE WHEN state = 'available' AND isfinite(oldest)
            THEN greatest(date_part('epoch', now()) - date_part('epoch', oldest), 0)
       END AS lag_seconds
FROM awa.active_counts()

-- name: queue_unpause_all
DELETE FROM awa.queues

-- name: queue_available_kinds
-- The kinds of $1's available jobs, in either lane.
SELECT DISTINCT kind FROM awa.jobs_active WHERE state = 'available' AND queue = $1

-- name: queue_make_due
-- The testing harness's drain(include_scheduled=True): run waiting jobs now,
-- but not children still waiting for a parent (its finish releases them).
UPDATE awa.jobs j SET state = 'available', run_at = now()
WHERE j.queue = $1 AND j.state IN ('scheduled', 'retryable')
  AND NOT EXISTS (SELECT 1 FROM awa.job_dependencies d
                  WHERE d.child_id = j.id AND d.resolved_at IS NULL)

-- name: throughput_add
-- Outcome counts and pickup latencies a worker process accumulated, as new
-- rows for this minute (one per queue; written every few seconds, never
-- inside a job's transaction). Only INSERTs: readers sum the rows, and no
-- row version dies until the retention sweep (migration 0022).
INSERT INTO awa.queue_throughput
    (queue, minute, shard, completed, failed, wait_count, wait_ms_sum, wait_ms_max)
SELECT q, date_trunc('minute', now()), $4, c, f, wc, ws, wm
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $5::bigint[], $6::float8[], $7::float8[])
    AS u(q, c, f, wc, ws, wm)

-- name: queue_unserved_kinds
-- Kinds of $1 with available jobs in queues that no worker seen in the last
-- $2 serves: those jobs wait forever. The queues holding available jobs come
-- from a loose scan of the claim index (one probe per queue, however deep
-- the backlog) and one of the ring's lane index (a queue there counts when
-- its claim cursors have a job left, awa.ring_available), and each unserved
-- queue is sampled, not counted whole.
WITH RECURSIVE queues AS (
    (SELECT queue FROM awa.jobs WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM awa.jobs j
            WHERE j.state = 'available' AND j.queue > queues.queue ORDER BY j.queue LIMIT 1)
    FROM queues WHERE queues.queue IS NOT NULL
), ring_queues AS (
    (SELECT queue FROM awa.ready ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM awa.ready w WHERE w.queue > r.queue ORDER BY w.queue LIMIT 1)
    FROM ring_queues r WHERE r.queue IS NOT NULL
), held AS (
    SELECT queue::text FROM queues WHERE queue IS NOT NULL
    UNION
    SELECT queue::text FROM ring_queues
    WHERE queue IS NOT NULL AND awa.ring_available(queue, 1) > 0
), served AS (
    SELECT jsonb_object_keys(queues) AS queue FROM awa.presence
    WHERE last_seen_at > now() - $2::interval
)
SELECT q.queue, s.kind, s.sampled
FROM held q
CROSS JOIN LATERAL (
    SELECT kind, count(*) AS sampled
    FROM (SELECT kind FROM awa.jobs_active j
          WHERE j.state = 'available' AND j.queue = q.queue LIMIT 1000) x
    WHERE kind = ANY($1::text[])
    GROUP BY kind) s
WHERE q.queue NOT IN (SELECT queue FROM served)
ORDER BY 1, 2
