"""The chaos scenarios, one fault each; each returns a `Report` (violations included).

Shared by the pytest suite (short form) and ``python -m tests.chaos`` (long form).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable

from tests.chaos import app
from tests.chaos.harness import Harness, Report
from tests.chaos.pgcluster import PrivateCluster
from tests.chaos.proxy import HalfOpenProxy

#: The LISTEN connection is the only worker connection without an application_name
#: (the pools say "awa", "awa-claim", "awa-runtime"), which is how the proxy tells it
#: apart: a startup packet naming none. A connection whose startup packet has not
#: gone through yet (one opening at the moment of the fault) names nothing yet and
#: is neither counted nor frozen as one.
LISTEN_APP = ""


def _rate(jobs: int) -> float:
    """Insert rate: the feed lasts about 5 s in the short form, ~60 s at 50,000 jobs."""
    if env := os.environ.get("AWA_CHAOS_RATE"):
        return float(env)
    return max(300.0, min(800.0, jobs / 5))


async def _start(h: Harness, workers: int = 3, **spawn: object) -> None:
    for _ in range(workers):
        h.spawn(**spawn)  # type: ignore[arg-type]
    await h.wait_workers_ready()
    h.start_background()


async def sigkill(url: str, jobs: int) -> Report:
    """SIGKILL a random worker every 1-3 s while jobs flow, and start a replacement."""
    async with Harness(url, "sigkill", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        await h.wait_fed(0.4)
        kills: list[tuple[float, int]] = []
        while not h.feed_done.is_set():
            victim = random.choice(h.live())
            victim.send_signal(signal.SIGKILL)
            kills.append((time.time(), victim.pid))
            h.spawn()
            await asyncio.sleep(random.uniform(1.0, 3.0))
        await h.finish()
        h.report.recovery_s = await h.recovery(kills[0][0])
        h.report.notes.update({"kills": len(kills), **await h.rescue_latency(kills)})
    return h.report


async def pg_restart(cluster: PrivateCluster, url: str, jobs: int, mode: str) -> Report:
    """Restart the (private) server with ``mode`` shutdown mid-drain."""
    async with Harness(url, f"pg_restart_{mode}", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        await h.wait_fed(0.4)
        fault = time.time()
        await asyncio.to_thread(cluster.restart, mode, 1.0)
        h.report.notes["down_s"] = round(time.time() - fault, 1)
        await h.finish()
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def pg_restart_drain(cluster: PrivateCluster, url: str, jobs: int,
                           restarts: int = 6) -> Report:
    """``pg_ctl restart -m immediate`` ``restarts`` times while the workers drain a
    backlog at full speed (claims of a full batch back to back): a claim the server
    forgets in the crash must not hand the same run lease out again (the harness
    counts the (job, lease) pairs started twice). The handlers' ledger rows commit
    asynchronously here (tests/chaos/app.py), so they do not flush the claims."""
    async with Harness(url, "pg_restart_drain", jobs=jobs, rate=jobs * 10.0) as h:
        h.start_background()  # the whole backlog in one COPY, then the callback resolver
        await asyncio.wait_for(h.feed_done.wait(), 120)
        for _ in range(3):
            h.spawn(env={"AWA_CHAOS_ASYNC_LEDGER": "1"})
        await h.wait_workers_ready()
        step = jobs / (restarts + 1)
        fault = 0.0
        for _ in range(restarts):
            await _wait_runs(h, step / 2)  # draining again since the last restart
            fault = fault or time.time()
            await asyncio.to_thread(cluster.restart, "immediate", 0.5)
        h.report.notes["restarts"] = restarts
        await h.finish()
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def _wait_runs(h: Harness, more: float) -> None:
    """Until the handlers have recorded ``more`` starts in the database from now."""
    first: int | None = None
    while True:
        n = (await h.query("SELECT count(*) AS n FROM chaos_runs"))[0]["n"]
        first = n if first is None else first
        if n - first >= more:
            return
        await asyncio.sleep(0.02)


async def terminate_backends(url: str, jobs: int) -> Report:
    """pg_terminate_backend every worker connection, three times, 1 s apart."""
    async with Harness(url, "terminate_backends", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        await h.wait_fed(0.3)
        fault = time.time()
        killed = 0
        for _ in range(3):
            rows = await h.query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name <> 'chaos-harness' AND backend_type = 'client backend'")
            killed += len(rows)
            await asyncio.sleep(1.0)
        h.report.notes["backends_killed"] = killed
        await h.finish()
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def pool_exhausted(url: str, jobs: int, hold_s: float = 5.0) -> Report:
    """A handler takes every connection of its worker's pool for ``hold_s`` seconds."""
    async with Harness(url, "pool_exhausted", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        await h.wait_fed(0.3)
        fault = time.time()
        stuck = [app.Stuck(n=-i, hold_s=hold_s) for i in range(1, 3)]
        await h.client.enqueue_many_copy(stuck, queue=app.QUEUE)
        await h.finish()
        rows = await h.query("SELECT state::text AS s, run_lease FROM awa.jobs_all "
                             "WHERE kind = 'stuck'")
        if [r["s"] for r in rows] != ["completed"] * len(stuck):
            h.report.violations.append(f"stuck jobs ended {[dict(r) for r in rows]}")
        h.report.notes["stuck_runs"] = sum(r["run_lease"] for r in rows)
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def half_open(url: str, jobs: int, target: str) -> Report:
    """Every worker connection open at the fault (``target="all"``), or only the LISTEN
    connections (``"listen"``), stops forwarding without closing."""
    host, port = _host_port(url)
    proxy = HalfOpenProxy(host, port).start()
    worker_url = _with_host_port(url, "127.0.0.1", proxy.port)
    try:
        async with Harness(url, f"half_open_{target}", jobs=jobs, rate=_rate(jobs),
                           worker_url=worker_url) as h:
            await _start(h)
            await h.wait_fed(0.3)
            listeners = proxy.live(LISTEN_APP)
            fault = time.time()
            frozen = proxy.freeze(None if target == "all" else LISTEN_APP)
            h.report.notes["frozen_connections"] = frozen
            relisten: float | None = None
            while not h.feed_done.is_set() or relisten is None:
                if relisten is None and proxy.live(LISTEN_APP) >= listeners > 0:
                    relisten = time.time() - fault
                if time.time() - fault > 120:
                    break
                await asyncio.sleep(0.05)
            if relisten is None:
                h.report.violations.append("LISTEN connections were not re-established")
            else:
                h.report.notes["listen_reconnected_s"] = round(relisten, 1)
            await h.finish()
            h.report.recovery_s = await h.recovery(fault)
            if target == "listen":
                h.report.recovery_s = relisten
    finally:
        proxy.stop()
    return h.report


async def held_xmin(url: str, jobs: int, hold_s: float) -> Report:
    """A transaction holds the xmin horizon back for ``hold_s`` seconds while jobs flow."""
    rate = min(_rate(jobs), jobs / (hold_s + 4.0))  # jobs keep flowing for the whole hold
    async with Harness(url, "held_xmin", jobs=jobs, rate=rate) as h:
        await _start(h)
        await h.wait_fed(0.1)
        holder = await h.connect()
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT txid_current()")
        start = time.time()
        samples: list[tuple[float, int, int]] = []
        while time.time() - start < hold_s and not h.feed_done.is_set():
            rows = await h.query(
                "SELECT (SELECT count(*) FROM awa.jobs_active "
                "WHERE state = 'available') AS backlog, "
                "coalesce((SELECT n_dead_tup FROM pg_stat_user_tables "
                "WHERE relid = 'awa.jobs'::regclass), 0) AS dead")
            samples.append((time.time(), rows[0]["backlog"], rows[0]["dead"]))
            await asyncio.sleep(0.5)
        released = time.time()
        await holder.execute("ROLLBACK")
        await holder.close()
        await h.finish(timeout=300 + jobs / 50)
        times = await h.finished_times()
        h.report.recovery_s = await h.recovery(released, since=h.feed_started + 1.0)
        h.report.baseline_rate = h.rate_between(times, h.feed_started + 1.0, start)
        h.report.notes.update({
            "held_s": round(released - start, 1),
            "rate_during": round(h.rate_between(times, start, released)),
            "rate_after": round(h.rate_between(times, released, min(released + 10, times[-1]))
                                if times and times[-1] > released else 0),
            "max_backlog": max((s[1] for s in samples), default=0),
            "max_dead_tuples": max((s[2] for s in samples), default=0)})
    return h.report


async def leader_kill_cron(url: str, jobs: int, kills: int = 4) -> Report:
    """SIGKILL the maintenance leader (which fires the every-second cron) repeatedly."""
    async with Harness(url, "leader_kill_cron", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        fault = await _kill_leaders(h, kills, lambda: asyncio.sleep(random.uniform(0.2, 1.5)))
        await h.finish()
        gaps = await h.query(
            "SELECT max(d) AS gap FROM (SELECT created_at - lag(created_at) OVER "
            "(ORDER BY created_at) AS d FROM awa.jobs_all WHERE kind = 'tick') g")
        h.report.notes["max_cron_insert_gap_s"] = round(gaps[0]["gap"].total_seconds(), 1) \
            if gaps and gaps[0]["gap"] else None
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def leader_kill_rescue(url: str, jobs: int) -> Report:
    """SIGKILL a worker, then the leader just before it would rescue that worker's jobs."""
    async with Harness(url, "leader_kill_rescue", jobs=jobs, rate=_rate(jobs)) as h:
        await _start(h)
        await h.wait_fed(0.3)
        leader = await _wait_leader(h)
        victim = next(p for p in h.live() if p.pid != leader)
        victim.send_signal(signal.SIGKILL)
        fault = time.time()
        h.spawn()
        staleness = h.settings["heartbeat_staleness_ms"] / 1000
        await asyncio.sleep(max(0.1, staleness - 0.3))
        leader_proc = next(p for p in h.live() if p.pid == leader)
        leader_proc.send_signal(signal.SIGKILL)
        h.spawn()
        await h.finish()
        h.report.recovery_s = await h.recovery(fault)
        h.report.notes.update(await h.rescue_latency([(fault, victim.pid)]))
    return h.report


async def clock_skew(url: str, jobs: int) -> Report:
    """Workers whose wall clocks are 30 s behind and ahead (leadership moves among them)."""
    async with Harness(url, "clock_skew", jobs=jobs, rate=_rate(jobs)) as h:
        for skew in (30.0, -30.0, 0.0):
            h.spawn(skew=skew)
            await asyncio.sleep(0.3)
        await h.wait_workers_ready()
        h.start_background()
        fault = await _kill_leaders(h, 2, lambda: asyncio.sleep(2.0),
                                    respawn_skew=lambda i: 30.0 if i % 2 else -30.0)
        await h.finish()
        h.report.recovery_s = await h.recovery(fault)
    return h.report


async def _wait_leader(h: Harness, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = await h.leader_pid()
        if pid is not None and pid in {p.pid for p in h.live()}:
            return pid
        await asyncio.sleep(0.05)
    raise AssertionError("no live leader")


async def _kill_leaders(h: Harness, kills: int, pause: Callable[[], Awaitable[None]],
                        respawn_skew: Callable[[int], float] | None = None) -> float:
    """Kill the leader ``kills`` times (after ``pause`` each); returns the first kill time."""
    await h.wait_fed(0.2)
    first = 0.0
    for i in range(kills):
        leader = await _wait_leader(h)
        await pause()
        proc = next((p for p in h.live() if p.pid == leader), None)
        if proc is None:
            continue
        proc.send_signal(signal.SIGKILL)
        first = first or time.time()
        h.spawn(skew=respawn_skew(i) if respawn_skew else 0.0)
    h.report.notes["leader_kills"] = kills
    return first


async def recovery_time_defaults(url: str, victim_is_leader: bool = False) -> Report:
    """With DEFAULT settings, SIGKILL a worker running jobs; time until they run again."""
    name = "recovery_defaults" + ("_leader" if victim_is_leader else "")
    async with Harness(url, name, jobs=0, rate=1.0, settings={}) as h:
        first = h.spawn(cron=False, env={"AWA_CHAOS_VICTIM": "1"} if victim_is_leader else {})
        await h.wait_workers_ready()
        await _wait_leader(h)
        second = h.spawn(cron=False, env={} if victim_is_leader else {"AWA_CHAOS_VICTIM": "1"})
        await h.wait_workers_ready()
        victim = first if victim_is_leader else second
        await h.client.enqueue_many_copy([app.Sleeper(n=-i) for i in range(1, 41)],
                                         queue=app.QUEUE)
        deadline = time.monotonic() + 60
        while True:
            rows = await h.query("SELECT count(*) AS n FROM chaos_runs WHERE pid = $1",
                                 victim.pid)
            if rows[0]["n"] >= 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        fault = time.time()
        held = (await h.query("SELECT count(*) AS n FROM chaos_runs WHERE pid = $1",
                              victim.pid))[0]["n"]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            rows = await h.query("SELECT count(*) AS n FROM awa.jobs_active")
            if rows[0]["n"] == 0:
                break
            await asyncio.sleep(0.2)
        h.report.notes.update({"victim_held": held,
                               **await h.rescue_latency([(fault, victim.pid)])})
        h.report.recovery_s = h.report.notes.get("rerun_max_s")
        h.stop_workers()
        await h.check()
    return h.report


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def _with_host_port(url: str, host: str, port: int) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["clock_skew", "half_open", "held_xmin", "leader_kill_cron",
           "leader_kill_rescue", "pg_restart", "pool_exhausted", "recovery_time_defaults",
           "sigkill", "terminate_backends"]
