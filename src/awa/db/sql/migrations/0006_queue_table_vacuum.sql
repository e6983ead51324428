-- 0006: vacuum never truncates the active job table.
--
-- awa.jobs churns (every job is inserted, updated and deleted), so its tail
-- pages empty and refill all the time. Truncating them at the end of a VACUUM
-- takes an ACCESS EXCLUSIVE lock, which stops every claim and completion
-- while it is held (a 1.7 s stall was measured by bench/scheduled.py), only
-- for the pages to be extended again moments later. Applies to autovacuum and
-- to the leader's own VACUUM alike.

ALTER TABLE awa.jobs SET (vacuum_truncate = false);

-- Partitions of awa.jobs_done are made ahead only for the hours finished jobs
-- land in (finalization time + a retention), not for every hour from now on:
-- the first cleanup pass used to create 73 at once, and each takes an ACCESS
-- EXCLUSIVE lock on awa.jobs_done that holds up every completion (an 8 s
-- stall at 8,000 jobs/s, bench/soak.py). Same rules as the one-argument
-- form, which now makes every hour from now to p_until through this one.
CREATE FUNCTION awa.ensure_done_partitions(p_from timestamptz, p_until timestamptz)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    sch text := (SELECT relnamespace::regnamespace::text FROM pg_class
                 WHERE oid = 'awa.jobs_done'::regclass);
    h timestamptz := date_trunc('hour', p_from);
    created integer := 0;
    part text;
BEGIN
    WHILE h <= p_until LOOP
        part := 'jobs_done_p' || to_char(h, 'YYYYMMDDHH24');
        IF to_regclass(format('%s.%I', sch, part)) IS NULL THEN
            BEGIN
                EXECUTE format(
                    'CREATE TABLE %s.%I PARTITION OF awa.jobs_done FOR VALUES FROM (%L) TO (%L)',
                    sch, part, h, h + interval '1 hour');
                created := created + 1;
            EXCEPTION WHEN duplicate_table OR check_violation OR invalid_object_definition THEN
                NULL;  -- made by another leader, or stray rows in the default partition
            END;
        END IF;
        h := h + interval '1 hour';
    END LOOP;
    RETURN created;
END $$;

CREATE OR REPLACE FUNCTION awa.ensure_done_partitions(p_until timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
    SELECT awa.ensure_done_partitions(now(), p_until)
$$;
