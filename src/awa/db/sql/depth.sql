-- Queue depth for producer backpressure: available jobs of one queue, never
-- counted past $2, so a check costs at most $2 index entries however deep the
-- backlog is. Three parts, each only while the ones before are short of $2:
-- the mutable lane's, from the claim index (jobs_claim_idx holds exactly the
-- available rows, in queue order); the ring's rows this transaction wrote,
-- when its own snapshot does not show its id as visible (it does not while
-- no later transaction has started, and the claim cursors' count then misses
-- them: one index probe per priority lane); and the
-- ring's committed ones, from its claim cursors (awa.ring_available, which
-- never walks spent rows). Other producers' uncommitted jobs are not counted.

-- name: depth_available
WITH mutable AS (
    SELECT count(*)::int AS n
    FROM (SELECT 1 FROM awa.jobs WHERE state = 'available' AND queue = $1::text
          LIMIT $2::int) s
), own AS (
    SELECT count(*)::int AS n
    FROM (SELECT 1 FROM generate_series(1, 4) p
          CROSS JOIN LATERAL (
              SELECT 1 FROM awa.ready w
              WHERE w.queue = $1::text AND w.priority = p
                AND w.xid = pg_current_xact_id_if_assigned()
                AND NOT pg_visible_in_snapshot(w.xid, pg_current_snapshot())
                AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k
                                WHERE k.slot = w.slot AND k.id = w.id
                                  AND k.lease_base = w.lease_base)
              LIMIT $2::int) x
          LIMIT (SELECT $2::int - n FROM mutable)) s
)
SELECT least($2::int, m.n + o.n + CASE WHEN m.n + o.n < $2::int
                                      THEN awa.ring_available($1::text, $2::int - m.n - o.n)
                                      ELSE 0 END) AS depth
FROM mutable m, own o
