-- 0010: no role gets to run Awa's writing functions just by existing.
--
-- PostgreSQL lets PUBLIC execute every new function. The two SECURITY
-- DEFINER partition functions run as the owner, so before this migration any
-- role with USAGE on the schema could call
-- awa.drop_done_partitions(now() + interval '100 years') and delete the whole
-- finished-job history, unless the operator had run `awa grants` (which
-- revokes it). The migration itself now takes EXECUTE away from PUBLIC on
-- every function that writes; the owner keeps it, and `awa grants ROLE`
-- gives it to the runtime role (never to a read-only role). The read-only
-- helpers (state_bit, retry_delay, error_entry, finished, dlq_enabled,
-- ui_matches, batch_match) stay callable: the read-only web UI uses them.
-- Trigger functions run as triggers whoever fires them; revoking them too
-- keeps the rule simple: nothing that writes is PUBLIC.

REVOKE EXECUTE ON FUNCTION awa.ensure_done_partitions(timestamptz),
    awa.ensure_done_partitions(timestamptz, timestamptz),
    awa.drop_done_partitions(timestamptz),
    awa.unique_claim_sync(), awa.unique_claim_release(), awa.notify_inserted()
    FROM PUBLIC;
