-- 0031: reclaiming the slot the ring has just left counts its attempts twice,
-- not six times, and reads its receipts for nothing else (issue 42).
--
-- Since the ring keeper looks again at the slot just left a few seconds after
-- each turn (0030), nearly every reclaim of a ready or receipts table is of
-- that slot, whose receipts table is full (360,000 rows at 12,000 jobs/s, a
-- count of its receipts and closures 0.1 s under that load). Reclaiming its
-- ready table counted it three times (the "just left and open" check, then
-- awa.ring_ready_spent in each look, which also counted the current slot,
-- always open under load); reclaiming its receipts table three times more.
--
-- * The look before the lock only decides whether the lock is worth asking
--   for: it reuses the check's count, taken a moment before in the same call
--   (awa.ring_ready_spent's `closed`; the receipts' look skips the move). The
--   look under the lock counts again, in the same snapshot as the cursors it
--   reads: that is the look that decides, as before. So two counts a table.
-- * The current slot is taken as open without counting it: its attempts in
--   flight make it open whenever there is load, and the test that follows
--   (a receipt from slot s with no closure) is exact by itself; the count only
--   spared that test in slots with nothing open.

-- * Deciding that a receipts slot's ready rows are gone (0030) read the whole
--   slot, in each look, whenever some ready slot held rows, and under load the
--   current one always does. A receipt of slot s can only come from a ready
--   slot at or before s in ring order: the claim read the ring's slot (s)
--   after the snapshot its rows are visible in, so their producers read the
--   ring's slot before the claim did, and the ring only moves on. So only the
--   ready slots from the oldest to s are looked in; by the time the receipts
--   of s are reclaimed those are normally truncated, and nothing is read.
--   (With a stale view of the current slot, the slots looked in are more,
--   never fewer.)

-- Whether every ready row the attempts of receipt slot s started from is gone
-- (0030's test), looking only in ready slots from the oldest to s.
CREATE OR REPLACE FUNCTION awa.ring_receipts_drained(s smallint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n     smallint := (SELECT c.slots FROM awa.ring_config c);
    cur   smallint := awa.ring_slot();
    held  smallint[] := '{}';
    found boolean;
BEGIN
    -- Ring order: cur + 1 (the oldest) .. cur (the newest); t at or before s.
    FOR t IN 0..n - 1 LOOP
        CONTINUE WHEN (t - cur - 1 + 2 * n) % n > (s - cur - 1 + 2 * n) % n;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', 'ready_' || t) INTO found;
        IF found THEN
            held := held || t::smallint;
        END IF;
    END LOOP;
    IF cardinality(held) = 0 THEN
        RETURN true;
    END IF;
    EXECUTE format(
        'SELECT NOT EXISTS (SELECT 1 FROM awa.%I r CROSS JOIN LATERAL (
                                SELECT 1 FROM awa.ready w
                                WHERE w.slot = r.ready_slot AND w.id = r.id
                                  AND w.lease_base = r.run_lease - 1 LIMIT 1) w
                            WHERE r.ready_slot = ANY ($1))', 'receipts_' || s)
        USING held INTO found;
    RETURN found;
END $$;

-- Whether ready slot s is spent (0029's test). `closed`: receipt slots the
-- caller has counted closed a moment ago; the look that decides passes none.
CREATE FUNCTION awa.ring_ready_spent(s smallint, closed smallint[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl   text := 'ready_' || s;
    cur   smallint := awa.ring_slot();
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
        IF r = ANY (closed) THEN
            CONTINUE;
        END IF;
        IF r = cur OR awa.ring_open(r::smallint) THEN
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

-- 0029's one-argument form, for awa.ring_spent and readers: nothing taken as closed.
CREATE OR REPLACE FUNCTION awa.ring_ready_spent(s smallint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT awa.ring_ready_spent(s, '{}'::smallint[])
$$;

-- 0030's reclaim; the look before the lock reuses the "just left" check's count.
CREATE OR REPLACE FUNCTION awa.ring_reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
    tbl text := family || '_' || s;
    n smallint := (SELECT c.slots FROM awa.ring_config c);
    -- Receipt slots counted closed in this call, for the look before the lock.
    closed smallint[] := '{}';
BEGIN
    IF family NOT IN ('ready', 'ready_cancels', 'receipts', 'closures', 'heartbeats',
                      'claim_log') THEN
        RAISE EXCEPTION 'no such ring table: %', family;
    END IF;
    IF s = awa.ring_slot() THEN
        RETURN false;  -- the slot being written
    END IF;
    -- The slot the ring has just left, while attempts claimed in it are still
    -- open (the jobs in flight at the turn): left alone (0029).
    IF family IN ('ready', 'receipts') AND s = (awa.ring_slot() + n - 1) % n THEN
        IF awa.ring_open(s) THEN
            RETURN false;
        END IF;
        closed := ARRAY[s];
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
            closed := '{}';  -- this look decides: it counts again
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', tbl) INTO ok;
        IF NOT ok THEN
            RETURN false;
        END IF;
        IF family = 'receipts' THEN
            IF NOT s = ANY (closed) AND awa.ring_open(s) THEN
                -- Attempts still open here move to the mutable lane (a `moved`
                -- closure, first come first served): a long job never pins the
                -- ring. Each attempt seen then has a closure.
                PERFORM awa.ring_materialize(array_agg(r.slot), array_agg(r.id),
                                             array_agg(r.run_lease))
                FROM awa.receipts r
                WHERE r.slot = s AND NOT EXISTS (
                    SELECT 1 FROM awa.closures c
                    WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease)
                HAVING count(*) > 0;
            END IF;
            -- Closed, but a ready row an attempt came from may still be there.
            -- (Before the lock a receipt may be written after the count; the
            -- look under the lock counts again and sees every one.)
            IF NOT awa.ring_receipts_drained(s) THEN
                RETURN false;
            END IF;
        ELSIF family = 'ready' THEN
            IF NOT awa.ring_ready_spent(s, closed) THEN
                RETURN false;
            END IF;
        ELSIF family <> 'claim_log' AND NOT awa.ring_spent(family, s) THEN
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
