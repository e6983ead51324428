-- 0027: finished jobs listed by kind or queue in milliseconds, however rare (issue 42).
--
-- list_jobs(kind=...) or (queue=...) read each partition of awa.jobs_done
-- backwards by its id index until it had `limit` matches: quick for a kind
-- that most jobs have, but a partition without one was read whole: 1.3 s for
-- a kind or queue absent from 10M jobs of history (bench/reads.py). A btree
-- index on either column would cost every completion another index entry (its
-- WAL included), so instead one small BRIN index of bloom filters on both:
-- for each 8 pages of history, whether a kind or queue may be there. A
-- completion appends to the newest range, which is not summarized yet, and
-- so does not write the index; autovacuum summarizes a range once it fills
-- (autosummarize). About 3 MB per million jobs.
--
-- Which scan is right depends on the value: by the id index for a common
-- one (it stops after `limit` rows), by the bloom index for a rare or absent
-- one. A prepared statement's generic plan cannot know the value, so the
-- history part is planned for each call, with its values, by
-- awa.history_newest (EXECUTE ... USING: a one-shot plan).
CREATE INDEX jobs_done_names_bloom_idx ON awa.jobs_done
    USING brin (kind text_bloom_ops, queue text_bloom_ops)
    WITH (pages_per_range = 8, autosummarize = on);

-- Finished jobs, newest first: of state st, kind k and queue qu (each NULL:
-- any), at most lim.
CREATE FUNCTION awa.history_newest(st awa.job_state, k text, qu text, lim int)
RETURNS SETOF awa.jobs_done LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT * FROM awa.jobs_done WHERE ($1 IS NULL OR state = $1)'
        ' AND ($2 IS NULL OR kind = $2) AND ($3 IS NULL OR queue = $3)'
        ' ORDER BY id DESC LIMIT $4'
        USING st, k, qu, lim;
END $$;
