-- Statements on external callbacks (docs/guide/callbacks.md). A callback id lives
-- on the job row (unique while set); resolving clears it in the same
-- statement, so of two racing resolutions exactly one matches a row. Every
-- resolution notifies awa_callback with the job id, to wake a waiting handler.

-- name: callback_register
-- The attempt's newest callback; it supersedes any earlier one. The job
-- counts its callbacks (metadata "awa:callback_seq") for "callback #N".
-- CEL rules ($5, or NULL) are kept in awa.callback_rules.
WITH reg AS (
    UPDATE awa.jobs
    SET callback_id = $3, callback_timeout_at = now() + make_interval(secs => $4::float8),
        metadata = jsonb_set(metadata, '{awa:callback_seq}',
                             to_jsonb(coalesce((metadata ->> 'awa:callback_seq')::int, 0) + 1))
    WHERE id = $1 AND run_lease = $2 AND state = 'running'
    RETURNING id
), rules AS (
    INSERT INTO awa.callback_rules (callback_id, job_id, rules)
    SELECT $3, id, $5::jsonb FROM reg WHERE $5::jsonb IS NOT NULL
)
SELECT id FROM reg

-- name: callback_rules_lock
-- resolve_callback: lock the waiting job (serializing concurrent resolutions)
-- and read its rules.
SELECT j.id, r.rules
FROM awa.jobs j LEFT JOIN awa.callback_rules r ON r.callback_id = j.callback_id
WHERE j.callback_id = $1 AND j.state IN ('waiting_external', 'running')
FOR UPDATE OF j

-- name: callback_rules_delete
DELETE FROM awa.callback_rules WHERE callback_id = $1

-- name: callback_rules_prune
-- Rules of callbacks that were resolved another way, superseded or expired.
DELETE FROM awa.callback_rules r
WHERE r.created_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM awa.jobs j WHERE j.callback_id = r.callback_id)

-- name: callback_park
-- The handler returned WaitForCallback: park and free the slot. If the
-- callback was already resumed (early callback), the job is re-dispatched to
-- continue the same attempt, which the next claim must not count again.
UPDATE awa.jobs
SET state = CASE WHEN callback_id = $3 THEN 'waiting_external'
                 ELSE 'available' END::awa.job_state,
    attempt = CASE WHEN callback_id = $3 THEN attempt ELSE greatest(attempt - 1, 0) END,
    run_at = now(), heartbeat_at = NULL, deadline_at = NULL, progress = coalesce($4, progress),
    concurrency_slot = NULL  -- a parked job gives its key's slot back (0011)
WHERE id = $1 AND run_lease = $2 AND state = 'running'
  AND (callback_id = $3 OR (callback_id IS NULL AND metadata->>'awa:resumed_callback' = $3::text))
RETURNING state

-- name: callback_wait
-- The handler waits in place, still running: park while it stays alive.
UPDATE awa.jobs
SET state = 'waiting_external', heartbeat_at = now(), progress = coalesce($4, progress)
WHERE id = $1 AND run_lease = $2 AND state = 'running' AND callback_id = $3
RETURNING id

-- name: callback_wait_status
SELECT state, run_lease, callback_id, metadata->>'awa:resumed_callback' AS resumed,
       metadata->'_awa_callback_result' AS result
FROM awa.jobs WHERE id = $1

-- name: callback_complete
WITH moved AS (
    DELETE FROM awa.jobs j
    WHERE j.callback_id = $1 AND j.state IN ('waiting_external', 'running')
    RETURNING j
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'completed', $3::interval, NULL, NULL, true, NULL,
                             jsonb_build_object('_awa_callback_result', $2::text::jsonb)) f
    RETURNING *
)
SELECT done.*, pg_notify('awa_callback', done.id::text) AS notified FROM done

-- name: callback_fail
WITH moved AS (
    DELETE FROM awa.jobs j
    WHERE j.callback_id = $1 AND j.state IN ('waiting_external', 'running')
    RETURNING j, awa.dlq_enabled(j.queue) AS to_dlq
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'failed', $3::interval,
                             awa.error_entry($2, (m.j).attempt, true)) f
    WHERE NOT m.to_dlq
    RETURNING *
), dead AS (
    INSERT INTO awa.dlq
    SELECT d.* FROM moved m,
        LATERAL awa.finished(m.j, 'failed', $3::interval,
                             awa.error_entry($2, (m.j).attempt, true)) f,
        LATERAL awa.dead_lettered(f, 'terminal_error') d
    WHERE m.to_dlq
    RETURNING *
), both_ AS (
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
           created_at, attempted_at, heartbeat_at, deadline_at, finalized_at, tags, metadata,
           errors, progress, output, unique_key, unique_states, ordering_key, callback_id,
           callback_timeout_at FROM done
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
           created_at, attempted_at, heartbeat_at, deadline_at, finalized_at, tags, metadata,
           errors, progress, output, unique_key, unique_states, ordering_key, callback_id,
           callback_timeout_at FROM dead
)
SELECT both_.*, pg_notify('awa_callback', both_.id::text) AS notified FROM both_

-- name: callback_retry
-- The next run counts as a new attempt, but an explicit retry always grants
-- one, even when the parked attempt was the last (attempt never passes max).
UPDATE awa.jobs
SET state = 'available', run_at = now(), callback_id = NULL, callback_timeout_at = NULL,
    heartbeat_at = NULL, deadline_at = NULL, attempt = least(attempt, max_attempts - 1)
WHERE callback_id = $1 AND state IN ('waiting_external', 'running')
RETURNING *, pg_notify('awa_callback', id::text) AS notified

