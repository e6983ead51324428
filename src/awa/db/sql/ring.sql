-- Upkeep of the append-only lane (migration 0020; docs/storage.md): rescue's
-- part in it, moving the ring on and reclaiming spent slots. The hot path's
-- statements (claim, completion, heartbeat) are in attempt.sql.

-- name: ring_rescue
-- Open ring attempts silent for $1 (or past their deadline), at most $2, move
-- to awa.jobs, where job_rescue_running then finds them stale.
SELECT awa.ring_rescue($1::interval, $2::int)

-- name: ring_advance
-- The ring's next slot if it was empty (new rows go there from now on), else NULL.
SELECT awa.ring_advance() AS slot

-- name: ring_state
-- The slot being written and the tables (family, slot) that hold rows.
SELECT awa.ring_slot() AS current, g.slots, o.family, o.slot
FROM awa.ring_config g, awa.ring_occupied() o

-- name: ring_reclaim
-- Truncate table $1 of slot $2 if every row in it is spent (true), in the
-- caller's transaction, which holds its lock until it ends.
SELECT awa.ring_reclaim($1::text, $2::smallint)

-- name: ring_enqueue_set
-- Whether plain jobs are enqueued into the ring from now on ($1).
UPDATE awa.ring_config SET enqueue = $1::boolean

-- name: ring_lanes_state
-- Whether plain jobs are enqueued into the ring, and whether claims must read
-- it (it takes jobs, or a lane of it was ever used). awa.db.lanes caches this.
SELECT enqueue, enqueue OR EXISTS (SELECT 1 FROM awa.ring_lanes) AS in_use FROM awa.ring_config

-- name: ring_lock_holders
-- The ring's partitions that other transactions hold a lock on, with each
-- holder's virtual transaction id (new for every transaction): the reclaim
-- does not ask for a table's lock while the same transaction has held it
-- since its previous pass (a long reader; asking would only queue the hot
-- path behind a lock that cannot be had).
SELECT c.relname::text AS name, l.virtualtransaction AS holder
FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_class c ON c.oid = l.relation
JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND i.inhparent IN ('awa.ready'::regclass, 'awa.ready_cancels'::regclass,
                      'awa.receipts'::regclass, 'awa.closures'::regclass,
                      'awa.heartbeats'::regclass, 'awa.claim_log'::regclass)
