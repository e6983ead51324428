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
