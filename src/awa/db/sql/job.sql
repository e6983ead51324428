-- Statements on jobs: insert, read, and the admin transitions.
-- Finished jobs are moved with awa.finished() (see 0001_jobs.sql).

-- fragment: job_insert_values
-- One job from `PreparedJob.insert_params`; due now unless $4 is in the future.
-- ring: whether it goes to the append-only lane (awa.ready, migration 0020):
-- when that lane takes inserts (awa.ring.enqueue) and the job is due now with
-- no unique, ordering or concurrency key (those coordinate in awa.jobs).
v AS (
    -- Each parameter appears once (psycopg sends a repeated one again, untyped).
    SELECT x.*, (SELECT enqueue FROM awa.ring_config) AND x.state = 'available'
                AND x.unique_key IS NULL AND x.ordering_key IS NULL
                AND x.concurrency_key IS NULL AS ring
    FROM (SELECT $1::text AS kind, $2::text AS queue, $3::text::jsonb AS args,
                 CASE WHEN $4::timestamptz > now() THEN 'scheduled' ELSE 'available'
                 END::awa.job_state AS state,
                 coalesce($4::timestamptz, now()) AS run_at, $5::smallint AS priority,
                 $6::smallint AS max_attempts, $7::text[] AS tags, $8::text::jsonb AS metadata,
                 $9::bytea AS unique_key, $10::smallint AS unique_states,
                 $11::text AS ordering_key, $12::text AS concurrency_key,
                 $13::integer AS concurrency_limit) x
), to_ring AS (
    INSERT INTO awa.ready (kind, queue, args, priority, max_attempts, run_at, tags, metadata)
    SELECT kind, queue, args, priority, max_attempts, run_at, tags, metadata FROM v WHERE ring
    RETURNING *
), {{ring_lane_known}}, to_jobs AS (
    INSERT INTO awa.jobs (kind, queue, args, state, run_at, priority, max_attempts, tags,
                          metadata, unique_key, unique_states, ordering_key, concurrency_key,
                          concurrency_limit)
    SELECT kind, queue, args, state, run_at, priority, max_attempts, tags, metadata, unique_key,
           unique_states, ordering_key, concurrency_key, concurrency_limit
    FROM v WHERE NOT ring
    RETURNING *
)

-- name: job_insert
WITH {{job_insert_values}}
SELECT * FROM to_jobs
UNION ALL
SELECT j.* FROM to_ring r CROSS JOIN LATERAL awa.ready_job(r) j

-- name: job_insert_one_mutable
-- job_insert_one where the ring takes no inserts (awa.db.lanes): into awa.jobs,
-- without the routing.
INSERT INTO awa.jobs (kind, queue, args, state, run_at, priority, max_attempts, tags,
                      metadata, unique_key, unique_states, ordering_key, concurrency_key,
                      concurrency_limit)
SELECT $1, $2, $3::text::jsonb,
       CASE WHEN $4::timestamptz > now() THEN 'scheduled' ELSE 'available' END::awa.job_state,
       coalesce($4::timestamptz, now()), $5, $6, $7, $8::text::jsonb, $9, $10, $11, $12, $13
RETURNING id, state, created_at

-- name: job_insert_one
-- The single-insert path: the caller holds every value it sent, so only what
-- the server chose comes back (a job due now has run_at = created_at).
WITH {{job_insert_values}}
SELECT id, state, created_at FROM to_jobs
UNION ALL
SELECT id, 'available'::awa.job_state, created_at FROM to_ring

-- name: job_insert_one_ring
-- job_insert_one for a plain job due now (no run_at, unique, ordering or
-- concurrency key) where the ring takes inserts (awa.db.lanes): straight into
-- awa.ready, without the routing to awa.jobs (which prepares that insert too).
WITH to_ring AS (
    INSERT INTO awa.ready (kind, queue, args, priority, max_attempts, tags, metadata)
    VALUES ($1, $2, $3::text::jsonb, $4, $5, $6, $7::text::jsonb)
    RETURNING id, queue, priority, created_at
), {{ring_lane_known}}
SELECT id, 'available'::awa.job_state AS state, created_at FROM to_ring

