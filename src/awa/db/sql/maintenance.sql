-- Statements of the maintenance services: leadership, promotion, rescue, cleanup.

-- name: tx_lock_timeout
-- This transaction waits at most $1 (text, e.g. '200ms') for any lock: the
-- upkeep that locks a table every completion or claim uses (a partition of
-- awa.jobs_done, a ring slot) never queues them behind a long reader.
SELECT set_config('lock_timeout', $1::text, true)

-- name: leader_acquire
-- Take or renew the leader lease (a new term row, migration 0028); true only
-- for the leader.
SELECT awa.leader_take($1, $2::interval)

-- name: leader_release
SELECT awa.leader_resign($1)

-- name: job_promote_due
-- Make due scheduled / retryable jobs available and wake their queues. $2:
-- only these jobs (NULL: any), $3: never these (see Rescuer).
WITH due AS (
    SELECT id FROM awa.jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
      AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[])) AND id <> ALL($3::bigint[])
    ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE awa.jobs j SET state = 'available' FROM due WHERE j.id = due.id RETURNING j.queue
)
SELECT queue, count(*) AS n, pg_notify('awa_jobs', queue) FROM promoted GROUP BY queue

-- fragment: heartbeat_stale
-- A running awa.jobs row (alias j) whose heartbeat is older than $1, counting
-- the heartbeats its attempt wrote in the append-only lane before it moved
-- here (migration 0020: a move inside a transaction still open, such as a
-- dependent's insert, leaves the worker beating the ring until it commits):
-- one receipt probe by id, one heartbeat probe, and only for stale rows.
(j.heartbeat_at < now() - $1::interval
 AND NOT EXISTS (SELECT 1 FROM awa.receipts r
                 JOIN awa.heartbeats h ON h.slot = r.slot AND h.id = r.id
                                      AND h.run_lease = r.run_lease
                 WHERE r.id = j.id AND r.run_lease = j.run_lease
                   AND h.at >= now() - $1::interval))

-- name: job_rescue_running
-- Attempts whose heartbeat is older than $1 or whose deadline passed: back to
-- retryable with backoff, or failed when attempts are exhausted (dlq = true
-- when a DLQ-enabled queue took it). Each rescued id is notified on
-- awa_cancel so a still-live handler learns it lost the job. $4: only these
-- jobs (NULL: any), $5: never these (the rescue service's quarantine, jobs
-- whose rescue failed on its own; see Rescuer).
WITH stale AS (
    SELECT id, CASE WHEN deadline_at < now()
                    THEN format('hard deadline exceeded: the attempt ran longer than %s '
                                '(the queue''s deadline_duration_ms, default 300000 = 5 '
                                'minutes, 0 = off; or a live deadline_ms override)',
                                date_trunc('second', deadline_at - attempted_at))
                    ELSE 'heartbeat stale' END AS reason
    FROM awa.jobs j
    WHERE state = 'running'
      AND ({{heartbeat_stale}} OR deadline_at < now())
      AND ($4::bigint[] IS NULL OR id = ANY($4::bigint[])) AND id <> ALL($5::bigint[])
    LIMIT $2 FOR UPDATE SKIP LOCKED
), failing AS (
    DELETE FROM awa.jobs j USING stale s
    WHERE j.id = s.id AND j.attempt >= j.max_attempts
    RETURNING j, s.reason, awa.dlq_enabled(j.queue) AS to_dlq
), failed AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM failing m,
        LATERAL awa.finished(m.j, 'failed', $3::interval,
                             awa.error_entry(m.reason, (m.j).attempt, true)) f
    WHERE NOT m.to_dlq
    RETURNING id, queue, kind, attempt, errors->-1->>'error' AS reason,
              'failed'::text AS outcome, false AS dlq
), dead AS (
    INSERT INTO awa.dlq
    SELECT d.* FROM failing m,
        LATERAL awa.finished(m.j, 'failed', $3::interval,
                             awa.error_entry(m.reason, (m.j).attempt, true)) f,
        LATERAL awa.dead_lettered(f, 'max_attempts_exhausted') d
    WHERE m.to_dlq
    RETURNING id, queue, kind, attempt, errors->-1->>'error' AS reason,
              'failed'::text AS outcome, true AS dlq
), retried AS (
    UPDATE awa.jobs j
    SET state = 'retryable', run_at = now() + awa.retry_delay(j.attempt),
        errors = coalesce(j.errors, '[]'::jsonb)
                 || jsonb_build_array(awa.error_entry(s.reason, j.attempt, false)),
        heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL
    FROM stale s
    WHERE j.id = s.id AND j.attempt < j.max_attempts
    RETURNING j.id, j.queue, j.kind, j.attempt, j.errors->-1->>'error' AS reason,
              'retryable'::text AS outcome, false AS dlq
)
SELECT r.*, pg_notify('awa_cancel', r.id::text)
FROM (SELECT * FROM failed UNION ALL SELECT * FROM dead UNION ALL SELECT * FROM retried) r

