-- 0023: a leaner ring claim, and a reclaim that locks only spent tables (issue 42).
--
-- The claim returns the ready rows its walk read.
-- 0020's awa.claim walked each lane collecting the ids of the rows it could
-- take, then read each taken row again by slot and id to return it: one
-- index probe and heap fetch per job, about a quarter of the claim's time at
-- 128 jobs per claim (auto_explain). The walk now keeps the rows themselves
-- (array_agg of the ready rows, in walk order) and the claim returns them
-- from there. Same signature, same rows, same order, same writes; nothing
-- else changes and no row moves.
--
-- The reclaim took each old table's ACCESS EXCLUSIVE lock before looking at
-- it, every pass, spent or not, and held it while it checked: for a slot's
-- ready rows that check reads every receipt of the ring (at 2,000 jobs/s,
-- tens of milliseconds), and every claim and completion, which lock all the
-- ring's partitions, queued behind it (the claim p99 spikes of 150-320 ms in
-- the held-xmin cell at 2,000/s). Now it first checks without the lock
-- (awa.ring_spent) and leaves a table that is not spent alone, taking no lock
-- at all; only a table that looks spent is locked and checked again under the
-- lock, as before (the check under the lock is the one that counts: a
-- producer may commit into the slot meanwhile).

CREATE OR REPLACE FUNCTION awa.claim(p_queue text, p_max int, p_deadline float8, p_aging float8)
RETURNS TABLE (id bigint, kind text, queue text, args jsonb, priority smallint,
               attempt smallint, max_attempts smallint, run_lease bigint, run_at float8,
               created_at float8, attempted_at float8, deadline_at float8, tags text[],
               metadata jsonb, errors jsonb, progress jsonb, unique_key bytea,
               ordering_key text, receipt_slot smallint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    last     awa.claim_log;
    s_now    pg_snapshot;
    n_new    bigint;
    -- Each lane's cursor (tick, xid, id), and where its walk ended.
    ticks    bigint[];
    xs       xid8[];
    ids      bigint[];
    end_t    bigint[] := '{0,0,0,0}';
    end_x    xid8[] := '{0,0,0,0}';
    end_i    bigint[] := '{0,0,0,0}';
    -- The rows the walks saw, lane after lane (first[p] .. last_at[p] are lane p's).
    w_tick   bigint[] := '{}';
    w_slot   smallint[] := '{}';
    w_id     bigint[] := '{}';
    w_lease  bigint[] := '{}';
    w_xid    xid8[] := '{}';
    w_skip   boolean[] := '{}';
    w_run_at timestamptz[] := '{}';
    w_rows   awa.ready[] := '{}';
    first    int[] := '{1,1,1,1}';
    last_at  int[] := '{0,0,0,0}';
    settled  boolean[] := '{false,false,false,false}';
    -- The ring rows taken.
    t_slot   smallint[] := '{}';
    t_id     bigint[] := '{}';
    t_lease  bigint[] := '{}';
    p        smallint;
    t        bigint;
    x        xid8;
    i        bigint;
    e        int;
    k        int;
    lo       pg_snapshot;
    hi       pg_snapshot;
    seen     int;
    asked    int;
    got      int;
    skipped  int;
    want     int := p_max;
    passed   int := 0;
    cancels  boolean;
    lanes    record;
    rslot    smallint;
    known    smallint[];
    a_slot   smallint[];
    a_id     bigint[];
    a_lease  bigint[];
    a_xid    xid8[];
    a_skip   boolean[];
    a_run_at timestamptz[];
    a_rows   awa.ready[];
    deadline timestamptz := CASE WHEN p_deadline > 0
                                 THEN now() + make_interval(secs => p_deadline) END;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- One snapshot for the whole call would not see the claim committed
        -- while the lock was waited for: two claims could take the same rows.
        RAISE EXCEPTION 'awa.claim must run in READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    IF p_max <= 0 OR EXISTS (SELECT 1 FROM awa.queues q WHERE q.queue = p_queue AND q.paused)
    THEN
        RETURN;
    END IF;
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('awa.claim:' || p_queue, 0));
    -- Read after the lock, in a fresh snapshot: the last claim's row, and the
    -- cancels committed under the lock before it.
    SELECT * INTO last FROM awa.claim_log c WHERE c.queue = p_queue ORDER BY c.n DESC LIMIT 1;
    cancels := EXISTS (SELECT 1 FROM awa.ready_cancels);
    s_now := pg_current_snapshot();
    rslot := awa.ring_slot();
    IF last.n IS NULL THEN
        n_new := 1;
        ticks := '{1,1,1,1}'; xs := '{0,0,0,0}'; ids := '{0,0,0,0}';
    ELSE
        n_new := last.n + 1;
        ticks := last.cur_tick; xs := last.cur_xid; ids := last.cur_id;
    END IF;
    -- Walk each ring lane from its cursor, collecting up to p_max rows it could
    -- take (rows passed over do not count). Nothing is taken yet.
    -- Read after s_now: a lane whose producer committed before s_now is listed.
    -- A lane not listed has no row up to s_now, so its cursor moves past s_now.
    known := ARRAY(SELECT l.priority FROM awa.ring_lanes l WHERE l.queue = p_queue);
    FOR ln IN 1..4 LOOP
        p := ln;
        t := ticks[p]; x := xs[p]; i := ids[p];
        got := 0;
        first[p] := cardinality(w_id) + 1;
        IF NOT (p = ANY(known)) THEN
            t := n_new + 1; x := '0'; i := 0;
        END IF;
        WHILE t <= n_new AND got < p_max LOOP
            IF t = 1 THEN
                lo := '1:1:';
            ELSIF t - 1 = last.n THEN
                lo := last.snap;
            ELSE
                SELECT c.snap INTO lo FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t - 1;
            END IF;
            IF t = n_new THEN
                hi := s_now;
            ELSE
                SELECT c.snap INTO hi FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t;
            END IF;
            asked := p_max - got;
            SELECT count(*)::int,
                   coalesce(array_agg(w.slot ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.id ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.lease_base ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.xid ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(cancels AND EXISTS (
                       SELECT 1 FROM awa.ready_cancels k
                       WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base)
                       ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.run_at::timestamptz ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w ORDER BY w.xid, w.id), '{}')
            INTO seen, a_slot, a_id, a_lease, a_xid, a_skip, a_run_at, a_rows
            FROM awa.ring_window(p_queue, p, lo, hi, x, i, asked) w;
            IF seen > 0 THEN
                w_tick := w_tick || array_fill(t, ARRAY[seen]);
                w_slot := w_slot || a_slot; w_id := w_id || a_id;
                w_lease := w_lease || a_lease; w_xid := w_xid || a_xid;
                w_skip := w_skip || a_skip; w_run_at := w_run_at || a_run_at;
                w_rows := w_rows || a_rows;
                x := a_xid[seen]; i := a_id[seen];
                got := got + seen - (CASE WHEN cancels
                                         THEN cardinality(array_positions(a_skip, true))
                                         ELSE 0 END);
            END IF;
            IF seen < asked THEN  -- tick t is spent: the lane moves on to the next
                t := t + 1; x := '0'; i := 0;
            END IF;
        END LOOP;
        last_at[p] := cardinality(w_id);
        -- Where the cursor stands once the whole walk is taken.
        end_t[p] := t; end_x[p] := x; end_i[p] := i;
    END LOOP;
    -- Take from the lanes, the most urgent first: a lane's urgency is its oldest
    -- job's priority after aging.
    FOR lanes IN
        SELECT l.ring, l.p FROM (
            SELECT true AS ring, g.p::smallint AS p,
                   (SELECT min(u.r) FROM unnest(w_run_at[first[g.p]:last_at[g.p]],
                                                w_skip[first[g.p]:last_at[g.p]]) u(r, s)
                    WHERE NOT u.s) AS head
            FROM generate_series(1, 4) g(p) WHERE last_at[g.p] >= first[g.p]
            UNION ALL
            SELECT false, m.priority, m.run_at FROM generate_series(1, 4) g(p),
                LATERAL (SELECT j.priority, j.run_at FROM awa.jobs j
                         WHERE j.state = 'available' AND j.queue = p_queue
                           AND j.priority = g.p AND j.concurrency_key IS NULL
                         ORDER BY j.run_at, j.id LIMIT 1) m
        ) l
        WHERE l.head IS NOT NULL
        ORDER BY awa.aged(l.p, l.head, p_aging), l.head, l.ring DESC
    LOOP
        EXIT WHEN want = 0;
        p := lanes.p;
        IF lanes.ring THEN
            -- Take the lane's first k rows it may take; e: the last row consumed.
            skipped := CASE WHEN cancels
                            THEN cardinality(array_positions(w_skip[first[p]:last_at[p]], true))
                            ELSE 0 END;
            k := least(want, last_at[p] - first[p] + 1 - skipped);
            IF k = last_at[p] - first[p] + 1 - skipped THEN
                e := last_at[p];  -- the whole walk: the cursor goes where the walk ended
                ticks[p] := end_t[p]; xs[p] := end_x[p]; ids[p] := end_i[p];
            ELSE
                e := CASE WHEN skipped = 0 THEN first[p] + k - 1 ELSE
                     (SELECT u.o FROM unnest(w_skip) WITH ORDINALITY u(s, o)
                      WHERE u.o >= first[p] AND NOT u.s ORDER BY u.o OFFSET k - 1 LIMIT 1) END;
                ticks[p] := w_tick[e]; xs[p] := w_xid[e]; ids[p] := w_id[e];
            END IF;
            IF skipped = 0 THEN
                a_slot := w_slot[first[p]:e]; a_id := w_id[first[p]:e];
                a_lease := w_lease[first[p]:e]; a_rows := w_rows[first[p]:e];
            ELSE
                SELECT array_agg(w_slot[g] ORDER BY g), array_agg(w_id[g] ORDER BY g),
                       array_agg(w_lease[g] ORDER BY g), array_agg(w_rows[g] ORDER BY g),
                       passed + (e - first[p] + 1) - count(*)
                INTO a_slot, a_id, a_lease, a_rows, passed
                FROM generate_series(first[p], e) g
                WHERE NOT w_skip[g];
            END IF;
            t_slot := t_slot || a_slot; t_id := t_id || a_id; t_lease := t_lease || a_lease;
            -- The lane's rows, in the order taken (lanes in order of urgency).
            RETURN QUERY
                SELECT w.id, w.kind::text, w.queue::text, w.args::jsonb, w.priority::smallint,
                       (w.attempt + 1)::smallint, w.max_attempts::smallint, w.lease_base + 1,
                       date_part('epoch', w.run_at), date_part('epoch', w.created_at),
                       date_part('epoch', now()), date_part('epoch', deadline),
                       nullif(w.tags::text[], '{}'), nullif(w.metadata, '{}'), w.errors,
                       NULL::jsonb, NULL::bytea, NULL::text, rslot
                -- The rows as the walk read them: no second read of the ring.
                FROM unnest(a_rows) WITH ORDINALITY w
                ORDER BY w.ordinality;
            settled[p] := true;
            want := want - k;
        ELSE
            RETURN QUERY
            WITH picked AS (
                SELECT a.id FROM awa.jobs a
                WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = p
                  AND a.concurrency_key IS NULL
                  -- A job with an ordering key waits for every earlier unfinished one.
                  AND (a.ordering_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM awa.jobs o
                      WHERE o.queue = p_queue AND o.ordering_key = a.ordering_key
                        AND o.id < a.id))
                ORDER BY a.run_at, a.id LIMIT want FOR UPDATE SKIP LOCKED
            )
            UPDATE awa.jobs j
            SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
                attempted_at = now(), heartbeat_at = now(), deadline_at = deadline
            -- By primary key (= ANY), never a join: a generic plan hash-joined the
            -- picked rows to a scan of the whole table.
            WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked))
            RETURNING j.id, j.kind::text, j.queue::text, j.args::jsonb, j.priority::smallint,
                j.attempt, j.max_attempts::smallint,
                j.run_lease, date_part('epoch', j.run_at), date_part('epoch', j.created_at),
                date_part('epoch', j.attempted_at), date_part('epoch', j.deadline_at),
                nullif(j.tags::text[], '{}'), nullif(j.metadata, '{}'), j.errors, j.progress,
                j.unique_key, j.ordering_key, NULL::smallint;
            GET DIAGNOSTICS got = ROW_COUNT;
            want := want - got;
        END IF;
    END LOOP;
    -- A lane whose walk saw only rows passed over (or none) moves to the walk's
    -- end; one with rows left untaken keeps its cursor.
    FOR ln IN 1..4 LOOP
        IF NOT settled[ln] AND NOT (false = ANY(w_skip[first[ln]:last_at[ln]])) THEN
            passed := passed + (last_at[ln] - first[ln] + 1);
            ticks[ln] := end_t[ln]; xs[ln] := end_x[ln]; ids[ln] := end_i[ln];
        END IF;
    END LOOP;
    IF cardinality(t_id) = 0 AND passed = 0 AND cardinality(w_id) = 0
       AND last.n IS NOT NULL AND last.cur_tick = array_fill(last.n + 1, ARRAY[4]) THEN
        RETURN;  -- every lane caught up and nothing taken: nothing to record
    END IF;
    INSERT INTO awa.claim_log (slot, queue, n, snap, cur_tick, cur_xid, cur_id)
    VALUES (rslot, p_queue, n_new, s_now, ticks, xs, ids);
    IF cardinality(t_id) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO awa.receipts (slot, id, run_lease, queue, ready_slot, deadline_at)
    SELECT rslot, u.i, u.l + 1, p_queue, u.s, deadline
    FROM unnest(t_id, t_lease, t_slot) AS u(i, l, s);
