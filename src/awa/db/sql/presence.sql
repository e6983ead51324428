-- name: presence_beat
-- A worker process says what it is (every few seconds), for the runtime page:
-- a new row each time (migration 0028); awa.presence reads the latest.
INSERT INTO awa.presence_beats
    (part, instance_id, hostname, pid, version, started_at, is_leader, listening,
     in_flight, claimed, completed, queues)
VALUES (awa.rotation_part(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)

-- name: presence_remove
-- Goodbye at shutdown: the process leaves awa.presence at once.
INSERT INTO awa.presence_beats (part, instance_id, hostname, pid, version, started_at, gone)
VALUES (awa.rotation_part(), $1, $2, $3, $4, $5, true)

-- name: presence_tidy
-- Empty the spent partition of each rotating record, if it can be had at once.
SELECT awa.rotation_tidy('presence_beats'), awa.rotation_tidy('leader_terms')

-- name: presence_prune
-- Rows of workers of a release before 0028 that vanished without saying
-- goodbye (SIGKILL, lost host); nothing once none is left.
DELETE FROM awa.runtime_instances WHERE last_seen_at < now() - interval '1 hour'
