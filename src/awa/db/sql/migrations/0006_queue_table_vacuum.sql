-- 0006: vacuum never truncates the active job table.
--
-- awa.jobs churns (every job is inserted, updated and deleted), so its tail
-- pages empty and refill all the time. Truncating them at the end of a VACUUM
-- takes an ACCESS EXCLUSIVE lock, which stops every claim and completion
-- while it is held (a 1.7 s stall was measured by bench/scheduled.py), only
-- for the pages to be extended again moments later. Applies to autovacuum and
-- to the leader's own VACUUM alike.

ALTER TABLE awa.jobs SET (vacuum_truncate = false);
