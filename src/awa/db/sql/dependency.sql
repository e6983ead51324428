-- Statements on job dependencies (after=, chain / group / chord). The release
-- of a finished parent's children happens in the trigger of the statement
-- that finishes it (awa.release_dependents, the job_dependencies migration), not here.

-- name: dependency_lock_parents
-- The active parents among $1, locked (in id order, as completion batches
-- lock) until the inserting transaction ends, and marked as having
-- dependents so their finishing statement releases the children: a parent
-- cannot finish between this and the commit of the new edges.
WITH locked AS (
    SELECT id FROM awa.jobs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
)
UPDATE awa.jobs j SET metadata = j.metadata || '{"_awa_dependents": true}'
FROM locked WHERE j.id = locked.id
RETURNING j.id

-- name: dependency_finished_parents
-- The finished parents among $1 (a separate statement: its snapshot sees a
-- parent that finished while the lock above waited for it).
SELECT id, state, prune_after FROM awa.jobs_done WHERE id = ANY($1::bigint[])
UNION ALL
SELECT id, state, prune_after FROM awa.dlq WHERE id = ANY($1::bigint[])

-- name: dependency_insert_edges
-- Edges of children to parents, $3[i] being parent $2[i]'s place in the list.
INSERT INTO awa.job_dependencies (parent_id, child_id, policy, ordinal)
SELECT p, c, pol, o FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::smallint[])
    AS e(c, p, pol, o)

-- name: dependency_release
-- Apply a parent that had already finished when its child was inserted.
SELECT awa.release_dependents($1, $2::awa.job_state, $3)

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
