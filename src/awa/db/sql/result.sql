-- Awaitable results: a waiter registers interest in a job (awa.job_waiters,
-- see migrations 0012 and 0018), is woken by NOTIFY awa_result or by its poll, and
-- reads the job wherever it lives.

-- name: result_register
-- Register a waiter on an active job. Marking the job (metadata._awa_waited:
-- its finished row then wakes the waiters, 0018) also locks its row, so its
-- finish cannot slip in between. No row back: the job is not active
-- (finished, dead-lettered, or unknown), so read it instead of waiting.
WITH job AS (
    UPDATE awa.jobs SET metadata = metadata || '{"_awa_waited": true}'
    WHERE id = $1 RETURNING id
)
INSERT INTO awa.job_waiters (job_id, expires_at)
SELECT id, coalesce($2::timestamptz, 'infinity') FROM job
ON CONFLICT (job_id) DO UPDATE
    SET expires_at = greatest(awa.job_waiters.expires_at, excluded.expires_at)
RETURNING job_id

-- name: result_unregister
-- A waiter's deadline $2 passed: drop the row unless another waiter's deadline
-- is later. (A waiter cancelled before its deadline leaves the row: it keeps
-- only the latest deadline, which may be another waiter's.)
DELETE FROM awa.job_waiters
WHERE job_id = $1 AND expires_at <= coalesce($2::timestamptz, 'infinity')

-- name: result_not_active
-- The poll: which of these jobs have left the active table (one index probe each).
SELECT w.id FROM unnest($1::bigint[]) AS w(id)
WHERE NOT EXISTS (SELECT 1 FROM awa.jobs j WHERE j.id = w.id)

-- name: result_waiter_count
SELECT count(*) FROM awa.job_waiters

-- name: result_waiters_prune
-- The cleanup service: registrations left by waiters that died or were
-- cancelled before their deadline (a waiter that times out removes its own; a
-- finish removes all), once expired, and those of jobs deleted by hand (no
-- finish to remove them; a registration is made only while its job is active).
-- Active in either lane (awa.jobs_active: one index probe per table for an id).
DELETE FROM awa.job_waiters w
WHERE w.expires_at < now() - interval '1 minute'
   OR NOT EXISTS (SELECT 1 FROM awa.jobs_active j WHERE j.id = w.job_id)
