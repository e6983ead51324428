-- 0028: leadership and presence become append-only records (issue 42).
--
-- awa.leader (one row, its lease renewed by the leader every third of the
-- election interval) and awa.runtime_instances (a row per worker process,
-- refreshed every 2 s) were updated in place: each renewal and each refresh
-- left a dead row version. A held xmin horizon keeps them all: the
-- 60-minute active-readers run left about 2,100 in awa.leader and 1,750 in
-- awa.runtime_instances an hour, one worker process, and each renewal walked
-- the versions the hold had kept. Off the claim and completion path, but
-- growing with the length of the hold.
--
-- Now each renewal is a new row of awa.leader_terms (term n, holder, expiry;
-- the current lease is the row with the highest n), and each refresh a new
-- row of awa.presence_beats (a process's latest row says what it is; a
-- goodbye is a row with `gone`). Neither is ever updated or deleted. Both are
-- partitioned into three by ten-minute block of the server's clock
-- (awa.rotation_part): rows go to the current block's partition, and the one
-- after it, which holds rows from 10 to 30 minutes ago, is emptied by
-- TRUNCATE (awa.rotation_tidy), which no snapshot holds back. So with a
-- horizon held for hours, each table keeps at most three blocks of rows and
-- no dead versions.
--
-- Rolling upgrade: workers of the previous release keep writing
-- awa.runtime_instances and awa.leader, which stay. awa.presence (the view
-- every reader now uses) shows the processes of both releases. A worker of
-- this release does not take the lease while awa.leader holds a live lease of
-- another process, and while processes of the previous release are alive (a
-- runtime_instances row seen within the lease's length) its leader also
-- holds awa.leader, so they keep one leader between them; once they are gone,
-- awa.leader is not written again.

-- The partition (0-2) of the ten-minute block `at` falls in.
CREATE FUNCTION awa.rotation_part(at timestamptz DEFAULT now()) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (floor(extract(epoch FROM at) / 600)::bigint % 3)::smallint
$$;

CREATE TABLE awa.leader_terms (
    part       smallint NOT NULL,
    n          bigint NOT NULL,
    holder     text,                   -- NULL: the holder resigned
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (n, part)
) PARTITION BY LIST (part);
CREATE TABLE awa.leader_terms_0 PARTITION OF awa.leader_terms FOR VALUES IN (0);
CREATE TABLE awa.leader_terms_1 PARTITION OF awa.leader_terms FOR VALUES IN (1);
CREATE TABLE awa.leader_terms_2 PARTITION OF awa.leader_terms FOR VALUES IN (2);

CREATE TABLE awa.presence_beats (
    part        smallint NOT NULL,
    instance_id text NOT NULL,
    hostname    text NOT NULL,
    pid         integer NOT NULL,
    version     text NOT NULL,
    started_at  timestamptz NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),
    is_leader   boolean NOT NULL DEFAULT false,
    listening   boolean NOT NULL DEFAULT false,
    in_flight   integer NOT NULL DEFAULT 0,
    claimed     bigint NOT NULL DEFAULT 0,
    completed   bigint NOT NULL DEFAULT 0,
    queues      jsonb NOT NULL DEFAULT '{}',
    gone        boolean NOT NULL DEFAULT false   -- the process said goodbye
) PARTITION BY LIST (part);
CREATE TABLE awa.presence_beats_0 PARTITION OF awa.presence_beats FOR VALUES IN (0);
CREATE TABLE awa.presence_beats_1 PARTITION OF awa.presence_beats FOR VALUES IN (1);
CREATE TABLE awa.presence_beats_2 PARTITION OF awa.presence_beats FOR VALUES IN (2);
CREATE INDEX presence_beats_latest_idx ON awa.presence_beats (instance_id, seen_at DESC);

-- Worker processes as awa.runtime_instances showed them: each process's
-- latest row, unless it said goodbye or has not been seen for an hour; with
-- the rows of workers of the previous release.
CREATE VIEW awa.presence AS
SELECT instance_id, hostname, pid, version, started_at, last_seen_at, is_leader, listening,
       in_flight, claimed, completed, queues
FROM (SELECT DISTINCT ON (b.instance_id)
             b.instance_id, b.hostname, b.pid, b.version, b.started_at,
             b.seen_at AS last_seen_at, b.is_leader, b.listening, b.in_flight, b.claimed,
             b.completed, b.queues, b.gone
      FROM awa.presence_beats b
      ORDER BY b.instance_id, b.seen_at DESC) latest
WHERE NOT latest.gone AND latest.last_seen_at > now() - interval '1 hour'
UNION ALL
SELECT instance_id, hostname, pid, version, started_at, last_seen_at, is_leader, listening,
       in_flight, claimed, completed, queues
FROM awa.runtime_instances
WHERE last_seen_at > now() - interval '1 hour';

