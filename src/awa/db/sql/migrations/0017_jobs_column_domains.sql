-- 0017: the jobs table's value checks move from table CHECK constraints to
-- domains on its columns (same rules, same SQLSTATE 23514 on a violation).
--
-- Why: PostgreSQL rebuilds a table's CHECK constraints for every INSERT or
-- UPDATE statement (it reads each one's stored expression tree back from
-- text and plans it), before it checks a single row. For a one-row insert
-- that was about 45% of the statement's executor CPU (perf: stringToNode
-- under ExecConstraints), some 20 µs of server CPU per `client.insert`, and
-- the same again for every claim, retry and snooze statement. A domain's
-- checks are planned once per connection and kept in its type cache; only
-- the values a statement assigns are checked, as before.
--
-- jobs_active_state stays a table CHECK: the state type is shared with the
-- history tables, which allow the other states.
--
-- This rewrites awa.jobs once (ALTER COLUMN TYPE to a domain with checks
-- validates every row): an ACCESS EXCLUSIVE lock for as long as it takes to
-- copy the active jobs (the finished ones live in awa.jobs_done).
-- awa.jobs_all depends on the columns, so it is dropped and created again
-- with the same definition and the same grants.

CREATE DOMAIN awa.name_200 AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN awa.job_args AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN awa.job_priority AS smallint CHECK (VALUE BETWEEN 1 AND 4);
CREATE DOMAIN awa.job_max_attempts AS smallint CHECK (VALUE BETWEEN 1 AND 1000);
CREATE DOMAIN awa.job_tags AS text[] CHECK (cardinality(VALUE) <= 20);
CREATE DOMAIN awa.job_run_at AS timestamptz CHECK (isfinite(VALUE));
CREATE DOMAIN awa.job_concurrency_limit AS integer CHECK (VALUE BETWEEN 1 AND 1000000);

CREATE TEMP TABLE awa_jobs_all_grants ON COMMIT DROP AS
    SELECT a.privilege_type, a.grantee, a.is_grantable
    FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = 'awa.jobs_all'::regclass AND a.grantee <> c.relowner;

DROP VIEW awa.jobs_all;

ALTER TABLE awa.jobs
    DROP CONSTRAINT jobs_kind_len,
    DROP CONSTRAINT jobs_queue_len,
    DROP CONSTRAINT jobs_args_object,
    DROP CONSTRAINT jobs_priority,
    DROP CONSTRAINT jobs_max_attempts,
    DROP CONSTRAINT jobs_tags,
    DROP CONSTRAINT jobs_run_at_finite,
    DROP CONSTRAINT jobs_concurrency_key_len,
    DROP CONSTRAINT jobs_concurrency_limit,
    ALTER COLUMN kind TYPE awa.name_200,
    ALTER COLUMN queue TYPE awa.name_200,
    ALTER COLUMN args TYPE awa.job_args,
    ALTER COLUMN priority TYPE awa.job_priority,
    ALTER COLUMN max_attempts TYPE awa.job_max_attempts,
    ALTER COLUMN tags TYPE awa.job_tags,
    ALTER COLUMN run_at TYPE awa.job_run_at,
    ALTER COLUMN concurrency_key TYPE awa.name_200,
    ALTER COLUMN concurrency_limit TYPE awa.job_concurrency_limit;

-- As in 0016; a UNION of a domain and its base type has the base type, so the
-- view's columns keep their types.
CREATE VIEW awa.jobs_all AS
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           coalesce(tags, '{}'), coalesce(metadata, '{}'), errors, progress, output,
           unique_key, unique_states, ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs_done
    UNION ALL
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.dlq;

DO $$
DECLARE g record;
BEGIN
    FOR g IN SELECT * FROM awa_jobs_all_grants LOOP
        EXECUTE format('GRANT %s ON awa.jobs_all TO %s%s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
