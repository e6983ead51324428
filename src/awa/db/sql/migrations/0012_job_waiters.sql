-- 0012: awaitable results (client.wait_for, job.wait).
--
-- A process waiting for a job to finish registers the job in awa.job_waiters
-- and LISTENs on awa_result. A statement that finishes jobs (every finish
-- deletes the row from awa.jobs) fires one statement-level trigger, which
-- looks at the waiters table and, only when somebody waits, matches the rows
-- the statement deleted against it and sends one NOTIFY per finished waited-on
-- job. Jobs nobody waits on therefore send no NOTIFY (PostgreSQL serializes
-- the commits of notifying transactions) and cost one look at an empty table
-- per finishing statement, not per job (bench/results/results_backpressure.md).
-- Matching every waiter against awa.jobs instead (no transition table) would
-- cost a probe per waiter per finishing statement: 9 ms at 1,000 waiters.
--
-- The registration locks the job row FOR KEY SHARE, which conflicts with the
-- DELETE that finishes it: either the registration waits for the finishing
-- transaction (and then finds the row gone: the waiter reads the result at
-- once), or the finishing DELETE waits for the registration to commit, and
-- its trigger then sees the new waiter. No finish can slip between the two.

CREATE TABLE awa.job_waiters (
    job_id     bigint PRIMARY KEY,
    -- The latest deadline of the processes waiting on the job ('infinity' for
    -- no timeout). A waiter that times out deletes the row only when no other
    -- waiter's deadline is still ahead; the job's finish deletes it anyway.
    expires_at timestamptz NOT NULL
);

CREATE FUNCTION awa.notify_waiters() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    done bigint;
BEGIN
    -- The common case: nobody waits, and this is all a finishing statement pays.
    IF NOT EXISTS (SELECT 1 FROM awa.job_waiters) THEN
        RETURN NULL;
    END IF;
    -- The waited-on jobs among those this statement finished: one waiters
    -- index probe per finished job, however many waiters there are.
    FOR done IN
        DELETE FROM awa.job_waiters w USING finished f
        WHERE w.job_id = f.id
        RETURNING w.job_id
    LOOP
        PERFORM pg_notify('awa_result', done::text);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_notify_waiters AFTER DELETE ON awa.jobs
    REFERENCING OLD TABLE AS finished
    FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_waiters();

-- As 0010: nothing that writes is PUBLIC (`awa grants ROLE` gives it back).
REVOKE EXECUTE ON FUNCTION awa.notify_waiters() FROM PUBLIC;
