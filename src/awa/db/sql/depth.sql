-- Queue depth for producer backpressure: available jobs of one queue, counted
-- from the claim index (jobs_claim_idx holds exactly the available rows, in
-- queue order) and never past $2, so a check costs at most $2 index entries
-- however deep the backlog is.

-- name: depth_available
SELECT count(*) AS depth
FROM (SELECT 1 FROM awa.jobs WHERE state = 'available' AND queue = $1 LIMIT $2) s