-- The lease as a reader sees it: the newest term, or the previous release's
-- row, whichever expires later (both are the same holder once the one leader
-- holds both). No row: nobody has led, or the last leader resigned.
CREATE VIEW awa.leadership AS
SELECT holder, expires_at
FROM ((SELECT t.holder, t.expires_at FROM awa.leader_terms t ORDER BY t.n DESC LIMIT 1)
      UNION ALL
      SELECT l.holder, l.expires_at FROM awa.leader l) c
WHERE holder IS NOT NULL
ORDER BY expires_at DESC
LIMIT 1;

-- Take or renew the lease for `me` until now() + ttl; false if another
-- process holds a live one. Takers queue on a transaction lock, and each
-- statement after it reads what the one before committed (READ COMMITTED:
-- a fresh snapshot per statement of a volatile function).
CREATE FUNCTION awa.leader_take(me text, ttl interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    cur record;
    won boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(2979, hashtext('awa.leader_terms'));
    SELECT t.n, t.holder, t.expires_at INTO cur FROM awa.leader_terms t ORDER BY t.n DESC LIMIT 1;
    IF cur.holder <> me AND cur.expires_at >= now() THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM awa.leader l WHERE l.holder <> me AND l.expires_at >= now()) THEN
        RETURN false;  -- a worker of the previous release leads
    END IF;
    IF EXISTS (SELECT 1 FROM awa.runtime_instances r WHERE r.last_seen_at > now() - ttl) THEN
        -- Workers of the previous release are alive: hold their lease too.
        INSERT INTO awa.leader AS l (singleton, holder, expires_at) VALUES (true, me, now() + ttl)
        ON CONFLICT (singleton) DO UPDATE SET holder = EXCLUDED.holder,
                                              expires_at = EXCLUDED.expires_at
        WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
        RETURNING true INTO won;
        IF won IS NULL THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO awa.leader_terms (part, n, holder, expires_at)
    VALUES (awa.rotation_part(), coalesce(cur.n, 0) + 1, me, now() + ttl);
    RETURN true;
END $$;

-- Give the lease up (shutdown), if `me` holds it: a term without a holder.
CREATE FUNCTION awa.leader_resign(me text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cur record;
BEGIN
    PERFORM pg_advisory_xact_lock(2979, hashtext('awa.leader_terms'));
    SELECT t.n, t.holder INTO cur FROM awa.leader_terms t ORDER BY t.n DESC LIMIT 1;
    IF cur.holder = me THEN
        INSERT INTO awa.leader_terms (part, n, holder, expires_at)
        VALUES (awa.rotation_part(), cur.n + 1, NULL, now());
    END IF;
    DELETE FROM awa.leader WHERE holder = me;
END $$;

-- Empty the partition after the current block's (rows from 10 to 30 minutes
-- ago) of awa.leader_terms or awa.presence_beats; true if it was emptied.
-- Never waits: a reader holding the partition, or a row that is not old
-- (a live lease, say, whose length exceeds a block; a row written across a
-- block's edge), leaves it for a later call. SECURITY DEFINER, as
-- awa.ring_reclaim: TRUNCATE is the owner's right.
CREATE FUNCTION awa.rotation_tidy(family text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
    keep boolean;
BEGIN
    IF family NOT IN ('leader_terms', 'presence_beats') THEN
        RAISE EXCEPTION 'no such rotating table: %', family;
    END IF;
    t := family || '_' || (awa.rotation_part() + 1) % 3;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', t) INTO keep;
    IF NOT keep THEN
        RETURN false;  -- empty already
    END IF;
    BEGIN
        EXECUTE format('LOCK TABLE awa.%I IN ACCESS EXCLUSIVE MODE NOWAIT', t);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    IF family = 'leader_terms' THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I WHERE expires_at >= now()'
                       ' - interval ''10 minutes'')', t) INTO keep;
    ELSE
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I WHERE seen_at >= now()'
                       ' - interval ''10 minutes'')', t) INTO keep;
    END IF;
    IF keep THEN
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE awa.%I', t);
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION awa.rotation_tidy(text) FROM PUBLIC;

-- Every role that could read or write the tables these replace (`awa grants`,
-- or default privileges) gets the same rights on the new ones, and a role
-- that may reclaim the ring may tidy these: none is refused between this
-- migration and a later `awa grants`.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT c.oid::regclass::text AS rel, a.grantee, a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid IN ('awa.leader'::regclass, 'awa.runtime_instances'::regclass)
               AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON %s TO %s', g.privilege_type,
                       CASE WHEN g.rel LIKE '%runtime_instances'
                            THEN 'awa.presence_beats, awa.presence'
                            ELSE 'awa.leader_terms, awa.leadership' END,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
    FOR g IN SELECT a.grantee
             FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = 'awa.ring_reclaim(text, smallint)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.rotation_tidy(text) TO %s',
                       g.grantee::regrole::text);
    END LOOP;
END $$;
