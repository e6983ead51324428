-- Descriptors: what each running worker declares about its queues and job
-- kinds (display name, owner, docs...). One row per declaring process, so the
-- UI can tell live (declared by a live worker), stale (no live worker
-- declares it) and drifted (live workers disagree) apart.
CREATE TABLE awa.descriptors (
    scope       text NOT NULL CHECK (scope IN ('queue', 'kind')),
    name        text NOT NULL,
    instance_id text NOT NULL,
    descriptor  jsonb NOT NULL,
    fingerprint text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name, instance_id)
);

-- Live queue overrides, set by operators (CLI, UI, API) and applied by every
-- worker serving the queue within seconds. NULL = not overridden.
CREATE TABLE awa.queue_overrides (
    queue               text PRIMARY KEY,
    poll_interval_ms    integer CHECK (poll_interval_ms BETWEEN 10 AND 3600000),
    claim_batch_size    integer CHECK (claim_batch_size BETWEEN 1 AND 1000),
    rate_limit_per_s    float8 CHECK (rate_limit_per_s > 0 AND rate_limit_per_s <= 1000000),
    rate_limit_burst    integer CHECK (rate_limit_burst BETWEEN 1 AND 1000000),
    deadline_ms         bigint CHECK (deadline_ms BETWEEN 0 AND 604800000),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    updated_by          text
);

-- The web UI's job filters, written once for its three list statements
-- (active, finished, all). Inlined by the planner (a plain SQL expression).
CREATE FUNCTION awa.ui_matches(j_queue text, j_kind text, j_tags text[], j_args jsonb,
                               p_queue text, p_kind text, p_tag text, p_search text)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_queue IS NULL OR j_queue = p_queue) AND (p_kind IS NULL OR j_kind = p_kind)
       AND (p_tag IS NULL OR p_tag = ANY (j_tags))
       AND (p_search IS NULL OR strpos(lower(j_kind || ' ' || j_queue || ' ' || j_args::text
                                             || ' ' || array_to_string(j_tags, ' ')),
                                       lower(p_search)) > 0)
$$;
