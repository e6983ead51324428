-- 0007: expired jobs_done partitions are dropped one per transaction.
--
-- drop_done_partitions used to drop every expired partition in one
-- transaction. After the first DROP TABLE it held an ACCESS EXCLUSIVE lock on
-- awa.jobs_done (which every completion inserts into) while it read the next
-- partition in full (unique claims to release, rows to count): completions
-- stalled for over a second at 10 million jobs of history (bench/soak.py).
-- Now a call drops at most one partition and returns its row count (NULL
-- when none has expired); it reads the partition before locking the parent,
-- and gives up after 200 ms of waiting for a lock (the next cleanup pass
-- tries again) rather than queueing every completion behind its request.

CREATE OR REPLACE FUNCTION awa.drop_done_partitions(p_before timestamptz)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' SET lock_timeout = '200ms' AS $$
DECLARE
    part regclass;
    n bigint;
BEGIN
    SELECT c.oid::regclass INTO part
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'awa.jobs_done'::regclass
      AND c.relname ~ '^jobs_done_p[0-9]{10}$'
      AND to_timestamp(substr(c.relname, 12), 'YYYYMMDDHH24') + interval '1 hour' <= p_before
    ORDER BY c.relname
    LIMIT 1;
    IF part IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format(
        'DELETE FROM awa.unique_claims c USING %s p '
        'WHERE p.unique_key IS NOT NULL AND c.unique_key = p.unique_key AND c.job_id = p.id',
        part);
    EXECUTE format('SELECT count(*) FROM %s', part) INTO n;
    EXECUTE format('DROP TABLE %s', part);
    RETURN n;
END $$;
