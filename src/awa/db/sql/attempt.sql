-- Statements of a running attempt: claim, heartbeat, and every outcome.
-- Each outcome is one statement guarded by (id, run_lease, state = running);
-- a guard that matches no row drops the write (the attempt went stale).

-- fragment: claimed_row
-- What a claim returns of each job it claimed: only what a running job can
-- hold, named as awa.core.model.CLAIM_COLUMNS names them. ClaimDecoder reads
-- them by name, fastest in this order (decoding is a large part of a worker's
-- time per job). Times come back as epoch seconds (float8, exact to
-- the microsecond until the 23rd century): the driver builds a timestamptz at
-- about three times the cost of datetime.fromtimestamp. Empty tags and
-- metadata come back NULL, which costs nothing to decode.
j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts,
    j.run_lease, date_part('epoch', j.run_at) AS run_at,
    date_part('epoch', j.created_at) AS created_at,
    date_part('epoch', j.attempted_at) AS attempted_at,
    date_part('epoch', j.deadline_at) AS deadline_at,
    nullif(j.tags, '{}') AS tags, nullif(j.metadata, '{}') AS metadata,
    j.errors, j.progress, j.unique_key, j.ordering_key

-- fragment: claim_durably
-- True, having made sure the claim's transaction commits durably: a run lease
-- is the attempt's fencing token, and a claim a server crash forgot would hand
-- the same lease out again (issue 40; docs/architecture.md, "Claims are
-- durable"). Where the server, database, role or session turned
-- synchronous_commit off, it is turned on for this transaction only; any other
-- value (local, or a wait for standbys) is left as it is.
(current_setting('synchronous_commit') <> 'off'
 OR set_config('synchronous_commit', 'on', true) = 'on')

-- name: attempt_claim
-- Up to $2 jobs of queue $1 from both lanes (the ring's and awa.jobs's), most
-- urgent first after aging ($4 = aging interval in seconds, 0 = off), FIFO
-- within a lane, with a deadline of $3 seconds (0 = none): awa.claim
-- (migration 0020). Each row also says where a ring attempt's receipt is
-- (receipt_slot; NULL for a mutable-lane job). Keyed jobs (concurrency_key)
-- are left to attempt_claim_keyed (concurrency.sql). Durable, as every claim.
SELECT * FROM awa.claim($1::text, $2::int, $3::float8, $4::float8)

-- name: attempt_claim_mutable
-- attempt_claim where the ring is off and has never held a job (awa.db.lanes):
-- awa.jobs alone, one statement. (What attempt_claim was before migration 0020.)
-- Up to $2 jobs of queue $1, most urgent first after aging ($4 = aging
-- interval in seconds, 0 = off), FIFO within a priority. The best candidates
-- of each raw priority are its oldest, so four short index scans find the
-- exact top $2. SKIP LOCKED: no job is ever handed to two claimers.
-- Keyed jobs (concurrency_key) are left to attempt_claim_keyed, which gives
-- each a slot of its key (concurrency.sql).
-- The claim commits durably (claim_durably).
WITH open AS (
    SELECT {{claim_durably}}
           AND NOT EXISTS (SELECT 1 FROM awa.queues WHERE queue = $1 AND paused) AS ok
), c1 AS (
    SELECT id, priority, run_at, ordering_key FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 1 AND concurrency_key IS NULL
      AND (SELECT ok FROM open)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c2 AS (
    SELECT id, priority, run_at, ordering_key FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 2 AND concurrency_key IS NULL
      AND (SELECT ok FROM open)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c3 AS (
    SELECT id, priority, run_at, ordering_key FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 3 AND concurrency_key IS NULL
      AND (SELECT ok FROM open)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), c4 AS (
    SELECT id, priority, run_at, ordering_key FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND priority = 4 AND concurrency_key IS NULL
      AND (SELECT ok FROM open)
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (SELECT * FROM c1 UNION ALL SELECT * FROM c2
                    UNION ALL SELECT * FROM c3 UNION ALL SELECT * FROM c4) c
    -- A job with an ordering key waits for every earlier unfinished job with that key.
    WHERE c.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM awa.jobs r
        WHERE r.queue = $1 AND r.ordering_key = c.ordering_key AND r.id < c.id)
    -- Ages are float8 epoch differences: they cannot fail on any stored time.
    ORDER BY CASE WHEN $4::float8 > 0
                  THEN greatest(1, priority - floor((date_part('epoch', now())
                                                     - date_part('epoch', run_at)) / $4))
                  ELSE priority END,
             run_at, id
    LIMIT $2
)
UPDATE awa.jobs j
SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
    attempted_at = now(), heartbeat_at = now(),
    deadline_at = CASE WHEN $3::float8 > 0 THEN now() + make_interval(secs => $3) END
FROM picked WHERE j.id = picked.id
-- (claimed_row: only what a running job can hold; see the fragment.)
RETURNING {{claimed_row}}

-- name: attempt_unclaim
-- Jobs claimed ahead that never started (the worker is stopping): available
-- again in their old place, their attempt not counted, other workers woken.
WITH back AS (
    UPDATE awa.jobs j
    SET state = 'available', attempt = greatest(j.attempt - 1, 0),
        heartbeat_at = NULL, deadline_at = NULL
    WHERE j.id = ANY($1::bigint[]) AND j.state::text = 'running'  -- by id, see below
      AND j.run_lease = ((SELECT jsonb_object_agg(c.id, c.lease)
                          FROM unnest($1::bigint[], $2::bigint[]) AS c(id, lease))
                         ->> j.id::text)::bigint
    RETURNING j.queue
)
SELECT count(*) AS n, pg_notify('awa_jobs', queue) FROM back GROUP BY queue

-- name: attempt_heartbeat
-- One row per attempt still owned (a missing one was rescued or cancelled);
-- written = false when its row was locked by another statement (usually the
-- completion batch finishing it) and this beat skipped it. SKIP LOCKED means
-- a heartbeat never waits for a row lock, so it can never be part of a
-- deadlock, which is what lets the completion batch lock in any order.
-- Buffered progress ($3, NULL = unchanged) is written along.
-- A ring attempt ($4: its receipt slot, NULL for the mutable lane) beats by a
-- heartbeats row while it is open; one moved to the mutable lane meanwhile
-- beats there (the caller moves an attempt with progress first: the ring has
-- no place for it).
WITH c AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::jsonb[], $4::smallint[])
        AS c(id, lease, progress, slot)
), ring AS (
    INSERT INTO awa.heartbeats (slot, id, run_lease)
    SELECT c.slot, c.id, c.lease FROM c
    WHERE c.slot IS NOT NULL AND awa.ring_open(c.slot, c.id, c.lease)
    RETURNING id
), owned AS (
    SELECT j.id FROM awa.jobs j JOIN c ON j.id = c.id AND j.run_lease = c.lease
    WHERE j.state IN ('running', 'waiting_external')
), locked AS (
    SELECT j.id, c.progress FROM awa.jobs j JOIN c ON j.id = c.id AND j.run_lease = c.lease
    WHERE j.state IN ('running', 'waiting_external')
    FOR UPDATE OF j SKIP LOCKED
), beat AS (
    UPDATE awa.jobs j SET heartbeat_at = now(), progress = coalesce(locked.progress, j.progress)
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
)
-- Grouped rather than owned LEFT JOIN beat: estimating few running jobs, the
-- planner joined them by a nested loop that rescanned beat per owned row,
-- quadratic in the attempts (3 s for 6,000; it hit the 30-s timeout when a
-- stall left tens of thousands of completions waiting, bench/soak.py).
SELECT id, bool_or(written) AS written
FROM (SELECT id, false AS written FROM owned UNION ALL SELECT id, true FROM beat
      UNION ALL SELECT id, true FROM ring) b
