-- Per-key concurrency (migration 0011, docs/guide/concurrency-keys.md).
--
-- A keyed job runs in a slot of its key, 1..limit; the unique index
-- jobs_concurrency_slot_idx admits one job in flight per (key, slot), so no
-- claim, however it races another, can put more than `limit` jobs of a key in
-- flight: a claim that picks a slot another claim took meanwhile fails with
-- unique_violation, and the dispatcher claims again (see worker/keyed.py).

-- fragment: concurrency_key_grant
-- For the key head `h` (key, lim) the walk just reached, with `h.want` jobs
-- still to find: the slots its jobs in flight hold (`t.taken`, one probe of
-- the slot index) and how many of its available jobs this claim takes
-- (`g.avail`: counted from its head job up to the smaller of its free slots
-- and what the claim still wants, never further). A key with a free slot is also try-locked for
-- this transaction, so two claims racing for one key rarely pick the same
-- slot: the one that does not get the lock passes the key by this time.
-- `OFFSET 0` keeps each subquery a unit the planner runs once per key: pulled
-- up, `t.taken` was read again for every place it is used (three probes).
LATERAL (SELECT array(SELECT r.concurrency_slot FROM awa.jobs r
                      WHERE r.concurrency_key = h.key AND r.concurrency_slot IS NOT NULL
                        AND r.state IN ('running', 'waiting_external')) AS taken
         OFFSET 0) t,
LATERAL (SELECT CASE WHEN h.lim > cardinality(t.taken)
                      AND pg_try_advisory_xact_lock(hashtext('awa:concurrency_key'),
                                                    hashtext(h.key))
                     THEN (SELECT count(*) FROM (
                              SELECT 1 FROM awa.jobs a
                              WHERE a.state = 'available' AND a.queue = $1
                                AND a.concurrency_key = h.key
                                AND (a.priority, a.run_at, a.id) >= (h.hp, h.hr, h.hid)
                              LIMIT least(h.lim - cardinality(t.taken), h.want)) c)
                     ELSE 0 END AS avail
         OFFSET 0) g

-- fragment: keyed_claim_chunk
-- The keyed claims' first CTEs: queue open, unkeyed jobs at all, the range scan
-- of the next $2 keyed jobs from the cursor ($5) and what each of its keys gets.
open AS (
    -- A claim commits durably, and so does the slot it grants (claim_durably).
    SELECT {{claim_durably}}
           AND NOT EXISTS (SELECT 1 FROM awa.queues WHERE queue = $1 AND paused) AS ok,
           (SELECT key_max_in_flight FROM awa.queues WHERE queue = $1) AS queue_limit
), plain AS (
    -- Unkeyed jobs to claim at all? A probe of the claim index; without it a
    -- plan reused from when the queue held only keyed jobs scanned the whole
    -- table for unkeyed ones (estimated at one row).
    SELECT (SELECT ok FROM open) AND EXISTS (
        SELECT 1 FROM awa.jobs
        WHERE state = 'available' AND queue = $1 AND concurrency_key IS NULL) AS ok
), chunk AS MATERIALIZED (
    -- The next $2 keyed jobs in key order from the cursor, wrapping round to
    -- the first key: one range scan of the claim index that, when keys hold
    -- few jobs each, visits many keys at once (each key's head and how many
    -- of its jobs wait, without a probe per key).
    SELECT * FROM (
        SELECT * FROM (
            SELECT a.concurrency_key AS key,
                   coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1) AS lim,
                   a.priority AS hp, a.run_at AS hr, a.id AS hid, false AS wrap,
                   a.ctid AS tid
            FROM awa.jobs a
            WHERE a.state = 'available' AND a.queue = $1 AND a.concurrency_key IS NOT NULL
              AND a.concurrency_key > $5::text AND (SELECT ok FROM open)
            ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT $2) after_cursor
        UNION ALL
        SELECT * FROM (
            SELECT a.concurrency_key,
                   coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1),
                   a.priority, a.run_at, a.id, true, a.ctid
            FROM awa.jobs a
            WHERE a.state = 'available' AND a.queue = $1 AND a.concurrency_key IS NOT NULL
              AND a.concurrency_key <= $5::text AND (SELECT ok FROM open)
            ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT $2) from_start
        LIMIT $2) c
), chunk_ranked AS MATERIALIZED (
    -- The chunk's jobs numbered within their key (1 = the key's head).
    SELECT c.*, row_number() OVER (PARTITION BY c.key ORDER BY c.hp, c.hr, c.hid) AS crn
    FROM chunk c
), chunk_keys AS MATERIALIZED (
    -- Each key of the chunk (in walk order, its head first) and what it gets:
    -- up to its free slots of the jobs the chunk holds of it.
    SELECT k.*, row_number() OVER (ORDER BY k.wrap, k.key) AS visit, t.taken,
           CASE WHEN k.lim > cardinality(t.taken)
                 AND pg_try_advisory_xact_lock(hashtext('awa:concurrency_key'),
                                               hashtext(k.key))
                THEN least(k.n, k.lim - cardinality(t.taken)) ELSE 0 END AS take
    FROM (SELECT DISTINCT ON (c.wrap, c.key) c.key, c.lim, c.hp, c.hr, c.hid, c.wrap,
                 count(*) OVER (PARTITION BY c.key) AS n
          FROM chunk c ORDER BY c.wrap, c.key, c.hp, c.hr, c.hid) k,
    LATERAL (SELECT array(SELECT r.concurrency_slot FROM awa.jobs r
                          WHERE r.concurrency_key = k.key AND r.concurrency_slot IS NOT NULL
                            AND r.state IN ('running', 'waiting_external')) AS taken
             OFFSET 0) t
)