-- name: job_staging_create
CREATE TEMP TABLE awa_job_staging (
    ord           bigint GENERATED ALWAYS AS IDENTITY,
    kind          text,
    queue         text,
    args          jsonb,
    run_at        timestamptz,
    priority      smallint,
    max_attempts  smallint,
    tags          text[],
    metadata      jsonb,
    unique_key    bytea,
    unique_states smallint,
    ordering_key  text,
    concurrency_key   text,
    concurrency_limit integer,
    after_ids         bigint[],  -- dependency_insert_from_staging only
    on_parent_failure text,
    job_id            bigint     -- reserved by job_ids_reserve (NULL: the next)
) ON COMMIT DROP

-- fragment: staging_claimed
-- The staged rows with their ids and states (src), and their unique claims.
src AS MATERIALIZED (
    SELECT coalesce(s.job_id, nextval(pg_get_serial_sequence('awa.jobs', 'id'))) AS id, s.*,
           CASE WHEN s.run_at > now() THEN 'scheduled' ELSE 'available' END::awa.job_state
               AS state
    FROM (SELECT * FROM awa_job_staging ORDER BY ord) s
), {{unique_claimed}}

-- fragment: unique_claimed
-- The unique claims of src's rows, taken in input order (a duplicate's is not).
claimed AS (
    INSERT INTO awa.unique_claims (unique_key, job_id)
    SELECT unique_key, id FROM src
    WHERE unique_key IS NOT NULL AND (unique_states & awa.state_bit(state)) <> 0
    ORDER BY id
    ON CONFLICT (unique_key) DO NOTHING
    RETURNING job_id
)

-- fragment: staging_insert
-- Insert the staged rows whose unique key (if any) was claimed.
INSERT INTO awa.jobs (id, kind, queue, args, state, run_at, priority, max_attempts, tags,
                      metadata, unique_key, unique_states, ordering_key, concurrency_key,
                      concurrency_limit)
SELECT id, kind, queue, args, state, coalesce(run_at, now()), priority, max_attempts, tags,
       metadata, unique_key, unique_states, ordering_key, concurrency_key, concurrency_limit
FROM src
WHERE unique_key IS NULL
   OR (unique_states & awa.state_bit(state)) = 0
   OR id IN (SELECT job_id FROM claimed)
ORDER BY id

-- fragment: staging_insert_routed
-- staging_insert's rows, the plain ones (due now, no unique, ordering or
-- concurrency key) into the append-only lane when it takes inserts
-- (job_insert_values says why); every inserted job comes back as a jobs row,
-- in id (input) order.
routed AS MATERIALIZED (
    SELECT s.*, (SELECT enqueue FROM awa.ring_config) AND s.state = 'available'
               AND s.unique_key IS NULL AND s.ordering_key IS NULL
               AND s.concurrency_key IS NULL AS ring
    FROM src s
), to_ring AS (
    INSERT INTO awa.ready (slot, id, kind, queue, args, priority, max_attempts, run_at, tags,
                           metadata)
    SELECT (SELECT awa.ring_slot()), id, kind, queue, args, priority, max_attempts,
           coalesce(run_at, now()), tags, metadata
    FROM routed WHERE ring ORDER BY id
    RETURNING *
), {{ring_lane_known}}, to_jobs AS (
    INSERT INTO awa.jobs (id, kind, queue, args, state, run_at, priority, max_attempts, tags,
                          metadata, unique_key, unique_states, ordering_key, concurrency_key,
                          concurrency_limit)
    SELECT id, kind, queue, args, state, coalesce(run_at, now()), priority, max_attempts, tags,
           metadata, unique_key, unique_states, ordering_key, concurrency_key, concurrency_limit
    FROM routed
    WHERE NOT ring AND (unique_key IS NULL
       OR (unique_states & awa.state_bit(state)) = 0
       OR id IN (SELECT job_id FROM claimed))
    ORDER BY id
    RETURNING *
)
SELECT * FROM (SELECT * FROM to_jobs
               UNION ALL SELECT j.* FROM to_ring r CROSS JOIN LATERAL awa.ready_job(r) j) i
ORDER BY id

-- name: job_insert_from_staging
-- Unique claims are taken first, in input order, so a duplicate (of an
-- existing job or of an earlier row in the batch) is skipped, not an error.
WITH {{staging_claimed}}, {{staging_insert_routed}}

