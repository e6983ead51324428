-- Statements on job dependencies (after=, chain / group / chord). The release
-- of a finished parent's children starts in the trigger of the statement that
-- finishes it (awa.release_dependents, migrations 0013 and 0019: at most 1,000
-- children there); the rest is left in awa.dependency_releases for the
-- workers' release service (dependency_release_next), one chunk per transaction.

-- name: dependency_parents_to_mutable
-- Parents among $1 still in the append-only lane move to awa.jobs first, where
-- dependency_lock_parents marks them (migration 0020). awa.ring_to_mutable in
-- two statements: first the available ones (awa.ring_unready, which takes
-- their queue's claim lock, held until the inserting transaction ends), then
-- (dependency_parents_materialize) the running ones. Only the parents not
-- claimed yet are handed to ring_unready: a running parent's queue is not
-- locked, so an open producer transaction holds up no claim of it.
SELECT coalesce(array_agg(id), '{}') AS ids FROM awa.ring_unready(ARRAY(
    SELECT w.id FROM awa.ready w
    WHERE w.id = ANY($1::bigint[])
      AND NOT EXISTS (SELECT 1 FROM awa.receipts r
                      WHERE r.id = w.id AND r.run_lease = w.lease_base + 1))) id

-- name: dependency_parents_materialize
-- The open ring attempts of parents $1 move to awa.jobs (awa.ring_materialize),
-- read in this statement's snapshot: after dependency_parents_to_mutable's
-- claim lock, so a claim that committed while it waited is seen and moved.
SELECT coalesce(array_agg(id), '{}') AS ids FROM (
    SELECT awa.ring_materialize(array_agg(r.slot), array_agg(r.id), array_agg(r.run_lease)) AS id
    FROM awa.receipts r
    WHERE r.id = ANY($1::bigint[]) AND NOT EXISTS (
        SELECT 1 FROM awa.closures c
        WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease)
    HAVING count(*) > 0) m

-- name: dependency_lock_parents
-- The active parents among $1, locked (in id order, as completion batches
-- lock) until the inserting transaction ends, and marked as having
-- dependents so their finishing statement releases the children: a parent
-- cannot finish between this and the commit of the new edges. One row, the
-- ids as an array (every driver, the bridge's included, reads one row).
WITH locked AS (
    SELECT id FROM awa.jobs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
), marked AS (
    UPDATE awa.jobs j SET metadata = j.metadata || '{"_awa_dependents": true}'
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
)
SELECT coalesce(array_agg(id), '{}') AS ids FROM marked

-- name: dependency_finished_parents
-- The finished parents among $1 (a separate statement: its snapshot sees a
-- parent that finished while the lock above waited for it), as three arrays.
SELECT coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(state::text), '{}') AS states,
       coalesce(array_agg(prune_after), '{}') AS prune_after
FROM (SELECT id, state, prune_after FROM awa.jobs_done WHERE id = ANY($1::bigint[])
      UNION ALL
      SELECT id, state, prune_after FROM awa.dlq WHERE id = ANY($1::bigint[])) f

-- name: dependency_insert_edges
-- Edges of children to parents, $4[i] being parent $2[i]'s place in the list.
INSERT INTO awa.job_dependencies (parent_id, child_id, policy, ordinal)
SELECT p, c, pol, o FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::smallint[])
    AS e(c, p, pol, o)

-- name: dependency_release
-- Apply parents that had already finished when their children were inserted:
-- parent $1[i] finished as $2[i], its retention ending at $3[i]; only to the
-- children $4 (the inserted ones; NULL: every open edge of the parent).
SELECT coalesce(sum(awa.release_dependents(p, s::awa.job_state, pa, NULL, $4::bigint[])),
                0)::int AS touched
FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS f(p, s, pa)

-- name: dependency_releases_next
-- The release service: parents whose children are still to release, oldest
-- first, but for $1 (this pass gave up on them), at most $2.
SELECT parent_id FROM awa.dependency_releases
WHERE parent_id <> ALL($1::bigint[])
ORDER BY queued_at, parent_id LIMIT $2

