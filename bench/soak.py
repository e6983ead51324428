#!/usr/bin/env python3
"""Soak: a steady load on top of a big history, against a fresh database (issue 9, item 3).

    python bench/soak.py                       # 30 min each, 10M jobs of history, 70% of peak
    python bench/soak.py --minutes 1 --blocks 2 --history 20000     # smoke (about 3 min)

1. **Peak**: bulk-insert --peak-jobs no-op jobs into a fresh database and drain
   them with one worker process (concurrency 32), --peak-rounds times (median:
   the drain peak); then, on a fresh database, the soak's own producer offers
   1.25x that for 150 s to one worker process: the jobs/s the worker completes
   over the last 135 s is the peak (loaded: what one worker sustains with the
   producer beside it on the same 2 cores, over five turns of the append-only
   lane's ring, whose upkeep a 45-s window barely saw; a drain of 20k jobs also
   counts its start, so it can read below that). --peak-kind drain skips
   the loaded measure; --peak R skips both.
2. **Two databases**: "fresh", freshly migrated, and "soak", the same seeded
   with --history finished jobs in awa.jobs_done (hourly partitions,
   prune_after spread over [now-1h, now+23h], 1 in 500 failed). Each has one
   worker process running from start to end.
3. **Load in alternating blocks**: a producer offers --rate-fraction x peak
   jobs/s to one database at a time, --minutes in all for each, in --blocks
   blocks each, ordered S F F S S F F S ...: both databases meet the same
   shared machine (its neighbours' load drifts by half over half an hour).

The producer inserts what is due every 10 ms with one COPY (enqueue_many_copy),
each job carrying sent_at = time.time() taken just before its insert; the
handler's first action records time.time() - sent_at (pickup latency).  Every
--sample-seconds the orchestrator reads the worker's window (jobs handled,
pickup p50/p99, slowest claim and completion batch) and the database: n_dead_tup
and total size of awa.jobs, the append-only lane's tables (all partitions of its
six families: where plain jobs live on a new database), awa.jobs_done (all
partitions) and awa.dlq, partition
count, expired partitions still present, WAL written, and the longest statement
a 100-ms probe saw running.  Output: bench/results/soak.json, soak.md and
soak_{throughput,p99,dead_tuples,table_size}.png.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
DB = "bench_soak"  # the database with the history
DB_FRESH = "bench_soak_fresh"
QUEUE = "bench"
CONCURRENCY = 32
LOADED_OFFER = 1.25  # x the drain peak, offered to find the loaded peak: more than it takes


# ===========================================================================
# roles: run with bench/.venvs/awa's python (`--role worker|produce`)


def _job_type():
    from dataclasses import dataclass

    @dataclass
    class BenchJob:  # kind "bench_job", as bench/systems/awa.py
        seq: int
        sent_at: float = 0.0

    return BenchJob


async def role_worker(a) -> None:
    """One awa worker process; on "sample" reports the window since the last sample."""
    import awa

    sys.path.insert(0, str(HERE / "systems"))
    import benchkit

    BenchJob = _job_type()
    stdin = benchkit._Stdin(asyncio.get_running_loop())
    client = awa.AsyncClient(a.url, max_connections=10)
    buf: dict = {"w": [], "n": 0}
    warm = array("d")

    @client.task(BenchJob, queue=QUEUE)
    async def handle(job):
        buf["w"].append(time.time() - job.args.sent_at)
        buf["n"] += 1

    # Attribution of slow windows: how long the event loop went without running
    # (CPU starvation, a long synchronous stretch) and the longest garbage collection.
    stall = {"lag": 0.0, "gc": 0.0, "gc_t0": 0.0}

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            stall["gc_t0"] = time.perf_counter()
        else:
            stall["gc"] = max(stall["gc"], time.perf_counter() - stall["gc_t0"])

    gc.callbacks.append(on_gc)

    # Claim round trips per window (slow claims show as fewer, slower ones).
    from awa.telemetry import otel as awa_telemetry
    diag = {"claims": 0, "claim_max": 0.0}
    real_claim_round = awa_telemetry.claim_round

    def claim_round(queue: str, seconds: float) -> None:
        diag["claims"] += 1
        diag["claim_max"] = max(diag["claim_max"], seconds)
        real_claim_round(queue, seconds)

    awa_telemetry.claim_round = claim_round

    # Completion batches per window, and the slowest: claims wait while completions
    # are not written as fast as jobs finish, so a slow batch stops pickup too.
    from awa.worker import completion as awa_completion
    real_flush = awa_completion.Completer._flush

    async def timed_flush(self, batch):
        t = time.perf_counter()
        try:
            return await real_flush(self, batch)
        finally:
            diag["flushes"] += 1
            diag["flush_max"] = max(diag["flush_max"], time.perf_counter() - t)

    awa_completion.Completer._flush = timed_flush
    diag.update(flushes=0, flush_max=0.0)

    async def loop_lag() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stall["lag"] = max(stall["lag"], time.perf_counter() - t - 0.01)

    benchkit.emit({"event": "ready", "pid": os.getpid()})
    if await stdin.expect("go") != "go":
        return
    c0 = benchkit.cpu_self()
    await client.start(queues=[(QUEUE, CONCURRENCY)])
    benchkit.emit({"event": "started", "t": time.time()})

    async def progress() -> None:
        last = -1
        while True:
            if buf["n"] != last:
                last = buf["n"]
                benchkit.emit({"event": "progress", "handled": last, "t": time.time()})
            await asyncio.sleep(0.1)

    ptask = asyncio.create_task(progress())
    lag_task = asyncio.create_task(loop_lag())
    while True:
        w = await stdin.expect("sample", "sample-warm", "stop")
        if w not in ("sample", "sample-warm"):
            break
        win, buf["w"] = buf["w"], []
        if w == "sample-warm":
            warm.extend(win)
        win.sort()
        benchkit.emit({"event": "sample", "t": time.time(), "handled": buf["n"],
                       "n": len(win), "cpu": benchkit.cpu_self() - c0,
                       "p50_ms": _q(win, 0.50), "p99_ms": _q(win, 0.99),
                       "max_ms": win[-1] * 1000 if win else None,
                       "loop_lag_ms": stall["lag"] * 1000, "gc_ms": stall["gc"] * 1000,
                       "claims": diag["claims"], "claim_max_ms": diag["claim_max"] * 1000,
                       "flushes": diag["flushes"], "flush_max_ms": diag["flush_max"] * 1000})
        stall["lag"] = stall["gc"] = 0.0
        diag.update(claims=0, claim_max=0.0, flushes=0, flush_max=0.0)
    ptask.cancel()
    lag_task.cancel()
    await client.shutdown(timeout_ms=5000)
    lat = sorted(warm)
    benchkit.emit({"event": "result", "handled": buf["n"], "warm_n": len(lat),
                   "p50_ms": _q(lat, 0.50), "p95_ms": _q(lat, 0.95), "p99_ms": _q(lat, 0.99),
                   "max_ms": lat[-1] * 1000 if lat else None, "cpu": benchkit.cpu_self() - c0})
    await stdin.expect("exit")
    await client.close()


def _q(sorted_s, q: float) -> float | None:
    """Percentile (nearest rank) of sorted seconds, in ms."""
    if not sorted_s:
        return None
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000


async def role_produce(a) -> None:
    """Offer `rate` jobs/s for `duration` s: every 10 ms, one COPY of what is due."""
    import awa

    sys.path.insert(0, str(HERE / "systems"))
    import benchkit

    BenchJob = _job_type()
    client = awa.AsyncClient(a.url, max_connections=2)
    await client.pool()  # connected before the clock starts
    stdin = benchkit._Stdin(asyncio.get_running_loop())
    benchkit.emit({"event": "ready"})
    if await stdin.expect("go") != "go":
        await client.close()
        return
    total = round(a.rate * a.duration)
    tick = 0.01
    sent = batches = 0
    behind = 0.0
    start = time.monotonic()
    try:
        while sent < total:
            t_tick = time.monotonic()
            due = min(total, int((t_tick - start) * a.rate) + 1)
            if due > sent:
                now = time.time()
                jobs = [BenchJob(seq=a.seq0 + sent + i, sent_at=now) for i in range(due - sent)]
                await client.enqueue_many_copy(jobs, queue=QUEUE)
                sent = due
                batches += 1
            behind = max(behind, (time.monotonic() - start) - sent / a.rate)
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - t_tick)))
    finally:
        await client.close()
    benchkit.emit({"event": "result", "n": sent, "seconds": time.monotonic() - start,
                   "batches": batches, "max_behind_s": behind})


# ===========================================================================
# orchestrator (bench/.venvs/_runner)


def _portable(value: object) -> object:
    """A parameter as the report keeps it: a path inside the repository relative to
    it (committed results name no machine's paths)."""
    if isinstance(value, str) and value.startswith("/"):
        try:
            return str(Path(value).resolve().relative_to(HERE.parent)) or "."
        except ValueError:
            return value
    return value

SAMPLE_SQL = """
WITH parts AS (SELECT relid FROM pg_partition_tree('awa.jobs_done') WHERE isleaf),
-- The append-only lane's tables (migration 0020), where plain jobs live on a
-- database created by this release: every partition of the six families.
ring AS (SELECT p.relid
         FROM unnest(ARRAY['awa.ready', 'awa.ready_cancels', 'awa.claim_log', 'awa.receipts',
                           'awa.closures', 'awa.heartbeats']::regclass[]) f,
              pg_partition_tree(f) p WHERE p.isleaf)
SELECT
  (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass),
  (SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass),
  pg_total_relation_size('awa.jobs'),
  (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM parts)::bigint,
  (SELECT coalesce(sum(s.n_dead_tup), 0) FROM pg_stat_user_tables s JOIN parts USING (relid)),
  (SELECT coalesce(sum(s.n_live_tup), 0) FROM pg_stat_user_tables s JOIN parts USING (relid)),
  (SELECT count(*) FROM parts),
  (SELECT array_agg(relid::regclass::text) FROM parts),
  pg_total_relation_size('awa.dlq'),
  (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'awa.dlq'::regclass),
  (SELECT count(*) FROM awa.jobs_done_default),
  pg_current_wal_lsn()::text,
  (SELECT count(*) FROM awa.jobs),
  (SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables
    WHERE relid = 'awa.jobs'::regclass),
  -- The oldest transaction holding an XID anywhere on the server: while it is open,
  -- no row deleted after it started can be removed (nor skipped cheaply by index scans).
  (SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)::float8
     FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()),
  (SELECT datname FROM pg_stat_activity WHERE backend_xid IS NOT NULL
     AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1),
  -- XIDs between the oldest running transaction and the next one: how far the
  -- horizon trails right now (rows deleted within that lag cannot be pruned yet).
  (SELECT pg_snapshot_xmax(s)::text::bigint - pg_snapshot_xmin(s)::text::bigint
     FROM pg_current_snapshot() s),
  -- The longest statement running in this database for over 5 s: what it is and
  -- what it waits on (a stalled completion or heartbeat shows up here).
  (SELECT round(extract(epoch FROM now() - query_start))::int || ' s, '
          || application_name || ', waits on '
          || coalesce(wait_event_type || ':' || wait_event, 'nothing') || ': '
          || left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 140)
     FROM pg_stat_activity
     WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
       AND now() - query_start > interval '5 s'
     ORDER BY query_start LIMIT 1),
  (SELECT coalesce(sum(s.n_dead_tup), 0)::bigint
     FROM pg_stat_user_tables s JOIN ring USING (relid)),
  (SELECT coalesce(sum(s.n_live_tup), 0)::bigint
     FROM pg_stat_user_tables s JOIN ring USING (relid)),
  (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM ring)::bigint
"""
SAMPLE_KEYS = ["jobs_dead", "jobs_live", "jobs_bytes", "done_bytes", "done_dead", "done_live",
               "partitions", "_parts", "dlq_bytes", "dlq_dead", "default_rows", "_lsn",
               "backlog", "jobs_vacuums", "oldest_xact_s", "oldest_xact_db",
               "horizon_lag_xids", "long_statement", "ring_dead", "ring_live", "ring_bytes"]

SEED_SQL = """
INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, attempt, max_attempts,
                           run_lease, run_at, created_at, attempted_at, heartbeat_at,
                           finalized_at, tags, metadata, errors, prune_after)
SELECT g, 'bench_job', %(queue)s, jsonb_build_object('seq', -g, 'sent_at', 0),
       CASE WHEN g %% 500 = 0 THEN 'failed' ELSE 'completed' END::awa.job_state,
       2, 1, 25, 1, f - interval '2 s', f - interval '2 s', f - interval '1 s',
       f - interval '1 s', f, '{}', '{}',
       CASE WHEN g %% 500 = 0 THEN jsonb_build_array(jsonb_build_object(
            'error', 'boom', 'attempt', 1, 'at', f, 'terminal', false)) END,
       f + CASE WHEN g %% 500 = 0 THEN interval '72 hours' ELSE interval '24 hours' END
FROM (SELECT g, %(t_end)s::timestamptz - interval '25 hours' * (%(n)s - g) / %(n)s AS f
      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g) s
"""


def part_hour(name: str):
    """Start hour (UTC) of an hourly jobs_done partition, or None (default partition)."""
    import datetime as dt

    base = name.rsplit(".", 1)[-1].strip('"')
    if not base.startswith("jobs_done_p"):
        return None
    try:
        return dt.datetime.strptime(base[11:], "%Y%m%d%H").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def seed_history(conn, n: int, chunk: int = 500_000) -> dict:
    """n finished jobs, finalized uniformly over the last 25 hours: prune_after spans
    [now-1h, now+23h] (failed: +72h), so the oldest hour is already due for pruning."""
    import datetime as dt

    t0 = time.monotonic()
    now = conn.execute("SELECT now()").fetchone()[0].astimezone(dt.UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    created = 0
    for h in range(-2, 74):  # hourly partitions covering every prune_after we write
        start = hour + dt.timedelta(hours=h)
        name = f"jobs_done_p{start:%Y%m%d%H}"
        created += conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
            "WHERE s.nspname = 'awa' AND c.relname = %s", (name,)).fetchone()[0] == 0
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS awa.{name} PARTITION OF awa.jobs_done "
            f"FOR VALUES FROM ('{start.isoformat()}') TO "
            f"('{(start + dt.timedelta(hours=1)).isoformat()}')")
    for lo in range(1, n + 1, chunk):
        hi = min(n, lo + chunk - 1)
        conn.execute(SEED_SQL, {"queue": QUEUE, "t_end": now, "n": n, "lo": lo, "hi": hi})
        print(f"  seeded {hi:,}/{n:,} ({time.monotonic() - t0:.0f}s)", flush=True)
    if n:
        conn.execute("SELECT setval(pg_get_serial_sequence('awa.jobs', 'id'), %s)", (n,))
    t_ins = time.monotonic() - t0
    conn.execute("VACUUM (ANALYZE) awa.jobs_done")
    return {"rows": n, "partitions_created": created, "insert_seconds": t_ins,
            "vacuum_seconds": time.monotonic() - t0 - t_ins}


