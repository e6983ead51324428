-- Descriptors and live queue overrides (see awa.descriptors, awa.overrides).

-- name: descriptor_upsert
INSERT INTO awa.descriptors AS d (scope, name, instance_id, descriptor, fingerprint)
SELECT s, n, $1, dsc::jsonb, f
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(s, n, dsc, f)
ON CONFLICT (scope, name, instance_id) DO UPDATE
SET descriptor = EXCLUDED.descriptor, fingerprint = EXCLUDED.fingerprint, declared_at = now()

-- name: descriptor_status
-- One row per declared queue or kind: the newest declaration (a live one
-- first), how many live processes declare it and how many variants they hold.
WITH d AS (
    SELECT d.*, coalesce(r.last_seen_at > now() - make_interval(secs => $1), false) AS live
    FROM awa.descriptors d LEFT JOIN awa.presence r USING (instance_id)
)
SELECT scope, name,
       (array_agg(descriptor ORDER BY live DESC, declared_at DESC))[1] AS descriptor,
       count(*) FILTER (WHERE live) AS live_instances,
       count(DISTINCT fingerprint) FILTER (WHERE live) AS live_variants,
       max(declared_at) AS declared_at
FROM d
WHERE ($2::text IS NULL OR scope = $2)
GROUP BY scope, name ORDER BY scope, name

-- name: descriptor_prune
-- Declarations of vanished processes, keeping the newest per name (it shows as stale).
DELETE FROM awa.descriptors d
WHERE NOT EXISTS (SELECT 1 FROM awa.presence r WHERE r.instance_id = d.instance_id)
  AND EXISTS (SELECT 1 FROM awa.descriptors n
              WHERE n.scope = d.scope AND n.name = d.name AND n.declared_at > d.declared_at)

-- name: override_set
-- Merge: only the fields given (non-NULL, flagged in $7) change.
INSERT INTO awa.queue_overrides AS o
    (queue, poll_interval_ms, claim_batch_size, rate_limit_per_s, rate_limit_burst,
     deadline_ms, updated_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (queue) DO UPDATE
SET poll_interval_ms = coalesce(EXCLUDED.poll_interval_ms, o.poll_interval_ms),
    claim_batch_size = coalesce(EXCLUDED.claim_batch_size, o.claim_batch_size),
    rate_limit_per_s = coalesce(EXCLUDED.rate_limit_per_s, o.rate_limit_per_s),
    rate_limit_burst = coalesce(EXCLUDED.rate_limit_burst, o.rate_limit_burst),
    deadline_ms = coalesce(EXCLUDED.deadline_ms, o.deadline_ms),
    updated_at = now(), updated_by = EXCLUDED.updated_by
RETURNING *

-- name: override_clear_fields
-- Clear the named fields ($2); a row with nothing left is deleted by override_drop_empty.
UPDATE awa.queue_overrides
SET poll_interval_ms = CASE WHEN 'poll_interval_ms' = ANY ($2) THEN NULL ELSE poll_interval_ms END,
    claim_batch_size = CASE WHEN 'claim_batch_size' = ANY ($2) THEN NULL ELSE claim_batch_size END,
    rate_limit_per_s = CASE WHEN 'rate_limit' = ANY ($2) THEN NULL ELSE rate_limit_per_s END,
    rate_limit_burst = CASE WHEN 'rate_limit' = ANY ($2) THEN NULL ELSE rate_limit_burst END,
    deadline_ms = CASE WHEN 'deadline_ms' = ANY ($2) THEN NULL ELSE deadline_ms END,
    updated_at = now()
WHERE queue = $1
RETURNING queue

-- name: override_drop_empty
DELETE FROM awa.queue_overrides
WHERE queue = $1 AND poll_interval_ms IS NULL AND claim_batch_size IS NULL
  AND rate_limit_per_s IS NULL AND deadline_ms IS NULL

-- name: override_list
SELECT * FROM awa.queue_overrides WHERE ($1::text[] IS NULL OR queue = ANY ($1)) ORDER BY queue
