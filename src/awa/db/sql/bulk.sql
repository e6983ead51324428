-- Chunked bulk admin actions (awa.bulk): a scope statement counts the
-- matching rows and takes the highest id, then chunk statements act on at most
-- $n rows with after_id < id <= last_id, in id order, each in its own short
-- transaction. Every chunk returns how many rows it changed and the highest id
-- it looked at (NULL when nothing is left), which is where the next one starts,
-- so each job is acted on at most once even if it comes back (a retried job
-- that fails again keeps its id). Filters are nullable, as in dlq.sql.

-- name: bulk_failed_scope
SELECT count(*) AS total, max(id) AS last_id FROM awa.jobs_done
WHERE state = 'failed' AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)

-- name: bulk_failed_retry_chunk
-- $1 kind, $2 queue, $3 after_id, $4 last_id, $5 chunk size.
WITH picked AS (
    SELECT id FROM awa.jobs_done
    WHERE state = 'failed' AND ($1::text IS NULL OR kind = $1)
      AND ($2::text IS NULL OR queue = $2)
      AND ($3::bigint IS NULL OR id > $3) AND id <= $4
    ORDER BY id LIMIT $5
), moved AS (
    DELETE FROM awa.jobs_done d USING picked p
    WHERE d.id = p.id AND d.state = 'failed'
    RETURNING d.*
), inserted AS (
    {{revive_moved}}
    RETURNING id
)
SELECT (SELECT count(*) FROM inserted) AS done, (SELECT max(id) FROM picked) AS last_id

-- name: bulk_failed_discard_chunk
-- $1 kind, $2 queue, $3 after_id, $4 last_id, $5 chunk size.
WITH picked AS (
    SELECT id FROM awa.jobs_done
    WHERE state = 'failed' AND ($1::text IS NULL OR kind = $1)
      AND ($2::text IS NULL OR queue = $2)
      AND ($3::bigint IS NULL OR id > $3) AND id <= $4
    ORDER BY id LIMIT $5
), gone AS (
    DELETE FROM awa.jobs_done d USING picked p
    WHERE d.id = p.id AND d.state = 'failed'
    RETURNING d.id
)
SELECT (SELECT count(*) FROM gone) AS done, (SELECT max(id) FROM picked) AS last_id

-- name: bulk_dlq_scope
SELECT count(*) AS total, max(id) AS last_id FROM awa.dlq
WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR $3 = ANY (tags))

-- name: bulk_dlq_retry_chunk
-- $1 kind, $2 queue, $3 tag, $4 after_id, $5 last_id, $6 chunk size.
WITH picked AS (
    SELECT id FROM awa.dlq
    WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)
      AND ($3::text IS NULL OR $3 = ANY (tags))
      AND ($4::bigint IS NULL OR id > $4) AND id <= $5
    ORDER BY id LIMIT $6
), moved AS (
    DELETE FROM awa.dlq d USING picked p WHERE d.id = p.id
    RETURNING d.*
), inserted AS (
    {{revive_moved}}
    RETURNING id
)
SELECT (SELECT count(*) FROM inserted) AS done, (SELECT max(id) FROM picked) AS last_id

-- name: bulk_dlq_purge_chunk
-- $1 kind, $2 queue, $3 tag, $4 after_id, $5 last_id, $6 chunk size.
WITH picked AS (
    SELECT id FROM awa.dlq
    WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)
      AND ($3::text IS NULL OR $3 = ANY (tags))
      AND ($4::bigint IS NULL OR id > $4) AND id <= $5
    ORDER BY id LIMIT $6
), gone AS (
    DELETE FROM awa.dlq d USING picked p WHERE d.id = p.id
    RETURNING d.id
)
SELECT (SELECT count(*) FROM gone) AS done, (SELECT max(id) FROM picked) AS last_id
