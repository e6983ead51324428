-- 0014: wake idle workers from a row-level trigger, filtered by its WHEN.
--
-- 0001's wake-up trigger was statement-level with a transition table: every
-- inserting statement paid for capturing its rows and for a plpgsql query
-- over them (SELECT DISTINCT queue), a measurable share of a single insert
-- and of a 20,000-row COPY (bench/README.md, "Insert path"). The row-level
-- trigger below is filtered by its WHEN clause, which PostgreSQL evaluates in
-- C for each row before queueing any trigger event: a row that is not
-- available, or is inserted while awa.defer_notify is on, costs one
-- comparison and no plpgsql call. Awa's multi-row paths (COPY, insert from
-- staging) set awa.defer_notify and send one NOTIFY per queue themselves, so
-- the per-row call is paid only by single-row inserts and by writers that are
-- not Awa (which therefore still wake workers promptly). pg_notify is
-- transactional: nothing is sent unless the transaction commits, and
-- duplicates within one transaction are folded into one.

DROP TRIGGER jobs_notify_insert ON awa.jobs;

-- Same name, so 0010's REVOKE (and `awa grants`) still apply to it.
CREATE OR REPLACE FUNCTION awa.notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('awa_jobs', NEW.queue);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON awa.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'available'
          AND current_setting('awa.defer_notify', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION awa.notify_inserted();
