-- 0013: job dependencies (insert(..., after=[...]), chain / group / chord).
--
-- A child waits for its parents as a `scheduled` job whose run_at is the
-- latest accepted time (9999-12-30, the "parked" time): no new state, so
-- the job_state enum, the unique-states bitmask and every reader stay as they
-- are, and promotion never reaches it. One edge per (parent, child) holds the
-- child's policy for a parent that does not complete. The edges are kept
-- after they are resolved (with the parent's final state) so the workflow
-- graph can still be drawn; cleanup prunes resolved ones after a while.
--
-- A parent that has children carries metadata._awa_dependents. Triggers on
-- the finished-job tables (jobs_done, dlq) run only for rows with that key,
-- so a finishing job without children pays one jsonb key test; the ones with
-- children release them in the statement, hence the transaction, that
-- finishes the parent, whichever statement that is (completion batch, fail,
-- cancel, callback resolution, rescue, admin cancel, drain).

CREATE TABLE awa.job_dependencies (
    parent_id    bigint NOT NULL,
    child_id     bigint NOT NULL,
    policy       text NOT NULL CHECK (policy IN ('cancel', 'run_anyway', 'discard')),
    ordinal      smallint NOT NULL,          -- the parent's place in the child's after list
    created_at   timestamptz NOT NULL DEFAULT now(),
    resolved_at  timestamptz,                -- when the parent finished
    parent_state awa.job_state,              -- how it finished
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX job_dependencies_child_idx ON awa.job_dependencies (child_id);
CREATE INDEX job_dependencies_resolved_idx ON awa.job_dependencies (resolved_at)
    WHERE resolved_at IS NOT NULL;

-- Release the children of a finished parent, then of every child this
-- cancels or discards in turn (a worklist, not recursion: a long chain
-- failing at its head must not exhaust the stack). Each child row is locked
-- (FOR UPDATE, in id order) before its edge is resolved and its remaining
-- edges are counted: two parents finishing at once serialize on the child,
-- and the second one sees the first's resolution, so exactly one of them
-- promotes it. p_prune_after: the parent's; children finished here keep it.
CREATE FUNCTION awa.release_dependents(p_parent bigint, p_state awa.job_state,
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

-- Jobs finished by release_dependents itself are already on its worklist.
CREATE FUNCTION awa.dependents_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('awa.releasing', true), '') <> 'on' THEN
        PERFORM awa.release_dependents(NEW.id, NEW.state, NEW.prune_after);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_dependents AFTER INSERT ON awa.jobs_done
    FOR EACH ROW WHEN (NEW.metadata ? '_awa_dependents')
    EXECUTE FUNCTION awa.dependents_on_finish();
CREATE TRIGGER dlq_dependents AFTER INSERT ON awa.dlq
    FOR EACH ROW WHEN (NEW.metadata ? '_awa_dependents')
    EXECUTE FUNCTION awa.dependents_on_finish();

REVOKE EXECUTE ON FUNCTION awa.release_dependents(bigint, awa.job_state, timestamptz),
    awa.dependents_on_finish() FROM PUBLIC;
