-- 0030: the rest of the ring's upkeep reads what it must (issue 42).
--
-- Found at 12,000 jobs/s (bench/soak.py --auto-explain-ms 300, nested
-- statements), after 0029:
--
-- * awa.ring_rescue ran 0.65-0.87 s every 10 s. Its filter over the receipts
--   of the open slots put the heartbeat test first (the planner costs a
--   sub-plan over empty heartbeat partitions at next to nothing), so it ran
--   that sub-plan, an append of four partition scans, for each of the
--   360,000 receipts of the current slot, nearly all of them younger than the
--   staleness bound. Now the receipts old enough to be stale are picked out
--   first, by a plain filter of the slot's rows; only those are looked up.
-- * Deciding that a receipts slot is spent joined each of its receipts to the
--   ready row it came from, one index probe per receipt: 0.37-0.41 s a look,
--   two looks a reclaim. By the time a receipts slot is reclaimed the ready
--   slots its attempts came from are normally truncated already (they are
--   older, and reclaimed first); a receipt can only come from a ready slot
--   that holds rows. So the ready slots that hold any row are found first
--   (one probe each) and only receipts from them are looked up: with none,
--   nothing is read.
-- * awa.ring_reclaim counted a receipts slot's attempts (awa.ring_open) up to
--   five times in a call. Now once per look: open attempts are moved to the
--   mutable lane when the count says there are some, and after that every
--   attempt of the slot is closed (each has a closure, the `moved` one or its
--   own), so the spent test does not count again.
-- * The rescue counted every slot every 10 s, the current one too (always
--   open: its attempts in flight), 0.1 s a count under that load.

-- Whether every ready row the attempts of receipt slot s started from is gone
-- (a ready row with no receipt reads as available: awa.jobs_all, counts).
CREATE FUNCTION awa.ring_receipts_drained(s smallint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    held smallint[] := '{}';
    found boolean;
BEGIN
    FOR t IN 0..(SELECT slots - 1 FROM awa.ring_config) LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', 'ready_' || t) INTO found;
        IF found THEN
            held := held || t::smallint;
        END IF;
    END LOOP;
    IF cardinality(held) = 0 THEN
        RETURN true;
    END IF;
    -- One probe per receipt from a ready slot that holds rows (LATERAL ... LIMIT
    -- 1: as a join the planner may hash a whole ready slot).
    EXECUTE format(
        'SELECT NOT EXISTS (SELECT 1 FROM awa.%I r CROSS JOIN LATERAL (
                                SELECT 1 FROM awa.ready w
                                WHERE w.slot = r.ready_slot AND w.id = r.id
                                  AND w.lease_base = r.run_lease - 1 LIMIT 1) w
                            WHERE r.ready_slot = ANY ($1))', 'receipts_' || s)
        USING held INTO found;
    RETURN found;
END $$;

-- 0029's test, with the receipts' ready rows looked up as above.
CREATE OR REPLACE FUNCTION awa.ring_spent(family text, s smallint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE family
        WHEN 'ready' THEN awa.ring_ready_spent(s)
        WHEN 'ready_cancels' THEN NOT EXISTS (SELECT 1 FROM awa.ready WHERE slot = s)
        WHEN 'receipts' THEN NOT awa.ring_open(s) AND awa.ring_receipts_drained(s)
        WHEN 'closures' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        WHEN 'heartbeats' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
    END
$$;

-- 0029's reclaim, counting a receipts slot once per look.
CREATE OR REPLACE FUNCTION awa.ring_reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
    tbl text := family || '_' || s;
    n smallint := (SELECT c.slots FROM awa.ring_config c);
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
    IF family IN ('ready', 'receipts') AND s = (awa.ring_slot() + n - 1) % n
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
        IF family = 'receipts' THEN
            IF awa.ring_open(s) THEN
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

-- 0029's rescue: the receipts old enough to be stale (or past their deadline)
-- are picked out of the open slots first; only they are looked up in the
-- closures and heartbeats. The current slot, while it is younger than the
-- staleness bound, is looked in without counting it (its counts read it
-- twice, 0.1 s a count at 12,000 jobs/s): few of its receipts can be that old.
CREATE OR REPLACE FUNCTION awa.ring_rescue(p_stale interval, p_max int) RETURNS integer
LANGUAGE sql AS $$
    WITH open AS MATERIALIZED (
        SELECT array_agg(g::smallint) AS slots
        FROM generate_series(0, (SELECT slots - 1 FROM awa.ring_config)) g,
             (SELECT t.slot, t.at FROM awa.ring_turns t ORDER BY t.n DESC LIMIT 1) cur
        WHERE (g = cur.slot AND cur.at > now() - p_stale) OR awa.ring_open(g::smallint)
    ), old AS MATERIALIZED (
        SELECT r.slot, r.id, r.run_lease, r.deadline_at < now() AS overdue
        FROM awa.receipts r
        WHERE r.slot = ANY ((SELECT slots FROM open)::smallint[])
          AND (r.claimed_at < now() - p_stale OR r.deadline_at < now())
    ), stale AS (
        SELECT o.slot, o.id, o.run_lease FROM old o
        WHERE NOT EXISTS (SELECT 1 FROM awa.closures c
                          WHERE c.slot = o.slot AND c.id = o.id AND c.run_lease = o.run_lease)
          AND (o.overdue OR NOT EXISTS (
              SELECT 1 FROM awa.heartbeats h
              WHERE h.slot = o.slot AND h.id = o.id AND h.run_lease = o.run_lease
                AND h.at >= now() - p_stale))
        LIMIT p_max
    )
    SELECT count(*)::integer FROM awa.ring_materialize(
        ARRAY(SELECT slot FROM stale), ARRAY(SELECT id FROM stale),
        ARRAY(SELECT run_lease FROM stale))
$$;