-- fragment: keyed_claim_grants
-- The free slots of each key granted (`visited`: the keys met), and the jobs of
-- the chunk's keys locked where the range scan saw them.
grants AS MATERIALIZED (
    -- The free slots of each key the walk grants, lowest first, as many as it
    -- takes of the key: its rn-th job gets free[rn]. Computed once per key
    -- (MATERIALIZED: inlined, the array was built again for every job).
    SELECT w.key, w.hp, w.hr, w.hid, w.take, w.chunked,
           array(SELECT s FROM generate_series(1, cardinality(w.taken) + w.take::integer) s
                 WHERE s <> ALL (w.taken) ORDER BY s LIMIT w.take) AS free
    FROM visited w
    WHERE w.take > 0
), chunk_locked AS (
    -- The jobs the chunk already found of its granted keys, as many of each as
    -- the key takes from its head, locked where the range scan saw them (by
    -- tuple id: no second index scan per key). A job claimed or finished
    -- meanwhile is skipped (its newer version is not available).
    SELECT a.id, a.priority, a.run_at, a.ordering_key, c.lim, c.key, a.ctid AS tid
    FROM chunk_ranked c JOIN grants g ON g.key = c.key AND g.chunked AND c.crn <= g.take
    JOIN awa.jobs a ON a.ctid = c.tid
    WHERE a.state = 'available' AND a.id = c.hid
    FOR UPDATE OF a SKIP LOCKED
)

