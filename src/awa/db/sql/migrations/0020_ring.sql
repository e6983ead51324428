-- 0020: the append-only lane (issue 42; the design is docs/storage.md).
--
-- A job that needs no mutable state (due now; no unique key, ordering key,
-- concurrency key or parents) can live its whole life as INSERTs: a `ready`
-- row when enqueued, a `receipts` row when claimed, `heartbeats` rows while
-- it runs and a `closures` row when it ends. None of them is ever updated or
-- deleted; each table is partitioned into a ring of 4 slots, and maintenance
-- reclaims an old slot with TRUNCATE once every row in it is spent. TRUNCATE
-- frees the files at once, so a transaction holding the xmin horizon (an idle
-- session, a long report) no longer makes the queue's hot rows pile up.
--
-- Claims find the ring's unclaimed rows through PostgreSQL's commit order
-- (the ticks of docs/storage.md): each ready row carries the id of the
-- transaction that inserted it, each claim records its snapshot in claim_log
-- with where every priority lane's cursor stands, and the next claim reads
-- only the rows that became visible since. awa.claim reads this lane and the
-- mutable lane (awa.jobs) in one call.
--
-- Everything else an attempt can do (fail, retry, snooze, wait for a
-- callback, record progress, be cancelled or rescued) first moves it into the
-- mutable lane (awa.ring_materialize: a `moved` closure and a running row of
-- awa.jobs with the same run lease), where the existing statements serve it.
--
-- Enqueueing into the ring is off until `awa.ring.enqueue` is set: claims,
-- completions, heartbeats and rescue read both lanes from this migration on,
-- so producers can be switched over at any time.

