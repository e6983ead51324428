-- 0022: the throughput rollup becomes append-only (issue 42).
--
-- Each worker process added its counts to this minute's row of its shard
-- about once a second, an UPDATE each time: ~3,600 dead row versions an hour
-- per process, which a held xmin horizon keeps. Now each flush is a new row
-- and readers sum them (they already summed shards), so the only rows that
-- ever die are the week-old ones the retention sweep deletes.
ALTER TABLE awa.queue_throughput DROP CONSTRAINT queue_throughput_pkey;
CREATE INDEX queue_throughput_queue_minute ON awa.queue_throughput (queue, minute);
CREATE INDEX queue_throughput_minute ON awa.queue_throughput (minute);