-- name: job_insert_many
-- A small batch in one statement (one round trip, no staging table): the
-- columns as arrays, one element per job. Tags travel as one JSON array per
-- job (arrays of arrays must be rectangular); $14, when not null, is the tag
-- list every job shares. Duplicates are skipped as in job_insert_from_staging.
WITH src AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('awa.jobs', 'id')) AS id, s.kind, s.queue,
           s.args::jsonb AS args, s.run_at, s.priority, s.max_attempts,
           coalesce($14::text[], ARRAY(SELECT jsonb_array_elements_text(s.tags::jsonb)))
               AS tags,
           s.metadata::jsonb AS metadata, s.unique_key, s.unique_states, s.ordering_key,
           s.concurrency_key, s.concurrency_limit,
           CASE WHEN s.run_at > now() THEN 'scheduled' ELSE 'available' END::awa.job_state
               AS state
    FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::smallint[],
                $6::smallint[], $7::text[], $8::text[], $9::bytea[], $10::smallint[],
                $11::text[], $12::text[], $13::integer[])
         WITH ORDINALITY AS s(kind, queue, args, run_at, priority, max_attempts, tags,
                              metadata, unique_key, unique_states, ordering_key,
                              concurrency_key, concurrency_limit, ord)
    ORDER BY s.ord
), {{unique_claimed}}, {{staging_insert_routed}}

-- name: job_get
SELECT * FROM awa.jobs_all WHERE id = $1

-- name: job_list_active
-- Active jobs of either lane (the rows of awa.jobs_active), newest first: the
-- newest $4 of awa.jobs and of each of the ring's views (migration 0021),
-- merged, so that each is one ordered index scan that stops early.
SELECT * FROM (
    (SELECT * FROM awa.jobs
     WHERE ($1::awa.job_state IS NULL OR state = $1)
          AND ($2::text IS NULL OR kind = $2) AND ($3::text IS NULL OR queue = $3)
     ORDER BY id DESC LIMIT $4)
    UNION ALL
    (SELECT * FROM awa.ring_jobs_available
     WHERE ($1::awa.job_state IS NULL OR state = $1)
          AND ($2::text IS NULL OR kind = $2) AND ($3::text IS NULL OR queue = $3)
     ORDER BY id DESC LIMIT $4)
    UNION ALL
    (SELECT * FROM awa.ring_jobs_running
     WHERE ($1::awa.job_state IS NULL OR state = $1)
          AND ($2::text IS NULL OR kind = $2) AND ($3::text IS NULL OR queue = $3)
     ORDER BY id DESC LIMIT $4)
) a
ORDER BY id DESC
LIMIT $4

-- name: job_list_finished
-- Finished jobs, newest first, planned for these values (migration 0027: by
-- the id index, or for a rare kind or queue by the bloom index of names).
SELECT * FROM awa.history_newest($1::awa.job_state, $2::text, $3::text, $4::int)

-- name: job_list_unsuccessful
-- Finished jobs of state $1, failed or cancelled, newest first, through the
-- partial index of the jobs that did not complete (migration 0025; the query
-- names its predicate): an ordered scan per partition that stops early however
-- rare they are. By the id index, each partition without one was read whole
-- (1.5 s with 10M jobs of history, bench/reads.py).
SELECT * FROM awa.jobs_done
WHERE state = $1 AND state <> 'completed'
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR queue = $3)
ORDER BY id DESC
LIMIT $4

-- name: job_list_any
-- Jobs of any state (the rows of awa.jobs_all), newest first: the newest $3
-- of each table or view it unions, merged (as job_list_active); the history's
-- part planned for these values (job_list_finished).
SELECT * FROM (
    (SELECT * FROM awa.jobs WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2) ORDER BY id DESC LIMIT $3)
    UNION ALL
    (SELECT * FROM awa.ring_jobs_available WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2) ORDER BY id DESC LIMIT $3)
    UNION ALL
    (SELECT * FROM awa.ring_jobs_running WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2) ORDER BY id DESC LIMIT $3)
    UNION ALL
    (SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
            run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
            coalesce(tags, '{}'), coalesce(metadata, '{}'), errors, progress, output,
            unique_key, unique_states, ordering_key, callback_id, callback_timeout_at,
            concurrency_key, concurrency_limit, concurrency_slot
     FROM awa.history_newest(NULL, $1::text, $2::text, $3::int))
    UNION ALL
    (SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease,
            run_at, created_at, attempted_at, heartbeat_at, deadline_at, finalized_at,
            tags, metadata, errors, progress, output, unique_key, unique_states,
            ordering_key, callback_id, callback_timeout_at,
            concurrency_key, concurrency_limit, concurrency_slot
     FROM awa.dlq WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2) ORDER BY id DESC LIMIT $3)
) a
ORDER BY id DESC
LIMIT $3

