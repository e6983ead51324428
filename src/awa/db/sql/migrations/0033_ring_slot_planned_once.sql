-- 0033: awa.ring_slot() is planned once per session, not once per statement
-- (issue 42).
--
-- Every single insert into the append-only lane (awa.ready's slot DEFAULT),
-- every claim (awa.claim) and the ring's upkeep ask for the current slot. A
-- SQL function whose body reads a table cannot be inlined, so PostgreSQL ran
-- it as its own query, parsed and planned anew for each statement that
-- called it: about 50 µs of server CPU, a quarter of a single insert's
-- (198 → 149 µs per insert) and most of the claim's planning (perf: fmgr_sql,
-- pg_plan_query). In PL/pgSQL the query's plan is kept for the session.
-- Same answer, same volatility (STABLE), same callers; a multi-row insert
-- still reads it once per row, at the same cost as before (13.4 µs a row).

CREATE OR REPLACE FUNCTION awa.ring_slot() RETURNS smallint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT t.slot FROM awa.ring_turns t ORDER BY t.n DESC LIMIT 1);
END $$;
