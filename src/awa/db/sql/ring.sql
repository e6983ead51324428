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
