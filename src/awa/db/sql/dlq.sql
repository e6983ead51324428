-- Statements on the dead letter queue (docs/guide/dlq.md). Filters are nullable
-- parameters; bulk statements are refused in Python without a filter unless
-- allow_all is set.

-- name: dlq_list
SELECT * FROM awa.dlq
WHERE ($1::text IS NULL OR kind = $1)
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR $3 = ANY (tags))
  AND ($4::bigint IS NULL OR id < $4)
  AND ($5::timestamptz IS NULL OR dlq_at < $5)
ORDER BY id DESC
LIMIT $6

-- name: dlq_get
SELECT * FROM awa.dlq WHERE id = $1

-- name: dlq_depth
SELECT count(*) FROM awa.dlq WHERE ($1::text IS NULL OR queue = $1)

-- name: dlq_depth_by_queue
SELECT queue, count(*) AS n FROM awa.dlq GROUP BY queue ORDER BY queue

-- name: dlq_retry
-- Back to the queue (optionally another queue, priority or time), attempt 0.
WITH moved AS (
    DELETE FROM awa.dlq
    WHERE ($1::bigint IS NOT NULL AND id = $1)
       OR ($1::bigint IS NULL
           AND ($5::text IS NULL OR kind = $5)
           AND ($6::text IS NULL OR queue = $6)
           AND ($7::text IS NULL OR $7 = ANY (tags)))
    RETURNING *
)
INSERT INTO awa.jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
                      run_at, created_at, tags, metadata, errors, progress, unique_key,
                      unique_states, ordering_key, concurrency_key, concurrency_limit)
SELECT id, kind, coalesce($3, queue), args,
       CASE WHEN $2::timestamptz > now() THEN 'scheduled' ELSE 'available' END::awa.job_state,
       coalesce($4, priority), 0, max_attempts, run_lease, coalesce($2::timestamptz, now()),
       created_at, tags, metadata, errors, progress, unique_key, unique_states, ordering_key,
       concurrency_key, concurrency_limit
FROM moved ORDER BY id
RETURNING *

-- name: dlq_move_failed
-- Move failed jobs (one by id, or by filter) from the finished table to the DLQ.
WITH moved AS (
    DELETE FROM awa.jobs_done
    WHERE state = 'failed'
      AND (($1::bigint IS NOT NULL AND id = $1)
           OR ($1::bigint IS NULL
               AND ($3::text IS NULL OR kind = $3)
               AND ($4::text IS NULL OR queue = $4)
               AND ($5::text IS NULL OR $5 = ANY (tags))))
    RETURNING *
)
INSERT INTO awa.dlq
SELECT d.* FROM moved, LATERAL awa.dead_lettered(moved::awa.jobs_done, $2) d
RETURNING *

-- name: dlq_purge
DELETE FROM awa.dlq
WHERE ($1::bigint IS NOT NULL AND id = $1)
   OR ($1::bigint IS NULL
       AND ($2::text IS NULL OR kind = $2)
       AND ($3::text IS NULL OR queue = $3)
       AND ($4::text IS NULL OR $4 = ANY (tags))
       AND ($5::bigint IS NULL OR id < $5)
       AND ($6::timestamptz IS NULL OR dlq_at < $6))

-- name: queue_set_dlq
-- A worker records whether the queues it serves dead-letter their failures.
INSERT INTO awa.queues (queue, dlq_enabled) SELECT * FROM unnest($1::text[], $2::boolean[])
ON CONFLICT (queue) DO UPDATE SET dlq_enabled = EXCLUDED.dlq_enabled
