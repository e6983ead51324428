"""Chaos harness: real worker processes, a paced mixed workload, faults, and a ledger check.

A scenario spawns ``awa worker tests.chaos.app:client`` processes, feeds the
workload at a steady rate (so faults land mid-drain), resolves callbacks as an
external system would, injects its fault, waits for quiescence, then checks
the invariants from the database alone (`Harness.check`):

- lost: every inserted job exists, exactly once, in its expected terminal state
  (``doom`` failed, every other kind completed); nothing is left unfinished;
- doubly completed: no job id appears twice in ``jobs_all``; every completed job's
  completing run lease is one that actually ran, and nothing ran after it (the
  workers' start ledgers, below);
- fencing: no (job id, run lease) pair was started twice (the workers' start
  ledgers, kept outside the database: a claim the server forgot in a crash would
  hand the same lease out again, and the old attempt's writes would pass as the new
  one's);
- follow-ups: each completed ``stage`` job has exactly one ``child`` and each
  completed ``flaky`` job exactly one ``audit`` (no unique keys, so a second
  completion would show up as a second row), and none exists without its trigger;
- cron: every fire time of ``chaos_tick`` has exactly one job, with no gaps.

Re-runs are allowed (at-least-once) and only reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from tests.chaos import app

import awa

ROOT = Path(__file__).resolve().parents[2]

#: start() settings for the scenarios: faults are detected within a couple of seconds.
CHAOS = {
    "poll_interval_ms": 100,
    "heartbeat_interval_ms": 250,
    "heartbeat_staleness_ms": 2000,
    "heartbeat_rescue_interval_ms": 500,
    "deadline_rescue_interval_ms": 500,
    "callback_rescue_interval_ms": 500,
    "promote_interval_ms": 100,
    "leader_election_interval_ms": 1500,
}

#: One cycle of the workload mix: kind of job number n is MIX[n % len(MIX)].
MIX = (["work"] * 10 + ["flaky"] * 2 + ["nap"] * 2 + ["park", "await_cb"] + ["stage"] * 3
       + ["doom"])
ARGS = {"work": app.Work, "flaky": app.Flaky, "nap": app.Nap, "park": app.Park,
        "await_cb": app.AwaitCb, "stage": app.Stage, "doom": app.Doom}
EXPECTED = {kind: ("failed" if kind == "doom" else "completed") for kind in ARGS}


def chaos_jobs(default: int) -> int:
    """Jobs per scenario: ``$AWA_CHAOS_JOBS`` or ``default``."""
    return int(os.environ.get("AWA_CHAOS_JOBS", default))


@dataclass
class Report:
    """What one scenario did and found."""

    scenario: str
    jobs: int = 0  #: harness-inserted jobs
    total: int = 0  #: every job, follow-ups and cron ticks included
    runs: int = 0
    reruns: int = 0
    recovery_s: float | None = None
    baseline_rate: float = 0.0  #: jobs/s before the fault
    notes: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def line(self) -> str:
        rec = "-" if self.recovery_s is None else f"{self.recovery_s:.1f}s"
        return (f"{self.scenario}: jobs={self.jobs} total={self.total} runs={self.runs} "
                f"reruns={self.reruns} recovery={rec} rate={self.baseline_rate:.0f}/s "
                f"violations={len(self.violations)} {self.notes}")


#: Reports of the scenarios run in this process (printed in pytest's summary).
REPORTS: list[Report] = []


class Harness:
    """One scenario's workers, workload, resolver and checks."""

    def __init__(self, database_url: str, name: str, *, jobs: int, rate: float,
                 worker_url: str | None = None, settings: dict[str, Any] | None = None,
                 slots: int = 16) -> None:
        self.url = database_url
        self.worker_url = worker_url or database_url
        self.name = name
        self.jobs = jobs
        self.rate = rate
        self.settings = CHAOS if settings is None else settings
        self.slots = slots
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix=f"awa-chaos-{name}-"))
        self.report = Report(name, jobs=jobs)
        self.client = awa.AsyncClient(database_url)
        self.conn: asyncpg.Connection | None = None
        self.fed = 0
        self.feed_started = 0.0
        self.feed_done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = time.monotonic()

    # -- setup and teardown -----------------------------------------------------

    async def __aenter__(self) -> Harness:
        await self.client.migrate()
        conn = await self.connect()
        await conn.execute("CREATE TABLE IF NOT EXISTS chaos_runs (job_id bigint, kind text, "
                           "attempt int, run_lease bigint, pid int, "
                           "at timestamptz NOT NULL DEFAULT clock_timestamp())")
        await conn.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.stop_workers(signal.SIGKILL)
        with contextlib.suppress(Exception):
            await self.client.close()
        self.report.elapsed_s = time.monotonic() - self._started
        REPORTS.append(self.report)

    async def connect(self, attempts: int = 100) -> asyncpg.Connection:
        """A harness connection (retried while the server restarts)."""
        for i in range(attempts):
            try:
                return await asyncpg.connect(self.url, server_settings={
                    "application_name": "chaos-harness"})
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if i == attempts - 1:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")

    async def query(self, sql: str, *args: Any) -> list[Any]:
        """Run a read on a fresh or kept connection, reconnecting after failures."""
        for i in range(100):
            try:
                if self.conn is None or self.conn.is_closed():
                    self.conn = await self.connect()
                return list(await self.conn.fetch(sql, *args, timeout=30))
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                if self.conn is not None:
                    self.conn.terminate()
                self.conn = None
                if i == 99:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")

    # -- workers ------------------------------------------------------------------

    def spawn(self, *, skew: float = 0.0, settings: dict[str, Any] | None = None,
              cron: bool = True, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        opts = self.settings if settings is None else settings
        full_env = {**os.environ, "DATABASE_URL": self.worker_url,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")])),
                    "AWA_CHAOS_SKEW_S": str(skew), "AWA_CHAOS_CRON": "1" if cron else "0",
                    "AWA_CHAOS_STARTS": str(self.logdir),
                    **(env or {})}
        log = open(self.logdir / f"worker-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "awa", "worker", "tests.chaos.app:client",
             "--queue", f"{app.QUEUE}={self.slots}",
             *[f"--set={k}={v}" for k, v in opts.items()]],
            env=full_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop_workers(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        for p in self.live():
            p.send_signal(sig)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    async def leader_pid(self) -> int | None:
        rows = await self.query("SELECT holder FROM awa.leadership WHERE expires_at > now()")
        if not rows:
            return None
        return int(rows[0]["holder"].split(":")[1])

    async def wait_workers_ready(self, timeout: float = 60) -> None:
        """Until every live worker has registered its presence row."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = await self.query("SELECT pid FROM awa.presence")
            if {p.pid for p in self.live()} <= {r["pid"] for r in rows}:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"workers did not start; logs in {self.logdir}")

    # -- workload -------------------------------------------------------------------

    def start_background(self) -> None:
        """Start feeding the workload and resolving callbacks."""
        self._tasks.append(asyncio.create_task(self._feed()))
        self._tasks.append(asyncio.create_task(self._resolve_callbacks()))

    async def _feed(self) -> None:
        self.feed_started = time.time()
        chunk = max(1, int(self.rate / 10))
        n = 0
        while n < self.jobs:
            batch = list(range(n, min(n + chunk, self.jobs)))
            await self._insert_chunk(batch)
            n = batch[-1] + 1
            self.fed = n
            lag = self.feed_started + n / self.rate - time.time()
            if lag > 0:
                await asyncio.sleep(lag)
        self.feed_done.set()

    async def _insert_chunk(self, ns: list[int]) -> None:
        jobs = [ARGS[MIX[n % len(MIX)]](n) for n in ns]
        for i in range(200):
            try:
                await self.client.enqueue_many_copy(jobs, queue=app.QUEUE)
                return
            except Exception:
                if i == 199:
                    raise
                await asyncio.sleep(0.2)
                # The commit may have landed before the connection broke: never insert twice.
                with contextlib.suppress(Exception):
                    rows = await self.query(
                        "SELECT count(*) AS n FROM awa.jobs_all WHERE kind = ANY($1) "
                        "AND (args->>'n')::int BETWEEN $2 AND $3", list(ARGS), ns[0], ns[-1])
                    if rows[0]["n"] == len(ns):
                        return

    async def _resolve_callbacks(self) -> None:
        while True:
            try:
                rows = await self.query(
                    "SELECT id, kind, callback_id FROM awa.jobs WHERE state = 'waiting_external'"
                    " AND callback_id IS NOT NULL ORDER BY id LIMIT 200")
                for r in rows:
                    with contextlib.suppress(awa.CallbackNotFound):
                        if r["kind"] == "park":
                            await self.client.complete_external(str(r["callback_id"]))
                        else:
                            await self.client.resume_external(str(r["callback_id"]), {"ok": 1})
            except asyncio.CancelledError:
                raise
            except Exception:
                pass  # the server restarts, a connection is killed...: try again
            await asyncio.sleep(0.05)

    async def wait_fed(self, fraction: float) -> None:
        while self.fed < self.jobs * fraction:
            await asyncio.sleep(0.02)

    async def finish(self, timeout: float | None = None) -> Report:
        """Wait for the feed, quiescence and stop the cron; stop workers; check."""
        timeout = timeout or 120 + self.jobs / 100
        deadline = time.monotonic() + timeout
        await asyncio.wait_for(self.feed_done.wait(), timeout)
        await self._wait_empty(deadline, "kind <> 'tick'")
        await self.query("UPDATE awa.cron_jobs SET paused = true RETURNING name")
        await self._wait_empty(deadline, "true")
        for task in self._tasks:
            task.cancel()
        self.stop_workers()
        await self.check()
        return self.report

    async def _wait_empty(self, deadline: float, where: str) -> None:
        while True:
            rows = await self.query(
                f"SELECT count(*) AS n FROM awa.jobs_active WHERE {where}")  # noqa: S608
            if rows[0]["n"] == 0:
                return
            if time.monotonic() > deadline:
                cols = "id, kind, state::text, attempt, run_at, heartbeat_at, now() AS now"
                sample = (f"SELECT {cols} FROM awa.jobs_active "  # noqa: S608
                          f"WHERE {where} ORDER BY id LIMIT 5")
                left = await self.query(sample)
                with contextlib.suppress(Exception):  # a diagnostic: never fails the check
                    await self._dump_sessions(self.logdir / "sessions.txt")
                self.report.violations.append(
                    f"not quiescent: {rows[0]['n']} jobs unfinished, e.g. "
                    f"{[dict(r) for r in left]}; logs (and the database's sessions and "
                    f"locks, sessions.txt) in {self.logdir}")
                return
            await asyncio.sleep(0.2)

    async def _dump_sessions(self, path: Path) -> None:
        """Write the database's sessions (who blocks whom, in which state, since when)
        and their locks to ``path``: what holds up the jobs left unfinished."""
        sessions = await self.query(
            "SELECT pid, pg_blocking_pids(pid) AS blocked_by, application_name, state, "
            "wait_event_type, wait_event, backend_xid::text AS xid, "
            "backend_xmin::text AS xmin, now() - state_change AS since_change, "
            "now() - xact_start AS xact_age, left(query, 200) AS query "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() ORDER BY pid")
        locks = await self.query(
            "SELECT l.pid, l.locktype, l.mode, l.granted, l.relation::regclass::text AS rel, "
            "l.transactionid::text AS xid FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE a.datname = current_database() "
            "AND l.locktype <> 'virtualxid' ORDER BY l.pid")
        path.write_text("".join(f"{dict(r)!r}\n" for r in [*sessions, *locks]))

    # -- measurement -----------------------------------------------------------------

    async def finished_times(self) -> list[float]:
        rows = await self.query("SELECT extract(epoch FROM finalized_at)::float8 AS t "
                                "FROM awa.jobs_all WHERE finalized_at IS NOT NULL")
        return sorted(r["t"] for r in rows)

    async def recovery(self, fault_at: float, *, since: float | None = None,
                       window: float = 1.0, threshold: float = 0.5) -> float | None:
        """Seconds from ``fault_at`` until a ``window`` of finishes reaches ``threshold``
        of the pre-fault rate (measured from ``since``, default feed start + 1 s)."""
        times = await self.finished_times()
        start = since if since is not None else self.feed_started + 0.5
        before = [t for t in times if start <= t < fault_at]
        span = max(fault_at - start, 0.5)
        baseline = len(before) / span
        self.report.baseline_rate = baseline
        if baseline <= 0:
            return None
        need = threshold * baseline * window
        after = [t - fault_at for t in times if t >= fault_at]
        if not after:
            return None
        step = 0.25
        counts = [0] * (int(max(after) / step) + 1)
        for x in after:
            counts[int(x / step)] += 1
        width = max(1, int(window / step))
        for i in range(max(1, len(counts) - width + 1)):
            if sum(counts[i:i + width]) >= need:
                return i * step
        return None

    def rate_between(self, times: list[float], a: float, b: float) -> float:
        return sum(1 for t in times if a <= t < b) / max(b - a, 1e-9)

    async def rescue_latency(self, kills: list[tuple[float, int]]) -> dict[str, float]:
        """For SIGKILLed pids: seconds from the kill until each job they held was rescued
        (its "heartbeat stale" error entry) and until it ran again."""
        rescued: list[float] = []
        rerun: list[float] = []
        for at, pid in kills:
            rows = await self.query(
                "SELECT r.job_id, (SELECT min(extract(epoch FROM n.at))::float8 FROM chaos_runs n"
                " WHERE n.job_id = r.job_id AND n.run_lease > r.run_lease) AS again, "
                "(SELECT min(extract(epoch FROM (e->>'at')::timestamptz))::float8 "
                " FROM awa.jobs_all j, jsonb_array_elements(j.errors) e WHERE j.id = r.job_id"
                " AND e->>'error' = 'heartbeat stale' AND (e->>'attempt')::int = r.attempt)"
                " AS rescued FROM chaos_runs r WHERE r.pid = $1 AND r.at <= to_timestamp($2) "
                "AND NOT EXISTS (SELECT 1 FROM awa.jobs_done d WHERE d.id = r.job_id "
                "AND d.run_lease = r.run_lease)", pid, at)
            rows = [r for r in rows if r["again"] is not None and r["again"] >= at]
            rescued.extend(r["rescued"] - at for r in rows if r["rescued"] is not None)
            rerun.extend(r["again"] - at for r in rows)
        if not rerun:
            return {}
        out = {"rescued_jobs": len(rerun), "rerun_median_s": round(statistics.median(rerun), 2),
               "rerun_max_s": round(max(rerun), 2)}
        if rescued:
            out |= {"rescue_median_s": round(statistics.median(rescued), 2),
                    "rescue_max_s": round(max(rescued), 2)}
        return out

    # -- the invariants ----------------------------------------------------------------

    async def check(self) -> None:
        v = self.report.violations
        rows = await self.query(
            "SELECT (args->>'n')::int AS n, kind, count(*) AS copies, "
            "array_agg(state::text) AS states FROM awa.jobs_all WHERE kind = ANY($1) "
            "GROUP BY 1, 2", list(ARGS))
        seen = {r["n"]: r for r in rows}
        lost = [n for n in range(self.jobs) if n not in seen]
        if lost:
            v.append(f"lost {len(lost)} jobs, e.g. n={lost[:10]}")
        for r in rows:
            if r["copies"] != 1:
                v.append(f"job n={r['n']} stored {r['copies']} times: {r['states']}")
            elif r["states"][0] != EXPECTED[r["kind"]]:
                v.append(f"job n={r['n']} ({r['kind']}) ended {r['states'][0]}, "
                         f"expected {EXPECTED[r['kind']]}")
        extra = [n for n in seen if n >= self.jobs]
        if extra:
            v.append(f"{len(extra)} jobs that were never inserted, e.g. {extra[:5]}")
        dup = await self.query("SELECT id, count(*) AS c FROM awa.jobs_all GROUP BY id "
                               "HAVING count(*) > 1 LIMIT 10")
        if dup:
            v.append(f"job ids finished more than once: {[dict(r) for r in dup]}")
        left = await self.query("SELECT count(*) AS n FROM awa.jobs_active")
        if left[0]["n"]:
            v.append(f"{left[0]['n']} jobs never reached a terminal state")
        # What ran is read from the workers' start ledgers, which no crash of the
        # server can lose (chaos_runs rows can be, in pg_restart_drain).
        ran: dict[int, set[int]] = {}
        for job_id, lease in self.starts():
            ran.setdefault(job_id, set()).add(lease)
        ledger = await self.query("SELECT id, kind, run_lease FROM awa.jobs_done "
                                  "WHERE state = 'completed'")
        bad = [{**dict(r), "ran": sorted(ran.get(r["id"], ()))} for r in ledger
               if r["run_lease"] not in ran.get(r["id"], ())
               or max(ran[r["id"]]) > r["run_lease"]]
        if bad:
            v.append(f"{len(bad)} completions not matching the attempt that ran, "
                     f"e.g. {bad[:5]}")
        self._check_leases()
        for parent_kind, child_kind in (("stage", "child"), ("flaky", "audit")):
            await self._check_followups(parent_kind, child_kind)
        await self._check_cron()
        stats = await self.query("SELECT count(*) AS runs, count(DISTINCT job_id) AS jobs "
                                 "FROM chaos_runs")
        self.report.runs = stats[0]["runs"]
        self.report.reruns = stats[0]["runs"] - stats[0]["jobs"]
        total = await self.query("SELECT count(*) AS n FROM awa.jobs_all")
        self.report.total = total[0]["n"]

    def starts(self) -> Counter[tuple[int, int]]:
        """How many times each (job id, run lease) was started, from the workers'
        ledgers (tests/chaos/app.py)."""
        seen: Counter[tuple[int, int]] = Counter()
        for path in self.logdir.glob("starts-*.log"):
            for line in path.read_text().splitlines():
                job_id, lease = line.split()
                seen[int(job_id), int(lease)] += 1
        return seen

    def _check_leases(self) -> None:
        """A run lease is a fencing token: no two starts of a job may share one."""
        starts = self.starts()
        twice = sorted(pair for pair, n in starts.items() if n > 1)
        self.report.notes["starts"] = sum(starts.values())
        self.report.notes["leases_started_twice"] = len(twice)
        if twice:
            self.report.violations.append(
                f"{len(twice)} (job id, run lease) pairs started more than once, "
                f"e.g. {twice[:5]}; logs in {self.logdir}")

    async def _check_followups(self, parent_kind: str, child_kind: str) -> None:
        v = self.report.violations
        parents = await self.query("SELECT id FROM awa.jobs_all WHERE kind = $1 "
                                   "AND state = 'completed'", parent_kind)
        done = {r["id"] for r in parents}
        kids = await self.query(
            "SELECT (args->>'parent')::bigint AS parent, count(*) AS c, "
            "bool_and(state = 'completed') AS ok FROM awa.jobs_all WHERE kind = $1 GROUP BY 1",
            child_kind)
        per = {r["parent"]: r for r in kids}
        missing = sorted(done - set(per))
        orphans = sorted(set(per) - done)
        twice = [p for p, r in per.items() if r["c"] != 1]
        unfinished = [p for p, r in per.items() if not r["ok"]]
        if missing:
            v.append(f"{len(missing)} completed {parent_kind} jobs without their "
                     f"{child_kind}, e.g. {missing[:5]}")
        if orphans:
            v.append(f"{len(orphans)} {child_kind} jobs without a completed trigger, "
                     f"e.g. {orphans[:5]}")
        if twice:
            v.append(f"{len(twice)} {parent_kind} jobs with several {child_kind} follow-ups "
                     f"(completed twice?), e.g. {twice[:5]}")
        if unfinished:
            v.append(f"{len(unfinished)} {child_kind} jobs not completed")

    async def _check_cron(self) -> None:
        v = self.report.violations
        rows = await self.query(
            "SELECT metadata->>'cron_fire_at' AS fire, count(*) AS c, "
            "bool_and(state = 'completed') AS ok FROM awa.jobs_all WHERE kind = 'tick' "
            "GROUP BY 1")
        if not rows:
            self.report.notes["cron_fires"] = 0
            return
        fires = sorted(datetime.fromisoformat(r["fire"]).timestamp() for r in rows)
        dups = [r["fire"] for r in rows if r["c"] != 1]
        if dups:
            v.append(f"cron fire times with several jobs: {dups[:5]}")
        if not all(r["ok"] for r in rows):
            v.append("cron jobs not completed")
        expected = round(fires[-1] - fires[0]) + 1
        if expected != len(fires):
            v.append(f"cron fired {len(fires)} of the {expected} fire times in its span")
        self.report.notes["cron_fires"] = len(fires)


def jitter(a: float, b: float) -> float:
    return random.uniform(a, b)
