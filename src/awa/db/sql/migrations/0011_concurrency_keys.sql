-- 0011: per-key concurrency (concurrency_key, max_in_flight), exact across a fleet.
--
-- A job may carry a concurrency key and the most attempts of that key allowed
-- in flight at once (its limit; NULL = the queue's key_max_in_flight, else 1).
-- A claim gives each keyed job a slot number, 1..limit, and the unique index
-- below admits one job per (key, slot) among jobs in flight, so PostgreSQL
-- itself refuses the claim that would exceed the limit: no count is read
-- and then trusted, and no counter row is written per claim or completion.
-- A slot frees itself when its job leaves `running` (completion, retry,
-- snooze, rescue, cancel): the row drops out of the partial index. A job
-- waiting in place for a callback (its handler alive) keeps its slot; a job
-- parked by WaitForCallback gives it back (callback_park clears it).
-- See docs/guide/concurrency-keys.md.

ALTER TABLE awa.jobs
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD COLUMN concurrency_slot  integer,
    ADD CONSTRAINT jobs_concurrency_key_len CHECK (length(concurrency_key) BETWEEN 1 AND 200),
    ADD CONSTRAINT jobs_concurrency_limit CHECK (concurrency_limit BETWEEN 1 AND 1000000);

-- Finished and dead-lettered jobs keep the key and limit, so a retry from
-- there is bound by them again (and the slot, to show where it ran).
ALTER TABLE awa.jobs_done
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD COLUMN concurrency_slot  integer;
ALTER TABLE awa.dlq
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD COLUMN concurrency_slot  integer;

-- The queue's limit for keyed jobs inserted without their own; written by
-- the workers that serve the queue (like dlq_enabled), read by every claim.
ALTER TABLE awa.queues ADD COLUMN key_max_in_flight integer
    CHECK (key_max_in_flight BETWEEN 1 AND 1000000);

-- The grant: at most one job in flight per (key, slot).
CREATE UNIQUE INDEX jobs_concurrency_slot_idx ON awa.jobs (concurrency_key, concurrency_slot)
    WHERE concurrency_slot IS NOT NULL AND state IN ('running', 'waiting_external');
-- The claim index splits unkeyed from keyed available jobs (the boolean
-- second column), so the plain claim reads only unkeyed ones, in its order,
-- and never steps over a keyed backlog; statements that read available jobs
-- by queue alone use it as before.
DROP INDEX awa.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON awa.jobs (queue, (concurrency_key IS NULL), priority, run_at, id)
    WHERE state = 'available';
-- Keyed claims walk the keys with available jobs in turn, each key's jobs in
-- claim order. Unkeyed jobs never enter it (nor the slot index).
CREATE INDEX jobs_concurrency_claim_idx
    ON awa.jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state = 'available' AND concurrency_key IS NOT NULL;

-- awa.finished() now carries the three columns into the finished row.
CREATE OR REPLACE FUNCTION awa.finished(
    j awa.jobs,
    p_state awa.job_state,
    p_retention interval,
    p_error jsonb DEFAULT NULL,
    p_progress jsonb DEFAULT NULL,
    p_clear_progress boolean DEFAULT false,
    p_output jsonb DEFAULT NULL,
    p_metadata jsonb DEFAULT NULL
) RETURNS SETOF awa.jobs_done
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT j.id, j.kind, j.queue, j.args, p_state, j.priority, j.attempt, j.max_attempts,
           j.run_lease, j.run_at, j.created_at, j.attempted_at, j.heartbeat_at, j.deadline_at,
           now(), j.tags, j.metadata || coalesce(p_metadata, '{}'::jsonb),
           CASE WHEN p_error IS NULL THEN j.errors
                ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(p_error) END,
           CASE WHEN p_clear_progress THEN NULL ELSE coalesce(p_progress, j.progress) END,
           coalesce(p_output, j.output), j.unique_key, j.unique_states, j.ordering_key,
           j.callback_id, j.callback_timeout_at, now() + p_retention,
           j.concurrency_key, j.concurrency_limit, j.concurrency_slot
$$;

-- A finished row as a dead-lettered one: the DLQ's columns are the finished
-- row's up to prune_after, then its own three, then the ones added since, so
-- a positional `f.*, reason, ...` no longer lines up. Every DLQ insert goes
-- through this instead. Inlined by the planner (a set-returning SQL function).
CREATE FUNCTION awa.dead_lettered(f awa.jobs_done, p_reason text)
RETURNS SETOF awa.dlq
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT f.id, f.kind, f.queue, f.args, f.state, f.priority, f.attempt, f.max_attempts,
           f.run_lease, f.run_at, f.created_at, f.attempted_at, f.heartbeat_at, f.deadline_at,
           f.finalized_at, f.tags, f.metadata, f.errors, f.progress, f.output, f.unique_key,
           f.unique_states, f.ordering_key, f.callback_id, f.callback_timeout_at,
           f.prune_after, p_reason, now(), f.run_lease,
           f.concurrency_key, f.concurrency_limit, f.concurrency_slot
$$;

-- The read view shows the key, its limit and the slot.
CREATE OR REPLACE VIEW awa.jobs_all AS
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs_done
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.dlq;
