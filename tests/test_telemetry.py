"""Telemetry: OTel counters and histograms from real jobs, W3C trace context
from enqueue into handlers, the Prometheus text, and life without OTel."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, ROOT, TO_MUTABLE, wait_until

import awa
from awa.enqueue import bridge
from awa.maintenance.services import QueueGauges, Rescuer
from awa.telemetry import otel as telemetry

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode, Tracer

KEY = "awa:traceparent"


@dataclass
class Otel:
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    tracer: Tracer

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """Data points of metric ``name`` by attribute set."""
        data = self.reader.get_metrics_data()
        out: dict[frozenset[tuple[str, Any]], Any] = {}
        for rm in data.resource_metrics if data is not None else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for p in metric.data.data_points:
                            out[frozenset((p.attributes or {}).items())] = p
        return out

    def value(self, name: str, **attrs: str) -> Any:
        """The counter value (or histogram count) for attributes ``attrs`` (0 when absent)."""
        want = frozenset(a for a in _attrs(**attrs).items())
        total = 0
        for key, p in self.points(name).items():
            if want <= key:
                total += p.count if hasattr(p, "count") else p.value
        return total

    def span(self, name: str) -> ReadableSpan | None:
        return next((s for s in self.spans.get_finished_spans() if s.name == name), None)


def _attrs(**attrs: str) -> dict[str, str]:
    return {f"awa.job.{k}": v for k, v in attrs.items()}


@pytest.fixture
def otel() -> Iterator[Otel]:
    """Awa instrumented with private SDK providers (the global ones are never set)."""
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    meters = MeterProvider(metric_readers=[reader])
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    awa.init_telemetry(meter_provider=meters, tracer_provider=tracers)
    try:
        yield Otel(reader, exporter, tracers.get_tracer("tests"))
    finally:
        awa.shutdown_telemetry()
        meters.shutdown()
        tracers.shutdown()


@dataclass
class Step:
    mode: str


async def test_job_counters_and_histograms(client: awa.AsyncClient, otel: Otel) -> None:
    @client.task(Step, queue="tele")
    async def handle(job: awa.Job) -> object:
        mode = job.args.mode
        if mode == "retry":
            return awa.RetryAfter(0.05) if job.attempt == 1 else None
        if mode == "cancel":
            return awa.Cancel("no")
        if mode == "terminal":
            raise awa.TerminalError("bad")
        return None

    for mode in ("ok", "retry", "cancel", "terminal"):
        await client.insert(Step(mode), queue="tele")
    await client.insert_many_copy([Step("ok")], queue="tele")
    await client.enqueue_many_copy([Step("ok")], queue="tele")
    step = {"kind": "step", "queue": "tele"}
    assert otel.value("awa.job.inserted", **step) == 6
    await client.start([("tele", 4)], **FAST)

    async def settled() -> bool:
        return bool(otel.value("awa.job.completed", **step) == 4
                    and otel.value("awa.job.failed", **step) == 1
                    and otel.value("awa.job.cancelled", **step) == 1
                    and otel.value("awa.job.in_flight", **step) == 0)
    await wait_until(settled, message="outcome counters")
    assert otel.value("awa.job.retried", **step) == 1
    assert otel.value("awa.job.claimed", **step) == 7  # the retried job is claimed twice
    assert otel.value("awa.job.wait_duration", **step) == 7
    assert otel.value("awa.job.duration", **step) == 7
    assert otel.value("awa.job.duration", outcome="failed", **step) == 1
    durations = otel.points("awa.job.duration")
    assert all(p.sum >= 0 for p in durations.values())
    assert frozenset({**_attrs(**step), "awa.job.outcome": "completed"}.items()) in durations
    assert otel.value("awa.dispatch.claim_duration", queue="tele") >= 1
    assert otel.value("awa.job.dlq_moved") == 0
    # Attributes stay bounded: never a job id or args.
    for name in ("awa.job.claimed", "awa.job.duration", "awa.job.inserted"):
        for key in otel.points(name):
            assert {k for k, _ in key} <= {"awa.job.kind", "awa.job.queue", "awa.job.outcome"}
    # The worker's Prometheus text carries the same outcome counters.
    assert client.runtime is not None
    text = client.runtime.metrics_text()
    for line in ('awa_job_failed_total{queue="tele"} 1', 'awa_job_retried_total{queue="tele"} 1',
                 'awa_job_cancelled_total{queue="tele"} 1', "# TYPE awa_job_failed_total counter"):
        assert line in text


async def test_dlq_and_rescue_counters(client: awa.AsyncClient, otel: Otel,
                                       conn: asyncpg.Connection) -> None:
    @client.task(Step, queue="dq")
    async def handle(job: awa.Job) -> None:
        raise awa.TerminalError("dead")

    await client.insert(Step("x"), queue="dq")
    await client.start([{"name": "dq", "max_workers": 1, "dlq_enabled": True}], **FAST)

    async def moved() -> bool:
        return bool(otel.value("awa.job.dlq_moved", kind="step", queue="dq") == 1)
    await wait_until(moved, message="dlq_moved")
    assert otel.value("awa.job.failed", kind="step", queue="dq") == 1
    await client.shutdown()

    # A stale attempt on its last try, on a DLQ-enabled queue: rescued into the DLQ.
    stale = await client.insert({"n": 1}, kind="stale_kind", queue="dq", max_attempts=1)
    await conn.execute(TO_MUTABLE, stale.id)
    await conn.execute("UPDATE awa.jobs SET state = 'running', attempt = 1, run_lease = 1, "
                       "attempted_at = now(), heartbeat_at = now() - interval '1 hour' "
                       "WHERE id = $1", stale.id)
    rescuer = Rescuer(await client.pool(), client._q, timedelta(seconds=1), lambda: True,
                      staleness=timedelta(seconds=90), failed_retention=timedelta(days=1))
    await rescuer.run_once()
    assert otel.value("awa.maintenance.rescues", kind="stale_kind", queue="dq") == 1
    assert otel.value("awa.job.dlq_moved", kind="stale_kind", queue="dq") == 1


async def test_rescue_of_a_ring_attempt_is_counted(client: awa.AsyncClient, otel: Otel,
                                                   conn: asyncpg.Connection) -> None:
    """A silent ring attempt is rescued through the ring's path (ring_rescue moves it
    to awa.jobs, where job_rescue_running retries it), and counted as any rescue."""
    await conn.execute(client._q["ring_enqueue_set"], True)
    job = await client.insert({"n": 1}, kind="ring_kind", queue="rq")
    claimed = await conn.fetch(client._q["attempt_claim"], "rq", 1, 0.0, 0.0)
    assert [(r["id"], r["receipt_slot"] is not None) for r in claimed] == [(job.id, True)]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", job.id) == 0
    await asyncio.sleep(0.05)  # silent for longer than the staleness below
    rescuer = Rescuer(await client.pool(), client._q, timedelta(seconds=1), lambda: True,
                      staleness=timedelta(milliseconds=20), failed_retention=timedelta(days=1))
    await rescuer.run_once()
    assert rescuer.rescued == 1
    assert otel.value("awa.maintenance.rescues", kind="ring_kind", queue="rq") == 1
    assert (await client.get_job(job.id)).state is awa.JobState.Retryable


async def test_queue_depth_and_lag_gauges(client: awa.AsyncClient, otel: Otel) -> None:
    old = datetime.now(UTC) - timedelta(seconds=30)
    for _ in range(3):
        await client.insert({"n": 1}, kind="idle_kind", queue="idle")
    first = await client.insert({"n": 0}, kind="idle_kind", queue="idle")
    later = await client.insert({"n": 2}, kind="idle_kind", queue="idle",
                                run_at=datetime.now(UTC) + timedelta(hours=1))
    pool = await client.pool()
    # Ring jobs (unless AWA_TEST_RING=0) move to awa.jobs first; a no-op otherwise.
    await pool.execute("SELECT count(*) FROM awa.ring_to_mutable(ARRAY("
                       "SELECT id FROM awa.jobs_active WHERE queue = 'idle'))")
    await pool.execute("UPDATE awa.jobs SET run_at = $2 WHERE id = $1", first.id, old)
    assert otel.points("awa.queue.depth") == {}  # nothing until the leader has looked
    gauges = QueueGauges(pool, client._q, lambda: True)
    await gauges.run_once()
    depth = {dict(k)["awa.job.state"]: p.value for k, p in otel.points("awa.queue.depth").items()
             if dict(k)["awa.job.queue"] == "idle"}
    assert depth == {"available": 4, "scheduled": 1}
    (lag,) = [p.value for k, p in otel.points("awa.queue.lag").items()
              if dict(k)["awa.job.queue"] == "idle"]
    assert 29 <= lag < 120
    # Emptied pairs report 0 rather than vanishing.
    for job_id in (first.id, later.id):
        await client.cancel(job_id)
    await pool.execute("DELETE FROM awa.jobs WHERE queue = 'idle'")
    await gauges.run_once()
    depth = {dict(k)["awa.job.state"]: p.value for k, p in otel.points("awa.queue.depth").items()
             if dict(k)["awa.job.queue"] == "idle"}
    assert depth == {"available": 0, "scheduled": 0}


@dataclass
class Traced:
    n: int


@dataclass
class TracedSync:
    n: int


@dataclass
class TracedFail:
    n: int


async def test_trace_context_reaches_async_and_sync_handlers(client: awa.AsyncClient,
                                                             otel: Otel) -> None:
    @client.task(Traced, queue="tr")
    async def async_handler(job: awa.Job) -> None:
        await asyncio.sleep(0)
        with otel.tracer.start_as_current_span("inside traced"):
            pass

    @client.task(TracedSync, queue="tr")
    def sync_handler(job: awa.Job) -> None:
        with otel.tracer.start_as_current_span("inside traced_sync"):
            pass

    @client.task(TracedFail, queue="tr")
    async def failing(job: awa.Job) -> None:
        raise ValueError("kaput")

    with otel.tracer.start_as_current_span("producer") as producer:
        jobs = [await client.insert(Traced(1), queue="tr"),
                await client.insert(TracedSync(1), queue="tr"),
                await client.insert(TracedFail(1), queue="tr", max_attempts=1)]
    pc = producer.get_span_context()
    expected = f"00-{pc.trace_id:032x}-{pc.span_id:016x}-{int(pc.trace_flags):02x}"
    assert all(j.metadata[KEY] == expected and j.traceparent == expected for j in jobs)
    await client.start([("tr", 3)], **FAST)

    async def finished() -> bool:
        return all(otel.span(f"awa.job.run {k}") is not None
                   for k in ("traced", "traced_sync", "traced_fail"))
    await wait_until(finished, message="consumer spans")
    for kind in ("traced", "traced_sync"):
        consumer, inner = otel.span(f"awa.job.run {kind}"), otel.span(f"inside {kind}")
        assert consumer is not None and inner is not None
        assert consumer.kind is SpanKind.CONSUMER
        assert consumer.parent is not None and consumer.parent.span_id == pc.span_id
        assert consumer.context.trace_id == pc.trace_id == inner.context.trace_id
        assert inner.parent is not None and inner.parent.span_id == consumer.context.span_id
        assert consumer.attributes is not None
        assert consumer.attributes["awa.job.kind"] == kind
        assert consumer.attributes["awa.job.outcome"] == "completed"
        assert consumer.status.status_code is StatusCode.UNSET
    failed = otel.span("awa.job.run traced_fail")
    assert failed is not None and failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["awa.job.outcome"] == "failed"
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.context.trace_id == pc.trace_id


async def test_traceparent_on_every_insert_path(client: awa.AsyncClient,
                                                sync_client: awa.Client, otel: Otel,
                                                database_url: str) -> None:
    custom = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with otel.tracer.start_as_current_span("producer") as producer:
        pc = producer.get_span_context()
        expected = f"00-{pc.trace_id:032x}-{pc.span_id:016x}-{int(pc.trace_flags):02x}"
        ids = [(await client.insert({"n": 1}, kind="k")).id]
        ids += [j.id for j in await client.insert_many_copy(
            [{"n": 2}, {"n": 3}], kind="k", opts=[None, {"priority": 1}])]
        assert await client.enqueue_many_copy([{"n": 4}], kind="k") == 1
        async with client.transaction() as tx:
            ids.append((await tx.insert({"n": 5}, kind="k")).id)
        ids.append(sync_client.insert({"n": 6}, kind="k").id)
        raw = await asyncpg.connect(database_url)
        try:
            ids.append((await bridge.insert_job(raw, {"n": 7}, kind="k"))["id"])
        finally:
            await raw.close()
        # A caller's own value is never overwritten, on single and bulk paths.
        own = [(await client.insert({"n": 8}, kind="k", metadata={KEY: custom})).id]
        own += [j.id for j in await client.insert_many_copy(
            [{"n": 9}, {"n": 10}], kind="k", metadata={KEY: custom, "x": 1},
            opts=[None, {"metadata": {KEY: custom}}])]
    jobs = await client.list_jobs(kind="k", limit=100)
    by_id = {j.id: j for j in jobs}
    copied = [j for j in jobs if j.args == {"n": 4}]
    assert len(copied) == 1 and copied[0].metadata[KEY] == expected
    assert [by_id[i].metadata.get(KEY) for i in ids] == [expected] * len(ids)
    assert [by_id[i].metadata.get(KEY) for i in own] == [custom] * 3
    assert by_id[own[1]].metadata["x"] == 1


async def test_no_span_no_traceparent(client: awa.AsyncClient) -> None:
    # Telemetry off and no span current: nothing is added, and running is untouched.
    job = await client.insert({"n": 1}, kind="plain")
    assert KEY not in job.metadata and job.traceparent is None
    many = await client.insert_many_copy([{"n": 2}], kind="plain", metadata={"m": 1})
    assert many[0].metadata == {"m": 1}
    assert telemetry.job_run(job) is telemetry._NO_RUN
    # A span of any provider is captured even without init_telemetry.
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("outside"):
        traced = await client.insert({"n": 3}, kind="plain")
    assert traced.traceparent is not None


def test_prometheus_label_escaping() -> None:
    assert telemetry.prometheus_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert telemetry.prometheus_label("plain") == "plain"


async def test_init_telemetry_builds_providers(client: awa.AsyncClient) -> None:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    awa.init_telemetry(service_name="billing", metric_readers=[reader],
                       span_exporters=[exporter], set_global=False)
    try:
        @client.task(Traced, queue="own")
        async def handle(job: awa.Job) -> None:
            return None

        await client.insert(Traced(1), queue="own")
        await client.start([("own", 1)], **FAST)
        otel = Otel(reader, exporter, TracerProvider().get_tracer("unused"))

        async def completed() -> bool:
            return bool(otel.value("awa.job.completed", kind="traced", queue="own") == 1)
        await wait_until(completed, message="completed counter")
        await client.shutdown()
    finally:
        awa.shutdown_telemetry()  # flushes the batch span processor
    (span,) = exporter.get_finished_spans()
    assert span.name == "awa.job.run traced"
    assert span.resource.attributes["service.name"] == "billing"
    if importlib.util.find_spec("opentelemetry.exporter") is None:
        # As awa-pg: without the exporter package an endpoint warns, exports nowhere.
        with pytest.warns(RuntimeWarning, match="opentelemetry-exporter-otlp-proto-http"):
            assert awa.init_telemetry(endpoint="http://127.0.0.1:4318", set_global=False)
        assert awa.init_telemetry(endpoint="http://127.0.0.1:4318", set_global=False) is False
        awa.shutdown_telemetry()


def test_awa_works_without_opentelemetry(database_url: str) -> None:
    """With OpenTelemetry unimportable, jobs run and init_telemetry says what to install."""
    script = textwrap.dedent("""
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # any import of it now fails
        import awa

        async def main(url):
            async with awa.AsyncClient(url) as client:
                done = asyncio.Event()

                @client.task(kind="nootel")
                async def handle(job):
                    done.set()

                job = await client.insert({"n": 1}, kind="nootel")
                assert "awa:traceparent" not in job.metadata
                await client.start(poll_interval_ms=50)
                await asyncio.wait_for(done.wait(), 15)
            try:
                awa.init_telemetry()
            except ImportError as exc:
                print("ok:", exc)

        asyncio.run(main(sys.argv[1]))
    """)
    out = subprocess.run([sys.executable, "-c", script, database_url], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok:" in out.stdout and "awa-queue[telemetry]" in out.stdout
