-- 0008: awa.jobs pages keep room for the claim's new row versions.
--
-- A claim rewrites each row it takes (state, attempt, lease, times). When the
-- new version fits on the row's own page, PostgreSQL logs only the bytes that
-- changed; when the page is full the new version goes to another page, and
-- the whole row is logged again plus a lock record for the old one. Jobs
-- inserted in bulk filled their pages, so every claim of them took the second
-- path. Pages filled from now on keep 55% free, room for the new versions of
-- all their rows (a claimed row is a little longer: two more timestamps). The
-- drain in bench/run.py writes 717 bytes of WAL per job instead of 803, at
-- the cost of about twice the pages for a backlog (awa.jobs holds only
-- unfinished jobs; finished ones move to awa.jobs_done).

ALTER TABLE awa.jobs SET (fillfactor = 45);
