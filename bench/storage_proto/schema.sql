-- Prototype of the append-only queue core (issue 42; design in docs/storage.md).
-- Applied to a scratch schema by bench/storage_proto/run.py; not part of the
-- package. Every hot-path write is an INSERT into a ring partition; space is
-- reclaimed by TRUNCATE of a whole partition, which needs no vacuum and does
-- not wait for the xmin horizon.

DROP SCHEMA IF EXISTS awa_proto CASCADE;
CREATE SCHEMA awa_proto;

-- Which ring slot new rows go to. One row, updated once per rotation.
CREATE TABLE awa_proto.ring (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    slot smallint NOT NULL,
    slots smallint NOT NULL,
    rotated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO awa_proto.ring (slot, slots) VALUES (0, 8);

CREATE FUNCTION awa_proto.current_slot() RETURNS smallint
LANGUAGE sql STABLE AS $$ SELECT slot FROM awa_proto.ring $$;

-- Available jobs: immutable once written. xid is the inserting transaction's
-- (top-level) id: a claim learns which rows became visible between two of its
-- snapshots from it, so it never walks rows that were already claimed.
CREATE TABLE awa_proto.ready (
    slot       smallint NOT NULL DEFAULT awa_proto.current_slot(),
    id         bigint NOT NULL,
    queue      text NOT NULL,
    priority   smallint NOT NULL,
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind       text NOT NULL,
    args       jsonb NOT NULL,
    lease_base bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX ON awa_proto.ready (queue, priority, xid, id);
CREATE INDEX ON awa_proto.ready (id);

-- An available ring job cancelled before any claim took it, in its ready
-- row's slot: claims pass over it. Written under the queue's claim lock, so a
-- claim and a cancel of one job cannot cross.
CREATE TABLE awa_proto.ready_cancels (
    slot       smallint NOT NULL,
    id         bigint NOT NULL,
    lease_base bigint NOT NULL
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX ON awa_proto.ready_cancels (slot, id, lease_base);

-- One row per claim transaction: its snapshot (the tick) and where each
-- priority lane's cursor stands after it: all rows of ticks before cur_tick
-- are spent, and of tick cur_tick those up to (cur_xid, cur_id).
CREATE TABLE awa_proto.claim_log (
    slot     smallint NOT NULL DEFAULT awa_proto.current_slot(),
    queue    text NOT NULL,
    n        bigint NOT NULL,
    snap     pg_snapshot NOT NULL,
    cur_tick bigint[] NOT NULL,
    cur_xid  xid8[] NOT NULL,
    cur_id   bigint[] NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX ON awa_proto.claim_log (queue, n);

-- One row per claimed attempt (the receipt) and one per finished attempt
-- (the closure), in the same slot: the unique index is the run-lease guard,
-- so a rescue and a late completion of the same attempt cannot both land.
CREATE TABLE awa_proto.receipts (
    slot       smallint NOT NULL,
    id         bigint NOT NULL,
    run_lease  bigint NOT NULL,
    queue      text NOT NULL,
    ready_slot smallint NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX ON awa_proto.receipts (slot, id, run_lease);
CREATE INDEX ON awa_proto.receipts (id);

CREATE TABLE awa_proto.closures (
    slot      smallint NOT NULL,
    id        bigint NOT NULL,
    run_lease bigint NOT NULL,
    outcome   smallint NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE UNIQUE INDEX ON awa_proto.closures (slot, id, run_lease);

-- "Attempt (id, lease) was alive at": one row per heartbeat, in its receipt's
-- slot. A job shorter than the heartbeat interval never writes one.
CREATE TABLE awa_proto.heartbeats (
    slot      smallint NOT NULL,
    id        bigint NOT NULL,
    run_lease bigint NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
) PARTITION BY LIST (slot);
CREATE INDEX ON awa_proto.heartbeats (slot, id, run_lease, at);

-- Finished jobs (history), append-only; the real schema keeps awa.jobs_done.
CREATE TABLE awa_proto.done (
    id bigint NOT NULL, queue text NOT NULL, kind text NOT NULL, args jsonb NOT NULL,
    run_lease bigint NOT NULL, created_at timestamptz NOT NULL,
    finalized_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON awa_proto.done (id);

DO $$
BEGIN
    FOR s IN 0..7 LOOP
        EXECUTE format('CREATE TABLE awa_proto.ready_%s PARTITION OF awa_proto.ready FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE awa_proto.claim_log_%s PARTITION OF awa_proto.claim_log FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE awa_proto.ready_cancels_%s PARTITION OF awa_proto.ready_cancels FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE awa_proto.receipts_%s PARTITION OF awa_proto.receipts FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE awa_proto.closures_%s PARTITION OF awa_proto.closures FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE awa_proto.heartbeats_%s PARTITION OF awa_proto.heartbeats FOR VALUES IN (%s)', s, s);
    END LOOP;
END $$;

CREATE SEQUENCE awa_proto.job_id;

-- The mutable lane, as awa.jobs is today (reduced to what a claim reads): the
-- jobs that need coordination state stay here, and the claim reads both lanes.
CREATE TABLE awa_proto.jobs (
    id        bigint PRIMARY KEY,
    queue     text NOT NULL,
    priority  smallint NOT NULL,
    state     text NOT NULL DEFAULT 'available',
    run_lease bigint NOT NULL DEFAULT 0,
    run_at    timestamptz NOT NULL DEFAULT now(),
    kind      text NOT NULL,
    args      jsonb NOT NULL
);
CREATE INDEX ON awa_proto.jobs (queue, priority, run_at, id) WHERE state = 'available';

-- The rows of lane (queue, priority) that became visible between snapshots
-- lo and hi, after position (x, i), in (xid, id) order. Rows of transactions
-- that were running at lo and ended by hi come first, from exact index probes
-- (one per such transaction); then rows of transactions that started after
-- lo, from one index range. A transaction running at both (an idle one
-- holding the xmin horizon) costs nothing. Neither read touches a spent row.
CREATE FUNCTION awa_proto.window_rows(p_queue text, p_priority smallint,
                                      lo pg_snapshot, hi pg_snapshot,
                                      x xid8, i bigint, lim int)
RETURNS SETOF awa_proto.ready
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    e xid8;
    n int := 0;
    r awa_proto.ready;
BEGIN
    FOR e IN SELECT v FROM pg_snapshot_xip(lo) v
             WHERE v >= x AND pg_visible_in_snapshot(v, hi) ORDER BY v LOOP
        FOR r IN SELECT * FROM awa_proto.ready w
                 WHERE w.queue = p_queue AND w.priority = p_priority AND w.xid = e
                   AND w.id > CASE WHEN e = x THEN i ELSE 0 END
                 ORDER BY w.id LIMIT lim - n LOOP
            n := n + 1;
            RETURN NEXT r;
        END LOOP;
        IF n >= lim THEN RETURN; END IF;
    END LOOP;
    RETURN QUERY
        SELECT * FROM awa_proto.ready w
        WHERE w.queue = p_queue AND w.priority = p_priority
          -- The start key: just after (x, i), or the first row of a
          -- transaction that started after lo, whichever is later.
          AND (w.xid, w.id) > (greatest(pg_snapshot_xmax(lo), x),
                               CASE WHEN x >= pg_snapshot_xmax(lo) THEN i ELSE 0 END)
          AND w.xid < pg_snapshot_xmax(hi)
          AND pg_visible_in_snapshot(w.xid, hi)
        ORDER BY w.xid, w.id LIMIT lim - n;
END $$;

-- Claim up to p_max jobs of p_queue, priority 1 first. Claims of one queue
-- take turns (a transaction-scoped advisory lock); each adds one claim_log
-- row, one receipt per job, and changes no row.
CREATE FUNCTION awa_proto.claim(p_queue text, p_max int)
RETURNS TABLE (id bigint, kind text, args jsonb, run_lease bigint, receipt_slot smallint,
               ready_slot smallint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    last     awa_proto.claim_log;
    s_now    pg_snapshot;
    n_new    bigint;
    ticks    bigint[];
    xs       xid8[];
    ids      bigint[];
    p        int;
    t        bigint;
    x        xid8;
    i        bigint;
    want     int := p_max;
    got      int;
    lo       pg_snapshot;
    hi       pg_snapshot;
    r        awa_proto.ready;
    m        record;
    seen     int;
    asked    int;
    passed   int := 0;
    cancels  boolean;
    rslot    smallint := awa_proto.current_slot();
    c_ids    bigint[] := '{}';
    c_leases bigint[] := '{}';
    c_slots  smallint[] := '{}';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('awa.claim:' || p_queue, 0));
    -- Everything read from here on is read after the lock, in a fresh snapshot:
    -- the last claim's row, and the cancels committed under the lock before it.
    SELECT * INTO last FROM awa_proto.claim_log c WHERE c.queue = p_queue
    ORDER BY c.n DESC LIMIT 1;
    cancels := EXISTS (SELECT 1 FROM awa_proto.ready_cancels);
    s_now := pg_current_snapshot();
    IF last.n IS NULL THEN
        n_new := 1;
        ticks := ARRAY[1, 1, 1, 1]; xs := ARRAY['0', '0', '0', '0']::xid8[]; ids := ARRAY[0, 0, 0, 0];
    ELSE
        n_new := last.n + 1;
        ticks := last.cur_tick; xs := last.cur_xid; ids := last.cur_id;
    END IF;
    FOR p IN 1..4 LOOP
        -- The mutable lane's jobs of this priority first (they are the fewer),
        -- then the ring's: priority orders across both lanes, age within each.
        IF want > 0 THEN
            FOR m IN UPDATE awa_proto.jobs j SET state = 'running', run_lease = j.run_lease + 1
                     WHERE j.id IN (SELECT a.id FROM awa_proto.jobs a
                                    WHERE a.queue = p_queue AND a.priority = p
                                      AND a.state = 'available'
                                    ORDER BY a.run_at, a.id LIMIT want FOR UPDATE SKIP LOCKED)
                     RETURNING j.id, j.kind, j.args, j.run_lease LOOP
                id := m.id; kind := m.kind; args := m.args; run_lease := m.run_lease;
                receipt_slot := NULL; ready_slot := NULL;  -- the mutable lane: no receipt
                want := want - 1;
                RETURN NEXT;
            END LOOP;
        END IF;
        t := ticks[p]; x := xs[p]; i := ids[p];
        WHILE t <= n_new LOOP
            IF want = 0 THEN EXIT; END IF;
            IF t = 1 THEN lo := '1:1:';
            ELSIF t - 1 = last.n THEN lo := last.snap;  -- a lane that is caught up: no lookup
            ELSE SELECT c.snap INTO lo FROM awa_proto.claim_log c WHERE c.queue = p_queue AND c.n = t - 1;
            END IF;
            IF t = n_new THEN hi := s_now;
            ELSE SELECT c.snap INTO hi FROM awa_proto.claim_log c WHERE c.queue = p_queue AND c.n = t;
            END IF;
            got := 0; seen := 0; asked := want;
            FOR r IN SELECT * FROM awa_proto.window_rows(p_queue, p::smallint, lo, hi, x, i, want) LOOP
                seen := seen + 1;
                x := r.xid; i := r.id;
                IF cancels AND EXISTS (SELECT 1 FROM awa_proto.ready_cancels c
                                       WHERE c.slot = r.slot AND c.id = r.id
                                         AND c.lease_base = r.lease_base) THEN
                    passed := passed + 1;  -- cancelled while available: passed over
                    CONTINUE;
                END IF;
                got := got + 1;
                id := r.id; kind := r.kind; args := r.args; run_lease := r.lease_base + 1;
                receipt_slot := rslot; ready_slot := r.slot;
                c_ids := c_ids || r.id; c_leases := c_leases || (r.lease_base + 1);
                c_slots := c_slots || r.slot;
                RETURN NEXT;
            END LOOP;
            want := want - got;
            IF seen < asked THEN  -- tick t is spent: the lane moves to the next one
                t := t + 1; x := '0'; i := 0;
            END IF;
        END LOOP;
        ticks[p] := t; xs[p] := x; ids[p] := i;
    END LOOP;
    -- A claim that took nothing from the ring while every lane was caught up
    -- writes nothing: its window was empty, and the next claim's window (from
    -- the same last tick) covers it. So an idle queue's polls stay read-only:
    -- no transaction id, no WAL, no commit to flush.
    IF cardinality(c_ids) = 0 AND passed = 0 AND last.n IS NOT NULL
       AND last.cur_tick = array_fill(last.n + 1, ARRAY[4]) THEN
        RETURN;
    END IF;
    INSERT INTO awa_proto.receipts (slot, id, run_lease, queue, ready_slot)
    SELECT rslot, u.i, u.l, p_queue, u.s FROM unnest(c_ids, c_leases, c_slots) AS u(i, l, s);
    INSERT INTO awa_proto.claim_log (queue, n, snap, cur_tick, cur_xid, cur_id)
    VALUES (p_queue, n_new, s_now, ticks, xs, ids);
END $$;

-- Maintenance: reclaim one table of one slot, in a transaction of its own
-- (the caller sets a short lock_timeout). The lock comes first, so the check
-- after it sees every row that will ever be in the table (a writer still open
-- would hold the lock off), and a transaction holds one exclusive lock and
-- waits for nothing else: reclaiming cannot deadlock with claims or
-- completions, which a truncate of several tables at once did.
--   receipts_s: every receipt has its closure.
--   closures_s, heartbeats_s: receipts_s is empty (both are only written for
--               a receipt that exists, so none can arrive after this).
--   ready_s:    every row is in a tick that every lane has passed, and no
--               open attempt (in any slot) still reads it.
--   claim_log_s: every tick is older than the oldest lane cursor needs.
CREATE FUNCTION awa_proto.reclaim(family text, s smallint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    min_tick bigint;
    spent    pg_snapshot;
    ok       boolean;
BEGIN
    IF family NOT IN ('ready', 'ready_cancels', 'receipts', 'closures', 'heartbeats',
                      'claim_log') THEN
        RAISE EXCEPTION 'no such table family: %', family;
    END IF;
    EXECUTE format('LOCK TABLE awa_proto.%I IN ACCESS EXCLUSIVE MODE', family || '_' || s);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa_proto.%I)', family || '_' || s) INTO ok;
    IF NOT ok THEN
        RETURN false;  -- empty already
    END IF;
    SELECT min(t) INTO min_tick FROM (
        SELECT DISTINCT ON (queue) cur_tick FROM awa_proto.claim_log ORDER BY queue, n DESC) c,
        unnest(c.cur_tick) t;
    SELECT c.snap INTO spent FROM awa_proto.claim_log c WHERE c.n = min_tick - 1;
    IF family = 'receipts' THEN
        -- Attempts still open in a slot old enough to reclaim (jobs running for
        -- longer than the ring's span) move to the mutable lane.
        PERFORM awa_proto.materialize(r.slot, r.id, r.run_lease)
        FROM awa_proto.receipts r WHERE r.slot = s AND NOT EXISTS (
            SELECT 1 FROM awa_proto.closures c
            WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease);
    END IF;
    ok := CASE
        WHEN family = 'ready_cancels' THEN NOT EXISTS (SELECT 1 FROM awa_proto.ready WHERE slot = s)
        WHEN family = 'receipts' THEN NOT EXISTS (
            SELECT 1 FROM awa_proto.receipts r WHERE r.slot = s AND NOT EXISTS (
                SELECT 1 FROM awa_proto.closures c
                WHERE c.slot = s AND c.id = r.id AND c.run_lease = r.run_lease))
        WHEN family IN ('closures', 'heartbeats') THEN NOT EXISTS (SELECT 1 FROM awa_proto.receipts WHERE slot = s)
        WHEN family = 'ready' THEN spent IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM awa_proto.ready r WHERE r.slot = s
                            AND NOT pg_visible_in_snapshot(r.xid, spent))
            AND NOT EXISTS (SELECT 1 FROM awa_proto.receipts r WHERE r.ready_slot = s
                            AND NOT EXISTS (SELECT 1 FROM awa_proto.closures c
                                WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease))
        ELSE min_tick IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM awa_proto.claim_log c WHERE c.slot = s AND c.n >= min_tick - 1)
    END;
    IF ok THEN
        EXECUTE format('TRUNCATE awa_proto.%I', family || '_' || s);
    END IF;
    RETURN ok;
END $$;

-- Move the ring on when the next slot is empty.
CREATE FUNCTION awa_proto.advance() RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    nxt smallint;
BEGIN
    SELECT (slot + 1) % slots INTO nxt FROM awa_proto.ring;
    IF EXISTS (SELECT 1 FROM awa_proto.ready WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa_proto.receipts WHERE slot = nxt)
       OR EXISTS (SELECT 1 FROM awa_proto.claim_log WHERE slot = nxt) THEN
        RETURN NULL;
    END IF;
    UPDATE awa_proto.ring SET slot = nxt, rotated_at = clock_timestamp();
    RETURN nxt;
END $$;

-- Rescue: every open attempt (a receipt without a closure) not heard from
-- (heartbeat, else claim) for p_stale is closed as rescued and its job put back
-- as a new ready row, the next attempt starting from its run lease. The closure
-- is the guard: a worker that finishes the rescued attempt later finds it and
-- writes nothing. Returns how many were rescued.
CREATE FUNCTION awa_proto.rescue(p_stale interval) RETURNS integer
LANGUAGE sql AS $$
    WITH stale AS (
        SELECT r.* FROM awa_proto.receipts r
        WHERE r.claimed_at < now() - p_stale
          AND NOT EXISTS (SELECT 1 FROM awa_proto.closures c
                          WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
          AND NOT EXISTS (SELECT 1 FROM awa_proto.heartbeats h
                          WHERE h.slot = r.slot AND h.id = r.id AND h.run_lease = r.run_lease
                            AND h.at >= now() - p_stale)
    ), closed AS (
        INSERT INTO awa_proto.closures (slot, id, run_lease, outcome)
        SELECT slot, id, run_lease, 3 FROM stale
        ON CONFLICT DO NOTHING RETURNING id, run_lease
    ), again AS (
        INSERT INTO awa_proto.ready (id, queue, priority, kind, args, lease_base, created_at)
        SELECT w.id, w.queue, w.priority, w.kind, w.args, c.run_lease, w.created_at
        FROM closed c JOIN stale s USING (id, run_lease)
        CROSS JOIN LATERAL (SELECT * FROM awa_proto.ready w
                            WHERE w.slot = s.ready_slot AND w.id = s.id LIMIT 1) w
        RETURNING 1
    )
    SELECT count(*)::integer FROM again
$$;

-- A heartbeat of attempt (slot, id, lease), written only while it is open.
CREATE FUNCTION awa_proto.heartbeat(p_slot smallint, p_id bigint, p_lease bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH hb AS (
        INSERT INTO awa_proto.heartbeats (slot, id, run_lease)
        SELECT p_slot, p_id, p_lease
        WHERE EXISTS (SELECT 1 FROM awa_proto.receipts
                      WHERE slot = p_slot AND id = p_id AND run_lease = p_lease)
          AND NOT EXISTS (SELECT 1 FROM awa_proto.closures
                          WHERE slot = p_slot AND id = p_id AND run_lease = p_lease)
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM hb)
$$;

-- Move an open ring attempt to the mutable lane, where attempts with mutable
-- state live (callbacks, progress) and where a long one no longer pins its
-- slot: a closure ("moved") and a running row with the same run lease. The
-- worker's ring completion then writes nothing, and it finishes the attempt on
-- the mutable lane. False if the attempt was not open.
CREATE FUNCTION awa_proto.materialize(p_slot smallint, p_id bigint, p_lease bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH r AS (
        SELECT * FROM awa_proto.receipts
        WHERE slot = p_slot AND id = p_id AND run_lease = p_lease
    ), c AS (
        INSERT INTO awa_proto.closures (slot, id, run_lease, outcome)
        SELECT slot, id, run_lease, 5 FROM r
        ON CONFLICT DO NOTHING RETURNING id, run_lease
    ), m AS (
        INSERT INTO awa_proto.jobs (id, queue, priority, state, run_lease, kind, args)
        SELECT w.id, w.queue, w.priority, 'running', c.run_lease, w.kind, w.args
        FROM c JOIN r USING (id, run_lease)
        CROSS JOIN LATERAL (SELECT * FROM awa_proto.ready w
                            WHERE w.slot = r.ready_slot AND w.id = r.id LIMIT 1) w
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM m)
$$;

-- Cancel ring job p_id: 'available' (a claim will pass over it), 'running' (its
-- attempt is closed as cancelled; the worker's completion writes nothing), or
-- NULL (no such open job). Under the queue's claim lock, so no claim crosses it.
CREATE FUNCTION awa_proto.cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r  awa_proto.ready;
    rc awa_proto.receipts;
BEGIN
    SELECT * INTO r FROM awa_proto.ready WHERE id = p_id ORDER BY lease_base DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('awa.claim:' || r.queue, 0));
    SELECT * INTO rc FROM awa_proto.receipts WHERE id = p_id AND run_lease = r.lease_base + 1;
    IF FOUND THEN
        INSERT INTO awa_proto.closures (slot, id, run_lease, outcome)
        VALUES (rc.slot, p_id, rc.run_lease, 4) ON CONFLICT DO NOTHING;
        RETURN CASE WHEN FOUND THEN 'running' END;
    END IF;
    INSERT INTO awa_proto.ready_cancels (slot, id, lease_base)
    VALUES (r.slot, p_id, r.lease_base) ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN 'available' END;
END $$;

-- How many ring jobs of p_queue are available (claimable now), counting at
-- most p_cap: per lane, the rest of the tick its cursor is in, then every row
-- that became visible after that tick, less the cancelled ones. Backpressure
-- and queue stats read this; a claim never does.
CREATE FUNCTION awa_proto.available(p_queue text, p_cap int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last  awa_proto.claim_log;
    s_now pg_snapshot := pg_current_snapshot();
    total bigint := 0;
    lo    pg_snapshot;
    hi    pg_snapshot;
    t     bigint;
BEGIN
    SELECT * INTO last FROM awa_proto.claim_log c WHERE c.queue = p_queue
    ORDER BY c.n DESC LIMIT 1;
    FOR p IN 1..4 LOOP
        EXIT WHEN total >= p_cap;
        t := coalesce(last.cur_tick[p], 1);
        lo := CASE WHEN t = 1 THEN '1:1:'::pg_snapshot ELSE
              (SELECT c.snap FROM awa_proto.claim_log c WHERE c.queue = p_queue AND c.n = t - 1) END;
        IF t <= coalesce(last.n, 0) THEN  -- tick t is recorded; rows after it come next
            hi := (SELECT c.snap FROM awa_proto.claim_log c WHERE c.queue = p_queue AND c.n = t);
        ELSE
            hi := s_now;
        END IF;
        total := total + (SELECT count(*) FROM awa_proto.window_rows(
            p_queue, p::smallint, lo, hi, coalesce(last.cur_xid[p], '0'),
            coalesce(last.cur_id[p], 0), p_cap) w
            WHERE NOT EXISTS (SELECT 1 FROM awa_proto.ready_cancels k
                              WHERE k.slot = w.slot AND k.id = w.id AND k.lease_base = w.lease_base));
        IF t <= coalesce(last.n, 0) THEN  -- and everything after tick t
            total := total + (SELECT count(*) FROM awa_proto.window_rows(
                p_queue, p::smallint, hi, s_now, '0', 0, p_cap) w
                WHERE NOT EXISTS (SELECT 1 FROM awa_proto.ready_cancels k
                                  WHERE k.slot = w.slot AND k.id = w.id
                                    AND k.lease_base = w.lease_base));
        END IF;
    END LOOP;
    RETURN least(total, p_cap);
END $$;