-- fragment: keyed_claim_unkeyed
-- Unkeyed jobs as attempt_claim takes them (none unless `plain` found some).
c1 AS (
    SELECT id, priority, run_at, ordering_key, NULL::integer AS slot, ctid AS tid FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 1 AND concurrency_key IS NULL
      AND (SELECT ok FROM plain)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c2 AS (
    SELECT id, priority, run_at, ordering_key, NULL::integer AS slot, ctid AS tid FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 2 AND concurrency_key IS NULL
      AND (SELECT ok FROM plain)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c3 AS (
    SELECT id, priority, run_at, ordering_key, NULL::integer AS slot, ctid AS tid FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 3 AND concurrency_key IS NULL
      AND (SELECT ok FROM plain)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c4 AS (
    SELECT id, priority, run_at, ordering_key, NULL::integer AS slot, ctid AS tid FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 4 AND concurrency_key IS NULL
      AND (SELECT ok FROM plain)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
)

-- fragment: keyed_picked
-- What a keyed claim takes: the unkeyed candidates (c1..c4) and the keyed jobs
-- granted a slot, ordering keys respected, in priority (aged) order.
picked AS (
    SELECT id, slot, tid FROM (
        SELECT * FROM c1 UNION ALL SELECT * FROM c2 UNION ALL SELECT * FROM c3
        UNION ALL SELECT * FROM c4
        UNION ALL SELECT id, priority, run_at, ordering_key, slot, tid FROM keyed
        WHERE slot <= lim) c
    WHERE c.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM awa.jobs r
        WHERE r.queue = $1 AND r.ordering_key = c.ordering_key AND r.id < c.id)
    ORDER BY CASE WHEN $4::float8 > 0
                  THEN greatest(1, priority - floor((date_part('epoch', now())
                                                     - date_part('epoch', run_at)) / $4))
                  ELSE priority END,
             run_at, id
    LIMIT $2
)

-- fragment: keyed_claim_finish
-- Unkeyed jobs as attempt_claim takes them, then the claim of everything picked
-- (`keyed` holds the keyed jobs with their slots).
{{keyed_claim_unkeyed}}, {{keyed_picked}}, claimed AS (
    UPDATE awa.jobs j
    SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
        attempted_at = now(), heartbeat_at = now(), concurrency_slot = picked.slot,
        deadline_at = CASE WHEN $3::float8 > 0 THEN now() + make_interval(secs => $3) END
    -- By tuple id: every picked row is locked by this statement, so the id
    -- it was locked at is its current version (the id check is a guard).
    FROM picked WHERE j.ctid = picked.tid AND j.id = picked.id
    RETURNING {{claimed_row}},
              j.concurrency_key, j.concurrency_limit, j.concurrency_slot
)

-- name: attempt_claim_keyed
-- attempt_claim for a queue that holds keyed jobs: up to $2 jobs of queue $1
-- ($3 deadline seconds, $4 aging interval as in attempt_claim), unkeyed ones
-- exactly as attempt_claim takes them, keyed ones by walking the keys that
-- have available jobs in turn (round robin): from the first key after $5
-- (the cursor the previous claim returned, '' at first) to the last, then
-- from the first again, at most $6 keys. The walk begins with one range scan
-- of the next $2 keyed jobs in key order (`chunk`), which covers many keys at
-- once when each holds few jobs, and goes on key by key (`walk`) only if the
-- chunk's keys could not fill the claim. A key with every slot taken is
-- passed, so a saturated key never holds up the others.
-- Within a key, jobs go by priority, then age; each takes the lowest free
-- slot not above its own limit (its max_in_flight, else the queue's
-- key_max_in_flight, else 1). Returns attempt_claim's columns, then the key,
-- limit and slot, then the cursor for the next claim and whether the walk
-- stopped at $6 keys; with nothing claimed, one row whose id is NULL.
WITH RECURSIVE {{keyed_claim_chunk}}, walk(key, hp, hr, hid, taken, take, found, visits, wrapped) AS (
    -- Only when the chunk is full but its keys could not give $2 jobs (some at
    -- their limit): go on key by key from the chunk's last key. The first row
    -- is that last key again, with nothing to take.
    SELECT l.key, l.hp, l.hr, l.hid, '{}'::integer[], 0::bigint,
           (SELECT sum(take) FROM chunk_keys)::bigint, l.visit::integer, l.wrap
    FROM (SELECT * FROM chunk_keys ORDER BY visit DESC LIMIT 1) l
    WHERE (SELECT count(*) FROM chunk) = $2 AND (SELECT sum(take) FROM chunk_keys) < $2
    UNION ALL
    SELECT h.key, h.hp, h.hr, h.hid, t.taken, g.avail, w.found + w.take, w.visits + 1,
           w.wrapped OR h.wrap
    FROM walk w,
    LATERAL (SELECT *, $2 - w.found - w.take AS want FROM (SELECT * FROM (
                 SELECT a.concurrency_key AS key,
                        coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1) AS lim,
                        false AS wrap, a.priority AS hp, a.run_at AS hr, a.id AS hid
                 FROM awa.jobs a
                 WHERE a.state = 'available' AND a.queue = $1
                   AND a.concurrency_key IS NOT NULL AND a.concurrency_key > w.key
                 ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT 1) onward
             UNION ALL
             SELECT * FROM (
                 SELECT a.concurrency_key,
                        coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1), true,
                        a.priority, a.run_at, a.id
                 FROM awa.jobs a
                 WHERE a.state = 'available' AND a.queue = $1
                   AND a.concurrency_key IS NOT NULL AND NOT w.wrapped
                 ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT 1) wrap_around
             LIMIT 1) h0) h,
    {{concurrency_key_grant}}
    WHERE w.found + w.take < $2 AND w.visits < $6
      -- after wrapping around, stop on reaching the keys the walk began with
      AND NOT ((w.wrapped OR h.wrap) AND h.key > $5::text)
), visited AS (
    SELECT key, hp, hr, hid, taken, take, visit AS visits, true AS chunked FROM chunk_keys
    UNION ALL
    SELECT key, hp, hr, hid, taken, take, visits, false FROM walk
), {{keyed_claim_grants}}, keyed AS (
    -- Each granted key's jobs with the slots they get: its rn-th job locked
    -- takes free[rn]. The keys the walk found are locked from their head (the
    -- first job of it the walk saw): the index still holds entries of jobs
    -- claimed a moment ago, not yet marked dead, and only the first read
    -- steps over them.
    SELECT x.id, x.priority, x.run_at, x.ordering_key, x.lim, g.free[x.rn] AS slot, x.tid
    FROM (SELECT l.*, (row_number() OVER (PARTITION BY l.key
                                          ORDER BY l.priority, l.run_at, l.id))::integer AS rn
          FROM chunk_locked l) x
    JOIN grants g ON g.key = x.key AND g.chunked
    UNION ALL
    SELECT x.id, x.priority, x.run_at, x.ordering_key, x.lim, g.free[x.rn] AS slot, x.tid
    FROM grants g,
    LATERAL (SELECT l.*, (row_number() OVER (ORDER BY l.priority, l.run_at, l.id))::integer AS rn
             FROM (
                 SELECT a.id, a.priority, a.run_at, a.ordering_key, a.ctid AS tid,
                        coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1) AS lim
                 FROM awa.jobs a
                 WHERE a.state = 'available' AND a.queue = $1 AND a.concurrency_key = g.key
                   AND (a.priority, a.run_at, a.id) >= (g.hp, g.hr, g.hid)
                 ORDER BY a.priority, a.run_at, a.id LIMIT g.take
                 FOR UPDATE SKIP LOCKED) l) x
    WHERE NOT g.chunked
    -- Never reached (the grants add up to at most $2), but it caps the rows
    -- the planner expects: it guesses a tenth of each key's jobs per LIMIT
    -- g.take, and a plan costed on that crossed jit_above_cost with a big
    -- backlog (a JIT-compiled claim takes seconds).
    LIMIT 1000
), {{keyed_claim_finish}}
SELECT c.*, w.cursor, w.capped
FROM (SELECT coalesce((SELECT key FROM visited ORDER BY visits DESC LIMIT 1), $5::text)
               AS cursor,
             coalesce((SELECT max(visits) FROM visited), 0) >= $6 AS capped) w