END $$;

-- Whether table `family` of slot s is spent: the conditions of 0020's
-- awa.ring_reclaim. Not for claim_log (awa.ring_carry_ticks moves what is
-- still needed).
CREATE FUNCTION awa.ring_spent(family text, s smallint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE family
        WHEN 'ready_cancels' THEN NOT EXISTS (SELECT 1 FROM awa.ready WHERE slot = s)
        -- Every attempt closed, and every ready row they came from gone (a
        -- ready row with no receipt reads as available: awa.jobs_all, counts).
        WHEN 'receipts' THEN NOT EXISTS (
            SELECT 1 FROM awa.receipts r WHERE r.slot = s AND NOT EXISTS (
                SELECT 1 FROM awa.closures c
                WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease))
            AND NOT EXISTS (
            SELECT 1 FROM awa.receipts r
            JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id
                            AND w.lease_base = r.run_lease - 1
            WHERE r.slot = s)
        WHEN 'closures' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        WHEN 'heartbeats' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        -- Every row passed by every lane of its queue (the tick before the
        -- oldest lane cursor shows it), none left to a later tick, and no
        -- attempt still open that started from one.
        WHEN 'ready' THEN
            NOT EXISTS (
                SELECT 1 FROM (SELECT DISTINCT w.queue FROM awa.ready w WHERE w.slot = s) q
                LEFT JOIN LATERAL (
                    SELECT c.snap FROM awa.claim_log c
                    WHERE c.queue = q.queue
                      AND c.n = (SELECT min(t) - 1 FROM (
                                     SELECT l.cur_tick FROM awa.claim_log l
                                     WHERE l.queue = q.queue ORDER BY l.n DESC LIMIT 1) z,
                                 unnest(z.cur_tick) t)
                ) spent ON true
                WHERE spent.snap IS NULL OR EXISTS (
                    SELECT 1 FROM awa.ready w
                    WHERE w.slot = s AND w.queue = q.queue
                      AND NOT pg_visible_in_snapshot(w.xid, spent.snap)))
            AND NOT EXISTS (
                SELECT 1 FROM awa.receipts r WHERE r.ready_slot = s AND NOT EXISTS (
                    SELECT 1 FROM awa.closures c
                    WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease))
    END
$$;

CREATE OR REPLACE FUNCTION awa.ring_reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
BEGIN
    IF family NOT IN ('ready', 'ready_cancels', 'receipts', 'closures', 'heartbeats',
                      'claim_log') THEN
        RAISE EXCEPTION 'no such ring table: %', family;
    END IF;
    IF s = awa.ring_slot() THEN
        RETURN false;  -- the slot being written
    END IF;
    FOR pass IN 1..2 LOOP
        IF pass = 2 THEN
            -- Spent, as far as could be seen without the lock: lock, then look
            -- again. Once locked, the table holds every row it will ever hold
            -- (a producer or claim that wrote into it has committed).
            EXECUTE format('LOCK TABLE awa.%I IN ACCESS EXCLUSIVE MODE', family || '_' || s);
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', family || '_' || s) INTO ok;
        IF NOT ok THEN
            RETURN false;
        END IF;
        IF family = 'receipts' THEN
            -- Attempts still open here move to the mutable lane (a `moved`
            -- closure, first come first served): a long job never pins the ring.
            PERFORM awa.ring_materialize(array_agg(r.slot), array_agg(r.id),
                                         array_agg(r.run_lease))
            FROM awa.receipts r
            WHERE r.slot = s AND NOT EXISTS (
                SELECT 1 FROM awa.closures c
                WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease)
            HAVING count(*) > 0;
        END IF;
        IF family <> 'claim_log' AND NOT awa.ring_spent(family, s) THEN
            RETURN false;  -- not spent (before the lock: none taken, nobody waited)
        END IF;
    END LOOP;
    -- claim_log: the ticks a queue's cursors still need (from the one before
    -- its oldest lane cursor on, the newest always) move to the current slot,
    -- so an idle queue does not pin the ring; the rest are spent. The table's
    -- lock keeps claims from reading it meanwhile.
    IF family = 'claim_log' THEN
        PERFORM awa.ring_carry_ticks(s);
    END IF;
    EXECUTE format('TRUNCATE awa.%I', family || '_' || s);
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION awa.ring_reclaim(text, smallint) FROM PUBLIC;