GROUP BY id

-- name: attempt_complete_batch
-- Finish many attempts in one round trip, each under its own lease guard.
-- Returns the ids that completed; the rest were stale and changed nothing.
-- $3 holds each job's output, or is NULL when none has one (unnest pads it).
-- No explicit row lock first (it would cost a WAL record per job): the
-- DELETE locks each row itself and re-checks the guard against the newest
-- version. Heartbeats skip locked rows, so they cannot deadlock with it.
-- Rows are found by id only: written as state = 'running', the guard lets the
-- planner read every running job through jobs_running_idx instead (statistics
-- say few are running), and that index holds an entry for every job claimed
-- since the last vacuum; while any transaction stays open none of them can be
-- skipped, each batch slows the next, and completions stopped for 30 s
-- (bench/soak.py). The text comparison cannot use that partial index.
-- Nor is the batch joined to the table: after an ANALYZE that saw an almost
-- empty queue, the reused generic plan read all of awa.jobs per batch (a full
-- index scan, the batch as a join filter) and completions stopped for 3 s
-- once a backlog had grown (bench/soak.py, auto_explain). `id = ANY($1)` can
-- only be an index condition; each row's lease and output are looked up in a
-- JSON map of the batch, built once.
-- Ring attempts ($5: each one's receipt slot, NULL for the mutable lane; NULL
-- when the batch has none) close by a closure, written only where the receipt
-- is and first come first served (awa.ring_close, migration 0025: a plain
-- insert, with no second WAL record per row), then finish from their ready
-- row. One whose closure lost because it was moved to the mutable lane
-- (ring_materialize) is finished there, by the DELETE below.
-- Each receipt and the ready row it started from are read once, one probe
-- apiece (LATERAL ... LIMIT 1: as a semi-join, a generic plan made on a small
-- ring hash-joined a scan of every receipt), before the closure; the jobs_done
-- rows are made from what was read for the closures that won. Each output
-- comes from c as a column: a sub-select among awa.finished's arguments keeps
-- the planner from inlining it, and called once per row it was two thirds of
-- the statement's time (bench: pg_stat_statements, track=all). `closed` is a
-- SELECT, run as far as it is read: whenever `opened` has rows, ring_done's
-- join reads it, and the first row read runs awa.ring_close whole (a plpgsql
-- set is returned all at once); with no ring attempt opened it need not run.
WITH c AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $5::smallint[], $3::jsonb[])
        AS c(id, lease, slot, output)
), opened AS MATERIALIZED (
    SELECT c.slot, c.id, c.lease, c.output, awa.ring_job(w, r, NULL) AS j FROM c
    CROSS JOIN LATERAL (SELECT * FROM awa.receipts r
                        WHERE r.slot = c.slot AND r.id = c.id AND r.run_lease = c.lease
                        LIMIT 1) r
    CROSS JOIN LATERAL (SELECT * FROM awa.ready w
                        WHERE w.slot = r.ready_slot AND w.id = r.id
                          AND w.lease_base = r.run_lease - 1 LIMIT 1) w
    WHERE c.slot IS NOT NULL
), closed AS MATERIALIZED (
    SELECT k.id FROM (SELECT array_agg(o.slot) AS s, array_agg(o.id) AS i,
                             array_agg(o.lease) AS l FROM opened o) a,
        awa.ring_close(a.s, a.i, a.l, awa.ring_outcome('completed')) AS k(id)
), outputs AS MATERIALIZED (
    SELECT jsonb_object_agg(c.id, c.output) FILTER (WHERE c.output IS NOT NULL) AS o FROM c
), ring_done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM closed k JOIN opened o ON o.id = k.id,
        LATERAL awa.finished(o.j, 'completed', $4::interval, NULL, NULL, true, o.output) f
    RETURNING id, queue
), moved AS (
    DELETE FROM awa.jobs j
    WHERE j.id = ANY(ARRAY(SELECT c.id FROM c WHERE c.slot IS NULL OR NOT EXISTS (
                               SELECT 1 FROM closed k WHERE k.id = c.id)))
      AND j.state::text = 'running'
      AND j.run_lease = ((SELECT jsonb_object_agg(c.id, c.lease) FROM c) ->> j.id::text)::bigint
    RETURNING j, (SELECT o FROM outputs) -> j.id::text AS output
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'completed', $4::interval, NULL, NULL, true, m.output) f
    RETURNING id, queue
)
SELECT id, queue FROM done UNION ALL SELECT id, queue FROM ring_done

