-- 0018: only jobs somebody waits on pay for the waiters trigger
-- (bench/results/hot_path.md, 2026-12-04).
--
-- 0012's trigger was statement-level with a transition table on awa.jobs
-- DELETE: every statement that finished jobs copied each deleted row into a
-- tuplestore and called plpgsql once to look at awa.job_waiters, whether or
-- not anyone waited (1,340 server instructions per job of a 32-job completion
-- batch, 1.7% of its cost). A row trigger on the DELETE, filtered by a mark
-- on the row, costs as much: PostgreSQL fetches the deleted row again for it
-- and reads every column before the mark.
--
-- Instead a registration marks the job (metadata._awa_waited, beside
-- _awa_dependents), which every finish carries into the finished row, and
-- the row triggers that already watch awa.jobs_done and awa.dlq for
-- _awa_dependents (0013) watch for either key in the same WHEN clause,
-- evaluated in C: a job nobody waits on pays nothing more. A waited-on job
-- discarded by its parent's failure (deleted without a finished row) is
-- handled by awa.release_dependents itself.
--
-- The registration's UPDATE takes the row lock the finishing DELETE needs,
-- as 0012's FOR KEY SHARE did: either it waits for the finishing transaction
-- (then finds no row, and the waiter reads the result at once), or the
-- DELETE waits for the registration to commit, deletes the marked version
-- and carries the mark. No finish slips between the two. A mark outlives a
-- waiter that gave up: the finish then finds no registration.

DROP TRIGGER jobs_notify_waiters ON awa.jobs;
DROP FUNCTION awa.notify_waiters();

-- Registrations made before this migration (it holds the jobs table's lock).
UPDATE awa.jobs j SET metadata = j.metadata || '{"_awa_waited": true}'
FROM awa.job_waiters w WHERE w.job_id = j.id;

-- Wake the waiters of a finished job: one index probe of awa.job_waiters.
CREATE FUNCTION awa.wake_waiters(p_job bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM awa.job_waiters WHERE job_id = p_job;
    IF FOUND THEN
        PERFORM pg_notify('awa_result', p_job::text);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION awa.dependents_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.metadata ? '_awa_waited' THEN
        PERFORM awa.wake_waiters(NEW.id);
    END IF;
    -- Jobs finished by release_dependents itself are already on its worklist.
    IF NEW.metadata ? '_awa_dependents'
       AND coalesce(current_setting('awa.releasing', true), '') <> 'on' THEN
        PERFORM awa.release_dependents(NEW.id, NEW.state, NEW.prune_after);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER jobs_done_dependents ON awa.jobs_done;
DROP TRIGGER dlq_dependents ON awa.dlq;
CREATE TRIGGER jobs_done_dependents AFTER INSERT ON awa.jobs_done
    FOR EACH ROW WHEN (NEW.metadata ?| '{_awa_dependents,_awa_waited}'::text[])
    EXECUTE FUNCTION awa.dependents_on_finish();
CREATE TRIGGER dlq_dependents AFTER INSERT ON awa.dlq
    FOR EACH ROW WHEN (NEW.metadata ?| '{_awa_dependents,_awa_waited}'::text[])
    EXECUTE FUNCTION awa.dependents_on_finish();

-- 0013's, with waiters woken for a discarded child (it leaves no finished row).
CREATE OR REPLACE FUNCTION awa.release_dependents(p_parent bigint, p_state awa.job_state,
                                                  p_prune_after timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    parents bigint[] := ARRAY[p_parent];
    outcomes awa.job_state[] := ARRAY[p_state];
    i integer := 1;
    parent bigint;
    outcome awa.job_state;
    c awa.jobs;
    pol text;
    touched integer := 0;
    queues text[] := '{}';
    q text;
BEGIN
    PERFORM set_config('awa.releasing', 'on', true);
    WHILE i <= cardinality(parents) LOOP
        parent := parents[i];
        outcome := outcomes[i];
        i := i + 1;
        FOR c IN
            SELECT j.* FROM awa.jobs j
            WHERE j.id IN (SELECT d.child_id FROM awa.job_dependencies d
                           WHERE d.parent_id = parent AND d.resolved_at IS NULL)
            ORDER BY j.id FOR UPDATE OF j
        LOOP
            UPDATE awa.job_dependencies d SET resolved_at = now(), parent_state = outcome
            WHERE d.parent_id = parent AND d.child_id = c.id AND d.resolved_at IS NULL
            RETURNING d.policy INTO pol;
            -- Not found: another transaction resolved it meanwhile. Not parked: the
            -- child was already released (or an operator moved it); leave it be.
            CONTINUE WHEN pol IS NULL OR c.state <> 'scheduled'
                          OR c.run_at < '9999-12-30 00:00:00+00';
            IF outcome = 'completed' OR pol = 'run_anyway' THEN
                IF NOT EXISTS (SELECT 1 FROM awa.job_dependencies d
                               WHERE d.child_id = c.id AND d.resolved_at IS NULL) THEN
                    UPDATE awa.jobs SET state = 'available', run_at = now() WHERE id = c.id;
                    queues := queues || c.queue;
                    touched := touched + 1;
                END IF;
            ELSIF pol = 'cancel' THEN
                DELETE FROM awa.jobs j WHERE j.id = c.id;
                INSERT INTO awa.jobs_done
                SELECT f.* FROM awa.finished(c, 'cancelled', p_prune_after - now(),
                    awa.error_entry(format('parent job %s %s', parent, outcome), c.attempt,
                                    false)) f;
                touched := touched + 1;
                IF c.metadata ? '_awa_dependents' THEN
                    parents := parents || c.id;
                    outcomes := outcomes || 'cancelled'::awa.job_state;
                END IF;
            ELSE  -- discard: the child goes as if never enqueued; its edges stay for the graph
                DELETE FROM awa.jobs j WHERE j.id = c.id;
                IF c.unique_key IS NOT NULL THEN
                    DELETE FROM awa.unique_claims u
                    WHERE u.unique_key = c.unique_key AND u.job_id = c.id;
                END IF;
                IF c.metadata ? '_awa_waited' THEN
                    PERFORM awa.wake_waiters(c.id);
                END IF;
                touched := touched + 1;
                IF c.metadata ? '_awa_dependents' THEN
                    parents := parents || c.id;
                    outcomes := outcomes || 'cancelled'::awa.job_state;
                END IF;
            END IF;
        END LOOP;
        -- Edges of children no longer active (cancelled meanwhile): resolved too.
        UPDATE awa.job_dependencies d SET resolved_at = now(), parent_state = outcome
        WHERE d.parent_id = parent AND d.resolved_at IS NULL;
    END LOOP;
    PERFORM set_config('awa.releasing', 'off', true);
    FOR q IN SELECT DISTINCT unnest(queues) LOOP
        PERFORM pg_notify('awa_jobs', q);
    END LOOP;
    RETURN touched;
END $$;

-- As 0010: nothing that writes is PUBLIC (`awa grants ROLE` gives it back).
REVOKE EXECUTE ON FUNCTION awa.wake_waiters(bigint) FROM PUBLIC;
