-- name: presence_upsert
-- A worker process announces itself (every few seconds) for the runtime page.
INSERT INTO awa.runtime_instances AS r
    (instance_id, hostname, pid, version, started_at, last_seen_at, is_leader, listening,
     in_flight, claimed, completed, queues)
VALUES ($1, $2, $3, $4, $5, now(), $6, $7, $8, $9, $10, $11::jsonb)
ON CONFLICT (instance_id) DO UPDATE
SET last_seen_at = now(), is_leader = EXCLUDED.is_leader, listening = EXCLUDED.listening,
    in_flight = EXCLUDED.in_flight, claimed = EXCLUDED.claimed,
    completed = EXCLUDED.completed, queues = EXCLUDED.queues

-- name: presence_remove
DELETE FROM awa.runtime_instances WHERE instance_id = $1

-- name: presence_prune
-- Processes that vanished without saying goodbye (SIGKILL, lost host).
DELETE FROM awa.runtime_instances WHERE last_seen_at < now() - interval '1 hour'