def host_cpu() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of the whole machine (Linux /proc/stat; zeros elsewhere):
    per window, how busy the 2 cores were and how much the hypervisor took."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq, steal, sum(v)


class _Probe:
    """A thread that runs one look at the server every 100 ms on its own connection
    and keeps the worst it saw per window (``take``)."""

    def __init__(self, url: str) -> None:
        import threading

        import psycopg

        self._conn = psycopg.connect(url, autocommit=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._max, self._what = 0.0, None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _look(self) -> tuple[float, str | None]:
        """One look: (ms, what it saw)."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            ms, what = self._look()
            with self._lock:
                if ms > self._max:
                    self._max, self._what = ms, what
            self._stop.wait(max(0.0, 0.1 - (time.perf_counter() - t)))

    def take(self) -> tuple[float, str | None]:
        """The worst since the last call: (ms, what)."""
        with self._lock:
            out = (self._max, self._what)
            self._max, self._what = 0.0, None
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


class CommitProbe(_Probe):
    """Commits a one-row transaction: its slowest commit per window shows a
    server-wide stall (a WAL flush held up by the disk, a lock), whatever the
    worker was doing."""

    def _look(self) -> tuple[float, str | None]:
        t = time.perf_counter()
        self._conn.execute("SELECT pg_current_xact_id()")  # an XID, so a WAL flush
        return (time.perf_counter() - t) * 1000, None


ACTIVITY_SQL = r"""
SELECT (extract(epoch FROM clock_timestamp() - a.query_start) * 1000)::float8,
       a.application_name || ', ' || coalesce(a.wait_event_type || ':' || a.wait_event, 'on CPU')
       || ': ' || left(regexp_replace(regexp_replace(a.query, '^(\s*--[^\n]*\n)+', ''),
                                      '\s+', ' ', 'g'), 100)
       || coalesce(' — blocked by ' || (
           SELECT string_agg(b.application_name || ' (' || b.state || ', '
                             || coalesce(b.wait_event_type || ':' || b.wait_event, 'on CPU')
                             || '): ' || left(regexp_replace(b.query, '\s+', ' ', 'g'), 80),
                             '; ')
           FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))
             AND a.wait_event_type = 'Lock'), '')
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.state = 'active' AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend'
  AND regexp_replace(a.query, '^(\s*--[^\n]*\n)+', '') NOT LIKE 'VACUUM%'
