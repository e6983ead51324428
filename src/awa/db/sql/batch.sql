-- Durable batch operations (awa.batch, awa.maintenance.batch). Filters are
-- always $1..$7: kind, queue, ids, tag, state, created_at >=, created_at <
-- (NULL = any), passed to awa.batch_match, which also requires a queued state.

-- name: batch_preview_count
-- Queued jobs of both lanes (awa.jobs_active: the ring's available ones too).
SELECT count(*) FROM awa.jobs_active j
WHERE awa.batch_match(ROW(j.*)::awa.jobs, $1, $2, $3, $4, $5, $6, $7)

-- name: batch_preview_sample
SELECT * FROM awa.jobs_active j
WHERE awa.batch_match(ROW(j.*)::awa.jobs, $1, $2, $3, $4, $5, $6, $7)
ORDER BY j.id LIMIT $8

-- name: batch_insert
INSERT INTO awa.batch_operations (id, op_kind, filter, spec, submitted_by)
VALUES ($1, $2, $3, $4, $5)
RETURNING *

-- name: batch_get
SELECT * FROM awa.batch_operations WHERE id = $1

-- name: batch_list
SELECT * FROM awa.batch_operations
WHERE ($1::text IS NULL OR state = $1)
ORDER BY submitted_at DESC, id DESC LIMIT $2

-- name: batch_cancel
-- Ask the operation to stop: it is 'cancelling' until the leader's runner
-- finalises it as 'cancelled' (after the step in flight, if any; a pending one
-- on its next pass), the one state machine awa-pg reports too. $2 (retention)
-- is applied by that finish.
UPDATE awa.batch_operations
SET state = 'cancelling', updated_at = now()
WHERE id = $1 AND state IN ('pending', 'scanning', 'running') AND $2::interval IS NOT NULL
RETURNING *

-- name: batch_purge
-- Finished operations finalized before $1, oldest first, at most $2.
WITH gone AS (
    DELETE FROM awa.batch_operations
    WHERE id IN (SELECT id FROM awa.batch_operations
                 WHERE finalized_at < $1 AND state IN ('completed', 'cancelled', 'failed')
                 ORDER BY finalized_at LIMIT $2)
    RETURNING 1
)
SELECT count(*) FROM gone

-- name: batch_prune_expired
-- Finished operations past their retention, at most $1 (maintenance).
WITH gone AS (
    DELETE FROM awa.batch_operations
    WHERE id IN (SELECT id FROM awa.batch_operations
                 WHERE finalized_at IS NOT NULL AND retention_until < now()
                   AND state IN ('completed', 'cancelled', 'failed')
                 ORDER BY finalized_at LIMIT $1)
    RETURNING 1
)
SELECT count(*) FROM gone

-- name: batch_active
SELECT id FROM awa.batch_operations
WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
ORDER BY submitted_at, id LIMIT $1

-- name: batch_step_lock
-- Each step of a runner holds this lock on its operation until it commits,
-- so steps (also of a second runner during a leader hand-over) never overlap.
-- It is not the row lock: a cancel goes through at once, even mid-chunk.
SELECT pg_advisory_xact_lock(2979, hashtext($1::uuid::text))

-- name: batch_start
UPDATE awa.batch_operations
SET state = 'scanning', started_at = now(), runner_instance = $2, updated_at = now(),
    cursor = jsonb_build_object('after_job_id', 0,
                                'max_job_id', greatest((SELECT coalesce(max(id), 0) FROM awa.jobs),
                                                       (SELECT coalesce(max(id), 0) FROM awa.ready)))
WHERE id = $1 AND state = 'pending'

-- name: batch_scan
-- Snapshot the matching jobs among the next $11 ids after $9 (from the first
-- job there, so gaps cost nothing), up to $10, into the operation $8. Returns
-- the last id looked at (NULL: nothing left), where the next scan starts. A
-- window of ids, not of matches, bounds each step however rare matches are.
-- Both lanes: the matching available jobs of the append-only lane move to
-- awa.jobs here (awa.ring_unready, under their queue's claim lock; one a claim
-- took first stays in the ring, running, and is not snapshotted), so the
-- chunks' statements (batch_apply, in later transactions) find them there.
WITH start AS (
    SELECT least((SELECT min(id) FROM awa.jobs WHERE id > $9 AND id <= $10),
                 (SELECT min(id) FROM awa.ready WHERE id > $9 AND id <= $10)) AS first
), found AS (
    SELECT j.id FROM awa.jobs j, start
    WHERE j.id >= start.first AND j.id < start.first + $11 AND j.id <= $10
      AND awa.batch_match(j, $1, $2, $3, $4, $5, $6, $7)
), in_ring AS (
    SELECT w.id FROM awa.ready w, start
    WHERE w.id >= start.first AND w.id < start.first + $11 AND w.id <= $10
      AND NOT EXISTS (SELECT 1 FROM awa.receipts r
                      WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
      AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                      WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base)
      AND awa.batch_match(awa.ready_job(w), $1, $2, $3, $4, $5, $6, $7)
), moved AS MATERIALIZED (
    SELECT awa.ring_unready(ARRAY(SELECT id FROM in_ring ORDER BY id)) AS id
), kept AS (
    INSERT INTO awa.batch_operation_jobs (operation_id, job_id)
    SELECT $8::uuid, id FROM (SELECT id FROM found UNION SELECT id FROM moved) f
    ON CONFLICT DO NOTHING
)
SELECT least($10, first + $11 - 1) AS scanned_to FROM start

-- name: batch_scan_progress
UPDATE awa.batch_operations
SET cursor = jsonb_set(cursor, '{after_job_id}', to_jsonb($2::bigint)), runner_instance = $3,
    updated_at = now()
WHERE id = $1

-- name: batch_scanned
-- The snapshot is complete: count it and start on the chunks.
UPDATE awa.batch_operations
SET state = 'running', runner_instance = $2, updated_at = now(),
    total_matched = (SELECT count(*) FROM awa.batch_operation_jobs WHERE operation_id = $1),
    cursor = jsonb_set(cursor, '{after_job_id}', '0')
WHERE id = $1 AND state = 'scanning'

-- name: batch_chunk
SELECT job_id FROM awa.batch_operation_jobs
WHERE operation_id = $1 ORDER BY job_id LIMIT $2

-- name: batch_chunk_unique
-- The unique jobs of a move chunk, for the runner to check which keys leave
-- the queue out (only those jobs may move).
SELECT id, kind, queue, args, unique_key FROM awa.jobs
WHERE id = ANY ($1::bigint[]) AND unique_key IS NOT NULL AND ordering_key IS NULL

-- name: batch_apply
-- Change the jobs $8 that are still queued and still match; $9 is the new
-- priority, $10 the new queue (NULL: unchanged). The first original value is
-- kept in metadata. A move leaves jobs with an ordering key alone, and
-- unique jobs unless listed in $11. Moved available jobs wake their queue.
-- The UPDATE waits for a job locked by a claim and re-checks it afterwards,
-- so a job is either claimed where it was or changed, never both.
WITH changed AS (
    UPDATE awa.jobs j
    SET priority = coalesce($9::smallint, j.priority),
        queue = coalesce($10::text, j.queue),
        metadata = j.metadata
            || CASE WHEN $9::smallint IS NULL OR j.metadata ? '_awa_original_priority'
                    THEN '{}'::jsonb
                    ELSE jsonb_build_object('_awa_original_priority', j.priority) END
            || CASE WHEN $10::text IS NULL OR j.metadata ? '_awa_original_queue'
                    THEN '{}'::jsonb
                    ELSE jsonb_build_object('_awa_original_queue', j.queue) END
    WHERE j.id = ANY ($8::bigint[]) AND awa.batch_match(j, $1, $2, $3, $4, $5, $6, $7)
      AND ($10::text IS NULL OR (j.ordering_key IS NULL
                                 AND (j.unique_key IS NULL OR j.id = ANY ($11::bigint[]))))
    RETURNING j.queue, j.state
), woken AS (
    SELECT pg_notify('awa_jobs', queue)
    FROM (SELECT DISTINCT queue FROM changed
          WHERE state = 'available' AND $10::text IS NOT NULL) q
)
SELECT (SELECT count(*) FROM changed) AS processed, (SELECT count(*) FROM woken) AS woken

-- name: batch_chunk_done
-- Drop the chunk from the snapshot and count it, in the chunk's transaction.
WITH gone AS (
    DELETE FROM awa.batch_operation_jobs WHERE operation_id = $1 AND job_id = ANY ($2::bigint[])
)
UPDATE awa.batch_operations
SET processed = processed + $3, skipped = skipped + $4, errored = errored + $5,
    last_error = coalesce($6, last_error), runner_instance = $7, updated_at = now(),
    cursor = jsonb_set(cursor, '{after_job_id}', to_jsonb((SELECT max(x) FROM unnest($2::bigint[]) x)))
WHERE id = $1

-- name: batch_finish
-- completed, cancelled or failed ($2); whatever is left of the snapshot goes.
-- An operation cancelled just as it ran out of work ends cancelled.
WITH gone AS (
    DELETE FROM awa.batch_operation_jobs WHERE operation_id = $1
)
UPDATE awa.batch_operations
SET state = CASE WHEN state = 'cancelling' AND $2::text = 'completed' THEN 'cancelled'
                 ELSE $2::text END,
    finalized_at = now(), retention_until = now() + $3::interval,
    last_error = coalesce($4, last_error), updated_at = now()
WHERE id = $1 AND state IN ('pending', 'scanning', 'running', 'cancelling')
RETURNING *
