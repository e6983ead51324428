-- 0024: the ring's turns become an append-only record (issue 42).
--
-- awa.ring was one row that every turn of the ring updated (slot, rotated_at):
-- one dead row version a turn, about 120 an hour, which a held xmin horizon
-- keeps; and every enqueue and claim reads that row (awa.ring_slot()), so
-- under a held horizon each read walked every version the hold kept, a cost
-- that grew with the length of the hold. It was the one table on the hot path
-- whose dead tuples grew with the phase of the held-xmin cell.
--
-- Now each turn is a new row of awa.ring_turns (turn n, the slot written from
-- then on). The current slot is the row with the highest n: a backward scan
-- of the primary key that stops at the first entry, which is always live, so
-- its cost does not depend on how many turns a held horizon keeps. Two turns
-- racing for the same n: the second inserts nothing (ON CONFLICT DO NOTHING)
-- and reports no turn. Turns older than a day are deleted, a batch every 1,440
-- turns (12 hours at a turn every 30 s), in rows no reader visits.
--
-- The settings (slots, enqueue) stay one row, now awa.ring_config, which only
-- an operator's switch updates. awa.ring becomes a view with the columns it
-- had, so statements of workers of the previous release (which read
-- awa.ring.slot, and update awa.ring.enqueue) keep working during a rolling
-- upgrade. Nothing else changes and no job row moves.

CREATE TABLE awa.ring_turns (
    n    bigint PRIMARY KEY,
    slot smallint NOT NULL CHECK (slot >= 0),
    at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO awa.ring_turns (n, slot, at) SELECT 0, slot, rotated_at FROM awa.ring;

ALTER TABLE awa.ring RENAME TO ring_config;
ALTER TABLE awa.ring_config DROP COLUMN slot, DROP COLUMN rotated_at;

-- The slot new rows go to: the latest turn.
CREATE OR REPLACE FUNCTION awa.ring_slot() RETURNS smallint
LANGUAGE sql STABLE AS $$ SELECT slot FROM awa.ring_turns ORDER BY n DESC LIMIT 1 $$;

-- awa.ring as it was (0020), for statements that read or switch it by that
-- name; `UPDATE awa.ring SET enqueue = ...` updates awa.ring_config through it.
CREATE VIEW awa.ring AS
    SELECT c.one,
           (SELECT t.slot FROM awa.ring_turns t ORDER BY t.n DESC LIMIT 1) AS slot,
           c.slots,
           (SELECT t.at FROM awa.ring_turns t ORDER BY t.n DESC LIMIT 1) AS rotated_at,
           c.enqueue
    FROM awa.ring_config c;

-- Every role that could read or switch awa.ring (`awa grants`, or default
-- privileges) gets the same rights on what replaces it: enqueue and claim read
-- awa.ring_turns from now on, and the previous release's statements read the
-- view, so none may be refused between this migration and a later `awa grants`.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.grantee, a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'awa.ring_config'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON awa.ring_turns, awa.ring TO %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END $$;

-- Move the ring on when the next slot is empty: a new turn. The new slot, or
-- NULL (the next slot holds rows, or another turn was taken meanwhile).
CREATE OR REPLACE FUNCTION awa.ring_advance() RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.ring_turns;
    nxt smallint;
    won boolean;
BEGIN
    SELECT * INTO cur FROM awa.ring_turns ORDER BY n DESC LIMIT 1;
    nxt := (cur.slot + 1) % (SELECT slots FROM awa.ring_config);
    IF EXISTS (SELECT 1 FROM awa.ring_occupied() o WHERE o.slot = nxt) THEN
        RETURN NULL;  -- the next slot still holds rows (0020's ring_occupied)
    END IF;
    INSERT INTO awa.ring_turns (n, slot) VALUES (cur.n + 1, nxt)
    ON CONFLICT (n) DO NOTHING
    RETURNING true INTO won;
    IF won IS NULL THEN
        RETURN NULL;
    END IF;
    IF (cur.n + 1) % 1440 = 0 THEN
        DELETE FROM awa.ring_turns WHERE n < cur.n + 1 AND at < now() - interval '1 day';
    END IF;
    RETURN nxt;
END $$;

-- Counts that stay linear whatever the planner believes of the ring.
--
-- The ring's partitions are emptied by TRUNCATE and filled again within a
-- turn, and autovacuum analyzes each one soon after its truncation, when it
-- is empty (reltuples 0). A plan made while a partition is empty and kept
-- while it fills (queue_stats: a prepared statement, planned once per
-- connection until an analyze or DDL invalidates it) probed that partition
-- with a sequential scan per outer row: with tens of thousands of rows in
-- each, one call ran for minutes, burnt a core, and held the partitions'
-- locks so the ring could not be reclaimed (the held-xmin cell at 2,000/s:
-- claim p99 96 ms; the 60-minute cell's 5-22 s queue_stats calls). The counts
-- of active jobs now come from one function that joins by hashing only (no
-- nested loop, no parallel workers on a small machine): linear in the ring's
-- rows whatever plan is cached. Counts, gauges and storage status read it.
--
-- (Switching autovacuum off on the partitions, so that a truncated one reads
-- as "unknown" rather than empty, was tried and rejected: without analyze
-- the planner has no statistics for `slot`, takes every `slot = s` to keep
-- 0.5% of a partition's rows instead of all of them, and chose nested loops
-- that held the reclaim's lock for 15 s in the 60-minute cell.)

-- Active jobs by queue and state, both lanes (the rows awa.jobs_active holds),
-- and the oldest run_at of each (queue, state).
CREATE FUNCTION awa.active_counts()
RETURNS TABLE (queue text, state awa.job_state, n bigint, oldest timestamptz)
LANGUAGE sql STABLE
SET enable_nestloop = off SET max_parallel_workers_per_gather = 0 AS $$
    SELECT queue, state, sum(n)::bigint, min(oldest) FROM (
        SELECT j.queue::text AS queue, j.state, count(*) AS n, min(j.run_at) AS oldest
        FROM awa.jobs j GROUP BY 1, 2
        UNION ALL
        SELECT w.queue, 'available', count(*), min(w.run_at)
        FROM awa.ready w
        WHERE NOT EXISTS (SELECT 1 FROM awa.receipts r
                          WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
          AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                          WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base)
        GROUP BY 1
        UNION ALL
        SELECT r.queue, 'running', count(*), NULL
        FROM awa.receipts r
        WHERE NOT EXISTS (SELECT 1 FROM awa.closures c
                          WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
        GROUP BY 1
    ) c
    GROUP BY queue, state
$$;

-- Reclaim, as 0023, and once the table is locked it checks again that s is
-- not the slot being written. 0023 checked only before the lock: a turn into
-- s committed while the lock was waited for (two leaders overlapping, for a
-- moment, around a failover) would have had claim_log's needed ticks carried
-- into s itself and then truncated with it. A turn needs s empty, and it
-- waits for this lock to read s, so the check under the lock is final.
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
            IF s = awa.ring_slot() THEN
                RETURN false;  -- the ring turned into s while the lock was waited for
            END IF;
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
