-- 0005: durable batch operations (set_priority, move_queue) over queued jobs.
--
-- An operator submits an operation with a filter; the maintenance leader
-- snapshots the ids of the matching queued jobs into batch_operation_jobs,
-- then changes them a chunk at a time, each chunk in its own short
-- transaction that re-checks every job (one that started, finished or no
-- longer matches is skipped), removes the chunk from the snapshot and
-- advances the cursor and counts. See awa/batch.py and docs/architecture.md.

CREATE TABLE awa.batch_operations (
    id              uuid PRIMARY KEY,
    op_kind         text NOT NULL CHECK (op_kind IN ('set_priority', 'move_queue')),
    filter          jsonb NOT NULL,
    spec            jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN (
                        'pending', 'scanning', 'running', 'cancelling',
                        'completed', 'cancelled', 'failed')),
    submitted_by    text,
    submitted_at    timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finalized_at    timestamptz,
    cursor          jsonb,        -- {after_job_id, max_job_id}
    total_matched   bigint,       -- set when the snapshot is complete
    processed       bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    errored         bigint NOT NULL DEFAULT 0,
    last_error      text,
    runner_instance text,
    retention_until timestamptz,  -- terminal operations are pruned after this
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX batch_operations_submitted_idx ON awa.batch_operations (submitted_at);
CREATE INDEX batch_operations_active_idx ON awa.batch_operations (submitted_at)
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling');
CREATE INDEX batch_operations_finalized_idx ON awa.batch_operations (finalized_at)
    WHERE finalized_at IS NOT NULL;

-- The snapshot: the jobs an operation still has to look at. A chunk deletes
-- its ids in the transaction that acts on them, so each is handled once.
CREATE TABLE awa.batch_operation_jobs (
    operation_id uuid NOT NULL REFERENCES awa.batch_operations (id) ON DELETE CASCADE,
    job_id       bigint NOT NULL,
    PRIMARY KEY (operation_id, job_id)
);

-- The one definition of "this job is queued and matches the filter" (NULL =
-- any), used by preview, snapshot and every chunk. A simple SQL function, so
-- the planner inlines it.
CREATE FUNCTION awa.batch_match(
    j awa.jobs,
    p_kind text,
    p_queue text,
    p_ids bigint[],
    p_tag text,
    p_state awa.job_state,
    p_created_gte timestamptz,
    p_created_lt timestamptz
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.state IN ('scheduled', 'available', 'retryable')
       AND (p_kind IS NULL OR j.kind = p_kind)
       AND (p_queue IS NULL OR j.queue = p_queue)
       AND (p_ids IS NULL OR j.id = ANY (p_ids))
       AND (p_tag IS NULL OR p_tag = ANY (j.tags))
       AND (p_state IS NULL OR j.state = p_state)
       AND (p_created_gte IS NULL OR j.created_at >= p_created_gte)
       AND (p_created_lt IS NULL OR j.created_at < p_created_lt)
$$;