ORDER BY a.query_start LIMIT 1
"""


class ActivityProbe(_Probe):
    """Reads pg_stat_activity: the statement seen running longest per window
    (VACUUM aside: the leader's runs for seconds by design), what it waited on
    and, for a lock wait, who held the lock. A stall of the worker's completions
    or claims names its cause here."""

    def _look(self) -> tuple[float, str | None]:
        row = self._conn.execute(ACTIVITY_SQL).fetchone()
        return (row[0], row[1]) if row is not None else (0.0, None)


def sample_db(conn) -> dict:
    row = conn.execute(SAMPLE_SQL).fetchone()
    return dict(zip(SAMPLE_KEYS, row, strict=True))


def checkpoint_totals(conn) -> tuple[int, float]:
    """(checkpoints, sync ms) since the server's statistics were reset:
    PostgreSQL 17 moved them from pg_stat_bgwriter to pg_stat_checkpointer."""
    if conn.info.server_version >= 170000:
        sql = "SELECT num_timed + num_requested, sync_time FROM pg_stat_checkpointer"
    else:
        sql = ("SELECT checkpoints_timed + checkpoints_req, checkpoint_sync_time "
               "FROM pg_stat_bgwriter")
    n, sync_ms = conn.execute(sql).fetchone()
    return int(n), float(sync_ms)


class Arm:
    """One database of the comparison: its connection, its worker process (running
    for the whole comparison, idle between its blocks), its probes and samples."""

    def __init__(self, tools, drv, name: str, db: str, history: int, seeded) -> None:
        import psycopg

        self.name, self.db, self.history, self.seeded = name, db, history, seeded
        self.url = tools.bench.db_url(drv.url, db)
        self.conn = psycopg.connect(self.url, autocommit=True)
        # The sampler's counts stay on one core: a parallel scan every window
        # would take both of this machine's cores from the system under test.
        self.conn.execute("SET max_parallel_workers_per_gather = 0")
        self.worker = tools.role(drv, __file__, "--role", "worker", url=self.url)
        self.probe = CommitProbe(self.url)
        self.activity = ActivityProbe(self.url)
        self.samples: list[dict] = []
        self.dropped: list[dict] = []
        self.produced: list[dict] = []
        self.parts: set[str] | None = None
        self.first_block_at: float | None = None

    def close(self) -> None:
        for p in (self.probe, self.activity):
            p.close()
        self.worker.kill()
        self.conn.close()

    @property
    def sent(self) -> int:
        return sum(p["n"] for p in self.produced)


def start_worker(worker) -> None:
    """Let a worker role that has connected start claiming; return once it does."""
    worker.wait_event("ready", 180)
    worker.send("go")
    worker.wait_event("started", 120)


def spawn_producer(tools, drv, url: str, rate: float, seconds: float, seq0: int = 0):
    """A producer role that, once sent "go", offers ``rate`` jobs/s for ``seconds``
    (job seq numbers from ``seq0``)."""
    return tools.role(drv, __file__, "--role", "produce", "--rate", str(rate),
                      "--duration", str(seconds), "--seq0", str(seq0), url=url)


def log_plans_over(admin, db: str, ms: int) -> None:
    """Sessions opened on ``db`` from now on log the plan of every statement
    that runs ``ms`` or longer (auto_explain, to the server's log): the way to
    name the plan of a statement the activity probe saw running for seconds.
    Plans only (no log_analyze: timing every statement would slow the run);
    statements inside functions too (the claim and the ring's upkeep are
    plpgsql: their own call shows no plan)."""
    for setting, value in (("session_preload_libraries", "auto_explain"),
                           ("auto_explain.log_min_duration", f"{int(ms)}ms"),
                           ("auto_explain.log_nested_statements", "on")):
        admin.conn.execute(f'ALTER DATABASE "{db}" SET {setting} = \'{value}\'')


def block_order(blocks: int) -> list[int]:
    """Which arm (0 fresh, 1 soak) runs each block: S F F S S F F S ..., so a drift
    of the machine over the run weighs on both arms alike. The soak goes first:
    its worker's first cleanup pass (a minute after start) drops the expired
    partitions of the history under load."""
    return [1 - ((i % 2) ^ ((i // 2) % 2)) for i in range(2 * blocks)]


def run_comparison(tools, drv, admin, rate: float, minutes: float, blocks: int,
                   sample_s: float, history: int,
                   auto_explain_ms: int | None = None) -> tuple[dict, dict]:
    """The fresh and the history database, each with a worker running throughout;
    the offered load alternates between them in ``blocks`` blocks each."""
    tools.bench.fresh_db(drv, admin, DB)
    admin.reset(DB_FRESH, template=DB + "_tpl")
    if auto_explain_ms:
        for db in (DB, DB_FRESH):
            log_plans_over(admin, db, auto_explain_ms)
    seeded = None
    arms: list[Arm] = []
    try:
        import psycopg

        with psycopg.connect(tools.bench.db_url(drv.url, DB), autocommit=True) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")
            print(f"[soak] seeding {history:,} finished jobs of history ...", flush=True)
            seeded = seed_history(conn, history) if history else None
        for name, db, hist in (("fresh", DB_FRESH, 0), ("soak", DB, history)):
            arm = Arm(tools, drv, name, db, hist, seeded if hist else None)
            arms.append(arm)
            arm.conn.execute("ANALYZE")
        for arm in arms:
            start_worker(arm.worker)
        block_s = minutes * 60 / blocks
        warmup = min(30.0, 0.2 * block_s)
        print(f"[soak] {rate:,.0f} jobs/s offered in {2 * blocks} blocks of {block_s:.0f}s, "
              f"alternating fresh / soak, sampling every {sample_s:g}s", flush=True)
        t0 = time.time()
        for i, which in enumerate(block_order(blocks)):
            run_block(tools, drv, arms[which], i, rate, block_s, sample_s, warmup, t0)
        out = [finish_arm(arm, rate, minutes, sample_s, warmup, blocks) for arm in arms]
    finally:
        for arm in arms:
            arm.close()
    return out[0], out[1]


def run_block(tools, drv, arm: Arm, block: int, rate: float, block_s: float,
              sample_s: float, warmup: float, t0: float) -> None:
    """One block of offered load on one arm, sampled every ``sample_s``; returns
    once its worker has handled every job produced so far."""
    from soak_report import sample_line  # the orchestrator's path has bench/, roles' not

    conn, worker = arm.conn, arm.worker
    worker.send("sample")  # a fresh window, discarded: the block starts from here
    w = worker.wait_event("sample", 30)
    prev_t, prev_handled = w["t"], w["handled"]
    prev = sample_db(conn)
    lsn_prev = prev["_lsn"]
    if arm.parts is None:
        arm.parts = set(prev["_parts"] or [])
    prod = spawn_producer(tools, drv, arm.url, rate, block_s, seq0=arm.sent)
    try:
        prod.wait_event("ready", 60)
        prod.send("go")
        start = time.time()
        if arm.first_block_at is None:
            arm.first_block_at = start
        cpu_prev = host_cpu()
        ckpt_prev = checkpoint_totals(conn)
        arm.probe.take(), arm.activity.take()  # what they saw before the block
        print(f"[{arm.name}] block {block + 1}: {block_s:.0f}s from t={start - t0:.0f}s",
              flush=True)
        k = 1
        while start + k * sample_s <= start + block_s + 0.5:
            due = start + k * sample_s
            time.sleep(max(0.0, due - time.time()))
            warm = due - arm.first_block_at > warmup
            worker.send("sample-warm" if warm else "sample")
            w = worker.wait_event("sample", 30)
            d = sample_db(conn)
            cpu = host_cpu()
            span = (cpu[2] - cpu_prev[2]) or 1
            d["host_busy_pct"] = 100.0 * (cpu[0] - cpu_prev[0]) / span
            d["host_steal_pct"] = 100.0 * (cpu[1] - cpu_prev[1]) / span
            cpu_prev = cpu
            ckpt = checkpoint_totals(conn)
            d["checkpoints"] = ckpt[0] - ckpt_prev[0]  # finished in this window
            d["checkpoint_sync_ms"] = ckpt[1] - ckpt_prev[1]
            ckpt_prev = ckpt
            for key in ("loop_lag_ms", "gc_ms", "claims", "claim_max_ms", "flushes",
                        "flush_max_ms"):
                d[key] = w.get(key)  # the worker's own view of this window
            d["commit_max_ms"] = arm.probe.take()[0]
            d["statement_max_ms"], d["statement_max"] = arm.activity.take()
            d["wal_bytes"] = conn.execute(
                "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint",
                (d.pop("_lsn"), lsn_prev)).fetchone()[0]
            lsn_prev = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            parts = set(d.pop("_parts") or [])
            arm.dropped += [{"t": w["t"] - t0, "partition": p}
                            for p in sorted(arm.parts - parts)]
            arm.parts = parts
            d["expired_partitions"] = sum(
                1 for p in parts
                if (h := part_hour(p)) is not None and h.timestamp() + 3600 <= time.time() - 180)
            handled = w["handled"]
            s = {"t": w["t"] - t0, "block": block, "warm": warm,
                 "jobs": handled - prev_handled,
                 "jobs_per_s": (handled - prev_handled) / (w["t"] - prev_t),
                 "handled": handled, "p50_ms": w["p50_ms"], "p99_ms": w["p99_ms"],
                 "max_ms": w["max_ms"], "n": w["n"], "worker_cpu_s": w["cpu"], **d}
            arm.samples.append(s)
            prev_t, prev_handled = w["t"], handled
            print(sample_line(s, tools.fmt), flush=True)
            k += 1
        arm.produced.append(prod.wait_event("result", block_s + 120))
    finally:
        prod.finish()
    deadline = time.monotonic() + 120
    while worker.handled < arm.sent and time.monotonic() < deadline:
        time.sleep(0.05)


def finish_arm(arm: Arm, rate: float, minutes: float, sample_s: float, warmup: float,
               blocks: int) -> dict:
    """Stop the arm's worker and check that every job it was offered completed once."""
    arm.worker.send("stop")
    res = arm.worker.wait_event("result", 60)
    arm.worker.finish()
    left = arm.conn.execute("SELECT count(*) FROM awa.jobs").fetchone()[0]
    done = arm.conn.execute(
        "SELECT count(*), count(DISTINCT args->>'seq') FROM awa.jobs_done "
        "WHERE id > %s AND state = 'completed'", (arm.history,)).fetchone()
    produced = {"n": arm.sent,
                "max_behind_s": max((p["max_behind_s"] for p in arm.produced), default=None)}
    out = {"name": arm.name, "rate": rate, "minutes": minutes, "blocks": blocks,
           "history": arm.history, "sample_s": sample_s, "seeded": arm.seeded,
           "warmup_s": warmup, "producer": produced, "worker": res, "samples": arm.samples,
           "dropped_partitions": arm.dropped,
           "verify": {"produced": arm.sent, "handled": res["handled"],
                      "completed": done[0], "completed_distinct": done[1], "left": left}}
    v = out["verify"]
    v["ok"] = v["produced"] == v["handled"] == v["completed"] == v["completed_distinct"] \
        and left == 0
    return out



def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="soak duration (30)")
    p.add_argument("--history", type=int, default=10_000_000, help="finished jobs seeded (10M)")
    p.add_argument("--rate-fraction", type=float, default=0.7, help="offered load / peak (0.7)")
    p.add_argument("--peak", type=float, default=None, help="peak jobs/s (default: measure)")
    p.add_argument("--rate", type=float, default=None, help="offered jobs/s (overrides)")
    p.add_argument("--peak-jobs", type=int, default=20_000, help="jobs drained to find peak")
    p.add_argument("--auto-explain-ms", type=int, default=None,
                   help="log (server log) the plans of statements running this long")
    p.add_argument("--peak-kind", choices=["loaded", "drain"], default="loaded",
                   help="peak as sustained beside the producer (loaded), or the drain peak")
    p.add_argument("--peak-rounds", type=int, default=3,
                   help="drains to find peak; the median counts (3)")
    p.add_argument("--blocks", type=int, default=6,
                   help="blocks of load per database, alternating fresh / soak (6)")
    p.add_argument("--sample-seconds", type=float, default=None, help="(5; 2 under 2 min)")
    p.add_argument("--role", choices=["worker", "produce"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--duration", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seq0", type=int, default=0, help=argparse.SUPPRESS)
    if "--role" not in argv:
        sys.path.insert(0, str(HERE))
        import benchtools

        benchtools.add_common_args(p)
    return p.parse_args(argv)


def measure_peak(tools, drv, admin, n: int, rounds: int) -> dict:
    """Drain ``n`` no-op jobs with one worker process, ``rounds`` times: the median
    round's jobs/s. A single drain lasts about a second, and on this shared machine
    single drains of the same code ranged over 11-16k jobs/s within an hour; 70% of
    a lucky one is nearer 85% of what the machine then sustains with a producer."""
    rates = []
    for _ in range(rounds):
        tools.bench.fresh_db(drv, admin, DB)
        drv.call("insert-bulk", "--n", str(n), timeout=max(300, n / 20))
        admin.analyze(DB)
        procs = [drv.spawn("worker", "--concurrency", str(CONCURRENCY))]
        try:
            r = tools.bench.run_workers(drv, procs, admin, DB, admin.postmaster_pid(), n,
                                        timeout=max(120, n / 50))
        finally:
            for p in procs:
                p.kill()
        rates.append(r["jobs_per_s"])
    peak = {"jobs_per_s": sorted(rates)[len(rates) // 2], "n": n, "measured": True,
            "rounds": rates}
    print(f"[peak] {peak['jobs_per_s']:,.0f} jobs/s ({n:,} jobs; rounds "
          + ", ".join(f"{x:,.0f}" for x in rates) + ")", flush=True)
    return peak


def measure_loaded_peak(tools, drv, admin, offer: float, seconds: float = 150.0,
                        skip: float = 15.0) -> dict:
    """Jobs/s one worker process completes while the soak's producer offers ``offer``
    (more than it can take) on a fresh database, counted after ``skip`` s: a lower
    bound of the rate where offered = completed, as the surplus costs producer CPU. A drain
    leaves the producer's CPU out: on 2 cores, 70% of the drain peak left a quarter
    of headroom, and steal of 1% then grew backlogs of 100k jobs on both databases."""
    tools.bench.fresh_db(drv, admin, DB)
    url = tools.bench.db_url(drv.url, DB)
    worker = tools.role(drv, __file__, "--role", "worker", url=url)
    prod = None
    try:
        start_worker(worker)
        prod = spawn_producer(tools, drv, url, offer, seconds)
        prod.wait_event("ready", 60)
        prod.send("go")
        start, marks = time.monotonic(), []
        for at in (skip, seconds - 0.5):  # both inside the producer's run
            time.sleep(max(0.0, start + at - time.monotonic()))
            worker.send("sample")
            w = worker.wait_event("sample", 30)
            marks.append((w["t"], w["handled"]))
        sent = prod.wait_event("result", seconds + 120)["n"]
    finally:
        for p in (prod, worker):
            if p is not None:
                p.kill()
    (t1, h1), (t2, h2) = marks
    peak = {"jobs_per_s": (h2 - h1) / (t2 - t1), "offered": offer, "seconds": seconds,
            "counted_s": t2 - t1, "produced": sent, "backlog_at_end": sent - h2}
    print(f"[peak] loaded: {peak['jobs_per_s']:,.0f} jobs/s with {offer:,.0f}/s offered "
          f"(backlog {peak['backlog_at_end']:,} jobs at the end)", flush=True)
    return peak


def main() -> None:
    args = parse(sys.argv[1:])
    if args.role is None and (args.peak_rounds < 1 or args.blocks < 1):
        sys.exit("--peak-rounds and --blocks must be at least 1")
    if args.role == "worker":
        return asyncio.run(role_worker(args))
    if args.role == "produce":
        return asyncio.run(role_produce(args))
    import benchtools as tools

    tools.bootstrap(__file__)
    import soak_report  # bench/ is on sys.path here, not in the roles (python -P)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    logs = tools.logdir("soak")
    admin = tools.admin_for(args, [DB, DB_FRESH])
    env = tools.environment(admin)
    print(tools.env_line(env), flush=True)
    drv = tools.awa_driver(args, DB, logs)
    sample_s = args.sample_seconds or (5.0 if args.minutes / args.blocks >= 2 else 2.0)
    try:
        if args.peak:
            peak = {"jobs_per_s": args.peak, "measured": False}
        else:
            peak = measure_peak(tools, drv, admin, args.peak_jobs, args.peak_rounds)
            if args.peak_kind == "loaded":
                peak = {**measure_loaded_peak(tools, drv, admin,
                                            LOADED_OFFER * peak["jobs_per_s"]),
                        "measured": True, "kind": "loaded", "drain": peak}
        rate = args.rate or args.rate_fraction * peak["jobs_per_s"]
        fresh, soak = run_comparison(tools, drv, admin, rate, args.minutes, args.blocks,
                                     sample_s, args.history, args.auto_explain_ms)
    finally:
        if not args.keep_db:
            for db in (DB, DB_FRESH, DB + "_tpl"):
                admin.drop(db)
    for arm in (fresh, soak):
        arm["summary"] = soak_report.summarize(arm)
    report = {"started": started, "environment": env, "env_line": tools.env_line(env),
              "params": {k: _portable(v) for k, v in vars(args).items()
                         if k not in ("role", "url")},
              "peak": peak, "rate": rate, "sample_seconds": sample_s,
              "concurrency": CONCURRENCY, "fresh": fresh, "soak": soak,
              "checks": soak_report.checks(fresh, soak)}
    md = soak_report.render(report, tools.RESULTS, tools.fmt)
    tools.write_report("soak", report, md)
    print(f"wrote {tools.RESULTS / 'soak.md'}, soak.json and {', '.join(report['plots'])} "
          f"(logs: {logs})")


if __name__ == "__main__":
    main()
