"""Awa adapter for the postgresql-job-queue-benchmarking harness.

One long-running process that speaks the harness's JSONL contract
(CONTRIBUTING_ADAPTERS.md of hardbyte/postgresql-job-queue-benchmarking):

* reads its configuration from the environment the harness sets
  (DATABASE_URL, PRODUCER_MODE, PRODUCER_RATE, WORKER_COUNT, ...);
* prints one ``descriptor`` record at startup, then every SAMPLE_EVERY_S
  (clock-aligned) one ``adapter`` record per metric on stdout; logs go to
  stderr;
* in fixed-rate mode with PRODUCER_PACING=harness it inserts the jobs the
  harness asks for with ``ENQUEUE <n>`` lines on stdin (scaled by the
  producer-rate control file, so the harness's high-load phases raise the
  offered load); otherwise it paces itself on real wall-clock elapsed time;
* in depth-target mode it keeps the queue's available depth near
  TARGET_DEPTH;
* exits 0 within a few seconds of SIGTERM.

Only Awa's public API is used: ``awa.AsyncClient``, ``migrate()``,
``enqueue_many_copy()``, ``@client.task``, ``start()``, ``queue_stats()``,
``shutdown()`` and ``close()``.  The one exception, for FLAVOR "awa" only:
after ``migrate()`` it switches enqueueing into the append-only lane on with
``UPDATE awa.ring SET enqueue = true`` over a plain asyncpg connection
(AWA_HARNESS_RING=0 leaves it off).

The same file drives ``awa-pg`` (the Rust-backed SDK on PyPI, same import
name): awa_pg_adapter.py runs it with FLAVOR = "awa-pg".
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

# Never let a file in this directory shadow the library.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import awa  # noqa: E402

FLAVOR: str = globals().get("FLAVOR", "awa")
SYSTEM = os.environ.get("AWA_HARNESS_SYSTEM", FLAVOR)
QUEUE = "harness_bench"

# Tables the harness polls for size / dead tuples.  Ours: every hot-path table
# of the "awa" schema: the mutable lane (awa.jobs, awa.jobs_done_default,
# awa.queue_throughput) and the append-only ring of migration 0020 (awa.ring
# and each partition of its six families, because pg_stat_user_tables reports
# per partition, never for the partitioned parent), and the leadership and
# presence records of migration 0028, written every few seconds whatever the
# load (before it: awa.leader and awa.runtime_instances, updated in place and
# not counted here).  The harness takes any
# number of tables: its metrics daemon runs one pg_stat_user_tables query per
# table per tick, and its plots and summary.json's peak_dead_tup sum them.
# awa.jobs stays first: the active-readers phase scans the first table.
# awa-pg: its queue-storage engine's tables.
RING_FAMILIES = ("ready", "ready_cancels", "claim_log", "receipts", "closures", "heartbeats")
RING_SLOTS = 4  # migration 0020: awa.ring.slots
EVENT_TABLES = {
    "awa": [
        "awa.jobs",
        "awa.jobs_done_default",
        "awa.queue_throughput",
        "awa.ring_turns",  # migration 0024 (awa.ring, before it, is now a view)
        "awa.ring_config",
        *(f"awa.{family}_{slot}" for family in RING_FAMILIES for slot in range(RING_SLOTS)),
        *(f"awa.{record}_{part}" for record in ("leader_terms", "presence_beats")
          for part in range(3)),
    ],
    "awa-pg": [],  # filled in at startup from the engine's own schema
}
# AWA_HARNESS_RING=0 leaves enqueue into the append-only lane off (the default
# of a migrated database); anything else switches it on after migrate().
RING_ON = os.environ.get("AWA_HARNESS_RING", "1").strip() != "0"
# AWA_HARNESS_CLAIM_BATCH=n sets the queue's claim_batch_size (unset: Awa's default).
CLAIM_BATCH = int(os.environ.get("AWA_HARNESS_CLAIM_BATCH", "0") or 0)
AWA_PG_TABLES = (
    "queue_ring_state",
    "queue_ring_slots",
    "lease_ring_state",
    "lease_ring_slots",
    "claim_ring_state",
    "claim_ring_slots",
    "queue_lanes",
    "attempt_state",
    "deferred_jobs",
    "dlq_entries",
)


# ---------------------------------------------------------------- helpers


def env_int(key: str, default: int) -> int:
    raw = os.environ.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(float(raw))
    except ValueError:
        return default


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log(msg: str) -> None:
    print(f"[{SYSTEM}-adapter {INSTANCE}] {msg}", file=sys.stderr, flush=True)


INSTANCE = env_int("BENCH_INSTANCE_ID", 0)


def emit(record: dict) -> None:
    record.setdefault("instance_id", INSTANCE)
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def read_control_rate(default: float) -> float:
    path = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
    if not path:
        return default
    try:
        with open(path) as fh:
            return max(0.0, float(fh.read().strip()))
    except (OSError, ValueError):
        return default


class RollingHistogram:
    """Bounded-memory latency percentiles over a rolling window.

    Values land in log-spaced buckets 0.5% wide (better than the 3
    significant figures the contract asks for at the percentiles we read),
    one bucket map per second, the last ``window_s`` seconds kept.
    """

    _GROWTH = math.log(1.005)

    def __init__(self, window_s: int = 30) -> None:
        self.window_s = window_s
        self.slots: deque[tuple[int, dict[int, int]]] = deque()

    def _bucket(self, value_ms: float) -> int:
        if value_ms <= 0.001:
            return -1
        return int(math.log(value_ms * 1000.0) / self._GROWTH)

    @classmethod
    def _value(cls, bucket: int) -> float:
        if bucket < 0:
            return 0.0
        return math.exp((bucket + 0.5) * cls._GROWTH) / 1000.0

    def record(self, value_ms: float, now: float | None = None) -> None:
        sec = int(now if now is not None else time.monotonic())
        if not self.slots or self.slots[-1][0] != sec:
            self.slots.append((sec, {}))
            while self.slots and self.slots[0][0] <= sec - self.window_s:
                self.slots.popleft()
        counts = self.slots[-1][1]
        b = self._bucket(value_ms)
        counts[b] = counts.get(b, 0) + 1

    def percentiles(self, qs: tuple[float, ...], now: float | None = None) -> list[float]:
        sec = int(now if now is not None else time.monotonic())
        merged: dict[int, int] = {}
        for s, counts in self.slots:
            if s > sec - self.window_s:
                for b, c in counts.items():
                    merged[b] = merged.get(b, 0) + c
        total = sum(merged.values())
        if total == 0:
            return [0.0 for _ in qs]
        out = []
        ordered = sorted(merged.items())
        for q in qs:
            rank = max(1, math.ceil(q * total))
            seen = 0
            for b, c in ordered:
                seen += c
                if seen >= rank:
                    out.append(round(self._value(b), 3))
                    break
        return out


@dataclass
class HarnessJob:
    seq: int
    t0: float  # wall-clock epoch seconds at insert
    pad: str = ""


# ---------------------------------------------------------------- adapter


class Adapter:
    def __init__(self) -> None:
        self.url = os.environ.get("DATABASE_URL") or ""
        if not self.url:
            raise SystemExit("DATABASE_URL must be set")
        self.sample_every = max(1, env_int("SAMPLE_EVERY_S", 5))
        self.producer_mode = os.environ.get("PRODUCER_MODE", "fixed")
        self.base_rate = float(env_int("PRODUCER_RATE", 800))
        self.target_depth = env_int("TARGET_DEPTH", 1000)
        self.worker_count = max(1, env_int("WORKER_COUNT", 32))
        self.batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 128))
        self.batch_ms = max(1, env_int("PRODUCER_BATCH_MS", 25))
        self.work_ms = max(0, env_int("JOB_WORK_MS", 1))
        self.pad = "x" * max(0, env_int("JOB_PAYLOAD_BYTES", 256) - 40)
        self.harness_paced = (
            os.environ.get("PRODUCER_PACING", "adapter") == "harness"
            and self.producer_mode == "fixed"
        )
        self.worker_pool = env_int("AWA_WORKER_MAX_CONNECTIONS", 10)

        self.shutdown = asyncio.Event()
        self.seq = INSTANCE * 1_000_000_000
        self.enqueued = 0
        self.completed = 0
        self.claimed = 0
        self.enqueue_errors = 0
        self.depth = 0
        self.running = 0
        self.depth_known = False
        self.ring_depth: float | None = None  # awa.ring_available (FLAVOR "awa", ring on)
        self.target_rate_now = self.base_rate
        self.claim_hist = RollingHistogram(30)
        self.producer_hist = RollingHistogram(30)
        self.depth_poll_hist = RollingHistogram(30)
        self.producer: awa.AsyncClient | None = None
        self.worker: awa.AsyncClient | None = None
        self.ring: bool | None = None  # awa.ring.enqueue after setup (FLAVOR "awa")

    # -- setup

    async def setup(self) -> list[str]:
        admin = awa.AsyncClient(self.url, max_connections=2)
        try:
            # Several replicas may start together; migrations are idempotent and
            # take their own lock, but retry a couple of times on a race.
            for attempt in range(5):
                try:
                    await admin.migrate()
                    break
                except Exception as exc:
                    if attempt == 4:
                        raise
                    log(f"migrate failed ({exc!r}); retrying")
                    await asyncio.sleep(0.5 + attempt)
            tables = list(EVENT_TABLES.get(FLAVOR, []))
            if FLAVOR == "awa":
                await self.set_ring(RING_ON)
            if FLAVOR == "awa-pg":
                # awa-pg 0.6: a fresh database migrates to the canonical engine and
                # flips to queue storage once a runtime starts; enqueue_many_copy
                # needs queue storage, so activate it up front (public API).
                status = json.loads(await admin.storage_status())
                if status.get("active_engine") != "queue_storage":
                    try:
                        await admin.install_queue_storage()
                    except Exception as exc:
                        log(f"install_queue_storage: {exc!r}")
                    status = json.loads(await admin.storage_status())
                schema = (
                    (status.get("details") or {}).get("schema")
                    or status.get("prepared_queue_storage_schema")
                    or "awa"
                )
                tables = [f"{schema}.{t}" for t in AWA_PG_TABLES]
                self.storage_status = status
            return tables
        finally:
            await admin.close()

    async def set_ring(self, on: bool) -> None:
        """Switch enqueueing into the append-only lane (migration 0020) on or
        off for this database: bench code, so a plain UPDATE of awa.ring."""
        import asyncpg

        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("UPDATE awa.ring SET enqueue = $1", on)
            self.ring = bool(await conn.fetchval("SELECT enqueue FROM awa.ring"))
        finally:
            await conn.close()
        log(f"awa.ring.enqueue = {self.ring} (AWA_HARNESS_RING={'0' if not on else '1'})")

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("awa-pg",) if FLAVOR == "awa-pg" else ("awa-queue",):
            try:
                return f"{dist} {version(dist)}"
            except PackageNotFoundError:
                pass
        return f"awa {getattr(awa, '__version__', '?')}"

    # -- worker

    async def start_worker(self) -> None:
        self.worker = awa.AsyncClient(self.url, max_connections=self.worker_pool)
        work_s = self.work_ms / 1000.0

        @self.worker.task(HarnessJob, queue=QUEUE)
        async def handle(job):
            args = job.args
            self.claimed += 1
            self.claim_hist.record(max(0.0, (time.time() - args.t0) * 1000.0))
            if work_s:
                await asyncio.sleep(work_s)
            self.completed += 1

        queue: Any = (QUEUE, self.worker_count)
        if CLAIM_BATCH:  # AWA_HARNESS_CLAIM_BATCH: an A/B of the claim size (Awa only)
            queue = {"name": QUEUE, "max_workers": self.worker_count,
                     "claim_batch_size": CLAIM_BATCH}
        await self.worker.start(queues=[queue])

    # -- producer

    def _jobs(self, n: int) -> list[HarnessJob]:
        t0 = time.time()
        start = self.seq
        self.seq += n
        return [HarnessJob(seq=start + i, t0=t0, pad=self.pad) for i in range(n)]

    async def insert(self, n: int) -> None:
        assert self.producer is not None
        jobs = self._jobs(n)
        began = time.monotonic()
        try:
            inserted = await self.producer.enqueue_many_copy(jobs, queue=QUEUE)
        except Exception as exc:
            self.enqueue_errors += n
            if self.enqueue_errors <= 5 or self.enqueue_errors % 1000 < n:
                log(f"insert of {n} failed: {exc!r}")
            await asyncio.sleep(0.05)
            return
        self.producer_hist.record((time.monotonic() - began) * 1000.0)
        self.enqueued += inserted if isinstance(inserted, int) else n

    async def produce_harness_paced(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        credit = 0.0
        while not self.shutdown.is_set():
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=0.5)
            except TimeoutError:
                continue
            if not line:  # stdin closed: fall back to local pacing
                log("stdin closed; pacing locally")
                await self.produce_locally_paced()
                return
            text = line.decode(errors="replace").strip()
            if not text.startswith("ENQUEUE "):
                continue
            try:
                n = int(text.split()[1])
            except (IndexError, ValueError):
                continue
            # The harness pacer runs at the launch rate; the high-load phase
            # only rewrites the control file.  Scale the tokens by it.
            rate = read_control_rate(self.base_rate)
            self.target_rate_now = rate
            credit += n * (rate / self.base_rate if self.base_rate > 0 else 1.0)
            whole = int(credit)
            credit -= whole
            while whole > 0 and not self.shutdown.is_set():
                take = min(whole, self.batch_max)
                whole -= take
                await self.insert(take)

    async def produce_locally_paced(self) -> None:
        period = self.batch_ms / 1000.0
        last = time.monotonic()
        credit = 0.0
        while not self.shutdown.is_set():
            rate = read_control_rate(self.base_rate)
            self.target_rate_now = rate
            sleep_for = period - (time.monotonic() - last)
            if sleep_for > 0:
                await asyncio.sleep(sleep_for)
            now = time.monotonic()
            credit += rate * (now - last)  # real elapsed time, not the nominal period
            last = now
            whole = int(credit)
            credit -= whole
            while whole > 0 and not self.shutdown.is_set():
                take = min(whole, self.batch_max)
                whole -= take
                await self.insert(take)

    async def produce_depth_target(self) -> None:
        # Control on a local estimate (inserted - claimed by this process): exact
        # for the single-replica peak cell, and free.  queue_stats() is only the
        # observer's metric: on awa-pg it takes seconds at depth 4000 (NOTES.md),
        # which would starve a producer that waited for it.
        self.target_rate_now = 0.0
        while not self.shutdown.is_set():
            local_depth = self.enqueued - self.claimed
            if local_depth >= self.target_depth:
                await asyncio.sleep(0.005)
                continue
            await self.insert(min(self.batch_max, self.target_depth - local_depth))

    # -- observation

    async def poll_depth(self) -> None:
        """The observer's queue_depth / running_depth, from queue_stats() once per
        sample period (instance 0 only).

        queue_stats() counts both lanes; ring_depth reports the ring's
        available jobs alone as its claim cursors count them
        (awa.ring_available, capped at 10^6)."""
        assert self.producer is not None
        needed = INSTANCE == 0
        ring_conn = None
        if needed and self.ring:
            import asyncpg

            try:
                ring_conn = await asyncpg.connect(self.url)
            except Exception as exc:
                log(f"ring_depth connection failed: {exc!r}")
        try:
            while not self.shutdown.is_set():
                if ring_conn is not None:
                    try:
                        self.ring_depth = float(
                            await ring_conn.fetchval(
                                "SELECT awa.ring_available($1, 1000000)", QUEUE
                            )
                        )
                    except Exception as exc:
                        log(f"ring_available failed: {exc!r}")
                        if ring_conn.is_closed():
                            try:
                                ring_conn = await asyncpg.connect(self.url)
                            except Exception:
                                pass
                if needed:
                    began = time.monotonic()
                    try:
                        stats = await self.producer.queue_stats()
                        mine = [s for s in stats if s.queue == QUEUE]
                        self.depth = int(mine[0].available) if mine else 0
                        self.running = int(mine[0].running) if mine else 0
                        self.depth_known = True
                        self.depth_poll_hist.record((time.monotonic() - began) * 1000.0)
                    except Exception as exc:
                        log(f"queue_stats failed: {exc!r}")
                await self._sleep(self.sample_every)
        finally:
            if ring_conn is not None:
                ring_conn.terminate()

    async def sample(self) -> None:
        # Align the first tick to the next wall-clock SAMPLE_EVERY_S boundary.
        every = self.sample_every
        await self._sleep(every - (time.time() % every))
        last_t = time.monotonic()
        last_enq, last_cmp = self.enqueued, self.completed
        while not self.shutdown.is_set():
            now = time.monotonic()
            dt = max(1e-3, now - last_t)
            enq_rate = (self.enqueued - last_enq) / dt
            cmp_rate = (self.completed - last_cmp) / dt
            last_t, last_enq, last_cmp = now, self.enqueued, self.completed
            claim = self.claim_hist.percentiles((0.5, 0.95, 0.99), now)
            prod = self.producer_hist.percentiles((0.5, 0.95, 0.99), now)
            rows: list[tuple[str, float, float]] = [
                ("claim_p50_ms", claim[0], 30.0),
                ("claim_p95_ms", claim[1], 30.0),
                ("claim_p99_ms", claim[2], 30.0),
                ("producer_call_p50_ms", prod[0], 30.0),
                ("producer_call_p95_ms", prod[1], 30.0),
                ("producer_call_p99_ms", prod[2], 30.0),
                ("enqueue_rate", enq_rate, float(every)),
                ("completion_rate", cmp_rate, float(every)),
            ]
            if INSTANCE == 0:
                poll = self.depth_poll_hist.percentiles((0.5, 0.99), now)
                rows += [
                    ("queue_depth", float(self.depth), 0.0),
                    ("running_depth", float(self.running), 0.0),
                    *(
                        [("ring_depth", float(self.ring_depth), 0.0)]
                        if self.ring_depth is not None
                        else []
                    ),
                    ("producer_target_rate", float(self.target_rate_now), 0.0),
                    ("depth_poll_p50_ms", poll[0], 30.0),
                    ("depth_poll_p99_ms", poll[1], 30.0),
                ]
            rows.append(("enqueue_errors_total", float(self.enqueue_errors), 0.0))
            t = now_iso()
            for metric, value, window in rows:
                emit(
                    {
                        "t": t,
                        "system": SYSTEM,
                        "kind": "adapter",
                        "subject_kind": "adapter",
                        "subject": "",
                        "metric": metric,
                        "value": round(float(value), 3),
                        "window_s": window,
                    }
                )
            # Next aligned boundary.
            await self._sleep(every - (time.time() % every))

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.shutdown.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            pass

    # -- main

    async def run(self) -> None:
        scenario = os.environ.get("SCENARIO", "long_horizon")
        if scenario != "long_horizon":
            raise SystemExit(
                f"{SYSTEM} adapter implements SCENARIO=long_horizon only, not {scenario!r}"
            )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown.set)

        tables = await self.setup()
        db_name = (urlparse(self.url).path or "/").lstrip("/")
        emit(
            {
                "kind": "descriptor",
                "system": SYSTEM,
                "event_tables": tables,
                "event_indexes": [],
                "extensions": [],
                "version": self.version(),
                "schema_version": str(
                    getattr(self, "storage_status", {}).get("active_engine", "current")
                )
                + ("" if self.ring is None else f" ring.enqueue={str(self.ring).lower()}"),
                "db_name": db_name,
                "started_at": now_iso(),
            }
        )
        log(
            f"mode={self.producer_mode} rate={self.base_rate:g} workers={self.worker_count} "
            f"harness_paced={self.harness_paced} version={self.version()} ring={self.ring}"
        )

        self.producer = awa.AsyncClient(self.url, max_connections=3)
        await self.start_worker()
        if self.producer_mode == "depth-target":
            producer = self.produce_depth_target()
        elif self.harness_paced:
            producer = self.produce_harness_paced()
        else:
            producer = self.produce_locally_paced()
        tasks = [asyncio.create_task(c) for c in (producer, self.poll_depth(), self.sample())]
        await self.shutdown.wait()
        log("SIGTERM: shutting down")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            assert self.worker is not None
            await asyncio.wait_for(self.worker.shutdown(timeout_ms=2000), timeout=3.5)
        except Exception as exc:
            log(f"worker shutdown: {exc!r}")
        for client in (self.worker, self.producer):
            try:
                if client is not None:
                    await asyncio.wait_for(client.close(), timeout=1.0)
            except Exception:
                pass


def main() -> None:
    asyncio.run(Adapter().run())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
