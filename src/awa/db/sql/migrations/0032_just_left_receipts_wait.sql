-- 0032: the receipts of the slot the ring has just left wait, without a count,
-- while its ready table holds rows (issue 42).
--
-- The ring keeper asks for the slot just left a few times after each turn
-- (0030). While that slot's ready table holds rows, they are not all passed,
-- or an open attempt still reads one, or they are spent and about to be
-- truncated; most of the slot's receipts were claimed from them, so asking
-- for the receipts then counts the full table (0.1 s under load) for a "not
-- yet". 0031 had the keeper skip that ask, a rule in Python on top of this
-- function; here the function answers it itself from one row of the ready
-- table, so every caller gets it. The receipts go once the ready rows are
-- gone; from 10 seconds after the turn the slot is treated as an older one.
--
-- And the slot just left is left alone only for the first 10 seconds after
-- the turn (the ring keeper looks again 1, 2 and 4 s after it; its next pass
-- comes 30 s later). Until now it was left alone for as long as it stayed the
-- slot just left, and that could be for ever: an attempt claimed in it from a
-- ready row two turns older (a backlog) and still running at the turn keeps
-- that ready slot, the next the ring must turn into, from being spent; the
-- ring cannot turn, the slot stays the one just left, and its attempt was
-- never moved to the mutable lane. Found in review. From 10 s after the turn
-- its open attempts move as an older slot's do, and the ring turns.

-- 0031's reclaim; the slot just left is left alone for 10 s after the turn,
-- and its receipts wait, without a count, while its ready table holds rows.
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
    -- open (the jobs in flight at the turn): left alone (0029), for the first
    -- seconds after the turn only (0032, below).
    IF family IN ('ready', 'receipts') AND s = (awa.ring_slot() + n - 1) % n
       AND (SELECT t.at FROM awa.ring_turns t ORDER BY t.n DESC LIMIT 1)
           > now() - interval '10 seconds' THEN
        IF family = 'receipts' THEN
            -- Its ready rows are still there: not yet, and one row says so
            -- where a count of its receipts would read them all (0032).
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', 'ready_' || s) INTO ok;
            IF ok THEN
                RETURN false;
            END IF;
        END IF;
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
