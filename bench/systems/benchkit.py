"""Shared harness for the benchmark drivers.

This module runs *inside each system's virtualenv* (it is imported by
``bench/systems/<system>.py``), so it may only use the standard library plus
``psycopg`` (which run.py installs into every venv for the verification
queries).  Nothing here is timed except what the harness measures explicitly.

A driver module defines a ``System`` class with:

    name: str
    def version(self) -> str
    async def setup(self, url) -> dict                      # the library's own schema install
    async def open_producer(self, url) -> Producer          # connected, ready to insert
    async def open_worker(self, url, concurrency, on_job) -> Worker
    def counts(self, url) -> dict                           # read-only verification query

    Producer: async insert(seq, sent_at)  -- one statement/transaction
              async insert_many(seqs) -> int  -- the fastest bulk API, one call
              async close()
    Worker:   async start()  -- start processing (returns once started)
              async stop()   -- graceful shutdown; completions flushed when it returns
              async close()  -- release connections
    on_job(seq, sent_at) must be the first thing the no-op handler does.

``counts`` returns a dict with at least:
    completed, completed_distinct, unfinished, queued, queued_distinct, failed, method

Protocol (run.py <-> driver): ``python -P <driver> <command> --url URL [...]``.
Every protocol line on stdout starts with ``@@BENCH `` followed by one JSON
object; anything else on stdout/stderr is library noise and ignored.
Commands:
    version                         -> {"version": ...}
    setup                           -> {"ok": true, "seconds": s}
    insert-single --n N             -> {"n": N, "seconds": s}
    insert-bulk --n N [--seq0 S]    -> {"n": N, "seconds": s}
    produce --rate R --duration D   -> {"n": n, "seconds": s}   (sent_at = time.time())
    verify                          -> counts(...)
    worker --concurrency C [--latency]
        -> {"event": "ready"}            then waits for "go" on stdin
        -> {"event": "started", "t": ...} after start() returned
        -> {"event": "progress", "handled": k}  (at most every 10 ms, on change)
        <- "stop"  -> {"event": "result", ...}   after stop() returned
        <- "exit"  -> closes and exits
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import threading
import time
import traceback
from typing import Any

MARK = "@@BENCH "


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def cpu_self() -> float:
    """User+system CPU of this process (all threads, so Rust/C threads too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def payload(seq: int, sent_at: float = 0.0) -> dict[str, Any]:
    return {"seq": seq, "sent_at": sent_at}


def pg_connect(url: str):  # psycopg, used only by verification / setup helpers
    import psycopg

    return psycopg.connect(url, autocommit=True)


def relation_exists(conn, name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def column_exists(conn, schema: str, table: str, column: str) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM information_schema.columns "
            "WHERE table_schema=%s AND table_name=%s AND column_name=%s",
            (schema, table, column),
        ).fetchone()
        is not None
    )


# --------------------------------------------------------------------------
# stdin reader for the interactive worker protocol


class _Stdin:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.loop = loop
        t = threading.Thread(target=self._run, daemon=True)
        t.start()

    def _run(self) -> None:
        for line in sys.stdin:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, line.strip())
        self.loop.call_soon_threadsafe(self.queue.put_nowait, "eof")

    async def expect(self, *words: str) -> str:
        while True:
            w = await self.queue.get()
            if w in words or w == "eof":
                return w


# --------------------------------------------------------------------------
# commands


async def cmd_insert_single(system, args) -> None:
    prod = await system.open_producer(args.url)
    try:
        t0 = time.perf_counter()
        c0 = cpu_self()
        for i in range(args.n):
            await prod.insert(args.seq0 + i, 0.0)
        dt = time.perf_counter() - t0
        emit({"n": args.n, "seconds": dt, "client_cpu": cpu_self() - c0})
    finally:
        await prod.close()


async def cmd_insert_bulk(system, args) -> None:
    prod = await system.open_producer(args.url)
    try:
        seqs = list(range(args.seq0, args.seq0 + args.n))
        t0 = time.perf_counter()
        c0 = cpu_self()
        n = await prod.insert_many(seqs)
        dt = time.perf_counter() - t0
        emit({"n": n, "seconds": dt, "client_cpu": cpu_self() - c0})
    finally:
        await prod.close()


async def cmd_produce(system, args) -> None:
    """Insert single jobs at a fixed rate; each carries its wall-clock insert time."""
    prod = await system.open_producer(args.url)
    try:
        total = round(args.rate * args.duration)
        interval = 1.0 / args.rate
        start = time.monotonic() + 0.05
        late = 0
        t0 = time.perf_counter()
        for i in range(total):
            due = start + i * interval
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -interval:
                late += 1
            await prod.insert(args.seq0 + i, time.time())
        emit({"n": total, "seconds": time.perf_counter() - t0, "late": late})
    finally:
        await prod.close()


async def cmd_worker(system, args) -> None:
    loop = asyncio.get_running_loop()
    stdin = _Stdin(loop)
    state = {"handled": 0}
    latencies: list[float] = []
    record = args.latency

    def on_job(seq: int, sent_at: float) -> None:
        if record:
            latencies.append(time.time() - sent_at)
        state["handled"] += 1

    worker = await system.open_worker(args.url, args.concurrency, on_job)
    emit({"event": "ready", "pid": os.getpid()})
    if await stdin.expect("go") != "go":
        await worker.close()
        return
    t_go = time.time()
    c_go = cpu_self()
    await worker.start()
    emit({"event": "started", "t": time.time(), "start_seconds": time.time() - t_go})

    async def progress() -> None:
        last = -1
        while True:
            h = state["handled"]
            if h != last:
                emit({"event": "progress", "handled": h, "t": time.time()})
                last = h
            await asyncio.sleep(0.01)

    ptask = asyncio.create_task(progress())
    await stdin.expect("stop")
    t_stop = time.time()
    ptask.cancel()
    err = None
    try:
        await worker.stop()
    except Exception as e:  # reported, not fatal: verification decides
        err = repr(e)
        traceback.print_exc()
    t_stopped = time.time()
    c_stopped = cpu_self()
    emit(
        {
            "event": "result",
            "handled": state["handled"],
            "t_go": t_go,
            "t_stop": t_stop,
            "t_stopped": t_stopped,
            "stop_seconds": t_stopped - t_stop,
            "cpu": c_stopped - c_go,
            "latencies_ms": [x * 1000.0 for x in latencies] if record else None,
            "stop_error": err,
        }
    )
    await stdin.expect("exit")
    try:
        await asyncio.wait_for(worker.close(), 30)
    except Exception:
        traceback.print_exc()


def main(system) -> None:
    p = argparse.ArgumentParser(prog=f"bench driver {system.name}")
    p.add_argument("command")
    p.add_argument("--url", default=os.environ.get("DATABASE_URL", ""))
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--seq0", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--latency", action="store_true")
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args()

    if args.command == "version":
        emit({"version": system.version()})
        return
    if args.command == "verify":
        emit(system.counts(args.url))
        return

    async def run() -> None:
        if args.command == "setup":
            t0 = time.perf_counter()
            info = await system.setup(args.url) or {}
            emit({"ok": True, "seconds": time.perf_counter() - t0, **info})
        elif args.command == "insert-single":
            await cmd_insert_single(system, args)
        elif args.command == "insert-bulk":
            await cmd_insert_bulk(system, args)
        elif args.command == "produce":
            await cmd_produce(system, args)
        elif args.command == "worker":
            await cmd_worker(system, args)
        else:
            raise SystemExit(f"unknown command {args.command!r}")

    asyncio.run(run())