LEFT JOIN claimed c ON true

-- fragment: keyed_chunk_grant
-- The common keyed claim's first CTEs, one pass over the next $2 keyed jobs:
-- `chunk` locks them where the range scan finds them (in key order from the
-- cursor $5, wrapping round) and numbers each within its key (`rn`, 1 = the
-- key's head; `n` of the key in the chunk); `grants` reads each key's taken
-- slots once (one probe of the slot index, from its head row) and says how
-- many of its jobs the claim takes and which free slots they get; `keyed`
-- gives the key's rn-th job free[rn] (the rn-th lowest free slot; with none
-- taken, simply rn); `w` is the cursor for the next claim, whether the
-- caller should walk on key by key (`walk`: the scan was full but its keys
-- could not fill the claim) and whether the queue has unkeyed jobs (`plain`).
-- A job locked here but not granted (its key at its limit) stays available:
-- its lock ends with this short transaction.
open AS (
    -- ($4, the aging interval, is named here only to type it for
    -- attempt_claim_keyed_only, which has no other use for it.)
    -- A claim commits durably, and so does the slot it grants (claim_durably).
    SELECT {{claim_durably}}
           AND NOT EXISTS (SELECT 1 FROM awa.queues WHERE queue = $1 AND paused) AS ok,
           (SELECT key_max_in_flight FROM awa.queues WHERE queue = $1) AS queue_limit,
           $4::float8 AS aging
), plain AS (
    -- Unkeyed jobs to claim at all? A probe of the claim index; without it a
    -- plan reused from when the queue held only keyed jobs scanned the whole
    -- table for unkeyed ones (estimated at one row).
    SELECT (SELECT ok FROM open) AND EXISTS (
        SELECT 1 FROM awa.jobs
        WHERE state = 'available' AND queue = $1 AND concurrency_key IS NULL) AS ok
), chunk AS MATERIALIZED (
    SELECT c.*, row_number() OVER (PARTITION BY c.key ORDER BY c.priority, c.run_at, c.id) AS rn,
           count(*) OVER (PARTITION BY c.key) AS n
    FROM (
        SELECT * FROM (
            SELECT a.concurrency_key AS key,
                   coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1) AS lim,
                   a.priority, a.run_at, a.id, a.ordering_key, false AS wrap, a.ctid AS tid
            FROM awa.jobs a
            WHERE a.state = 'available' AND a.queue = $1 AND a.concurrency_key IS NOT NULL
              AND a.concurrency_key > $5::text AND (SELECT ok FROM open)
            ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT $2
            FOR UPDATE SKIP LOCKED) after_cursor
        UNION ALL
        SELECT * FROM (
            SELECT a.concurrency_key,
                   coalesce(a.concurrency_limit, (SELECT queue_limit FROM open), 1),
                   a.priority, a.run_at, a.id, a.ordering_key, true, a.ctid
            FROM awa.jobs a
            WHERE a.state = 'available' AND a.queue = $1 AND a.concurrency_key IS NOT NULL
              AND a.concurrency_key <= $5::text AND (SELECT ok FROM open)
            ORDER BY a.concurrency_key, a.priority, a.run_at, a.id LIMIT $2
            FOR UPDATE SKIP LOCKED) from_start
        LIMIT $2) c
), grants AS MATERIALIZED (
    -- Per key (its head row): the key takes up to its free slots (its head's
    -- limit less the slots taken) of its jobs in the chunk, if it gets the
    -- key's transaction lock (two claims racing for one key then rarely pick
    -- the same slot; the unique index refuses it if they do). `OFFSET 0`
    -- keeps the slot read a unit, run once per key. `rn <= 1`, not `rn = 1`:
    -- the planner guesses a third of the rows for it, not one, and so hashes
    -- this CTE in `keyed` instead of scanning it again for every job.
    -- The free slots, lowest first: 1.. less the taken ones (a hashed NOT IN;
    -- `<> ALL` compared every candidate with every taken slot; a function scan
    -- returns generate_series' rows in order, so no sort), only for a key with
    -- some taken.
    SELECT g.key, g.take,
           CASE WHEN cardinality(g.taken) > 0 THEN
               array(SELECT s FROM generate_series(1, cardinality(g.taken) + g.take::integer) s
                     WHERE s NOT IN (SELECT unnest(g.taken)) LIMIT g.take) END AS free
    FROM (SELECT c.key, t.taken,
                 CASE WHEN c.lim > cardinality(t.taken)
                       AND pg_try_advisory_xact_lock(hashtext('awa:concurrency_key'),
                                                     hashtext(c.key))
                      THEN least(c.n, c.lim - cardinality(t.taken)) ELSE 0 END AS take
          FROM chunk c,
          LATERAL (SELECT array(SELECT r.concurrency_slot FROM awa.jobs r
                                WHERE r.concurrency_key = c.key
                                  AND r.concurrency_slot IS NOT NULL
                                  AND r.state IN ('running', 'waiting_external')) AS taken
                   OFFSET 0) t
          WHERE c.rn <= 1) g
), keyed AS (
    SELECT c.id, c.priority, c.run_at, c.ordering_key, c.lim,
           coalesce(g.free[c.rn], c.rn)::integer AS slot, c.tid
    FROM chunk c JOIN grants g ON g.key = c.key AND c.rn <= g.take
), w AS (
    SELECT coalesce((SELECT key FROM chunk ORDER BY wrap DESC, key DESC LIMIT 1), $5::text)
               AS cursor,
           (SELECT count(*) FROM chunk) = $2
           AND coalesce((SELECT sum(take) FROM grants), 0) < $2 AS walk,
           (SELECT ok FROM plain) AS plain
)

