-- 0016: less WAL per completed job (bench/results/wal_breakdown.md).
--
-- Every job writes seven WAL records between its claim and its completion:
-- the claim's row lock and update, the new version's entries in jobs_pkey and
-- jobs_running_idx, the delete, the insert into awa.jobs_done and its id
-- index entry. The count is the floor of this design (a claim cannot be a HOT
-- update: it moves the row between partial indexes); this migration makes
-- two of them smaller and removes the index page splits.
--
-- 1. A completed row keeps less. Its heartbeat_at and deadline_at described
--    the running attempt only; they are NULL once it completed (failed and
--    cancelled rows keep them: they tell how an attempt ended). Empty tags and
--    metadata are stored as NULL in completed rows; awa.jobs_all and the
--    readers show them as empty again. Completed rows never go back to
--    awa.jobs or to the DLQ (retries take failed and cancelled ones), so
--    nothing copies a NULL into a NOT NULL column. 208 -> 168 bytes for a
--    small job; about 38 WAL bytes less per job.
-- 2. jobs_pkey keeps half of each leaf page free. A claim adds a second entry
--    for the same id (the row's new version); leaves packed by the inserts
--    split under it (a split record logs half a page): about 12 WAL bytes
--    per job. Only pages split or built from now on are filled this way.
--
-- Each statement is idempotent and leaves existing rows as they are.

ALTER TABLE awa.jobs_done ALTER COLUMN tags DROP NOT NULL,
                          ALTER COLUMN metadata DROP NOT NULL;

ALTER INDEX awa.jobs_pkey SET (fillfactor = 50);

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
           j.run_lease, j.run_at, j.created_at, j.attempted_at,
           CASE WHEN p_state <> 'completed' THEN j.heartbeat_at END,
           CASE WHEN p_state <> 'completed' THEN j.deadline_at END,
           now(),
           CASE WHEN p_state = 'completed' THEN nullif(j.tags, '{}') ELSE j.tags END,
           CASE WHEN p_state = 'completed'
                THEN nullif(j.metadata || coalesce(p_metadata, '{}'::jsonb), '{}')
                ELSE j.metadata || coalesce(p_metadata, '{}'::jsonb) END,
           CASE WHEN p_error IS NULL THEN j.errors
                ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(p_error) END,
           CASE WHEN p_clear_progress THEN NULL ELSE coalesce(p_progress, j.progress) END,
           coalesce(p_output, j.output), j.unique_key, j.unique_states, j.ordering_key,
           j.callback_id, j.callback_timeout_at, now() + p_retention,
           j.concurrency_key, j.concurrency_limit, j.concurrency_slot
$$;

-- Readers see empty tags and metadata, wherever the job lives.
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
           coalesce(tags, '{}'), coalesce(metadata, '{}'), errors, progress, output,
           unique_key, unique_states, ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs_done
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.dlq;