-- name: dependency_release_one
-- One chunk: at most $2 children of parent $1 released, in this statement's
-- own transaction. No row: the parent is done, or another worker has it
-- (SKIP LOCKED). release_dependents deletes the parent's row once every
-- edge of it is resolved.
WITH next AS MATERIALIZED (
    SELECT parent_id, parent_state, prune_after, after_child FROM awa.dependency_releases
    WHERE parent_id = $1 FOR UPDATE SKIP LOCKED
)
SELECT parent_id, awa.release_dependents(parent_id, parent_state, prune_after, $2::integer,
                                         NULL, after_child) AS touched
FROM next

-- name: dependency_releases_pending
-- Parents whose children are still to release, and the oldest one's age.
SELECT count(*) AS parents, extract(epoch FROM now() - min(queued_at)) AS oldest_s
FROM awa.dependency_releases

-- fragment: staging_edges
-- The edges of each row inserted from the staging table (ins) to the parents in
-- its after_ids, with its on_parent_failure (a row skipped for its unique key
-- gets none).
edges AS (
    INSERT INTO awa.job_dependencies (parent_id, child_id, policy, ordinal)
    SELECT p.parent, s.id, s.on_parent_failure, (p.ord - 1)::smallint
    FROM src s JOIN ins ON ins.id = s.id,
         unnest(s.after_ids) WITH ORDINALITY AS p(parent, ord)
)

-- name: dependency_insert_from_staging
-- job_insert_from_staging for rows that may wait for other jobs: the jobs and
-- their edges in one statement; the inserted rows.
WITH {{staging_claimed}},
ins AS (
    {{staging_insert}}
    RETURNING *
), {{staging_edges}}
SELECT * FROM ins ORDER BY id

-- fragment: dependency_array_src
-- job_insert_many's src, for a batch where some jobs wait for others: $15
-- holds each job's parent ids as an array literal (NULL: none), $16 its
-- on_parent_failure.
src AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('awa.jobs', 'id')) AS id, s.kind, s.queue,
           s.args::jsonb AS args, s.run_at, s.priority, s.max_attempts,
           coalesce($14::text[], ARRAY(SELECT jsonb_array_elements_text(s.tags::jsonb)))
               AS tags,
           s.metadata::jsonb AS metadata, s.unique_key, s.unique_states, s.ordering_key,
           s.concurrency_key, s.concurrency_limit, s.after::bigint[] AS after_ids,
           s.on_parent_failure,
           CASE WHEN s.run_at > now() THEN 'scheduled' ELSE 'available' END::awa.job_state
               AS state
    FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::smallint[],
                $6::smallint[], $7::text[], $8::text[], $9::bytea[], $10::smallint[],
                $11::text[], $12::text[], $13::integer[], $15::text[], $16::text[])
         WITH ORDINALITY AS s(kind, queue, args, run_at, priority, max_attempts, tags,
                              metadata, unique_key, unique_states, ordering_key,
                              concurrency_key, concurrency_limit, after, on_parent_failure,
                              ord)
    ORDER BY s.ord
)

-- name: dependency_insert_many
-- job_insert_many for a small batch where some jobs wait for others: every
-- job in one statement, in the batch's order, with the edges of those that
-- wait. No staging table: one round trip. The inserted rows.
WITH {{dependency_array_src}}, {{unique_claimed}},
ins AS (
    {{staging_insert}}
    RETURNING *
), {{staging_edges}}
SELECT * FROM ins ORDER BY id

-- name: dependency_count_many
-- dependency_insert_many answering only how many jobs it inserted
-- (enqueue_many_copy: no rows to send back).
WITH {{dependency_array_src}}, {{unique_claimed}},
ins AS (
    {{staging_insert}}
    RETURNING id
), {{staging_edges}}
SELECT count(*) AS inserted FROM ins

-- name: dependency_count_from_staging
-- dependency_insert_from_staging answering only how many jobs it inserted
-- (enqueue_many_copy: no rows to send back).
WITH {{staging_claimed}},
ins AS (
    {{staging_insert}}
    RETURNING id
), {{staging_edges}}
SELECT count(*) AS inserted FROM ins