-- fragment: keyed_chunk_update
-- The claim of everything picked, by tuple id (every picked row is locked by
-- this statement, so the id it was locked at is its current version; the id
-- check is a guard). Top level, not a CTE: the rows go straight out, with the
-- cursor, `walk` and `plain` on each.
UPDATE awa.jobs j
SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
    attempted_at = now(), heartbeat_at = now(), concurrency_slot = picked.slot,
    deadline_at = CASE WHEN $3::float8 > 0 THEN now() + make_interval(secs => $3) END
FROM picked, w WHERE j.ctid = picked.tid AND j.id = picked.id
RETURNING {{claimed_row}},
          j.concurrency_key, j.concurrency_limit, j.concurrency_slot,
          w.cursor, w.walk, w.plain

-- name: attempt_claim_keyed_chunk
-- The common keyed claim: attempt_claim_keyed without its walk key by key (a
-- claim's fixed cost is mostly its plan's size). Up to $2 jobs of queue $1
-- ($3 deadline seconds, $4 aging interval), unkeyed ones as attempt_claim
-- takes them, keyed ones from one range scan of the next $2 keyed jobs in key
-- order after the cursor $5 (wrapping round), each key granted up to its free
-- slots. Returns the claimed jobs as attempt_claim_keyed does, each with the
-- cursor for the next claim, `walk` (the scan was full but its keys could not
-- fill the claim: the caller goes on with attempt_claim_keyed from the
-- cursor) and `plain` (the queue had unkeyed jobs). Nothing claimed: no rows
-- (the caller goes on with attempt_claim_keyed; see worker/keyed.py).
WITH {{keyed_chunk_grant}}, {{keyed_claim_unkeyed}}, {{keyed_picked}}
{{keyed_chunk_update}}

