-- 0021: the ring's active jobs as two views of their own (issue 42, slice 3).
--
-- 0020's awa.jobs_active is one UNION ALL of three branches: awa.jobs, the
-- ring's available jobs and its running ones. A list that wants the newest
-- few active jobs (ORDER BY id DESC LIMIT n: `awa job list`, the UI's pages)
-- cannot reach the ring's id indexes through it: the planner keeps the joined
-- branches as subqueries, reads every ready row with hash anti-joins and sorts
-- them all (200 ms for 200,000 ready rows). Each branch alone is an ordered
-- index scan with nested-loop probes that stops after n rows (1 ms).
--
-- So the two ring branches become views, awa.ring_jobs_available and
-- awa.ring_jobs_running (same columns as awa.jobs), and awa.jobs_active is
-- the same union, now written over them: one definition of what a ring job's
-- active row is. Lists take n from each of awa.jobs and the two views and
-- merge (ui.sql, job.sql); counts and gauges keep reading awa.jobs_active.
-- Nothing is written and no row changes.

-- The ring's available jobs: ready rows no claim took and no one passed over,
-- as the awa.jobs rows they stand for.
CREATE VIEW awa.ring_jobs_available AS
    SELECT w.id, w.kind, w.queue, w.args, 'available'::awa.job_state AS state, w.priority,
           w.attempt, w.max_attempts, w.lease_base AS run_lease, w.run_at, w.created_at,
           NULL::timestamptz AS attempted_at, NULL::timestamptz AS heartbeat_at,
           NULL::timestamptz AS deadline_at, NULL::timestamptz AS finalized_at,
           w.tags, w.metadata, w.errors, NULL::jsonb AS progress, NULL::jsonb AS output,
           NULL::bytea AS unique_key, NULL::smallint AS unique_states,
           NULL::text AS ordering_key, NULL::uuid AS callback_id,
           NULL::timestamptz AS callback_timeout_at, NULL::text AS concurrency_key,
           NULL::integer AS concurrency_limit, NULL::integer AS concurrency_slot
    FROM awa.ready w
    WHERE NOT EXISTS (SELECT 1 FROM awa.receipts r
                      WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
      AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                      WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base);

-- The ring's running jobs: open receipts (no closure yet), as the running
-- awa.jobs rows they stand for, heartbeat the latest sign of life.
CREATE VIEW awa.ring_jobs_running AS
    SELECT w.id, w.kind, w.queue, w.args, 'running'::awa.job_state AS state, w.priority,
           (w.attempt + 1)::smallint AS attempt, w.max_attempts, r.run_lease, w.run_at,
           w.created_at, r.claimed_at AS attempted_at,
           coalesce((SELECT max(h.at) FROM awa.heartbeats h
                     WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease),
                    r.claimed_at) AS heartbeat_at,
           r.deadline_at, NULL::timestamptz AS finalized_at, w.tags, w.metadata, w.errors,
           NULL::jsonb AS progress, NULL::jsonb AS output, NULL::bytea AS unique_key,
           NULL::smallint AS unique_states, NULL::text AS ordering_key,
           NULL::uuid AS callback_id, NULL::timestamptz AS callback_timeout_at,
           NULL::text AS concurrency_key, NULL::integer AS concurrency_limit,
           NULL::integer AS concurrency_slot
    FROM awa.receipts r
    JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id AND w.lease_base = r.run_lease - 1
    WHERE NOT EXISTS (SELECT 1 FROM awa.closures c
                      WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease);

-- The same rows as 0020's definition, the ring's branches now the views
-- above. Its columns and their types stay as they were, so awa.jobs_all
-- (which reads it) and the grants on both stay.
CREATE OR REPLACE VIEW awa.jobs_active AS
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs
    UNION ALL
    SELECT * FROM awa.ring_jobs_available
    UNION ALL
    SELECT * FROM awa.ring_jobs_running;
