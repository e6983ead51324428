-- 0008: awa.jobs keeps half of each page free (fillfactor 80 -> 50).
--
-- A claim rewrites every row it takes (state, attempt, lease and three
-- times), and the new version is about 24 bytes larger than the row a
-- producer inserted. With a fifth of the page free, a claim of 32 jobs from
-- a packed page found room there for only a few of them: the rest moved to
-- another page, which costs an extra row-lock WAL record each and a full
-- copy of the row in the update record (on the same page PostgreSQL logs
-- only the bytes that changed). With half the page free every claimed row
-- stays on its page: 790 -> 718 WAL bytes per completed job in a drain of
-- 20,000 (bench/README.md, "WAL bytes per job"). Lower settings saved
-- nothing more. The price is a backlog that takes about twice the pages.
--
-- Only new pages are filled this way; the ALTER takes a lock that blocks no
-- reads or writes.

ALTER TABLE awa.jobs SET (fillfactor = 50);
