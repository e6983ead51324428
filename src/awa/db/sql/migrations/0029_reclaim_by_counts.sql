-- 0029: the ring's upkeep reads what it must, not every row of a slot (issue 42).
--
-- Measured on the soak at 12,000 jobs/s (bench/results/soak.md): reclaiming a
-- slot read all of it, twice (the look without the lock and the one under
-- it), 1.6-3.9 s of CPU at a time on 2 cores, and the rescue read every
-- receipt of the ring against the closures every 10 s (0.3-0.6 s). With a
-- slot of 360,000 jobs, on an idle machine: "ready" 0.93 s a look (its rows
-- against the cursors 0.19 s, every receipt claimed from it against the
-- closures 0.74 s), "receipts" 0.46 s a look plus 0.46 s for the open ones.
--
-- Three facts make most of that reading unnecessary:
--
-- * A closure is written only where its receipt is (ring_close, ring_materialize),
--   and each attempt has at most one of each (unique indexes). A closure's
--   writer read its receipt, so a snapshot that sees the closure sees the
--   receipt. So a receipt slot's attempts are all closed exactly when it holds
--   as many closures as receipts: two counts (about 20 ms each at 275,000 rows)
--   in place of one index probe per receipt.
-- * A ready row with transaction id x is visible in snapshot S unless
--   x >= xmax(S) or x is in xip(S) (pg_visible_in_snapshot's own rule). So
--   "some row of the slot is not yet passed" is, per lane, one index range
--   probe (xid >= xmax) and one probe per transaction running at that tick;
--   the lanes of the slot come from a skip scan of its lane index. The
--   answer is the same as reading every row (xid is not monotone in commit
--   order, but this is not an order test: it is the snapshot's own rule).
-- * Only a receipt slot with attempts open can hold an open attempt: the
--   "no open attempt reads this ready row" test and the rescue look only in
--   those slots (normally the current one), and there they read only the
--   receipts that match.
--
-- The slot the ring has just left is not reclaimed while attempts claimed in
-- it are open: those are the jobs in flight at the turn, which finish within
-- moments. Its receipts are not moved to the mutable lane meanwhile, and its
-- ready rows are not checked (finding those open attempts read the whole
-- slot: they are its newest). A slot two turns old still has its open
-- attempts moved, so a long job still never pins the ring.

-- Whether receipt slot r has an attempt that has not been closed.
CREATE FUNCTION awa.ring_open(r smallint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    open boolean;
BEGIN
    EXECUTE format('SELECT (SELECT count(*) FROM awa.%I) > (SELECT count(*) FROM awa.%I)',
                   'receipts_' || r, 'closures_' || r) INTO open;
    RETURN open;
END $$;

-- Whether ready slot s is spent: every row passed by every lane of its queue
-- (visible in the tick before the queue's oldest lane cursor), and no attempt
-- still open that started from one. 0023's conditions, read by index.
CREATE FUNCTION awa.ring_ready_spent(s smallint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl   text := 'ready_' || s;
    lane  record;
    snap  pg_snapshot;
    running xid8[];
    seen  text;
    found boolean;
BEGIN
    FOR lane IN EXECUTE format(
        'WITH RECURSIVE l AS (
             (SELECT queue, priority FROM awa.%1$I ORDER BY queue, priority LIMIT 1)
             UNION ALL
             SELECT n.queue, n.priority FROM l CROSS JOIN LATERAL (
                 SELECT w.queue, w.priority FROM awa.%1$I w
                 WHERE (w.queue, w.priority) > (l.queue, l.priority)
                 ORDER BY w.queue, w.priority LIMIT 1) n)
         SELECT queue::text AS queue, priority FROM l', tbl)
    LOOP
        IF seen IS DISTINCT FROM lane.queue THEN
            seen := lane.queue;
            SELECT c.snap INTO snap FROM awa.claim_log c
            WHERE c.queue = lane.queue
              AND c.n = (SELECT min(t) - 1 FROM (
                             SELECT l.cur_tick FROM awa.claim_log l
                             WHERE l.queue = lane.queue ORDER BY l.n DESC LIMIT 1) z,
                         unnest(z.cur_tick) t);
            IF snap IS NULL THEN
                RETURN false;  -- no tick yet that passes anything of this queue
            END IF;
            running := ARRAY(SELECT pg_snapshot_xip(snap));
        END IF;
        -- One index probe per transaction running at the tick (as a join:
        -- `xid = ANY (...)` was planned as a filter over the whole lane).
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM awa.%1$I w
                            WHERE w.queue = $1 AND w.priority = $2 AND w.xid >= $3)
                 OR EXISTS (SELECT 1 FROM unnest($4::xid8[]) x CROSS JOIN LATERAL (
                                SELECT 1 FROM awa.%1$I w
                                WHERE w.queue = $1 AND w.priority = $2 AND w.xid = x.x
                                LIMIT 1) y)', tbl)
            USING lane.queue, lane.priority, pg_snapshot_xmax(snap), running INTO found;
        IF found THEN
            RETURN false;  -- a row not passed yet
        END IF;
    END LOOP;
    FOR r IN 0..(SELECT slots - 1 FROM awa.ring_config) LOOP
        IF awa.ring_open(r::smallint) THEN
            EXECUTE format(
                'SELECT EXISTS (SELECT 1 FROM awa.%I x WHERE x.ready_slot = $1
                                AND NOT EXISTS (SELECT 1 FROM awa.%I c
                                                WHERE c.slot = $2 AND c.id = x.id
                                                  AND c.run_lease = x.run_lease))',
                'receipts_' || r, 'closures_' || r)
                USING s, r::smallint INTO found;
            IF found THEN
                RETURN false;  -- an attempt still reads one of its rows
            END IF;
        END IF;
    END LOOP;
    RETURN true;
END $$;

-- Whether table `family` of slot s is spent (0023's conditions). Not for
-- claim_log (awa.ring_carry_ticks moves what is still needed).
CREATE OR REPLACE FUNCTION awa.ring_spent(family text, s smallint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE family
        WHEN 'ready' THEN awa.ring_ready_spent(s)
        WHEN 'ready_cancels' THEN NOT EXISTS (SELECT 1 FROM awa.ready WHERE slot = s)
        -- Every attempt closed, and every ready row they came from gone (a
        -- ready row with no receipt reads as available: awa.jobs_all, counts).
        WHEN 'receipts' THEN NOT awa.ring_open(s) AND NOT EXISTS (
            SELECT 1 FROM awa.receipts r
            JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id
                            AND w.lease_base = r.run_lease - 1
            WHERE r.slot = s)
        WHEN 'closures' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        WHEN 'heartbeats' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
    END
$$;

-- 0026's reclaim; the open attempts of a receipts slot are looked for only
-- when its counts say there are some, and the slot the ring has just left is
-- left alone while attempts in it are open (those in flight at the turn).
CREATE OR REPLACE FUNCTION awa.ring_reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
    tbl text := family || '_' || s;
BEGIN
    IF family NOT IN ('ready', 'ready_cancels', 'receipts', 'closures', 'heartbeats',
                      'claim_log') THEN
        RAISE EXCEPTION 'no such ring table: %', family;
    END IF;
    IF s = awa.ring_slot() THEN
        RETURN false;  -- the slot being written
    END IF;
    -- The slot the ring has just left, while attempts claimed in it are still
    -- open (the jobs in flight at the turn): its receipts are not moved and its
    -- ready rows are still read, and looking for the open attempts reads the
    -- whole slot (they are its newest), 0.6 s for 360,000 receipts.
    IF family IN ('ready', 'receipts')
       AND s = (awa.ring_slot() + (SELECT slots - 1 FROM awa.ring_config))
               % (SELECT slots FROM awa.ring_config)
       AND awa.ring_open(s) THEN
        RETURN false;
    END IF;
    FOR pass IN 1..2 LOOP
        IF pass = 2 THEN
            -- Spent, as far as could be seen without the lock: lock out its
            -- writers, then look again. Once locked, the table holds every row
            -- it will hold (a producer or claim that wrote into it has committed).
            EXECUTE format('LOCK TABLE awa.%I IN %s MODE', tbl,
                           CASE WHEN family = 'claim_log' THEN 'ACCESS EXCLUSIVE'
                                ELSE 'SHARE ROW EXCLUSIVE' END);
            IF s = awa.ring_slot() THEN
                RETURN false;  -- the ring turned into s while the lock was waited for
            END IF;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', tbl) INTO ok;
        IF NOT ok THEN
            RETURN false;
        END IF;
        IF family = 'receipts' AND awa.ring_open(s) THEN
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
    IF family = 'claim_log' THEN
        PERFORM awa.ring_carry_ticks(s);
    ELSE
        -- Nothing was written into the table since the look (its writers are
        -- locked out); only the truncation needs readers gone, for a moment.
        EXECUTE format('LOCK TABLE awa.%I IN ACCESS EXCLUSIVE MODE', tbl);
        IF s = awa.ring_slot() THEN
            RETURN false;  -- a turn into s committed before this lock: leave it
        END IF;
    END IF;
    EXECUTE format('TRUNCATE awa.%I', tbl);
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION awa.ring_reclaim(text, smallint) FROM PUBLIC;

-- 0020's rescue, looking only in the receipt slots with attempts open.
CREATE OR REPLACE FUNCTION awa.ring_rescue(p_stale interval, p_max int) RETURNS integer
LANGUAGE sql AS $$
    WITH open AS MATERIALIZED (
        SELECT array_agg(g::smallint) AS slots
        FROM generate_series(0, (SELECT slots - 1 FROM awa.ring_config)) g
        WHERE awa.ring_open(g::smallint)
    ), stale AS (
        SELECT r.slot, r.id, r.run_lease FROM awa.receipts r
        WHERE r.slot = ANY ((SELECT slots FROM open)::smallint[])
          AND (r.claimed_at < now() - p_stale OR r.deadline_at < now())
          AND NOT EXISTS (SELECT 1 FROM awa.closures c
                          WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
          AND (r.deadline_at < now() OR NOT EXISTS (
              SELECT 1 FROM awa.heartbeats h
              WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease
                AND h.at >= now() - p_stale))
        LIMIT p_max
    )
    SELECT count(*)::integer FROM awa.ring_materialize(
        ARRAY(SELECT slot FROM stale), ARRAY(SELECT id FROM stale),
        ARRAY(SELECT run_lease FROM stale))
$$;

-- 0020's window, with the probe for each transaction that was running at `lo`
-- written as a range of the lane index ((xid, id) after (v, start), xid up to
-- v) instead of `xid = v ... ORDER BY id`. With the equality the planner
-- takes the order to be id alone, which ready_id_idx gives as well; the
-- claim's generic plan, made when the ring had just turned into a nearly
-- empty partition (a truncation elsewhere invalidates it), chose that index
-- there, and as the partition filled every probe read all of its ids: at
-- 12,000 jobs/s claims slowed from 10 to 250 ms within a turn of the ring and
-- the lane fell behind (bench/soak.py, auto_explain of nested statements).
-- Ordered by (xid, id), only the lane index gives the order, as in the
-- second part, whose plan never changed.
CREATE OR REPLACE FUNCTION awa.ring_window(p_queue text, p_priority smallint, lo pg_snapshot,
                                           hi pg_snapshot, x xid8, i bigint, lim int)
RETURNS SETOF awa.ready
LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        (SELECT w.* FROM unnest(ARRAY(SELECT v FROM pg_snapshot_xip(lo) v
                                      WHERE v >= x AND pg_visible_in_snapshot(v, hi))) e(v)
         -- One index range per transaction (its rows after the cursor).
         CROSS JOIN LATERAL (
             SELECT * FROM awa.ready w
             WHERE w.queue = p_queue AND w.priority = p_priority
               AND (w.xid, w.id) > (e.v, CASE WHEN e.v = x THEN i ELSE 0 END)
               AND w.xid <= e.v
             ORDER BY w.xid, w.id LIMIT lim) w
         ORDER BY e.v, w.id LIMIT lim)
        UNION ALL
        (SELECT * FROM awa.ready w
         WHERE w.queue = p_queue AND w.priority = p_priority
           -- The start key: just after (x, i), or the first row of a transaction
           -- that started after lo, whichever is later.
           AND (w.xid, w.id) > (greatest(pg_snapshot_xmax(lo), x),
                                CASE WHEN x >= pg_snapshot_xmax(lo) THEN i ELSE 0 END)
           AND w.xid < pg_snapshot_xmax(hi)
           AND pg_visible_in_snapshot(w.xid, hi)
         ORDER BY w.xid, w.id LIMIT lim)
    ) t
    LIMIT lim  -- the first part's ids are all below xmax(lo), the second's from it on
$$;