-- name: attempt_claim_keyed_only
-- attempt_claim_keyed_chunk for a queue whose last claim found no unkeyed jobs:
-- the same, without the four scans for unkeyed ones (about 7 % of the
-- statement's cost; `plain` still probes for them, and the caller turns back
-- to attempt_claim_keyed_chunk when it finds some). Keyed jobs only, so no
-- ordering by priority across them and no LIMIT: the chunk holds at most $2.
WITH {{keyed_chunk_grant}}, picked AS (
    SELECT c.id, c.slot, c.tid FROM keyed c
    WHERE c.slot <= c.lim AND (c.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM awa.jobs r
        WHERE r.queue = $1 AND r.ordering_key = c.ordering_key AND r.id < c.id))
)
{{keyed_chunk_update}}

-- name: concurrency_key_stats
-- Keys with jobs in flight, per queue (only queue $1; NULL: every queue),
-- saturated first, then by jobs in flight, at most $2: the jobs in flight on
-- the queue, on every queue (what the limit counts), the limit (the largest
-- among the jobs in flight: their own, else the queue's, else 1) and the
-- key's available jobs on the queue, counted up to $3. Reads the slot index
-- (jobs in flight only) and, per key listed, at most $3 entries of the keyed
-- claim index: never the whole backlog. A key with nothing in flight is not
-- held by its limit and is not listed.
WITH flight AS (
    SELECT r.queue, r.concurrency_key AS key, count(*) AS running,
           max(coalesce(r.concurrency_limit, q.key_max_in_flight, 1)) AS lim
    FROM awa.jobs r LEFT JOIN awa.queues q ON q.queue = r.queue
    WHERE r.concurrency_slot IS NOT NULL AND r.state IN ('running', 'waiting_external')
    GROUP BY r.queue, r.concurrency_key
), keys AS (
    SELECT f.queue, f.key, f.running,
           sum(f.running) OVER (PARTITION BY f.key)::bigint AS in_flight,
           max(f.lim) OVER (PARTITION BY f.key) AS lim
    FROM flight f
)
SELECT k.queue, k.key, k.running, k.in_flight, k.lim AS max_in_flight,
       k.in_flight >= k.lim AS saturated, w.waiting
FROM (SELECT * FROM keys WHERE $1::text IS NULL OR queue = $1
      ORDER BY in_flight >= lim DESC, in_flight DESC, key, queue LIMIT $2) k,
LATERAL (SELECT count(*) AS waiting FROM (
             SELECT 1 FROM awa.jobs a
             WHERE a.state = 'available' AND a.queue = k.queue AND a.concurrency_key = k.key
             LIMIT $3) c) w
ORDER BY k.in_flight >= k.lim DESC, k.in_flight DESC, k.key, k.queue

-- name: queue_set_key_limit
-- A worker records the key_max_in_flight of the queues it serves with one.
INSERT INTO awa.queues (queue, key_max_in_flight)
SELECT * FROM unnest($1::text[], $2::integer[])
ON CONFLICT (queue) DO UPDATE SET key_max_in_flight = EXCLUDED.key_max_in_flight

-- name: attempt_claim_keyed_ring
-- The unkeyed jobs of a keyed queue where the ring is in use: awa.claim over
-- both lanes (migration 0020; ring jobs are never keyed, and it leaves keyed
-- ones alone), up to $2 jobs of queue $1 ($3 deadline seconds, $4 aging
-- interval), with attempt_claim_keyed's key columns (NULL) so a keyed claim's
-- rows read alike, and each ring attempt's receipt_slot. See worker/keyed.py.
SELECT c.*, NULL::text AS concurrency_key, NULL::integer AS concurrency_limit,
       NULL::integer AS concurrency_slot
FROM awa.claim($1::text, $2::int, $3::float8, $4::float8) c

-- name: ring_unkeyed_waiting
-- Whether ring jobs of queue $1 wait to be claimed (awa.ring_available, capped
-- at one: the claim_log's last row and one index probe per priority lane).
SELECT awa.ring_available($1::text, 1) > 0 AS waiting