-- name: dependency_jobs_get
-- Jobs by id, in id order (rows re-read after an insert released some at once).
SELECT * FROM awa.jobs_all WHERE id = ANY($1::bigint[]) ORDER BY id

-- name: dependency_graph
-- The workflow around job $1: every job connected to it through edges,
-- whichever direction (at most $2 jobs), with each job's state (NULL: gone,
-- discarded or pruned) and its edges.
WITH RECURSIVE nodes(id) AS (
    SELECT $1::bigint
    UNION
    SELECT CASE WHEN d.parent_id = n.id THEN d.child_id ELSE d.parent_id END
    FROM nodes n JOIN awa.job_dependencies d ON d.parent_id = n.id OR d.child_id = n.id
), picked AS (
    SELECT id FROM nodes ORDER BY id LIMIT $2
)
SELECT s.id, a.kind, a.queue, a.state::text AS state, a.attempt, a.finalized_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'parent_id', d.parent_id, 'policy', d.policy,
                     'parent_state', d.parent_state::text,
                     'resolved_at', d.resolved_at) ORDER BY d.ordinal)
                 FROM awa.job_dependencies d WHERE d.child_id = s.id), '[]') AS parents
FROM picked s LEFT JOIN awa.jobs_all a ON a.id = s.id
ORDER BY s.id

-- name: dependency_parent_outputs
-- A child's parents in after= order, with how they finished and their
-- retained outputs (NULL once pruned).
SELECT d.parent_id AS id, a.kind, coalesce(a.state, d.parent_state)::text AS state,
       a.output
FROM awa.job_dependencies d LEFT JOIN awa.jobs_all a ON a.id = d.parent_id
WHERE d.child_id = $1
ORDER BY d.ordinal

-- name: dependency_waiting_on
-- How many parents each of the jobs $1 still waits for (only those waiting).
SELECT child_id AS id, count(*) AS waiting
FROM awa.job_dependencies
WHERE child_id = ANY($1::bigint[]) AND resolved_at IS NULL
GROUP BY child_id

-- name: dependency_prune
-- Cleanup: resolved edges older than $1, at most $2 per pass.
DELETE FROM awa.job_dependencies d
USING (SELECT parent_id, child_id FROM awa.job_dependencies
       WHERE resolved_at < now() - $1::interval LIMIT $2) old
WHERE d.parent_id = old.parent_id AND d.child_id = old.child_id

-- name: dependency_release_orphans
-- Cleanup: children still parked for a parent that exists nowhere, neither
-- active, finished nor dead-lettered (deleted by hand: every finish resolves
-- its edges in its own statement). Such a parent counts as cancelled, so its
-- children's on_parent_failure applies (cancelled ones kept for $1); at most
-- $2 parents per pass, each releasing at most $3 children here (the release
-- service goes on with the rest, as after any finish). Parked children are
-- read from jobs_due_idx, each parent probed by id; the statement's one
-- snapshot sees a parent that is moving between the tables in exactly one of
-- them. A parent whose release is already queued is the release service's.
SELECT coalesce(sum(awa.release_dependents(o.parent_id, 'cancelled',
                                           now() + $1::interval, $3::integer)), 0)::int
       AS touched
FROM (
    SELECT DISTINCT d.parent_id
    FROM awa.jobs c
    JOIN awa.job_dependencies d ON d.child_id = c.id AND d.resolved_at IS NULL
    WHERE c.state = 'scheduled' AND c.run_at >= '9999-12-30 00:00:00+00'
      AND NOT EXISTS (SELECT 1 FROM awa.jobs p WHERE p.id = d.parent_id)
      AND NOT EXISTS (SELECT 1 FROM awa.jobs_done p WHERE p.id = d.parent_id)
      AND NOT EXISTS (SELECT 1 FROM awa.dlq p WHERE p.id = d.parent_id)
      AND NOT EXISTS (SELECT 1 FROM awa.dependency_releases r WHERE r.parent_id = d.parent_id)
    LIMIT $2
) o