-- name: attempt_complete_batch_mutable
-- attempt_complete_batch for a batch with no ring attempt (every one in
-- awa.jobs: the ring is off, or none of these came from it): the same
-- guarded DELETE, without the ring's closures in the plan (its CTEs cost
-- every completion some server CPU even when they find nothing).
WITH moved AS (
    DELETE FROM awa.jobs j
    WHERE j.id = ANY($1::bigint[]) AND j.state::text = 'running'
      AND j.run_lease = ((SELECT jsonb_object_agg(c.id, c.lease)
                          FROM unnest($1::bigint[], $2::bigint[]) AS c(id, lease))
                         ->> j.id::text)::bigint
    RETURNING j, (SELECT jsonb_object_agg(c.id, c.output) FILTER (WHERE c.output IS NOT NULL)
                  FROM unnest($1::bigint[], $3::jsonb[]) AS c(id, output)) -> j.id::text
                 AS output
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'completed', $4::interval, NULL, NULL, true, m.output) f
    RETURNING id, queue
)
SELECT id, queue FROM done

-- name: attempt_fail
-- Failure ($3 = error text, $5 = progress to keep or NULL, $6 = marks the
-- entry terminal: a TerminalError, as opposed to attempts running out).
-- On a DLQ-enabled queue the job goes to the dead letter queue instead
-- (dlq = true in the result, for the awa.job.dlq_moved counter).
WITH moved AS (
    DELETE FROM awa.jobs j
    WHERE j.id = $1 AND j.run_lease = $2 AND j.state = 'running'
    RETURNING j, awa.dlq_enabled(j.queue) AS to_dlq
), done AS (
    INSERT INTO awa.jobs_done
    SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'failed', $4::interval,
                             awa.error_entry($3, (m.j).attempt, $6), $5::jsonb) f
    WHERE NOT m.to_dlq
    RETURNING id, queue, kind
), dead AS (
    INSERT INTO awa.dlq
    SELECT d.* FROM moved m,
        LATERAL awa.finished(m.j, 'failed', $4::interval,
                             awa.error_entry($3, (m.j).attempt, $6), $5::jsonb) f,
        LATERAL awa.dead_lettered(f, CASE WHEN $6 THEN 'terminal_error'
                                          ELSE 'max_attempts_exhausted' END) d
    WHERE m.to_dlq
    RETURNING id, queue, kind
)
SELECT id, queue, kind, false AS dlq FROM done
UNION ALL SELECT id, queue, kind, true AS dlq FROM dead