-- name: callback_resume
-- Back to running with the payload for the waiting handler. A job parked by a
-- returned WaitForCallback has no live handler (no heartbeat): it is
-- re-dispatched instead, with the payload in its metadata, to continue the
-- same attempt (the next claim does not count it again).
UPDATE awa.jobs
SET state = CASE WHEN heartbeat_at IS NULL THEN 'available' ELSE 'running' END::awa.job_state,
    attempt = CASE WHEN heartbeat_at IS NULL THEN greatest(attempt - 1, 0) ELSE attempt END,
    run_at = now(),
    heartbeat_at = CASE WHEN heartbeat_at IS NULL THEN NULL ELSE now() END,
    deadline_at = CASE WHEN heartbeat_at IS NOT NULL AND deadline_at IS NOT NULL
                       THEN now() + (deadline_at - attempted_at) END,
    metadata = metadata || jsonb_build_object('_awa_callback_result', $2::text::jsonb,
                                              'awa:resumed_callback', callback_id::text),
    callback_id = NULL, callback_timeout_at = NULL
WHERE callback_id = $1 AND state IN ('waiting_external', 'running')
RETURNING *, pg_notify('awa_callback', id::text) AS notified

-- name: callback_heartbeat
-- Push the timeout forward, only while the job is waiting on this callback.
UPDATE awa.jobs
SET callback_timeout_at = now() + make_interval(secs => $2::float8)
WHERE callback_id = $1 AND state = 'waiting_external'
RETURNING *

-- name: callback_rescue_candidates
-- The ids callback_rescue_expired would rescue (at most $1, not $2), untouched.
SELECT id FROM awa.jobs
WHERE state = 'waiting_external' AND callback_timeout_at < now() AND id <> ALL($2::bigint[])
ORDER BY id LIMIT $1

-- name: callback_rescue_expired
-- Callbacks past their timeout: retryable with backoff, or failed when attempts
-- are exhausted, with the error "callback timed out"; a live waiter is told.
-- A parked job whose unique states exclude waiting_external released its key,
-- and another job may hold it now: moving into a state the key covers would
-- conflict (and abort the whole batch). Such a job fails instead when failed
-- is not covered ('fail'), else it stays parked and is checked again after a
-- backoff ('wait'). Of two parked jobs with one key in a batch, the first wins.
-- $3: only these jobs (NULL: any), $4: never these (see Rescuer).
WITH locked AS (
    SELECT id FROM awa.jobs
    WHERE state = 'waiting_external' AND callback_timeout_at < now()
      AND ($3::bigint[] IS NULL OR id = ANY($3::bigint[])) AND id <> ALL($4::bigint[])
    LIMIT $1 FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT j.id,
           CASE WHEN j.unique_key IS NULL
                  OR (j.unique_states & awa.state_bit(CASE WHEN j.attempt >= j.max_attempts
                        THEN 'failed' ELSE 'retryable' END::awa.job_state)) = 0
                  OR (NOT EXISTS (SELECT 1 FROM awa.unique_claims c
                                  WHERE c.unique_key = j.unique_key AND c.job_id <> j.id)
                      AND row_number() OVER (PARTITION BY j.unique_key ORDER BY j.id) = 1)
                THEN 'normal'
                WHEN (j.unique_states & awa.state_bit('failed')) = 0 THEN 'fail'
                ELSE 'wait' END AS plan
    FROM awa.jobs j JOIN locked USING (id)
), failing AS (
    DELETE FROM awa.jobs j USING expired e
    WHERE j.id = e.id AND (e.plan = 'fail' OR (e.plan = 'normal' AND j.attempt >= j.max_attempts))
    RETURNING j, awa.dlq_enabled(j.queue) AS to_dlq,
              CASE WHEN e.plan = 'fail' THEN 'callback timed out; another job holds its unique key'
                   ELSE 'callback timed out' END AS reason
), failed AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM failing m,
        LATERAL awa.finished(m.j, 'failed', $2::interval,
                             awa.error_entry(m.reason, (m.j).attempt, true)) f
    WHERE NOT m.to_dlq
    RETURNING id, queue, kind, attempt, errors->-1->>'error' AS reason,
              'failed'::text AS outcome
), dead AS (
    INSERT INTO awa.dlq
    SELECT d.* FROM failing m,
        LATERAL awa.finished(m.j, 'failed', $2::interval,
                             awa.error_entry(m.reason, (m.j).attempt, true)) f,
        LATERAL awa.dead_lettered(f, 'callback_timeout') d
    WHERE m.to_dlq
    RETURNING id, queue, kind, attempt, errors->-1->>'error' AS reason,
              'failed'::text AS outcome
), retried AS (
    UPDATE awa.jobs j
    SET state = 'retryable', run_at = now() + awa.retry_delay(j.attempt),
        errors = coalesce(j.errors, '[]'::jsonb)
                 || jsonb_build_array(awa.error_entry('callback timed out', j.attempt, false)),
        heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL
    FROM expired e
    WHERE j.id = e.id AND e.plan = 'normal' AND j.attempt < j.max_attempts
    RETURNING j.id, j.queue, j.kind, j.attempt, j.errors->-1->>'error' AS reason,
              'retryable'::text AS outcome
), postponed AS (
    UPDATE awa.jobs j SET callback_timeout_at = now() + awa.retry_delay(j.attempt)
    FROM expired e
    WHERE j.id = e.id AND e.plan = 'wait'
)
SELECT r.*, pg_notify('awa_callback', r.id::text), pg_notify('awa_cancel', r.id::text)
FROM (SELECT * FROM failed UNION ALL SELECT * FROM dead UNION ALL SELECT * FROM retried) r

-- name: attempt_progress
UPDATE awa.jobs SET progress = $3
WHERE id = $1 AND run_lease = $2 AND state IN ('running', 'waiting_external')
RETURNING id