-- name: done_partitions_missing
-- Of the hours jobs finished from now until $2 later land in, with each
-- retention of $1, those awa.jobs_done has no partition for yet (named
-- jobs_done_pYYYYMMDDHH in UTC, beside it: awa.ensure_done_partitions), oldest
-- first. One read, so a pass (and a worker's start) with nothing to make costs
-- one round trip, not a transaction per hour.
SELECT DISTINCT h.hour
FROM unnest($1::interval[]) r(retention),
     generate_series(date_trunc('hour', now() + r.retention, 'UTC'),
                     now() + r.retention + $2::interval, interval '1 hour') h(hour)
WHERE NOT EXISTS (
    SELECT 1 FROM pg_class c
    WHERE c.relnamespace = (SELECT relnamespace FROM pg_class
                            WHERE oid = 'awa.jobs_done'::regclass)
      AND c.relname = 'jobs_done_p' || to_char(h.hour AT TIME ZONE 'UTC', 'YYYYMMDDHH24'))
ORDER BY h.hour

-- name: done_partitions_ensure
-- The hourly partition of hour $1 (one per statement, so one per transaction).
SELECT awa.ensure_done_partitions($1, $1)

-- name: done_partitions_drop
-- Drops one expired partition and returns its row count; NULL when none is left.
SELECT awa.drop_done_partitions(now())

-- name: done_default_prune
-- Stray finished rows (no partition covered them) are deleted in batches.
WITH old AS (
    SELECT ctid FROM awa.jobs_done_default WHERE prune_after < now() LIMIT $1
)
DELETE FROM awa.jobs_done_default d USING old WHERE d.ctid = old.ctid

-- name: dlq_prune
WITH old AS (SELECT id FROM awa.dlq WHERE dlq_at < now() - $1::interval LIMIT $2)
DELETE FROM awa.dlq d USING old WHERE d.id = old.id

-- name: throughput_prune
DELETE FROM awa.queue_throughput WHERE minute < now() - interval '7 days'

-- name: jobs_dead_tuples
-- The active table churns (insert, claim, delete per job); when autovacuum is
-- off or behind, the leader vacuums it itself.
SELECT coalesce(n_dead_tup, 0) AS dead, coalesce(n_live_tup, 0) AS live
FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass

-- name: jobs_vacuum
-- Never truncates the table (vacuum_truncate = false, migration 0006).
VACUUM (ANALYZE) awa.jobs

-- name: job_rescue_candidates
-- The ids job_rescue_running would rescue (at most $2, not $3), without
-- touching them: the rescue service tries each alone when a batch failed.
SELECT id FROM awa.jobs j
WHERE state = 'running' AND ({{heartbeat_stale}} OR deadline_at < now())
  AND id <> ALL($3::bigint[])
ORDER BY id LIMIT $2

-- name: job_promote_candidates
-- The ids job_promote_due would promote (at most $1, not $2), untouched.
SELECT id FROM awa.jobs
WHERE state IN ('scheduled', 'retryable') AND run_at <= now() AND id <> ALL($2::bigint[])
ORDER BY run_at LIMIT $1