-- name: attempt_cancel
WITH moved AS (
    DELETE FROM awa.jobs j
    WHERE j.id = $1 AND j.run_lease = $2 AND j.state = 'running'
    RETURNING j
)
INSERT INTO awa.jobs_done
SELECT f.* FROM moved m,
    LATERAL awa.finished(m.j, 'cancelled', $4::interval,
                         awa.error_entry($3, (m.j).attempt, false), $5::jsonb) f
RETURNING id

-- name: attempt_retry
-- Back to retryable after $3 seconds (NULL = backoff), recording error $4 if given.
-- The backoff is awa.retry_delay (migration 0001), the formula of
-- awa.core.states.retry_delay: min(2^attempt * (1 + U(0, 0.25)), 24 h).
UPDATE awa.jobs j
SET state = 'retryable',
    run_at = now() + coalesce(make_interval(secs => $3::float8), awa.retry_delay(j.attempt)),
    errors = CASE WHEN $4::text IS NULL THEN j.errors
                  ELSE coalesce(j.errors, '[]'::jsonb)
                       || jsonb_build_array(awa.error_entry($4, j.attempt, false)) END,
    progress = coalesce($5::jsonb, j.progress),
    heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL
WHERE j.id = $1 AND j.run_lease = $2 AND j.state = 'running'
RETURNING j.id

-- name: attempt_snooze
-- Run again after $3 seconds without consuming an attempt.
UPDATE awa.jobs j
SET state = 'scheduled', run_at = now() + make_interval(secs => $3::float8),
    attempt = greatest(j.attempt - 1, 0), progress = coalesce($4::jsonb, j.progress),
    heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL
WHERE j.id = $1 AND j.run_lease = $2 AND j.state = 'running'
RETURNING j.id

-- name: attempt_claim_one_kind
-- The testing harness: claim the next available job of one kind in one queue
-- (durably, as every claim: claim_durably).
WITH open AS (
    SELECT {{claim_durably}} AS ok
), picked AS (
    SELECT id FROM awa.jobs
    WHERE state = 'available' AND queue = $1 AND kind = $2 AND (SELECT ok FROM open)
    ORDER BY priority, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE awa.jobs j
SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
    attempted_at = now(), heartbeat_at = now()
FROM picked WHERE j.id = picked.id
RETURNING j.*

-- name: attempt_materialize
-- Move open ring attempts (receipt slots $1, ids $2, run leases $3) to the
-- mutable lane before anything but a plain completion is written for them
-- (migration 0020, awa.ring_materialize). Moving one already moved, or no
-- longer open, does nothing; the write that follows is guarded as usual.
SELECT awa.ring_materialize($1::smallint[], $2::bigint[], $3::bigint[]) AS id
