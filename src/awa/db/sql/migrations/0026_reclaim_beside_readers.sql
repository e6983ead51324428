-- 0026: reclaiming a ring slot no longer holds claims up while it checks (issue 42).
--
-- 0024's ring_reclaim looked at a table without a lock and, when it looked
-- spent, took ACCESS EXCLUSIVE and looked again. That second look reads the
-- whole table (every ready row against its queue's cursors, every receipt
-- against the closures), and under ACCESS EXCLUSIVE it keeps out every
-- statement whose plan names the ring's partitions, which is every claim and
-- completion (a cached plan locks all of a partitioned table's partitions).
-- After the harness's active-readers phase (readers counting awa.ready for
-- 600 s at 800/s), the current slot had grown to 161 MB while the readers
-- kept it from being truncated; its reclaim then held claims for about a second.
--
-- Now the look under the lock is taken under SHARE ROW EXCLUSIVE: it waits for
-- and keeps out only writers into that one table (a producer or claim that
-- took the slot before the ring turned, or a closure for one of its attempts;
-- once the table looks spent there are normally none), while claims, which
-- only read an old slot's tables, and readers go on. Only the TRUNCATE itself
-- takes ACCESS EXCLUSIVE, after the look: no row can have arrived in between,
-- because SHARE ROW EXCLUSIVE is held throughout. claim_log still takes
-- ACCESS EXCLUSIVE before it looks: it carries the ticks that cursors still
-- need into the current slot, and no claim may read the table meanwhile (the
-- table is a few rows a queue, so the look is short).
--
-- Two reclaims of one table (leaders overlapping around a failover) exclude
-- each other: SHARE ROW EXCLUSIVE conflicts with itself. A writer that holds
-- a read lock on the table and then waits to write into it, while this waits
-- to truncate it, is resolved by the reclaim's lock timeout (50 ms), long
-- before deadlock detection.
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