CREATE TABLE awa.ring (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    slot       smallint NOT NULL,
    slots      smallint NOT NULL,
    rotated_at timestamptz NOT NULL DEFAULT now(),
    enqueue    boolean NOT NULL DEFAULT false
);
-- Four slots: every statement that cannot name its slot reads each partition
-- (an index probe apiece, a large share of a claim's time at 16), and a slot
-- only has to outlive the work in it: at a turn every 30 s the ring holds two
-- minutes of jobs, and a job running longer moves to the mutable lane.
INSERT INTO awa.ring (slot, slots) VALUES (0, 4);

-- The slot new rows go to.
CREATE FUNCTION awa.ring_slot() RETURNS smallint
LANGUAGE sql STABLE AS $$ SELECT slot FROM awa.ring $$;

-- How a ring attempt ended (closures.outcome).
CREATE FUNCTION awa.ring_outcome(name text) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE name WHEN 'completed' THEN 1 WHEN 'moved' THEN 2 END::smallint
$$;

-- An available job, immutable once written. xid: the inserting (top-level)
-- transaction. lease_base: the run lease the next attempt starts from.
-- attempt: attempts already made. The other columns are awa.jobs's.
CREATE TABLE awa.ready (
    slot         smallint NOT NULL DEFAULT awa.ring_slot(),
    -- awa.jobs's own id sequence, named (pg_get_serial_sequence would look it up per row).
    id           bigint NOT NULL DEFAULT nextval('awa.jobs_id_seq'::regclass),
    queue        awa.name_200 NOT NULL,
    priority     awa.job_priority NOT NULL,
    xid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind         awa.name_200 NOT NULL,
    args         awa.job_args NOT NULL,
    attempt      smallint NOT NULL DEFAULT 0,
    max_attempts awa.job_max_attempts NOT NULL,
    lease_base   bigint NOT NULL DEFAULT 0,
    run_at       awa.job_run_at NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    tags         awa.job_tags NOT NULL DEFAULT '{}',
    metadata     jsonb NOT NULL DEFAULT '{}',
    errors       jsonb
) PARTITION BY LIST (slot);
CREATE INDEX ready_lane_idx ON awa.ready (queue, priority, xid, id);
CREATE INDEX ready_id_idx ON awa.ready (id);

-- The ring lanes (queue, priority) that ever took a job: a claim walks only
-- these (most queues use one priority, and each lane walked is a query).
-- Producers add their lane in the transaction that inserts into it, only when
-- it is not known yet (job.sql, ring_lane_known); nothing deletes a row. Two
-- open transactions inserting the first jobs of the same new lane wait for
-- one another (the primary key), once per lane ever.
CREATE TABLE awa.ring_lanes (
    queue    text NOT NULL,
    priority smallint NOT NULL,
    PRIMARY KEY (queue, priority)
);

-- An available ring job taken out of the ring before any claim (cancelled, or
-- moved to the mutable lane by an operator): claims pass over it.
CREATE TABLE awa.ready_cancels (
    slot       smallint NOT NULL,
    id         bigint NOT NULL,
    lease_base bigint NOT NULL
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX ready_cancels_key ON awa.ready_cancels (slot, id, lease_base);

-- One row per claim that moved a cursor: its snapshot (the tick) and where
-- each priority lane stands after it: the ticks before cur_tick are spent,
-- and of tick cur_tick the rows up to (cur_xid, cur_id).
CREATE TABLE awa.claim_log (
    slot     smallint NOT NULL,
    queue    text NOT NULL,
    n        bigint NOT NULL,
    snap     pg_snapshot NOT NULL,
    cur_tick bigint[] NOT NULL,
    cur_xid  xid8[] NOT NULL,
    cur_id   bigint[] NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX claim_log_queue_idx ON awa.claim_log (queue, n);

-- An attempt (the receipt) and its end (the closure), in the same slot. The
-- unique index on closures is the run-lease guard: the first closure wins.
CREATE TABLE awa.receipts (
    slot        smallint NOT NULL,
    id          bigint NOT NULL,
    run_lease   bigint NOT NULL,
    queue       text NOT NULL,
    ready_slot  smallint NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    deadline_at timestamptz
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX receipts_key ON awa.receipts (slot, id, run_lease);
CREATE INDEX receipts_id_idx ON awa.receipts (id);

CREATE TABLE awa.closures (
    slot      smallint NOT NULL,
    id        bigint NOT NULL,
    run_lease bigint NOT NULL,
    outcome   smallint NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX closures_key ON awa.closures (slot, id, run_lease);

-- "Attempt (id, run_lease) was alive at": written only while it is open.
CREATE TABLE awa.heartbeats (
    slot      smallint NOT NULL,
    id        bigint NOT NULL,
    run_lease bigint NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX heartbeats_key ON awa.heartbeats (slot, id, run_lease, at);

DO $$
DECLARE
    t text;
BEGIN
    FOR s IN 0..3 LOOP
        FOREACH t IN ARRAY ARRAY['ready', 'ready_cancels', 'claim_log', 'receipts',
                                 'closures', 'heartbeats'] LOOP
            EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.%I FOR VALUES IN (%s)',
                           t || '_' || s, t, s);
        END LOOP;
    END LOOP;
END $$;

-- Wake idle workers, as awa.jobs's jobs_notify_insert does.
CREATE TRIGGER ready_notify_insert AFTER INSERT ON awa.ready
    FOR EACH ROW
    WHEN (current_setting('awa.defer_notify', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION awa.notify_inserted();

-- The attempt of ready row w that receipt r opened, as a running awa.jobs row
-- (what awa.finished and the mutable lane take). heartbeat: its latest sign of life.
CREATE FUNCTION awa.ring_job(w awa.ready, r awa.receipts, heartbeat timestamptz)
RETURNS awa.jobs
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(w.id, w.kind, w.queue, w.args, 'running', w.priority, w.attempt + 1,
               w.max_attempts, r.run_lease, w.run_at, w.created_at, r.claimed_at,
               heartbeat, r.deadline_at, NULL, w.tags, w.metadata, w.errors, NULL, NULL,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.jobs
$$;

-- Ready row w as the available awa.jobs row it stands for (what inserts return).
CREATE FUNCTION awa.ready_job(w awa.ready) RETURNS awa.jobs
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(w.id, w.kind, w.queue, w.args, 'available', w.priority, w.attempt,
               w.max_attempts, w.lease_base, w.run_at, w.created_at, NULL, NULL, NULL, NULL,
               w.tags, w.metadata, w.errors, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL)::awa.jobs
$$;

-- The ready row that attempt (slot, id, lease) started from.
CREATE FUNCTION awa.ring_ready_of(r awa.receipts) RETURNS awa.ready
LANGUAGE sql STABLE AS $$
    SELECT w FROM awa.ready w
    WHERE w.slot = r.ready_slot AND w.id = r.id AND w.lease_base = r.run_lease - 1
$$;

-- Is ring attempt (slot, id, lease) open: claimed, and no closure yet?
CREATE FUNCTION awa.ring_open(p_slot smallint, p_id bigint, p_lease bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM awa.receipts r
                   WHERE r.slot = p_slot AND r.id = p_id AND r.run_lease = p_lease)
       AND NOT EXISTS (SELECT 1 FROM awa.closures c
                       WHERE c.slot = p_slot AND c.id = p_id AND c.run_lease = p_lease)
$$;

-- The rows of lane (queue, priority) that became visible between snapshots
-- lo and hi, after position (x, i), in (xid, id) order, at most lim. Rows of
-- transactions running at lo and ended by hi come first, found by their ids
-- (one index probe each); then the rows of transactions that started after
-- lo, from one index range. A transaction running at both (one holding the
-- horizon) costs nothing, and neither read touches a spent row. One SELECT in
-- SQL, so the planner inlines it into the statement that calls it.
CREATE FUNCTION awa.ring_window(p_queue text, p_priority smallint, lo pg_snapshot,
                                hi pg_snapshot, x xid8, i bigint, lim int)
RETURNS SETOF awa.ready
LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        (SELECT w.* FROM unnest(ARRAY(SELECT v FROM pg_snapshot_xip(lo) v
                                      WHERE v >= x AND pg_visible_in_snapshot(v, hi))) e(v)
         -- One exact probe per transaction (xid = e.v), whatever the statistics say.
         CROSS JOIN LATERAL (
             SELECT * FROM awa.ready w
             WHERE w.queue = p_queue AND w.priority = p_priority AND w.xid = e.v
               AND (e.v <> x OR w.id > i)
             ORDER BY w.id LIMIT lim) w
         ORDER BY e.v, w.id LIMIT lim)
        UNION ALL
        (SELECT * FROM awa.ready w
         WHERE w.queue = p_queue AND w.priority = p_priority
           -- The start key: just after (x, i), or the first row of a transaction
           -- that started after lo, whichever is later.
           AND (w.xid, w.id) > (greatest(pg_snapshot_xmax(lo), x),
                                CASE WHEN x >= pg_snapshot_xmax(lo) THEN i ELSE 0 END)
           AND w.xid < pg_snapshot_xmax(hi)
           AND pg_visible_in_snapshot(w.xid, hi)
         ORDER BY w.xid, w.id LIMIT lim)
    ) t
    LIMIT lim  -- the first part's ids are all below xmax(lo), the second's from it on
$$;

-- A job's priority after aging: one level more urgent per `aging` seconds waited.
CREATE FUNCTION awa.aged(priority smallint, run_at timestamptz, aging float8)
RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN aging > 0
                THEN greatest(1, priority - floor((date_part('epoch', now())
                                                  - date_part('epoch', run_at)) / aging))
                ELSE priority END
$$;

-- Claim up to p_max jobs of p_queue from both lanes: the ring's (through the
-- ticks) and the mutable lane's (awa.jobs, SKIP LOCKED), as running attempts
-- with a p_deadline (seconds, 0 = none). Lanes are taken in order of their
-- oldest job's priority after aging (p_aging seconds per level, 0 = off),
-- oldest first on a tie; FIFO within a lane. Claims of one queue take turns (a
-- transaction-scoped advisory lock). A claim adds one claim_log row and one
-- receipt per ring job, and changes no ring row; one that moved no ring cursor
-- writes nothing there, so an idle queue's polls stay read-only.
-- Must run in READ COMMITTED: every statement after the lock takes a fresh
-- snapshot and sees the claim that committed before it.
-- The claim commits durably: synchronous_commit is turned on for it if off
-- (a run lease is a fencing token; see attempt.sql, claim_durably).
CREATE FUNCTION awa.claim(p_queue text, p_max int, p_deadline float8, p_aging float8)
RETURNS TABLE (id bigint, kind text, queue text, args jsonb, priority smallint,
               attempt smallint, max_attempts smallint, run_lease bigint, run_at float8,
               created_at float8, attempted_at float8, deadline_at float8, tags text[],
               metadata jsonb, errors jsonb, progress jsonb, unique_key bytea,
               ordering_key text, receipt_slot smallint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    last     awa.claim_log;
    s_now    pg_snapshot;
    n_new    bigint;
    -- Each lane's cursor (tick, xid, id), and where its walk ended.
    ticks    bigint[];
    xs       xid8[];
    ids      bigint[];
    end_t    bigint[] := '{0,0,0,0}';
    end_x    xid8[] := '{0,0,0,0}';
    end_i    bigint[] := '{0,0,0,0}';
    -- The rows the walks saw, lane after lane (first[p] .. last_at[p] are lane p's).
    w_tick   bigint[] := '{}';
    w_slot   smallint[] := '{}';
    w_id     bigint[] := '{}';
    w_lease  bigint[] := '{}';
    w_xid    xid8[] := '{}';
    w_skip   boolean[] := '{}';
    w_run_at timestamptz[] := '{}';
    first    int[] := '{1,1,1,1}';
    last_at  int[] := '{0,0,0,0}';
    settled  boolean[] := '{false,false,false,false}';
    -- The ring rows taken.
    t_slot   smallint[] := '{}';
    t_id     bigint[] := '{}';
    t_lease  bigint[] := '{}';
    p        smallint;
    t        bigint;
    x        xid8;
    i        bigint;
    e        int;
    k        int;
    lo       pg_snapshot;
    hi       pg_snapshot;
    seen     int;
    asked    int;
    got      int;
    skipped  int;
    want     int := p_max;
    passed   int := 0;
    cancels  boolean;
    lanes    record;
    rslot    smallint;
    known    smallint[];
    a_slot   smallint[];
    a_id     bigint[];
    a_lease  bigint[];
    a_xid    xid8[];
    a_skip   boolean[];
    a_run_at timestamptz[];
    deadline timestamptz := CASE WHEN p_deadline > 0
                                 THEN now() + make_interval(secs => p_deadline) END;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- One snapshot for the whole call would not see the claim committed
        -- while the lock was waited for: two claims could take the same rows.
        RAISE EXCEPTION 'awa.claim must run in READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    IF p_max <= 0 OR EXISTS (SELECT 1 FROM awa.queues q WHERE q.queue = p_queue AND q.paused)
    THEN
        RETURN;
    END IF;
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('awa.claim:' || p_queue, 0));
    -- Read after the lock, in a fresh snapshot: the last claim's row, and the
    -- cancels committed under the lock before it.
    SELECT * INTO last FROM awa.claim_log c WHERE c.queue = p_queue ORDER BY c.n DESC LIMIT 1;
    cancels := EXISTS (SELECT 1 FROM awa.ready_cancels);
    s_now := pg_current_snapshot();
    rslot := awa.ring_slot();
    IF last.n IS NULL THEN
        n_new := 1;
        ticks := '{1,1,1,1}'; xs := '{0,0,0,0}'; ids := '{0,0,0,0}';
    ELSE
        n_new := last.n + 1;
        ticks := last.cur_tick; xs := last.cur_xid; ids := last.cur_id;
    END IF;
    -- Walk each ring lane from its cursor, collecting up to p_max rows it could
    -- take (rows passed over do not count). Nothing is taken yet.
    -- Read after s_now: a lane whose producer committed before s_now is listed.
    -- A lane not listed has no row up to s_now, so its cursor moves past s_now.
    known := ARRAY(SELECT l.priority FROM awa.ring_lanes l WHERE l.queue = p_queue);
    FOR ln IN 1..4 LOOP
        p := ln;
        t := ticks[p]; x := xs[p]; i := ids[p];
        got := 0;
        first[p] := cardinality(w_id) + 1;
        IF NOT (p = ANY(known)) THEN
            t := n_new + 1; x := '0'; i := 0;
        END IF;
        WHILE t <= n_new AND got < p_max LOOP
            IF t = 1 THEN
                lo := '1:1:';
            ELSIF t - 1 = last.n THEN
                lo := last.snap;
            ELSE
                SELECT c.snap INTO lo FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t - 1;
            END IF;
            IF t = n_new THEN
                hi := s_now;
            ELSE
                SELECT c.snap INTO hi FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t;
            END IF;
            asked := p_max - got;
            SELECT count(*)::int,
                   coalesce(array_agg(w.slot ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.id ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.lease_base ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.xid ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(cancels AND EXISTS (
                       SELECT 1 FROM awa.ready_cancels k
                       WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base)
                       ORDER BY w.xid, w.id), '{}'),
                   coalesce(array_agg(w.run_at::timestamptz ORDER BY w.xid, w.id), '{}')
            INTO seen, a_slot, a_id, a_lease, a_xid, a_skip, a_run_at
            FROM awa.ring_window(p_queue, p, lo, hi, x, i, asked) w;
            IF seen > 0 THEN
                w_tick := w_tick || array_fill(t, ARRAY[seen]);
                w_slot := w_slot || a_slot; w_id := w_id || a_id;
                w_lease := w_lease || a_lease; w_xid := w_xid || a_xid;
                w_skip := w_skip || a_skip; w_run_at := w_run_at || a_run_at;
                x := a_xid[seen]; i := a_id[seen];
                got := got + seen - (CASE WHEN cancels
                                         THEN cardinality(array_positions(a_skip, true))
                                         ELSE 0 END);
            END IF;
            IF seen < asked THEN  -- tick t is spent: the lane moves on to the next
                t := t + 1; x := '0'; i := 0;
            END IF;
        END LOOP;
        last_at[p] := cardinality(w_id);
        -- Where the cursor stands once the whole walk is taken.
        end_t[p] := t; end_x[p] := x; end_i[p] := i;
    END LOOP;
    -- Take from the lanes, the most urgent first: a lane's urgency is its oldest
    -- job's priority after aging.
    FOR lanes IN
        SELECT l.ring, l.p FROM (
            SELECT true AS ring, g.p::smallint AS p,
                   (SELECT min(u.r) FROM unnest(w_run_at[first[g.p]:last_at[g.p]],
                                                w_skip[first[g.p]:last_at[g.p]]) u(r, s)
                    WHERE NOT u.s) AS head
            FROM generate_series(1, 4) g(p) WHERE last_at[g.p] >= first[g.p]
            UNION ALL
            SELECT false, m.priority, m.run_at FROM generate_series(1, 4) g(p),
                LATERAL (SELECT j.priority, j.run_at FROM awa.jobs j
                         WHERE j.state = 'available' AND j.queue = p_queue
                           AND j.priority = g.p AND j.concurrency_key IS NULL
                         ORDER BY j.run_at, j.id LIMIT 1) m
        ) l
        WHERE l.head IS NOT NULL
        ORDER BY awa.aged(l.p, l.head, p_aging), l.head, l.ring DESC
    LOOP
        EXIT WHEN want = 0;
        p := lanes.p;
        IF lanes.ring THEN
            -- Take the lane's first k rows it may take; e: the last row consumed.
            skipped := CASE WHEN cancels
                            THEN cardinality(array_positions(w_skip[first[p]:last_at[p]], true))
                            ELSE 0 END;
            k := least(want, last_at[p] - first[p] + 1 - skipped);
            IF k = last_at[p] - first[p] + 1 - skipped THEN
                e := last_at[p];  -- the whole walk: the cursor goes where the walk ended
                ticks[p] := end_t[p]; xs[p] := end_x[p]; ids[p] := end_i[p];
            ELSE
                e := CASE WHEN skipped = 0 THEN first[p] + k - 1 ELSE
                     (SELECT u.o FROM unnest(w_skip) WITH ORDINALITY u(s, o)
                      WHERE u.o >= first[p] AND NOT u.s ORDER BY u.o OFFSET k - 1 LIMIT 1) END;
                ticks[p] := w_tick[e]; xs[p] := w_xid[e]; ids[p] := w_id[e];
            END IF;
            IF skipped = 0 THEN
                a_slot := w_slot[first[p]:e]; a_id := w_id[first[p]:e];
                a_lease := w_lease[first[p]:e];
            ELSE
                SELECT array_agg(u.s ORDER BY u.o), array_agg(u.i ORDER BY u.o),
                       array_agg(u.l ORDER BY u.o), passed + (e - first[p] + 1) - count(*)
                INTO a_slot, a_id, a_lease, passed
                FROM unnest(w_slot[first[p]:e], w_id[first[p]:e], w_lease[first[p]:e],
                            w_skip[first[p]:e]) WITH ORDINALITY u(s, i, l, c, o)
                WHERE NOT u.c;
            END IF;
            t_slot := t_slot || a_slot; t_id := t_id || a_id; t_lease := t_lease || a_lease;
            -- The lane's rows, in the order taken (lanes in order of urgency).
            RETURN QUERY
                SELECT w.id, w.kind::text, w.queue::text, w.args::jsonb, w.priority::smallint,
                       (w.attempt + 1)::smallint, w.max_attempts::smallint, w.lease_base + 1,
                       date_part('epoch', w.run_at), date_part('epoch', w.created_at),
                       date_part('epoch', now()), date_part('epoch', deadline),
                       nullif(w.tags::text[], '{}'), nullif(w.metadata, '{}'), w.errors,
                       NULL::jsonb, NULL::bytea, NULL::text, rslot
                FROM unnest(a_slot, a_id, a_lease) WITH ORDINALITY u(s, i, l, o)
                -- Each row by its slot and id (one partition, one index probe), not a
                -- join the planner might make by scanning the ring.
                CROSS JOIN LATERAL (SELECT * FROM awa.ready r
                                    WHERE r.slot = u.s AND r.id = u.i AND r.lease_base = u.l
                                    LIMIT 1) w
                ORDER BY u.o;
            settled[p] := true;
            want := want - k;
        ELSE
            RETURN QUERY
            WITH picked AS (
                SELECT a.id FROM awa.jobs a
                WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = p
                  AND a.concurrency_key IS NULL
                  -- A job with an ordering key waits for every earlier unfinished one.
                  AND (a.ordering_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM awa.jobs o
                      WHERE o.queue = p_queue AND o.ordering_key = a.ordering_key
                        AND o.id < a.id))
                ORDER BY a.run_at, a.id LIMIT want FOR UPDATE SKIP LOCKED
            )
            UPDATE awa.jobs j
            SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
                attempted_at = now(), heartbeat_at = now(), deadline_at = deadline
            -- By primary key (= ANY), never a join: a generic plan hash-joined the
            -- picked rows to a scan of the whole table.
            WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked))
            RETURNING j.id, j.kind::text, j.queue::text, j.args::jsonb, j.priority::smallint,
                j.attempt, j.max_attempts::smallint,
                j.run_lease, date_part('epoch', j.run_at), date_part('epoch', j.created_at),
                date_part('epoch', j.attempted_at), date_part('epoch', j.deadline_at),
                nullif(j.tags::text[], '{}'), nullif(j.metadata, '{}'), j.errors, j.progress,
                j.unique_key, j.ordering_key, NULL::smallint;
            GET DIAGNOSTICS got = ROW_COUNT;
            want := want - got;
        END IF;
    END LOOP;
    -- A lane whose walk saw only rows passed over (or none) moves to the walk's
    -- end; one with rows left untaken keeps its cursor.
    FOR ln IN 1..4 LOOP
        IF NOT settled[ln] AND NOT (false = ANY(w_skip[first[ln]:last_at[ln]])) THEN
            passed := passed + (last_at[ln] - first[ln] + 1);
            ticks[ln] := end_t[ln]; xs[ln] := end_x[ln]; ids[ln] := end_i[ln];
        END IF;
    END LOOP;
    IF cardinality(t_id) = 0 AND passed = 0 AND cardinality(w_id) = 0
       AND last.n IS NOT NULL AND last.cur_tick = array_fill(last.n + 1, ARRAY[4]) THEN
        RETURN;  -- every lane caught up and nothing taken: nothing to record
    END IF;
    INSERT INTO awa.claim_log (slot, queue, n, snap, cur_tick, cur_xid, cur_id)
    VALUES (rslot, p_queue, n_new, s_now, ticks, xs, ids);
    IF cardinality(t_id) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO awa.receipts (slot, id, run_lease, queue, ready_slot, deadline_at)
    SELECT rslot, u.i, u.l + 1, p_queue, u.s, deadline
    FROM unnest(t_id, t_lease, t_slot) AS u(i, l, s);
END $$;

-- Move open ring attempts (slot, id, lease) into the mutable lane: a `moved`
-- closure (so the ring's completion and heartbeats of the attempt write
-- nothing more) and a running awa.jobs row with the same run lease, its
-- heartbeat the attempt's latest. Every outcome but a plain completion, and
-- anything that changes a running job, goes this way first; so do attempts
-- still open when their slot is reclaimed. Returns the ids moved.
CREATE FUNCTION awa.ring_materialize(p_slots smallint[], p_ids bigint[], p_leases bigint[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    WITH c AS (
        SELECT * FROM unnest(p_slots, p_ids, p_leases) AS c(slot, id, lease)
    ), closed AS (
        INSERT INTO awa.closures (slot, id, run_lease, outcome)
        SELECT c.slot, c.id, c.lease, awa.ring_outcome('moved') FROM c
        WHERE EXISTS (SELECT 1 FROM awa.receipts r
                      WHERE r.slot = c.slot AND r.id = c.id AND r.run_lease = c.lease)
        ON CONFLICT DO NOTHING
        RETURNING slot, id, run_lease
    ), moved AS (
        INSERT INTO awa.jobs
        SELECT j.* FROM closed k
        CROSS JOIN LATERAL (SELECT * FROM awa.receipts r
                            WHERE r.slot = k.slot AND r.id = k.id AND r.run_lease = k.run_lease
                            LIMIT 1) r
        CROSS JOIN LATERAL (SELECT * FROM awa.ready w
                            WHERE w.slot = r.ready_slot AND w.id = r.id
                              AND w.lease_base = r.run_lease - 1 LIMIT 1) w
        CROSS JOIN LATERAL awa.ring_job(w, r, coalesce(
            (SELECT max(h.at) FROM awa.heartbeats h
             WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease),
            r.claimed_at)) j
        RETURNING id
    )
    SELECT id FROM moved
$$;

-- Rescue's part in the ring: open attempts not heard from (heartbeat, else
-- claim) for p_stale, or past their deadline, move to the mutable lane (with
-- their last sign of life as heartbeat), where the rescue statement
-- (job_rescue_running) finds them stale and retries or fails them as any
-- other. Once moved, a late completion of the attempt writes nothing in the
-- ring, and none in the mutable lane once rescue has put it back. At most
-- p_max. Returns how many moved.
CREATE FUNCTION awa.ring_rescue(p_stale interval, p_max int) RETURNS integer
LANGUAGE sql AS $$
    WITH stale AS (
        SELECT r.slot, r.id, r.run_lease FROM awa.receipts r
        WHERE (r.claimed_at < now() - p_stale OR r.deadline_at < now())
          AND NOT EXISTS (SELECT 1 FROM awa.closures c
                          WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
          AND (r.deadline_at < now() OR NOT EXISTS (
              SELECT 1 FROM awa.heartbeats h
              WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease
                AND h.at >= now() - p_stale))
        LIMIT p_max
    )
    SELECT count(*)::integer FROM awa.ring_materialize(
        ARRAY(SELECT slot FROM stale), ARRAY(SELECT id FROM stale),
        ARRAY(SELECT run_lease FROM stale))
$$;

-- Move available ring jobs p_ids into the mutable lane (available there, same
-- id and run lease), so that an operator's change (cancel, reschedule,
-- reprioritize, a dependent added) finds them where it looks. Each is taken
-- under its queue's claim lock, so no claim crosses the move: either a claim
-- took it first (it is running, see ring_materialize) or it is passed over
-- from now on (ready_cancels). Returns the ids moved.
CREATE FUNCTION awa.ring_unready(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    w awa.ready;
BEGIN
    FOR w IN SELECT DISTINCT ON (r.id) r.* FROM awa.ready r
             WHERE r.id = ANY(p_ids) ORDER BY r.id, r.lease_base DESC LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('awa.claim:' || w.queue, 0));
        CONTINUE WHEN EXISTS (SELECT 1 FROM awa.receipts k
                              WHERE k.id = w.id AND k.run_lease = w.lease_base + 1);
        INSERT INTO awa.ready_cancels (slot, id, lease_base)
        VALUES (w.slot, w.id, w.lease_base) ON CONFLICT DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO awa.jobs SELECT j.* FROM awa.ready_job(w) j;
        RETURN NEXT w.id;
    END LOOP;
END $$;

-- Move ring jobs p_ids, available or running, into the mutable lane, where
-- every change but the hot path's is made (a dependent added, an operator's
-- cancel or reschedule); jobs not in the ring are left alone. Available ones
-- first (ring_unready takes the claim lock), then the attempts open after
-- that, read in a fresh snapshot: a claim that committed while the lock was
-- waited for is seen and moved too. Returns the ids moved.
CREATE FUNCTION awa.ring_to_mutable(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT awa.ring_unready(p_ids);
    RETURN QUERY
        SELECT awa.ring_materialize(array_agg(r.slot), array_agg(r.id), array_agg(r.run_lease))
        FROM awa.receipts r
        WHERE r.id = ANY(p_ids) AND NOT EXISTS (
            SELECT 1 FROM awa.closures c
            WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
        HAVING count(*) > 0;
END $$;

-- Move the ring on when the next slot is empty; the new slot, or NULL.
CREATE FUNCTION awa.ring_advance() RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    nxt smallint;
BEGIN
    SELECT (g.slot + 1) % g.slots INTO nxt FROM awa.ring g FOR UPDATE;
    IF EXISTS (SELECT 1 FROM awa.ready WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa.ready_cancels WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa.receipts WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa.closures WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa.heartbeats WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa.claim_log WHERE slot = nxt) THEN
        RETURN NULL;
    END IF;
    UPDATE awa.ring SET slot = nxt, rotated_at = now();
    RETURN nxt;
END $$;

-- Copy the ticks of slot s that a cursor still needs into the current slot
-- (reclaim of claim_log_s, which holds that partition's lock); how many.
CREATE FUNCTION awa.ring_carry_ticks(s smallint) RETURNS integer
LANGUAGE sql AS $$
    WITH needed AS (
        INSERT INTO awa.claim_log (slot, queue, n, snap, cur_tick, cur_xid, cur_id, at)
        SELECT awa.ring_slot(), c.queue, c.n, c.snap, c.cur_tick, c.cur_xid, c.cur_id, c.at
        FROM awa.claim_log c
        WHERE c.slot = s AND c.n >= (
            SELECT min(t) - 1 FROM (
                SELECT l.cur_tick FROM awa.claim_log l
                WHERE l.queue = c.queue ORDER BY l.n DESC LIMIT 1) z,
            unnest(z.cur_tick) t)
        RETURNING 1
    )
    SELECT count(*)::integer FROM needed
$$;

-- Reclaim one table of one slot, in a transaction of its own (the caller sets
-- a short lock_timeout). The lock comes first, so the check after it sees
-- every row that will ever be in the table (a writer still open holds the
-- lock off), and the transaction holds one exclusive lock and waits for
-- nothing else, so it cannot deadlock with claims or completions.
--   receipts:      every receipt has its closure (attempts still open move to
--                  the mutable lane first: jobs running longer than the ring's
--                  span do not pin it), and the ready rows they were claimed
--                  from are gone (a ready row without its receipt would read
--                  as available).
--   closures, heartbeats: the slot's receipts are gone (both are written only
--                  for a receipt that exists, so none can arrive after this).
--   ready:         every row is in a tick every lane of its queue has passed,
--                  and no open attempt (of any slot) started from it.
--   ready_cancels: the slot's ready rows are gone.
--   claim_log:     always: the ticks still needed move to the current slot.
-- True if the table was truncated; false if it was empty or not yet spent.
-- SECURITY DEFINER, as the partition functions (0010): TRUNCATE is the
-- owner's right, and the runtime role only calls it (docs/security.md).
CREATE FUNCTION awa.ring_reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
BEGIN
    IF family NOT IN ('ready', 'ready_cancels', 'receipts', 'closures', 'heartbeats',
                      'claim_log') THEN
        RAISE EXCEPTION 'no such ring table: %', family;
    END IF;
    IF s = awa.ring_slot() THEN
        RETURN false;  -- the slot being written
    END IF;
    EXECUTE format('LOCK TABLE awa.%I IN ACCESS EXCLUSIVE MODE', family || '_' || s);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', family || '_' || s) INTO ok;
    IF NOT ok THEN
        RETURN false;
    END IF;
    IF family = 'receipts' THEN
        PERFORM awa.ring_materialize(array_agg(r.slot), array_agg(r.id), array_agg(r.run_lease))
        FROM awa.receipts r
        WHERE r.slot = s AND NOT EXISTS (
            SELECT 1 FROM awa.closures c
            WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease)
        HAVING count(*) > 0;
    END IF;
    ok := CASE family
        WHEN 'ready_cancels' THEN NOT EXISTS (SELECT 1 FROM awa.ready WHERE slot = s)
        WHEN 'receipts' THEN NOT EXISTS (
            SELECT 1 FROM awa.receipts r WHERE r.slot = s AND NOT EXISTS (
                SELECT 1 FROM awa.closures c
                WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease))
            -- A receipt outlives the ready row it was claimed from: a ready row
            -- with no receipt reads as available (awa.jobs_all, counts).
            AND NOT EXISTS (
                SELECT 1 FROM awa.receipts r
                JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id
                                AND w.lease_base = r.run_lease - 1
                WHERE r.slot = s)
        WHEN 'closures' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        WHEN 'heartbeats' THEN NOT EXISTS (SELECT 1 FROM awa.receipts WHERE slot = s)
        WHEN 'ready' THEN
            -- Every row passed by every lane of its queue (the tick before the
            -- oldest lane cursor shows it), none left to a later tick.
            NOT EXISTS (
                SELECT 1 FROM (SELECT DISTINCT w.queue FROM awa.ready w WHERE w.slot = s) q
                LEFT JOIN LATERAL (
                    SELECT c.snap FROM awa.claim_log c
                    WHERE c.queue = q.queue
                      AND c.n = (SELECT min(t) - 1 FROM (
                                     SELECT l.cur_tick FROM awa.claim_log l
                                     WHERE l.queue = q.queue ORDER BY l.n DESC LIMIT 1) z,
                                 unnest(z.cur_tick) t)
                ) spent ON true
                WHERE spent.snap IS NULL OR EXISTS (
                    SELECT 1 FROM awa.ready w
                    WHERE w.slot = s AND w.queue = q.queue
                      AND NOT pg_visible_in_snapshot(w.xid, spent.snap)))
            AND NOT EXISTS (
                SELECT 1 FROM awa.receipts r WHERE r.ready_slot = s AND NOT EXISTS (
                    SELECT 1 FROM awa.closures c
                    WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease))
        ELSE
            -- claim_log: the ticks a queue's cursors still need (from the one
            -- before its oldest lane cursor on, the newest always) move to the
            -- current slot, so an idle queue does not pin the ring; the rest
            -- are spent. The table's lock keeps claims from reading it meanwhile.
            awa.ring_carry_ticks(s) >= 0
    END;
    IF ok THEN
        EXECUTE format('TRUNCATE awa.%I', family || '_' || s);
    END IF;
    RETURN ok;
END $$;

-- How many ring jobs of p_queue are available, counting at most p_cap: per
-- lane, the rest of the tick its cursor is in, then every row that became
-- visible after that tick, less those passed over. Counts and backpressure
-- read this; a claim never does.
CREATE FUNCTION awa.ring_available(p_queue text, p_cap int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last  awa.claim_log;
    s_now pg_snapshot := pg_current_snapshot();
    total bigint := 0;
    lo    pg_snapshot;
    hi    pg_snapshot;
    t     bigint;
BEGIN
    SELECT * INTO last FROM awa.claim_log c WHERE c.queue = p_queue ORDER BY c.n DESC LIMIT 1;
    FOR p IN 1..4 LOOP
        EXIT WHEN total >= p_cap;
        t := coalesce(last.cur_tick[p], 1);
        lo := CASE WHEN t = 1 THEN '1:1:'::pg_snapshot ELSE
              (SELECT c.snap FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t - 1) END;
        IF t <= coalesce(last.n, 0) THEN
            hi := (SELECT c.snap FROM awa.claim_log c WHERE c.queue = p_queue AND c.n = t);
        ELSE
            hi := s_now;
        END IF;
        total := total + (SELECT count(*) FROM awa.ring_window(
            p_queue, p::smallint, lo, hi, coalesce(last.cur_xid[p], '0'),
            coalesce(last.cur_id[p], 0), p_cap) w
            WHERE NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                              WHERE k.slot = w.slot AND k.id = w.id
                                AND k.lease_base = w.lease_base));
        IF t <= coalesce(last.n, 0) THEN
            total := total + (SELECT count(*) FROM awa.ring_window(
                p_queue, p::smallint, hi, s_now, '0', 0, p_cap) w
                WHERE NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                                  WHERE k.slot = w.slot AND k.id = w.id
                                    AND k.lease_base = w.lease_base));
        END IF;
    END LOOP;
    RETURN least(total, p_cap);
END $$;

-- The ring's tables that hold rows, by family and slot (what reclaim looks at):
-- one probe per partition, none of them locked.
CREATE FUNCTION awa.ring_occupied() RETURNS TABLE (family text, slot smallint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f  text;
    ok boolean;
BEGIN
    FOR s IN 0..3 LOOP
        FOREACH f IN ARRAY ARRAY['receipts', 'closures', 'heartbeats', 'ready',
                                 'ready_cancels', 'claim_log'] LOOP
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', f || '_' || s) INTO ok;
            IF ok THEN
                family := f;
                slot := s;
                RETURN NEXT;
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- Every active job, whichever lane holds it: awa.jobs's rows, and the ring's
-- available jobs (a ready row no claim took and no one passed over) and
-- running ones (open receipts) as the rows awa.jobs would hold for them. A
-- finished ring job is in awa.jobs_done, a moved one in awa.jobs. Counts,
-- lists and the UI read this; a claim never does. The columns are written out
-- (not awa.ready_job), so a filter on id or queue reaches the ring's indexes.
CREATE VIEW awa.jobs_active AS
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
           run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
           tags, metadata, errors, progress, output, unique_key, unique_states,
           ordering_key, callback_id, callback_timeout_at,
           concurrency_key, concurrency_limit, concurrency_slot
    FROM awa.jobs
    UNION ALL
    SELECT w.id, w.kind, w.queue, w.args, 'available', w.priority, w.attempt, w.max_attempts,
           w.lease_base, w.run_at, w.created_at, NULL, NULL, NULL, NULL, w.tags, w.metadata,
           w.errors, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM awa.ready w
    WHERE NOT EXISTS (SELECT 1 FROM awa.receipts r
                      WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
      AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                      WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base)
    UNION ALL
    SELECT w.id, w.kind, w.queue, w.args, 'running', w.priority, (w.attempt + 1)::smallint,
           w.max_attempts, r.run_lease, w.run_at, w.created_at, r.claimed_at,
           coalesce((SELECT max(h.at) FROM awa.heartbeats h
                     WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease),
                    r.claimed_at),
           r.deadline_at, NULL, w.tags, w.metadata, w.errors, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL
    FROM awa.receipts r
    JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id AND w.lease_base = r.run_lease - 1
    WHERE NOT EXISTS (SELECT 1 FROM awa.closures c
                      WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease);

-- awa.jobs_all shows the ring's jobs too. Its columns stay as they were, so
-- its grants stay.
CREATE OR REPLACE VIEW awa.jobs_all AS
    SELECT * FROM awa.jobs_active
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

-- The available ring jobs of queue p_queue move to the mutable lane (an
-- operator's drain of the queue acts on them there); their ids.
CREATE FUNCTION awa.ring_queue_to_mutable(p_queue text) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT awa.ring_unready(ARRAY(
        SELECT w.id FROM awa.ready w
        WHERE w.queue = p_queue
          AND NOT EXISTS (SELECT 1 FROM awa.receipts r
                          WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)))
$$;

-- As 0010 does for the partition functions: only roles granted it (the
-- runtime role, `awa grants`) may truncate ring slots through the owner.
REVOKE EXECUTE ON FUNCTION awa.ring_reclaim(text, smallint) FROM PUBLIC;
