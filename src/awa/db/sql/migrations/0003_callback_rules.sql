-- CEL rules of a callback (filter, on_complete, on_fail, transform), kept
-- beside the job rather than on the hot awa.jobs row. Only callbacks
-- registered with rules have a row; resolve_callback deletes it, and
-- maintenance drops rows whose callback no longer exists on any job.
CREATE TABLE awa.callback_rules (
    callback_id uuid PRIMARY KEY,
    job_id      bigint NOT NULL,
    rules       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