-- name: job_ring_to_mutable
-- The jobs among $1 still in the append-only lane (available or running) move
-- to awa.jobs first (migration 0020, awa.ring_to_mutable), in a statement of
-- their own: the admin transition that follows (cancel, wait_for's mark) then
-- finds them where it looks, and a running one's worker learns of it as of
-- any mutable-lane job. Jobs not in the ring are left alone.
SELECT coalesce(array_agg(id), '{}') AS ids FROM awa.ring_to_mutable($1::bigint[]) id

-- name: job_ring_queue_to_mutable
-- Every available ring job of queue $1 moves to awa.jobs (awa.ring_queue_to_mutable),
-- before an operator's drain of the queue; how many.
SELECT count(*) AS moved FROM awa.ring_queue_to_mutable($1::text)

-- name: job_ring_next_to_mutable
-- The testing harness: the next available job of kind $2 in queue $1, over
-- both lanes in the claim's order (priority, run_at, id), moves to awa.jobs
-- if it is a ring job, so attempt_claim_one_kind (which reads awa.jobs) takes it.
SELECT coalesce(array_agg(id), '{}') AS ids FROM awa.ring_to_mutable(ARRAY(
    SELECT a.id FROM (
        SELECT j.id, j.priority, j.run_at FROM awa.jobs j
        WHERE j.state = 'available' AND j.queue = $1 AND j.kind = $2
        UNION ALL
        SELECT w.id, w.priority, w.run_at FROM awa.ready w
        WHERE w.queue = $1 AND w.kind = $2
          AND NOT EXISTS (SELECT 1 FROM awa.receipts r
                          WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
          AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                          WHERE k.slot = w.slot AND k.id = w.id
                            AND k.lease_base = w.lease_base)
    ) a ORDER BY a.priority, a.run_at, a.id LIMIT 1)) id

-- name: job_cancel
-- Cancel one unfinished job, running or not. A running handler's later
-- writes find no active row and are dropped by the run-lease guard.
WITH moved AS (
    DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j, j.state AS prior_state
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m, LATERAL awa.finished(m.j, 'cancelled', $2::interval) f
    RETURNING *
)
SELECT done.*, (SELECT prior_state FROM moved) AS prior_state,
       CASE WHEN (SELECT prior_state FROM moved) = 'running'
            THEN pg_notify('awa_cancel', done.id::text) END AS notified
FROM done

-- name: job_cancel_by_unique_key
WITH target AS (
    SELECT c.job_id FROM awa.unique_claims c
    JOIN awa.jobs j ON j.id = c.job_id
    WHERE c.unique_key = $1 AND ($2::text IS NULL OR j.queue = $2)
), moved AS (
    DELETE FROM awa.jobs j USING target t WHERE j.id = t.job_id
    RETURNING j, j.state AS prior_state
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m, LATERAL awa.finished(m.j, 'cancelled', $3::interval) f
    RETURNING *
)
SELECT done.*, CASE WHEN m.prior_state = 'running'
                    THEN pg_notify('awa_cancel', done.id::text) END AS notified
FROM done JOIN moved m ON (m.j).id = done.id

-- fragment: revive_moved
-- Finished → available: the rows of a CTE named ``moved`` (deleted from
-- jobs_done or the DLQ) back into the active table with attempt 0, as one job
-- each keeps its id, history and unique claim. Admin retry, retry_failed and
-- the bulk retries include it; DLQ retry (other queue, priority or time) does
-- its own.
INSERT INTO awa.jobs (id, kind, queue, args, state, priority, attempt, max_attempts,
                      run_lease, run_at, created_at, tags, metadata, errors, progress,
                      unique_key, unique_states, ordering_key, concurrency_key, concurrency_limit)
SELECT id, kind, queue, args, 'available', priority, 0, max_attempts, run_lease,
       now(), created_at, tags, metadata, errors, progress, unique_key,
       unique_states, ordering_key, concurrency_key, concurrency_limit
FROM moved ORDER BY id

-- name: job_retry_finished
-- Admin retry of a failed or cancelled job: back to available, attempt 0.
WITH moved AS (
    DELETE FROM awa.jobs_done d
    WHERE d.id = $1 AND d.state IN ('failed', 'cancelled')
    RETURNING d.*
)
{{revive_moved}}
RETURNING *

-- name: job_retry_waiting
-- Admin retry of a job parked on a callback: the callback is abandoned.
UPDATE awa.jobs
SET state = 'available', attempt = 0, run_at = now(), callback_id = NULL,
    callback_timeout_at = NULL, heartbeat_at = NULL, deadline_at = NULL
WHERE id = $1 AND state = 'waiting_external'
RETURNING *

-- name: storage_reset
-- install_queue_storage(reset=True), the testing harness's clean(): remove every
-- job (both lanes), unique claim and dependency. Off the hot path (no worker
-- runs), so the ring's rows are deleted here; its claim cursors stay (they
-- only ever move past rows, and no row is left behind them).
WITH a AS (DELETE FROM awa.jobs), d AS (DELETE FROM awa.jobs_done),
     e AS (DELETE FROM awa.job_dependencies),
     r1 AS (DELETE FROM awa.ready), r2 AS (DELETE FROM awa.ready_cancels),
     r3 AS (DELETE FROM awa.receipts), r4 AS (DELETE FROM awa.closures),
     r5 AS (DELETE FROM awa.heartbeats)
