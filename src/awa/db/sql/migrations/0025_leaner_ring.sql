-- 0025: a ring attempt writes less WAL, and the ring's available jobs are
-- counted from the claim cursors (issue 42, goals 3 and 4).
--
-- WAL. bench/wal_breakdown.py on the lane: 760 bytes of WAL per job drained,
-- against 680 for awa.jobs alone. Two parts of it bought nothing:
--
-- * awa.receipts had two indexes, (slot, id, run_lease) unique and (id): two
--   index entries per claimed job (80 + 64 bytes). One unique index
--   (id, run_lease, slot) serves both lookups. Each partition holds one slot,
--   so slot as the first column narrowed nothing; a lookup by id alone uses
--   the new index's first column. (A unique index of a partitioned table must
--   hold the partition key; its place in the index is free.)
-- * The completion wrote its closures with INSERT ... ON CONFLICT DO NOTHING,
--   a speculative insertion, which logs a second record per row
--   (Heap/HEAP_CONFIRM, 48 bytes). awa.ring_close inserts, plainly, the
--   closures not there yet. Only a rival closure of the same attempt (a
--   rescue, a cancel or a move into the mutable lane) committed while it runs
--   makes that insert fail, on the unique index; it then inserts again with
--   ON CONFLICT DO NOTHING. The first closure still wins, as before.
--
-- Counts. awa.active_counts() (0024) found the ring's available jobs by
-- hashing every ready row of the ring against every receipt: linear in the
-- ring's rows (half of queue_stats' 53 ms at 2,000 jobs/s), whatever the
-- backlog. It now walks each queue's lanes from their claim cursors, as
-- ring_available does (awa.ring_backlog, which also keeps the oldest run_at,
-- for the lag): proportional to the backlog, nothing when a queue keeps up.
--
-- History. Failed and cancelled jobs listed newest first (the API's lists, the
-- dashboard's recent failures) read each partition of awa.jobs_done by its id
-- index until they found one: partitions with none were read whole (1.5 s
-- with 10M jobs of history, bench/reads.py). A partial index of the jobs that
-- did not complete, in id order, makes that one short scan per partition.
-- Completions, the hot path, never write it. Building it reads the history
-- once (0.8 s for 10M jobs here, cached; completions wait meanwhile).
--
-- Nothing moves; statements of the previous release work unchanged
-- (ring_available keeps its signature and answers).

-- The whole swap under one lock taken first: CREATE INDEX's share lock, then
-- DROP INDEX's exclusive one, would upgrade a lock other sessions queue for
-- (a claim waiting behind the first, a reader holding the table: deadlock).
LOCK TABLE awa.receipts IN ACCESS EXCLUSIVE MODE;
CREATE UNIQUE INDEX receipts_attempt ON awa.receipts (id, run_lease, slot);
DROP INDEX awa.receipts_key;
DROP INDEX awa.receipts_id_idx;

-- Close the open attempts (slot, id, lease) with p_outcome, first closure
-- first served; the ids closed by this call. The caller has checked that each
-- receipt exists (a closure is written only where its receipt is).
-- Each attempt's closure is looked for by one probe of the unique index
-- (LATERAL ... LIMIT 1, sequential scans off), as ON CONFLICT did: a plan made
-- while a slot's closures were analyzed empty, reused once they filled, hashed
-- every closure of the ring per call (0.3 s at 100,000).
CREATE FUNCTION awa.ring_close(p_slots smallint[], p_ids bigint[], p_leases bigint[],
                               p_outcome smallint)
RETURNS SETOF bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    won bigint[];
BEGIN
    BEGIN
        -- This statement's snapshot sees every closure committed before it.
        WITH k AS (
            INSERT INTO awa.closures (slot, id, run_lease, outcome)
            SELECT c.slot, c.id, c.lease, p_outcome
            FROM unnest(p_slots, p_ids, p_leases) AS c(slot, id, lease)
            LEFT JOIN LATERAL (SELECT 1 AS found FROM awa.closures x
                               WHERE x.slot = c.slot AND x.id = c.id AND x.run_lease = c.lease
                               LIMIT 1) x ON true
            WHERE x.found IS NULL
            RETURNING id
        )
        SELECT array_agg(id) INTO won FROM k;
    EXCEPTION WHEN unique_violation THEN
        -- A rival committed since (the block's writes are undone): skip it.
        WITH k AS (
            INSERT INTO awa.closures (slot, id, run_lease, outcome)
            SELECT c.slot, c.id, c.lease, p_outcome
            FROM unnest(p_slots, p_ids, p_leases) AS c(slot, id, lease)
            ON CONFLICT DO NOTHING
            RETURNING id
        )
        SELECT array_agg(id) INTO won FROM k;
    END;
    RETURN QUERY SELECT unnest(won);
END $$;

-- How many ring jobs of p_queue are available (counting at most p_cap), and the
-- oldest run_at among those counted. Per lane: the rest of the tick its cursor
-- is in, then every row that became visible after that tick, less those taken
-- out (ready_cancels). ring_available's walk (0020), keeping the oldest too,
-- over the queue's own lanes only (0020 walked all four priorities).
CREATE FUNCTION awa.ring_backlog(p_queue text, p_cap int,
                                 OUT jobs bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last  awa.claim_log;
    s_now pg_snapshot := pg_current_snapshot();
    lo    pg_snapshot;
    hi    pg_snapshot;
    t     bigint;
    c     bigint;
    o     timestamptz;
    p     smallint;
    -- As in the claim: the per-row probe of the cancels only when there are any.
    cancels boolean := EXISTS (SELECT 1 FROM awa.ready_cancels);
BEGIN
    jobs := 0;
    SELECT * INTO last FROM awa.claim_log l WHERE l.queue = p_queue ORDER BY l.n DESC LIMIT 1;
    -- Only the queue's lanes (awa.ring_lanes: every lane that ever took a job).
    FOR p IN SELECT r.priority FROM awa.ring_lanes r WHERE r.queue = p_queue ORDER BY 1 LOOP
        EXIT WHEN jobs >= p_cap;
        t := coalesce(last.cur_tick[p], 1);
        lo := CASE WHEN t = 1 THEN '1:1:'::pg_snapshot ELSE
              (SELECT l.snap FROM awa.claim_log l WHERE l.queue = p_queue AND l.n = t - 1) END;
        hi := CASE WHEN t <= coalesce(last.n, 0)
                   THEN (SELECT l.snap FROM awa.claim_log l WHERE l.queue = p_queue AND l.n = t)
                   ELSE s_now END;
        -- The rest of the cursor's tick, then (if that tick is past) what came after it.
        FOR part IN 1..2 LOOP
            EXIT WHEN part = 2 AND t > coalesce(last.n, 0);
            SELECT count(*), min(w.run_at) INTO c, o
            FROM awa.ring_window(p_queue, p,
                                 CASE part WHEN 1 THEN lo ELSE hi END,
                                 CASE part WHEN 1 THEN hi ELSE s_now END,
                                 CASE part WHEN 1 THEN coalesce(last.cur_xid[p], '0') ELSE '0' END,
                                 CASE part WHEN 1 THEN coalesce(last.cur_id[p], 0) ELSE 0 END,
                                 p_cap) w
            WHERE NOT (cancels AND EXISTS (SELECT 1 FROM awa.ready_cancels k
                                           WHERE k.slot = w.slot AND k.id = w.id
                                             AND k.lease_base = w.lease_base));
            jobs := jobs + c;
            oldest := least(oldest, o);
        END LOOP;
    END LOOP;
    jobs := least(jobs, p_cap);
END $$;

CREATE OR REPLACE FUNCTION awa.ring_available(p_queue text, p_cap int) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT jobs FROM awa.ring_backlog(p_queue, p_cap) $$;

-- Open ring attempts by queue: receipts without their closure, joined by
-- hashing only (0024's reason: linear in the live slots' rows whatever plan
-- is cached), no parallel workers, no JIT (a read the UI and gauges repeat).
CREATE FUNCTION awa.ring_running_counts() RETURNS TABLE (queue text, n bigint)
LANGUAGE sql STABLE
SET enable_nestloop = off SET max_parallel_workers_per_gather = 0 SET jit = off AS $$
    SELECT r.queue, count(*) FROM awa.receipts r
    WHERE NOT EXISTS (SELECT 1 FROM awa.closures c
                      WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
    GROUP BY 1
$$;

-- Active jobs by queue and state, both lanes, and the oldest run_at of each
-- (0024), the ring's available ones counted from the cursors. (Not under
-- 0024's enable_nestloop = off: the call per queue can only be a nested loop,
-- and the penalty made every plan cost enough for JIT, seconds a call, also
-- in ring_backlog's own plans, cached for the session.)
CREATE OR REPLACE FUNCTION awa.active_counts()
RETURNS TABLE (queue text, state awa.job_state, n bigint, oldest timestamptz)
LANGUAGE sql STABLE SET max_parallel_workers_per_gather = 0 SET jit = off AS $$
    SELECT queue, state, sum(n)::bigint, min(oldest) FROM (
        SELECT j.queue::text AS queue, j.state, count(*) AS n, min(j.run_at) AS oldest
        FROM awa.jobs j GROUP BY 1, 2
        UNION ALL
        SELECT l.queue, 'available', b.jobs, b.oldest
        FROM (SELECT DISTINCT r.queue FROM awa.ring_lanes r) l
        CROSS JOIN LATERAL awa.ring_backlog(l.queue, 2147483647) b
        WHERE b.jobs > 0
        UNION ALL
        SELECT r.queue, 'running', r.n, NULL FROM awa.ring_running_counts() r
    ) c
    GROUP BY queue, state
$$;

-- Failed and cancelled jobs in id order (job_list_unsuccessful, ui_recent_failures).
CREATE INDEX jobs_done_not_completed_id_idx ON awa.jobs_done (id) WHERE state <> 'completed';
