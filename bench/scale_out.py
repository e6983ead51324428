#!/usr/bin/env python3
"""Scale-out: 1, 2, 4, 8 worker processes on separate simulated hosts (issue 9, item 4).

    python bench/scale_out.py                          # 20,000 jobs, 1/2/4/8 processes
    python bench/scale_out.py --jobs 2000 --procs 1,2 --keys 4 --per-key 5   # smoke
    python bench/scale_out.py --no-netns               # plain processes on 127.0.0.1

Hosts: network namespaces this script creates and always deletes again
(``awa-db`` plus ``awa-w1`` ... ``awa-wK``).  Worker k reaches the database
over a veth pair at 10.213.k.1:5432 (its own side is 10.213.k.2/30), where
``socat`` in ``awa-db`` forwards each connection to PostgreSQL's Unix socket,
so PostgreSQL's configuration is untouched and no address outside these
namespaces is used.  Needs root (``ip netns``) and socat; without either it
falls back to plain processes and says so.

For each process count: a fresh database, --jobs no-op jobs bulk-inserted
(untimed), then the processes (concurrency 32 each, like bench/run.py's
drains) drain the one queue; timed from "go" to the last worker's graceful
shutdown.  One reference row runs a single process on 127.0.0.1 without
namespaces, to show the cost of the forwarder.  Every drain is verified from
the database (each job completed exactly once).

Order check, at the largest process count: the same drain plus, at the same
time, --keys x --per-key jobs on one queue with ``ordering_key`` and as many
on a ``PartitionedQueue`` (--partitions, routed by key).  Each handler first
appends (queue, key, seq, pid) to ``bench_order_log``; per key the seqs must
appear in insertion order, each exactly once, and all of a key's jobs in one
partition.  Writes bench/results/scale_out.md and scale_out.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DB = "bench_scale"
QUEUE = "bench"
KEYED = "keyed"
LOGICAL = "ordered"
CONCURRENCY = 32
NET = "10.213"
PG_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"


# ===========================================================================
# role: the worker and the ordered-job producer (bench/.venvs/awa's python)


def role_main(argv: list[str]) -> None:
    """`scale_out.py <command> --url URL ...`: benchkit's protocol with a System
    that also serves the ordered queues when BENCH_SCALE_ORDERED=1."""
    import asyncio
    from dataclasses import dataclass

    import asyncpg

    import awa

    sys.path.insert(0, str(HERE / "systems"))
    import benchkit

    pool_size = int(os.environ.get("BENCH_SCALE_POOL", "10"))
    ordered = os.environ.get("BENCH_SCALE_ORDERED") == "1"
    partitions = int(os.environ.get("BENCH_SCALE_PARTITIONS", "4"))
    pq = awa.PartitionedQueue(LOGICAL, partitions)

    @dataclass
    class BenchJob:  # kind "bench_job", as bench/systems/awa.py
        seq: int
        sent_at: float = 0.0

    @dataclass
    class OrderJob:
        key: str
        seq: int

    class Worker:
        def __init__(self, client, queues, log_pool) -> None:
            self.client, self.queues, self.log_pool = client, queues, log_pool

        async def start(self) -> None:
            await self.client.start(queues=self.queues)

        async def stop(self) -> None:
            await self.client.shutdown(timeout_ms=5000)

        async def close(self) -> None:
            await self.client.close()
            if self.log_pool is not None:
                await self.log_pool.close()

    class System:
        name = "awa"

        def version(self) -> str:
            from importlib.metadata import version

            return version("awa")

        async def open_worker(self, url, concurrency, on_job):
            client = awa.AsyncClient(url, max_connections=pool_size)
            pid = os.getpid()

            @client.task(BenchJob, queue=QUEUE)
            async def handle(job):
                on_job(job.args.seq, job.args.sent_at)

            queues: list = [(QUEUE, concurrency)]
            log_pool = None
            if ordered:
                log_pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
                insert = "INSERT INTO bench_order_log (queue, key, seq, pid) VALUES ($1,$2,$3,$4)"

                @client.task(OrderJob, queue=KEYED)
                async def handle_ordered(job):
                    on_job(job.args.seq, 0.0)
                    await log_pool.execute(insert, job.queue, job.args.key, job.args.seq, pid)

                queues += [(KEYED, 8), *pq.queue_configs(max_workers_per_partition=4)]
            return Worker(client, queues, log_pool)

    if argv[0] == "insert-ordered":
        p = argparse.ArgumentParser()
        p.add_argument("command")
        p.add_argument("--url")
        p.add_argument("--keys", type=int)
        p.add_argument("--per-key", type=int)
        a = p.parse_args(argv)

        async def insert() -> None:
            keys = [f"k{i:03d}" for i in range(a.keys)]
            # seq-major: every key's seq 0, then every key's seq 1, ...
            jobs = [OrderJob(k, s) for s in range(a.per_key) for k in keys]
            client = awa.AsyncClient(a.url, max_connections=2)
            try:
                n = await client.enqueue_many_copy(
                    jobs, opts=[{"queue": KEYED, "ordering_key": j.key} for j in jobs])
                n += await client.enqueue_many_copy(
                    jobs, opts=[pq.route_by_key(j.key) for j in jobs])
            finally:
                await client.close()
            benchkit.emit({"n": n})

        asyncio.run(insert())
        return
    sys.argv = [sys.argv[0], *argv]
    benchkit.main(System())


# ===========================================================================
# namespaces


class Net:
    """awa-db + awa-w1..awa-wN, one veth pair each, socat in awa-db → Unix socket."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.names = ["awa-db"] + [f"awa-w{k}" for k in range(1, n + 1)]
        self.socat: subprocess.Popen | None = None
        self.made: list[str] = []

    @staticmethod
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def up(self) -> None:
        existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for name in self.names:
            if name in existing.split():
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                      text=True).stdout.split()
                if pids:
                    raise RuntimeError(f"netns {name} exists and has processes {pids}")
                self.ip("netns", "del", name)  # left over by an earlier run of this script
        for name in self.names:
            self.ip("netns", "add", name)
            self.made.append(name)
            self.ip("-n", name, "link", "set", "lo", "up")
        for k in range(1, self.n + 1):
            w, d = f"awa-v{k}w", f"awa-v{k}d"
            self.ip("link", "add", w, "type", "veth", "peer", "name", d)
            self.ip("link", "set", w, "netns", f"awa-w{k}")
            self.ip("link", "set", d, "netns", "awa-db")
            self.ip("-n", f"awa-w{k}", "addr", "add", f"{NET}.{k}.2/30", "dev", w)
            self.ip("-n", "awa-db", "addr", "add", f"{NET}.{k}.1/30", "dev", d)
            self.ip("-n", f"awa-w{k}", "link", "set", w, "up")
            self.ip("-n", "awa-db", "link", "set", d, "up")
        self.socat = subprocess.Popen(
            ["ip", "netns", "exec", "awa-db", "socat",
             "TCP-LISTEN:5432,fork,reuseaddr,backlog=512", f"UNIX-CONNECT:{PG_SOCKET}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until the forwarder listens
            probe = subprocess.run(
                ["ip", "netns", "exec", "awa-w1", sys.executable, "-c",
                 f"import socket; socket.create_connection(('{NET}.1.1', 5432), 1).close()"],
                capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("socat in awa-db does not accept connections")

    def url(self, k: int, admin_url: str, db: str) -> str:
        import urllib.parse as up

        u = up.urlsplit(admin_url)
        user = u.username or "postgres"
        pw = f":{u.password}" if u.password else ""
        return up.urlunsplit((u.scheme, f"{user}{pw}@{NET}.{k}.1:5432", "/" + db, "", ""))

    def prefix(self, k: int) -> list[str]:
        return ["ip", "netns", "exec", f"awa-w{k}"]

    def forwarder_cpu(self) -> float | None:
        """CPU seconds of socat and its exited (reaped) children."""
        if self.socat is None:
            return None
        try:
            s = Path(f"/proc/{self.socat.pid}/stat").read_text()
        except OSError:
            return None
        f = s[s.rfind(")") + 2:].split()
        return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")

    def down(self) -> None:
        if self.socat is not None and self.socat.poll() is None:
            self.socat.terminate()  # our own child, by its handle
            try:
                self.socat.wait(5)
            except subprocess.TimeoutExpired:
                self.socat.kill()
                self.socat.wait()
        for name in reversed(self.made):
            out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in out.stdout.split():  # socat children still forwarding: ours
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGTERM)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.made.clear()


class CpuCap:
    """Each worker process in a cgroup of its own, capped at ``cpus`` CPUs (cgroup v2
    ``cpu.max``, else v1 ``cpu.cfs_quota_us``): the worker, not the machine, is the
    bottleneck, as on worker hosts of their own. PostgreSQL is not capped."""

    PERIOD_US = 10_000

    def __init__(self, cpus: float, n: int) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "cpu" in v2.read_text().split():
            self.root, self.v2 = Path("/sys/fs/cgroup"), True
        elif Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
            self.root, self.v2 = Path("/sys/fs/cgroup/cpu"), False
        else:
            raise RuntimeError("no cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us)")
        self.cpus = cpus
        self.dirs = [self.root / f"awa-bench-w{k}" for k in range(1, n + 1)]
        quota = max(1000, int(cpus * self.PERIOD_US))
        for d in self.dirs:
            d.mkdir(exist_ok=True)
            if self.v2:
                (d / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
            else:
                (d / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(quota))

    def prefix(self, k: int) -> list[str]:
        """Run a command inside worker k's cgroup (the shell joins it, then execs)."""
        procs = self.dirs[k - 1] / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def throttled(self) -> tuple[int, int]:
        """(periods, periods throttled) summed over the workers' cgroups."""
        stats = [dict(ln.split()[:2] for ln in (d / "cpu.stat").read_text().splitlines())
                 for d in self.dirs]
        return (sum(int(st.get("nr_periods", 0)) for st in stats),
                sum(int(st.get("nr_throttled", 0)) for st in stats))

    def down(self) -> None:
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()  # empty once its processes have exited


# ===========================================================================
# orchestrator (bench/.venvs/_runner)

ORDER_LOG = """
CREATE TABLE bench_order_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL, key text NOT NULL, seq int NOT NULL, pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())
"""


def drain(tools, drv, sdrv, admin, postmaster, n: int, count: int, net, order=None,
          cap: CpuCap | None = None) -> dict:
    import psycopg

    bench = tools.bench
    bench.fresh_db(drv, admin, DB)
    drv.call("insert-bulk", "--n", str(n), timeout=max(300, n / 20))
    extra = 0
    if order:
        with psycopg.connect(drv.url, autocommit=True) as c:
            c.execute(ORDER_LOG)
        extra = sdrv.call("insert-ordered", "--keys", str(order["keys"]), "--per-key",
                          str(order["per_key"]), timeout=600)["n"]
    admin.analyze(DB)
    procs = []
    for k in range(1, count + 1):
        if net:
            cmd = net.prefix(k) + sdrv.cmd("worker", "--concurrency", str(CONCURRENCY),
                                           url=net.url(k, admin.url, DB))
        else:
            cmd = sdrv.cmd("worker", "--concurrency", str(CONCURRENCY))
        if cap is not None:
            cmd = cap.prefix(k) + cmd
        procs.append(bench.Proc(sdrv, cmd))
    fwd0 = net.forwarder_cpu() if net else None
    thr0 = cap.throttled() if cap else None
    try:
        out = bench.run_workers(sdrv, procs, admin, DB, postmaster, n + extra,
                                timeout=max(180, (n + extra) / 50))
    finally:
        for p in procs:
            p.kill()
    out.pop("results", None)
    out["processes"] = count
    out["network"] = "netns + socat" if net else "127.0.0.1"
    if cap is not None and thr0 is not None:
        thr = cap.throttled()
        out["cpu_cap"] = cap.cpus
        out["throttled_share"] = (thr[1] - thr0[1]) / max(1, thr[0] - thr0[0])
    if net:
        fwd = net.forwarder_cpu()
        out["forwarder_cpu_per_1k"] = (fwd - fwd0) / (n + extra) * 1000 \
            if fwd is not None and fwd0 is not None else None
    out["verify"] = bench.verify(drv, admin, DB, completed=n, handled=out["handled"] - extra)
    if order:
        out["order"] = check_order(drv.url, order, extra)
    return out


def check_order(url: str, order: dict, inserted: int) -> dict:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute("SELECT queue, key, array_agg(seq ORDER BY id), count(DISTINCT pid) "
                         "FROM bench_order_log GROUP BY 1, 2").fetchall()
        left = c.execute("SELECT count(*) FROM awa.jobs WHERE kind = 'order_job'").fetchone()[0]
        done = c.execute("SELECT count(*) FROM awa.jobs_done "
                         "WHERE kind = 'order_job' AND state = 'completed'").fetchone()[0]
        span = c.execute("SELECT extract(epoch FROM max(at) - min(at)) "
                         "FROM bench_order_log").fetchone()[0]
    want = list(range(order["per_key"]))
    out: dict = {"inserted": inserted, "completed": done, "left": left,
                 "seconds": float(span or 0)}
    keys_per_group: dict[str, dict[str, int]] = {}
    for queue, key, seqs, pids in rows:
        g = "ordering_key" if queue == KEYED else "PartitionedQueue"
        st = out.setdefault(g, {"keys": 0, "jobs": 0, "in_order": 0, "out_of_order": 0,
                                "duplicates": 0, "missing": 0, "multi_process_keys": 0})
        keys_per_group.setdefault(g, {})
        keys_per_group[g][key] = keys_per_group[g].get(key, 0) + 1
        st["jobs"] += len(seqs)
        st["duplicates"] += len(seqs) - len(set(seqs))
        st["missing"] += len(set(want) - set(seqs))
        st["multi_process_keys"] += pids > 1
        if all(a < b for a, b in itertools.pairwise(seqs)):
            st["in_order"] += 1
        else:
            st["out_of_order"] += 1
    for g, keys in keys_per_group.items():
        out[g]["keys"] = len(keys)
        out[g]["keys_in_two_partitions"] = sum(1 for v in keys.values() if v > 1)
    ok = bool(rows) and left == 0 and done == inserted
    for g in ("ordering_key", "PartitionedQueue"):
        st = out.get(g)
        ok = ok and st is not None and st["keys"] == order["keys"] and not (
            st["out_of_order"] or st["duplicates"] or st["missing"]
            or st.get("keys_in_two_partitions"))
    out["ok"] = ok
    return out


def free_connections(admin) -> int:
    return admin.one(
        "SELECT current_setting('max_connections')::int "
        "- current_setting('superuser_reserved_connections')::int - count(*) "
        "FROM pg_stat_activity")


def markdown(rep: dict, fmt) -> str:
    L = [f"# Awa scale-out — {rep['started']}", "", rep["env_line"], "",
         f"{rep['jobs']:,} no-op jobs in one queue; each worker process serves it at "
         f"concurrency {CONCURRENCY} with a {rep['pool']}-connection pool (plus the "
         f"runtime's own: 3 for claims, up to 6 for maintenance, 1 LISTEN). "
         f"Network: {rep['network']}.", ""]
    if rep.get("cpu_cap"):
        L += [f"**CPU cap: each worker process in its own cgroup, at most {rep['cpu_cap']} "
              f"CPU** (PostgreSQL uncapped): the worker is the bottleneck, as on worker "
              f"hosts of their own, and PostgreSQL has headroom on this 2-core machine. "
              f"Not a figure for one uncapped machine.", ""]
    L += ["| processes | network | jobs/s | × 1 process | worker CPU s/1k | "
          "Postgres CPU s/1k | forwarder CPU s/1k | verified |",
          "|---:|---|---:|---:|---:|---:|---:|---|"]
    plain = rep["network"].startswith("plain")  # no namespaces: every row counts
    base = next((r["jobs_per_s"] for r in rep["runs"]
                 if r["processes"] == 1 and (plain or r["network"] != "127.0.0.1")), None)
    for r in rep["runs"]:
        sp = r["jobs_per_s"] / base if base and (plain or r["network"] != "127.0.0.1") \
            else None
        L.append(f"| {r['processes']} | {r['network']} | {fmt(r['jobs_per_s'])} | "
                 f"{f'{sp:.2f}×' if sp else '–'} | {fmt(r.get('worker_cpu_per_1k'))} | "
                 f"{fmt(r.get('pg_cpu_per_1k'))} | {fmt(r.get('forwarder_cpu_per_1k'))} | "
                 f"{'✓' if r['verify']['ok'] and 'error' not in r else '✗'} |"
                 + (f" {r['throttled_share']:.0%} |" if "throttled_share" in r else ""))
    if rep.get("cpu_cap"):
        L[L.index("|---:|---|---:|---:|---:|---:|---:|---|") - 1] += " periods throttled |"
        L[L.index("|---:|---|---:|---:|---:|---:|---:|---|")] += "---:|"
    by: dict[int, list[float]] = {}
    for r in rep["runs"]:
        if plain or r["network"] != "127.0.0.1":
            by.setdefault(r["processes"], []).append(r["jobs_per_s"])
    if any(len(v) > 1 for v in by.values()) and 1 in by:
        import statistics as st
        one = st.median(by[1])
        L += ["", "Median of the repeats: " + ", ".join(
            f"{k} process{'es' if k > 1 else ''} {fmt(st.median(v))} jobs/s "
            f"({st.median(v) / one:.2f}×)" for k, v in sorted(by.items())) + "."]
    o = rep.get("order")
    if o:
        oc = o["order"]
        L += ["", f"Order check with {o['processes']} processes: {o['jobs']:,} no-op jobs plus "
              f"{rep['keys']} keys × {rep['per_key']} jobs on an `ordering_key` queue and as "
              f"many on `PartitionedQueue('{LOGICAL}', {rep['partitions']})`, all at once "
              f"({fmt(o['jobs_per_s'])} jobs/s overall; the ordered jobs took "
              f"{oc['seconds']:.1f}s). Result: **{'in order' if oc['ok'] else 'VIOLATED'}**.",
              "", "| | keys | jobs | in order | out of order | duplicates | missing | "
              "keys in 2 partitions | keys run by >1 process |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for g in ("ordering_key", "PartitionedQueue"):
            s = oc.get(g) or {}
            L.append(f"| {g} | {s.get('keys', 0)} | {s.get('jobs', 0)} | "
                     f"{s.get('in_order', 0)} | {s.get('out_of_order', 0)} | "
                     f"{s.get('duplicates', 0)} | {s.get('missing', 0)} | "
                     f"{s.get('keys_in_two_partitions', '–')} | "
                     f"{s.get('multi_process_keys', 0)} |")
    L += [""] + [f"- {n}" for n in rep["notes"]] + [""]
    return "\n".join(L)


def main() -> None:
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        return role_main(sys.argv[1:])
    sys.path.insert(0, str(HERE))
    import benchtools as tools

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    p.add_argument("--procs", default="1,2,4,8", help="process counts (1,2,4,8)")
    p.add_argument("--pool", type=int, default=0,
                   help="awa pool size per process (default: fit the server's free connections)")
    p.add_argument("--keys", type=int, default=32, help="order check: keys (32)")
    p.add_argument("--per-key", type=int, default=25, help="order check: jobs per key (25)")
    p.add_argument("--partitions", type=int, default=4, help="order check: partitions (4)")
    p.add_argument("--no-netns", action="store_true", help="plain processes on 127.0.0.1")
    p.add_argument("--no-direct", action="store_true", help="skip the 127.0.0.1 reference row")
    p.add_argument("--no-order", action="store_true", help="skip the order check")
    p.add_argument("--cpu-cap", type=float, default=0.0,
                   help="cap each worker process at this many CPUs (cgroup; needs root)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the process counts this many times, interleaved (1)")
    tools.add_common_args(p)
    args = p.parse_args()
    counts = [int(x) for x in args.procs.split(",") if x.strip()]
    tools.bootstrap(__file__)
    import copy

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    logs = tools.logdir("scale")
    admin = tools.admin_for(args, [DB])
    env = tools.environment(admin)
    print(tools.env_line(env), flush=True)
    drv = tools.awa_driver(args, DB, logs)
    sdrv = copy.copy(drv)
    sdrv.path = str(Path(__file__).resolve())
    postmaster = admin.postmaster_pid()
    notes: list[str] = []
    top = max(counts)
    free = free_connections(admin)
    pool = args.pool or max(2, min(10, (free - 12) // top - 4 - 2))  # claim pool 3, LISTEN 1
    os.environ["BENCH_SCALE_POOL"] = str(pool)
    os.environ["BENCH_SCALE_PARTITIONS"] = str(args.partitions)
    notes.append(f"{free} free connections on the server at the start; pool per process {pool}")

    net = None
    why = None
    if args.no_netns:
        why = "--no-netns"
    elif os.geteuid() != 0 or not shutil.which("ip"):
        why = "needs root and iproute2 (ip netns)"
    elif not shutil.which("socat"):
        why = "socat is not installed (apt-get install socat)"
    if why is None:
        net = Net(top)

        def on_term(*_):
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, on_term)
        try:
            net.up()
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            why = f"could not create network namespaces: {detail.strip()}"
            net.down()
            net = None
    if net is None:
        notes.append(f"FALLBACK: plain processes on 127.0.0.1, no network namespaces ({why})")
        print(f"[net] FALLBACK to plain processes: {why}", flush=True)
    else:
        notes.append(f"worker k runs in netns awa-wk and connects to {NET}.k.1:5432 over a "
                     "veth pair; socat in netns awa-db forwards to PostgreSQL's Unix socket")
        print(f"[net] namespaces {', '.join(net.names)} up, socat pid {net.socat.pid}",
              flush=True)
    runs = []
    order_run = None
    cap = None
    if args.cpu_cap:
        cap = CpuCap(args.cpu_cap, top)
        notes.append(f"CPU cap {args.cpu_cap} CPU per worker process: "
                     f"{'cgroup v2 cpu.max' if cap.v2 else 'cgroup v1 cpu.cfs_quota_us'}, "
                     f"period {CpuCap.PERIOD_US // 1000} ms")
    try:
        plan = [] if args.no_direct or net is None else [(1, None)]
        plan += [(c, net) for _ in range(args.repeat) for c in counts]
        for count, n_ in plan:
            label = "127.0.0.1" if n_ is None else "netns"
            print(f"[run] {count} process(es), {label:9} ", end="", flush=True)
            r = drain(tools, drv, sdrv, admin, postmaster, args.jobs, count, n_, cap=cap)
            runs.append(r)
            print(f"{r['jobs_per_s']:8,.0f} jobs/s  "
                  f"{'verified' if r['verify']['ok'] else 'NOT VERIFIED ' + str(r['verify'])}"
                  + (f"  throttled {r['throttled_share']:.0%}" if cap else ""), flush=True)
        if not args.no_order:
            os.environ["BENCH_SCALE_ORDERED"] = "1"
            order = {"keys": args.keys, "per_key": args.per_key}
            print(f"[order] {top} process(es), {args.jobs:,} jobs + 2 × {args.keys} keys × "
                  f"{args.per_key} ordered ", end="", flush=True)
            order_run = drain(tools, drv, sdrv, admin, postmaster, args.jobs, top, net, order)
            order_run["jobs"] = args.jobs
            oc = order_run["order"]
            print(f"{'in order' if oc['ok'] else 'VIOLATED'}: "
                  f"{json.dumps({k: oc.get(k) for k in ('ordering_key', 'PartitionedQueue')})}",
                  flush=True)
    finally:
        if cap is not None:
            cap.down()
        if net is not None:
            net.down()
            left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                                  text=True).stdout
            print("[net] namespaces removed" if not any(
                n in left.split() for n in net.names) else f"[net] LEFT OVER: {left}")
        if not args.keep_db:
            for db in (DB, DB + "_tpl"):
                admin.drop(db)
    rep = {"started": started, "environment": env, "env_line": tools.env_line(env),
           "cpu_cap": args.cpu_cap or None,
           "jobs": args.jobs, "pool": pool, "keys": args.keys, "per_key": args.per_key,
           "partitions": args.partitions,
           "network": "network namespaces + socat" if net else "plain processes, 127.0.0.1",
           "runs": runs, "order": order_run, "notes": notes}
    md = markdown(rep, tools.fmt)
    name = "scale_out_capped" if args.cpu_cap else "scale_out"
    tools.write_report(name, rep, md)
    print(f"wrote {tools.RESULTS / name}.md and {name}.json (logs: {logs})")


if __name__ == "__main__":
    main()
