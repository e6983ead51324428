-- 0019: a parent's children are released in bounded chunks (issue 40, item 3).
--
-- Until now the statement that finished a parent released every one of its
-- children (0013's trigger): 200,000 children took most of the runtime's 30 s
-- statement timeout, 400,000 never finished (the parent ran again and again and
-- released nothing), and a rescue that had to cancel them timed out and failed
-- the whole rescue pass.
--
-- Now the finishing statement releases at most INLINE_BUDGET (1,000) children,
-- counted over the whole cascade (children cancelled or discarded in turn
-- release theirs from the same budget), so a small workflow still moves on in
-- the statement that finishes its parent, as before. What is left over becomes
-- one row of awa.dependency_releases per parent: the parent and how it ended.
-- Workers' `release` service takes those rows with SKIP LOCKED and calls
-- awa.release_dependents on each with a bounded budget (a chunk), one short
-- transaction per chunk, until no edge of the parent is left unresolved; then
-- the row goes.
--
-- Exactly once, as before: every path locks a child's row (id order) before it
-- resolves the child's edge, only the transaction whose UPDATE resolved the
-- edge may act on the child, and the child is promoted only when no edge of it
-- is left open, counted by a statement after the lock (so it sees a second
-- parent's resolution committed while it waited). A chunk is one
-- transaction: a crash loses only the chunk in flight, whose edges are still
-- open, and the row of the parent is still there for the next worker.
--
-- A parent that completed releases its chunk set-based (a few statements per
-- chunk, not four per child); a failed or cancelled one goes child by child,
-- since each child's policy decides (cancel, discard, run anyway).
--
-- p_children (the producer's own children, when it finds their parent already
-- finished) limits the first parent to those children: an insert never takes
-- on the rest of a release in progress.

CREATE TABLE awa.dependency_releases (
    parent_id    bigint PRIMARY KEY,
    parent_state awa.job_state NOT NULL,
    prune_after  timestamptz NOT NULL,       -- the parent's; children finished here keep it
    -- Edges of children up to this id are resolved: the next chunk starts after
    -- it, instead of stepping over every resolved edge again (which made a
    -- million children quadratic: 1.4 s per chunk by the 900,000th).
    after_child  bigint NOT NULL DEFAULT 0,
    queued_at    timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION awa.release_dependents(p_parent bigint, p_state awa.job_state,
                                       p_prune_after timestamptz, p_budget integer,
                                       p_children bigint[] DEFAULT NULL,
                                       p_after_child bigint DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    parents bigint[] := ARRAY[p_parent];
    outcomes awa.job_state[] := ARRAY[p_state];
    i integer := 1;
    parent bigint;
    outcome awa.job_state;
    first boolean;
    budget integer := p_budget;  -- edges still allowed in this call (NULL: no bound)
    ids bigint[];
    n integer;
    last bigint;
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
        first := i = 1;
        i := i + 1;
        IF budget IS NOT NULL AND budget <= 0 THEN
            -- Out of budget: a worker's release service goes on from here.
            INSERT INTO awa.dependency_releases (parent_id, parent_state, prune_after)
            VALUES (parent, outcome, p_prune_after) ON CONFLICT (parent_id) DO NOTHING;
            CONTINUE;
        END IF;
        -- Every edge up to p_after_child is resolved (see after_child), and every
        -- edge of a finished parent was committed before its finish (the insert
        -- locks a running parent) or is resolved by its own insert.
        SELECT coalesce(array_agg(e.child_id), '{}') INTO ids
        FROM (SELECT d.child_id FROM awa.job_dependencies d
              WHERE d.parent_id = parent AND d.resolved_at IS NULL
                AND d.child_id > CASE WHEN first THEN p_after_child ELSE 0 END
                AND (NOT first OR p_children IS NULL OR d.child_id = ANY(p_children))
              ORDER BY d.child_id LIMIT budget) e;
        n := cardinality(ids);
        last := coalesce(ids[n], 0);
        IF outcome = 'completed' THEN
            -- Lock first, then count open edges in later statements (fresh snapshots).
            PERFORM 1 FROM awa.jobs j WHERE j.id = ANY(ids) ORDER BY j.id FOR UPDATE;
            WITH resolved AS (
                UPDATE awa.job_dependencies d SET resolved_at = now(), parent_state = outcome
                WHERE d.parent_id = parent AND d.child_id = ANY(ids) AND d.resolved_at IS NULL
                RETURNING d.child_id
            )
            SELECT coalesce(array_agg(child_id), '{}') INTO ids FROM resolved;
            -- Not parked: already released (or moved by an operator); left be.
            WITH promoted AS (
                UPDATE awa.jobs j SET state = 'available', run_at = now()
                WHERE j.id = ANY(ids) AND j.state = 'scheduled'
                  AND j.run_at >= '9999-12-30 00:00:00+00'
                  AND NOT EXISTS (SELECT 1 FROM awa.job_dependencies d
                                  WHERE d.child_id = j.id AND d.resolved_at IS NULL)
                RETURNING j.queue
            )
            SELECT queues || coalesce(array_agg(DISTINCT queue), '{}'), touched + count(*)
            INTO queues, touched FROM promoted;
        ELSE
            FOR c IN
                SELECT j.* FROM awa.jobs j WHERE j.id = ANY(ids) ORDER BY j.id FOR UPDATE OF j
            LOOP
                UPDATE awa.job_dependencies d SET resolved_at = now(), parent_state = outcome
                WHERE d.parent_id = parent AND d.child_id = c.id AND d.resolved_at IS NULL
                RETURNING d.policy INTO pol;
                -- Not found: another transaction resolved it meanwhile. Not parked: the
                -- child was already released (or an operator moved it); leave it be.
                CONTINUE WHEN pol IS NULL OR c.state <> 'scheduled'
                              OR c.run_at < '9999-12-30 00:00:00+00';
                IF pol = 'run_anyway' THEN
                    IF NOT EXISTS (SELECT 1 FROM awa.job_dependencies d
                                   WHERE d.child_id = c.id AND d.resolved_at IS NULL) THEN
                        UPDATE awa.jobs SET state = 'available', run_at = now()
                        WHERE id = c.id;
                        queues := queues || c.queue;
                        touched := touched + 1;
                    END IF;
                ELSIF pol = 'cancel' THEN
                    DELETE FROM awa.jobs j WHERE j.id = c.id;
                    INSERT INTO awa.jobs_done
                    SELECT f.* FROM awa.finished(c, 'cancelled', p_prune_after - now(),
                        awa.error_entry(format('parent job %s %s', parent, outcome),
                                        c.attempt, false)) f;
                    touched := touched + 1;
                    IF c.metadata ? '_awa_dependents' THEN
                        parents := parents || c.id;
                        outcomes := outcomes || 'cancelled'::awa.job_state;
                    END IF;
                ELSE  -- discard: gone as if never enqueued; its edges stay for the graph
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
            WHERE d.parent_id = parent AND d.child_id = ANY(ids) AND d.resolved_at IS NULL;
        END IF;
        IF budget IS NOT NULL THEN
            budget := budget - n;
            IF budget <= 0 THEN  -- more may be left: the release service goes on
                INSERT INTO awa.dependency_releases (parent_id, parent_state, prune_after,
                                                     after_child)
                VALUES (parent, outcome, p_prune_after, last)
                ON CONFLICT (parent_id) DO UPDATE SET after_child = EXCLUDED.after_child;
                CONTINUE;
            END IF;
        END IF;
        IF NOT first OR p_children IS NULL THEN  -- every edge of this parent resolved
            DELETE FROM awa.dependency_releases WHERE parent_id = parent;
        END IF;
    END LOOP;
    PERFORM set_config('awa.releasing', 'off', true);
    FOR q IN SELECT DISTINCT unnest(queues) LOOP
        PERFORM pg_notify('awa_jobs', q);
    END LOOP;
    RETURN touched;
END $$;

-- 0018's, releasing at most 1,000 children in the finishing statement.
CREATE OR REPLACE FUNCTION awa.dependents_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.metadata ? '_awa_waited' THEN
        PERFORM awa.wake_waiters(NEW.id);
    END IF;
    -- Jobs finished by release_dependents itself are already on its worklist.
    IF NEW.metadata ? '_awa_dependents'
       AND coalesce(current_setting('awa.releasing', true), '') <> 'on' THEN
        PERFORM awa.release_dependents(NEW.id, NEW.state, NEW.prune_after, 1000);
    END IF;
    RETURN NULL;
END $$;

DROP FUNCTION awa.release_dependents(bigint, awa.job_state, timestamptz);

-- As 0010: nothing that writes is PUBLIC (`awa grants ROLE` gives it back).
REVOKE EXECUTE ON FUNCTION
    awa.release_dependents(bigint, awa.job_state, timestamptz, integer, bigint[], bigint)
    FROM PUBLIC;