DELETE FROM awa.unique_claims

-- name: storage_status
-- ring_enqueue: whether plain jobs are inserted into the append-only lane
-- (awa.ring.enqueue) rather than awa.jobs.
SELECT (SELECT coalesce(sum(n), 0) FROM awa.active_counts())::bigint AS active_jobs,
       (SELECT enqueue FROM awa.ring_config) AS ring_enqueue,
       (SELECT count(*) FROM pg_inherits WHERE inhparent = 'awa.jobs_done'::regclass)
           AS partitions,
       (SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'awa.jobs_done'::regclass) AS finished_estimate


-- name: job_retry_failed_bulk
-- Admin retry_failed: every failed job of a kind or queue back to available.
WITH moved AS (
    DELETE FROM awa.jobs_done d
    WHERE d.state = 'failed' AND ($1::text IS NULL OR d.kind = $1)
      AND ($2::text IS NULL OR d.queue = $2)
    RETURNING d.*
)
{{revive_moved}}
RETURNING *

-- name: job_discard_failed
DELETE FROM awa.jobs_done WHERE state = 'failed' AND kind = $1

-- name: queue_notify
-- Wake the workers of these queues: after a writing transaction committed, or
-- inside one that deferred the per-row trigger (delivered at its commit).
SELECT pg_notify('awa_jobs', q) FROM unnest($1::text[]) AS q

-- name: tx_begin_deferred_notify
BEGIN; SELECT set_config('awa.defer_notify', 'on', true)

-- name: tx_defer_notify
-- tx_begin_deferred_notify inside a transaction already open: the per-row
-- wake-up trigger stays off until it ends (queue_notify wakes instead).
SELECT set_config('awa.defer_notify', 'on', true)

-- name: job_ids_reserve
-- $1 job ids, in increasing order: a bulk call whose jobs take different
-- paths (some wait for others, some do not) gives each its place in the
-- call's order, whichever statement inserts it.
SELECT array_agg(nextval(pg_get_serial_sequence('awa.jobs', 'id')) ORDER BY g) AS ids
FROM generate_series(1, $1) g

-- fragment: ring_lane_known
-- The lanes of the jobs to_ring inserted, made known to claims (awa.ring_lanes).
-- Only a lane not known yet is inserted: ON CONFLICT would wait for another
-- open transaction that inserted the same new lane, where a known lane (the
-- steady state) costs one index probe and never waits.
lanes AS (
    INSERT INTO awa.ring_lanes (queue, priority)
    SELECT DISTINCT r.queue, r.priority FROM to_ring r
    WHERE NOT EXISTS (SELECT 1 FROM awa.ring_lanes l
                      WHERE l.queue = r.queue AND l.priority = r.priority)
    ON CONFLICT DO NOTHING
)

-- name: ring_lanes_known
-- The lanes ($1 queues, $2 priorities) a COPY into the ring fills, made known.
INSERT INTO awa.ring_lanes (queue, priority)
SELECT DISTINCT u.q, u.p FROM unnest($1::text[], $2::smallint[]) AS u(q, p)
WHERE NOT EXISTS (SELECT 1 FROM awa.ring_lanes l WHERE l.queue = u.q AND l.priority = u.p)
ON CONFLICT DO NOTHING

-- name: ring_takes_inserts
-- Whether plain jobs are enqueued into the append-only lane (migration 0020),
-- and the slot they go to.
SELECT enqueue, awa.ring_slot() AS slot FROM awa.ring_config
