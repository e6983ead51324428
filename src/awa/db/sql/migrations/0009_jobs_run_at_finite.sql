-- 0009: a job's run_at is always a finite time.
--
-- asyncpg stores Python's datetime.min and datetime.max as -infinity and
-- +infinity. One such job made every claim on its queue fail ("cannot
-- subtract infinite timestamps" in priority aging) and every queue statistic
-- with it. The producer now refuses those values; this migration moves any
-- row already stored to the nearest finite time (a -infinity job keeps its
-- place at the head of its queue: its creation time; a +infinity one the
-- latest accepted run_at) and adds a CHECK so no writer, ours or another,
-- can store one again. Finished and dead-lettered jobs never run, so their
-- copies are left as they are.

UPDATE awa.jobs SET run_at = CASE WHEN run_at = '-infinity' THEN least(created_at, now())
                                  ELSE '9999-12-30 00:00:00+00' END
WHERE NOT isfinite(run_at);

ALTER TABLE awa.jobs ADD CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at));
