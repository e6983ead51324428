"""Telemetry: OpenTelemetry metrics and traces, free when unused (docs/telemetry.md).

Awa never imports OpenTelemetry on its own. Metrics and the consumer span
turn on when `init_telemetry` is called, or when a client or worker starts in
a process whose application already set global OTel providers (`detect`).
Until then each hook below is one check of a module-level ``None``. W3C trace
context travels in ``metadata["awa:traceparent"]``: captured at enqueue when
a span is current, made ambient (under a CONSUMER span) around the handler.
Every instrument is listed in ``docs/telemetry.md``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from awa.core.outcomes import OUTCOMES

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider, Observation
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from awa.core.model import Job, Outcome

log = logging.getLogger("awa.telemetry")

TRACEPARENT_KEY = "awa:traceparent"
INSTRUMENTATION_NAME = "awa"
#: How often the maintenance leader refreshes the queue depth and lag gauges.
QUEUE_GAUGE_INTERVAL = timedelta(seconds=15)
#: Histogram buckets, seconds: from a fast no-op handler up to an hour.
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0, 900.0, 3600.0)
#: An outcome kind's ``awa.job.outcome`` attribute, from the one table (`OUTCOMES`).
OUTCOME_NAMES: dict[str, str] = {kind: o.telemetry for kind, o in OUTCOMES.items()}
_MISSING = ("awa.init_telemetry needs OpenTelemetry: pip install 'awa-queue[telemetry]' "
            "(opentelemetry-api and opentelemetry-sdk)")


#: The counters: name → description. Each is an observable counter over an
#: in-process tally, so counting costs a dict increment, not an SDK call.
COUNTERS = {
    "awa.job.inserted": "Jobs inserted.",
    "awa.job.claimed": "Attempts claimed by workers.",
    "awa.job.completed": "Attempts that completed.",
    "awa.job.failed": "Attempts that failed the job for good.",
    "awa.job.retried": "Attempts that failed and will be retried.",
    "awa.job.cancelled": "Attempts whose handler returned Cancel.",
    "awa.job.dlq_moved": "Failed jobs routed to the DLQ.",
    "awa.maintenance.rescues": "Attempts rescued (stale heartbeat, deadline, callback timeout).",
    "awa.enqueue.signalled": "Jobs enqueued with backpressure=\"signal\" (depth measured).",
    "awa.enqueue.rejected": "Jobs refused by backpressure=Reject(limit) (QueueFull).",
}
_COUNTER_OF_OUTCOME: dict[str, str] = {kind: f"awa.job.{o.telemetry}"
                                       for kind, o in OUTCOMES.items() if o.counted}
_IN_FLIGHT = "awa.job.in_flight"


class _Metrics:
    """The instruments of one `Meter`, the tallies behind the counters, cached attribute sets."""

    def __init__(self, meter: Meter) -> None:
        def seconds(name: str, description: str) -> Histogram:
            return meter.create_histogram(name, unit="s", description=description,
                                          explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)

        self._lock = threading.Lock()  # tallies grow from any thread; collection copies them
        self._tallies: dict[str, dict[tuple[str, str], int]] = {
            name: {} for name in (*COUNTERS, _IN_FLIGHT)}
        for name, description in COUNTERS.items():
            meter.create_observable_counter(name, callbacks=[self._observer(name)],
                                            unit="{job}", description=description)
        meter.create_observable_up_down_counter(
            _IN_FLIGHT, callbacks=[self._observer(_IN_FLIGHT)], unit="{job}",
            description="Handlers running now.")
        self.duration = seconds("awa.job.duration", "Handler run time.")
        self.wait = seconds("awa.job.wait_duration", "Time from due (run_at) to claim.")
        self.claim_duration = seconds("awa.dispatch.claim_duration",
                                      "Round trip of one claim query.")
        meter.create_observable_gauge("awa.queue.depth", callbacks=[_observe_depth],
                                      unit="{job}", description="Active jobs by queue and state.")
        meter.create_observable_gauge("awa.queue.lag", callbacks=[_observe_lag], unit="s",
                                      description="Age of the oldest available job.")
        self._labels: dict[tuple[str, ...], dict[str, str]] = {}

    def add(self, name: str, kind: str, queue: str, n: int = 1) -> None:
        """Add ``n`` to the tally of counter ``name`` for a kind and queue."""
        key = (kind, queue)
        with self._lock:
            tally = self._tallies[name]
            tally[key] = tally.get(key, 0) + n

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            from opentelemetry.metrics import Observation

            with self._lock:
                items = list(self._tallies[name].items())
            return [Observation(n, self.labels(kind, queue)) for (kind, queue), n in items]
        return observe

    def queue_labels(self, queue: str) -> dict[str, str]:
        """The attribute set of a queue alone (shared, like `labels`)."""
        found = self._labels.get((queue,))
        if found is None:
            found = self._labels[(queue,)] = {"awa.job.queue": queue}
        return found

    def labels(self, kind: str, queue: str, outcome: str | None = None) -> dict[str, str]:
        """The attribute set of a kind and queue (one shared dict each: no per-job allocation)."""
        key = (kind, queue) if outcome is None else (kind, queue, outcome)
        found = self._labels.get(key)
        if found is None:
            found = {"awa.job.kind": kind, "awa.job.queue": queue}
            if outcome is not None:
                found["awa.job.outcome"] = outcome
            self._labels[key] = found
        return found


_metrics: _Metrics | None = None
_tracer: Tracer | None = None
_explicit = False  # init_telemetry chose the providers; detect() leaves them alone
_owned: list[Any] = []  # providers init_telemetry built, shut down by shutdown_telemetry
_applied: tuple[Any, ...] | None = None  # the settings init_telemetry last applied


# -- hooks called by the pipeline (each a no-op while telemetry is off) -----------------

def inserted(kind: str, queue: str, n: int = 1) -> None:
    """Count ``n`` inserted jobs of one kind and queue."""
    m = _metrics
    if m is not None:
        m.add("awa.job.inserted", kind, queue, n)


def _add_jobs(name: str, jobs: Iterable[Any]) -> None:
    """Add jobs (anything with ``kind`` and ``queue``) to counter ``name``, one add per pair."""
    m = _metrics
    if m is not None:
        for (kind, queue), n in Counter((j.kind, j.queue) for j in jobs).items():
            m.add(name, kind, queue, n)


def inserted_jobs(jobs: Iterable[Any]) -> None:
    """Count inserted jobs (anything with ``kind`` and ``queue``), one add per pair."""
    _add_jobs("awa.job.inserted", jobs)


def backpressure(counter: str, jobs: Iterable[Any]) -> None:
    """Count jobs an enqueue signalled (``"signalled"``) or refused (``"rejected"``)."""
    _add_jobs(f"awa.enqueue.{counter}", jobs)


def claimed(job: Job, wait_seconds: float | None) -> None:
    """Count a claim and how long the job waited past its due time."""
    m = _metrics
    if m is not None:
        m.add("awa.job.claimed", job.kind, job.queue)
        if wait_seconds is not None:
            m.wait.record(max(wait_seconds, 0.0), m.labels(job.kind, job.queue))


def claim_round(queue: str, seconds: float) -> None:
    """Record the round trip of one claim query."""
    m = _metrics
    if m is not None:
        m.claim_duration.record(seconds, m.queue_labels(queue))


def outcome(job: Job, kind: str) -> None:
    """Count an outcome a worker wrote (or queued for the batched completion write)."""
    m = _metrics
    if m is not None:
        name = _COUNTER_OF_OUTCOME.get(kind)
        if name is not None:
            m.add(name, job.kind, job.queue)


def dead_lettered(row: Any) -> None:
    """Count a failure the statement routed to the DLQ (its row has ``dlq`` true)."""
    m = _metrics
    if m is not None and row is not None and row.get("dlq"):
        m.add("awa.job.dlq_moved", row["kind"], row["queue"])


def rescued(rows: Sequence[Any]) -> None:
    """Count rescued attempts, and those the rescue moved to the DLQ."""
    m = _metrics
    if m is not None:
        for r in rows:
            m.add("awa.maintenance.rescues", r["kind"], r["queue"])
            dead_lettered(r)


# -- trace context ---------------------------------------------------------------------

def traceparent() -> str | None:
    """The current span as a W3C ``traceparent``, or None (no OTel loaded, no valid span)."""
    if sys.modules.get("opentelemetry.trace") is None:
        return None  # no span can be current in a process that never loaded the API
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def with_traceparent(metadata: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``metadata`` plus the current ``awa:traceparent``; a caller's own value is kept."""
    if metadata is not None and TRACEPARENT_KEY in metadata:
        return metadata
    value = traceparent()
    if value is None:
        return metadata
    return {**(metadata or {}), TRACEPARENT_KEY: value}


def _parent_context(value: str | None) -> Context | None:
    """The remote context a job's traceparent names, if OTel is loaded and it parses."""
    if value is None or sys.modules.get("opentelemetry.trace") is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract({"traceparent": value})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


class _NoRun:
    """The run scope while telemetry is off: one shared instance, every call a no-op."""

    __slots__ = ()

    def __enter__(self) -> _NoRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        return None

    def error(self, exc: BaseException) -> None:
        """Note the handler's exception (recorded on the span)."""

    def done(self, result: Outcome) -> None:
        """Note the attempt's outcome (span status, duration attributes)."""


_NO_RUN = _NoRun()
NO_RUN = _NO_RUN  #: what `job_run` returns while telemetry is off (callers may skip it)


class _Run(_NoRun):
    """Around one handler run: consumer span made ambient, in-flight and duration metrics."""

    __slots__ = ("_job", "_metrics", "_outcome", "_span", "_started", "_token")

    def __init__(self, job: Job, metrics: _Metrics | None) -> None:
        self._job = job
        self._metrics = metrics
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self._outcome: Outcome | None = None
        self._started = 0.0

    def __enter__(self) -> _Run:
        job, m = self._job, self._metrics
        if m is not None:
            m.add(_IN_FLIGHT, job.kind, job.queue)
        parent = _parent_context(job.traceparent)
        tracer = _tracer
        ctx = parent
        if tracer is not None:
            from opentelemetry import trace

            self._span = tracer.start_span(
                f"awa.job.run {job.kind}", context=parent, kind=trace.SpanKind.CONSUMER,
                attributes={"awa.job.id": job.id, "awa.job.kind": job.kind,
                            "awa.job.queue": job.queue, "awa.job.attempt": job.attempt,
                            "messaging.system": "awa",
                            "messaging.destination.name": job.queue})
            ctx = trace.set_span_in_context(self._span, parent)
        if ctx is not None:
            from opentelemetry import context

            self._token = context.attach(ctx)
        self._started = time.perf_counter()
        return self

    def error(self, exc: BaseException) -> None:
        if self._span is not None:
            self._span.record_exception(exc)

    def done(self, result: Outcome) -> None:
        self._outcome = result

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        elapsed = time.perf_counter() - self._started
        if self._token is not None:
            from opentelemetry import context

            context.detach(self._token)
        result = self._outcome
        name = OUTCOME_NAMES.get(result.kind, result.kind) if result else "abandoned"
        if self._span is not None:
            self._end_span(self._span, name, result, exc)
        m, job = self._metrics, self._job
        if m is not None:
            m.add(_IN_FLIGHT, job.kind, job.queue, -1)
            m.duration.record(elapsed, m.labels(job.kind, job.queue, name))

    @staticmethod
    def _end_span(span: Span, name: str, result: Outcome | None,
                  exc: BaseException | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("awa.job.outcome", name)
        if result is None:
            span.set_status(Status(StatusCode.ERROR, f"abandoned: {type(exc).__name__}"))
        elif OUTCOMES[result.kind].failure:
            first = (result.error or name).split("\n", 1)[0]
            span.set_status(Status(StatusCode.ERROR, first))
        span.end()


def job_run(job: Job) -> _NoRun:
    """The scope to run ``job``'s handler in (the shared no-op while telemetry is off)."""
    if _metrics is None and _tracer is None and TRACEPARENT_KEY not in job.metadata:
        return _NO_RUN
    return _Run(job, _metrics)


# -- queue depth and lag (maintenance leader only, cached) ------------------------------

@dataclass(slots=True)
class _QueueSnapshot:
    at: float = float("-inf")
    depth: dict[tuple[str, str], int] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)


_queues = _QueueSnapshot()


def _fresh_queues() -> _QueueSnapshot | None:
    fresh = time.monotonic() - _queues.at < 3 * QUEUE_GAUGE_INTERVAL.total_seconds()
    return _queues if fresh else None


def _observe_depth(options: CallbackOptions) -> Iterable[Observation]:
    from opentelemetry.metrics import Observation

    snap = _fresh_queues()
    if snap is None:
        return []
    return [Observation(n, {"awa.job.queue": q, "awa.job.state": s})
            for (q, s), n in snap.depth.items()]


def _observe_lag(options: CallbackOptions) -> Iterable[Observation]:
    from opentelemetry.metrics import Observation

    snap = _fresh_queues()
    if snap is None:
        return []
    return [Observation(v, {"awa.job.queue": q}) for q, v in snap.lag.items()]


def metrics_on() -> bool:
    """Whether metrics are being recorded (the queue gauges' query is skipped if not)."""
    return _metrics is not None


def record_queue_snapshot(rows: Iterable[Mapping[str, Any]]) -> None:
    """Cache one ``queue_depth_lag`` result for the depth and lag gauges to report."""
    # Pairs seen before and now empty report 0 instead of vanishing.
    depth = dict.fromkeys(_queues.depth, 0)
    lag = dict.fromkeys(_queues.lag, 0.0)
    for r in rows:
        depth[(r["queue"], r["state"])] = int(r["depth"])
        lag.setdefault(r["queue"], 0.0)
        if r["lag_seconds"] is not None:
            lag[r["queue"]] = float(r["lag_seconds"])
    _queues.depth, _queues.lag, _queues.at = depth, lag, time.monotonic()


# -- setup ----------------------------------------------------------------------------

def _configured_globals() -> tuple[MeterProvider | None, TracerProvider | None]:
    from opentelemetry import metrics, trace

    mp = metrics.get_meter_provider()
    tp = trace.get_tracer_provider()
    # The API hands out a proxy (or a no-op) until an application sets a provider.
    unset_mp = isinstance(mp, metrics.NoOpMeterProvider) \
        or type(mp).__name__ == "_ProxyMeterProvider"
    unset_tp = isinstance(tp, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return (None if unset_mp else mp), (None if unset_tp else tp)


def _use(meter_provider: MeterProvider | None, tracer_provider: TracerProvider | None) -> None:
    global _metrics, _tracer
    from awa.core.version import __version__

    if meter_provider is not None and _metrics is None:
        _metrics = _Metrics(meter_provider.get_meter(INSTRUMENTATION_NAME, __version__))
    if tracer_provider is not None and _tracer is None:
        _tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME, __version__)


def detect() -> None:
    """Instrument with the application's global OTel providers, if it set any.

    Called when a client connects and a worker starts; a no-op after
    `init_telemetry`, and (without importing anything) when OTel is not loaded.
    """
    if _explicit or sys.modules.get("opentelemetry") is None:
        return
    try:
        _use(*_configured_globals())
    except ImportError:  # a partial or broken install: stay off
        log.debug("OpenTelemetry is loaded but not usable; telemetry stays off", exc_info=True)


def _otlp_exporters(endpoint: str | None, protocol: str | None) -> tuple[Any, Any]:
    protocol = protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(f"OTLP protocol must be 'grpc' or 'http/protobuf', not {protocol!r}")
    flavour = "grpc" if protocol == "grpc" else "http"
    base = f"opentelemetry.exporter.otlp.proto.{flavour}"
    try:
        metric_module = importlib.import_module(f"{base}.metric_exporter")
        trace_module = importlib.import_module(f"{base}.trace_exporter")
    except ImportError as exc:
        raise ImportError(f"an OTLP endpoint needs opentelemetry-exporter-otlp-proto-{flavour}"
                          ) from exc
    metric_kw: dict[str, str] = {}
    trace_kw: dict[str, str] = {}
    if endpoint is not None:  # else the exporters read OTEL_EXPORTER_OTLP_* themselves
        http = flavour == "http"
        metric_kw["endpoint"] = endpoint.rstrip("/") + "/v1/metrics" if http else endpoint
        trace_kw["endpoint"] = endpoint.rstrip("/") + "/v1/traces" if http else endpoint
    return (metric_module.OTLPMetricExporter(**metric_kw),
            trace_module.OTLPSpanExporter(**trace_kw))


def init_telemetry(endpoint: str | None = None, service_name: str = "awa",
                   export_interval_ms: int | None = None, *,
                   meter_provider: MeterProvider | None = None,
                   tracer_provider: TracerProvider | None = None,
                   metric_readers: Sequence[MetricReader] = (),
                   span_exporters: Sequence[SpanExporter] = (),
                   protocol: str | None = None, console: bool = False,
                   export_interval: float = 60.0, set_global: bool = True) -> bool:
    """Turn on Awa's metrics and traces, with SDK providers built here unless given.

    Providers you pass are used as they are (not made global, not shut down
    here). Otherwise an SDK provider is built for service ``service_name``,
    exporting to: ``metric_readers`` / ``span_exporters``; OTLP when
    ``endpoint`` (or ``$OTEL_EXPORTER_OTLP_ENDPOINT``) is set, over
    ``protocol`` ``"http/protobuf"`` (default) or ``"grpc"``, which needs
    ``opentelemetry-exporter-otlp``; the console when ``console``. A signal
    with nowhere to export gets no provider and stays off. Built providers
    become the global ones when ``set_global`` (if none was set before), so
    the application's own spans share them. Without the OTLP exporter package
    an endpoint only warns (RuntimeWarning) and exports nowhere.
    ``export_interval_ms`` (`awa-pg`'s spelling) overrides ``export_interval``.

    Returns False, changing nothing, when telemetry is already on with exactly
    these settings (and no providers, readers or exporters passed); else True.
    Requires the ``telemetry`` extra; raises ImportError without it.
    """
    global _explicit, _applied
    try:
        importlib.import_module("opentelemetry.metrics")
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    if export_interval_ms is not None:
        if isinstance(export_interval_ms, bool) or not isinstance(export_interval_ms, int) \
                or export_interval_ms < 1:
            raise ValueError("export_interval_ms must be a positive integer")
        export_interval = export_interval_ms / 1000
    plain = not (meter_provider or tracer_provider or metric_readers or span_exporters)
    key = (endpoint, service_name, protocol, console, export_interval, set_global)
    if plain and _explicit and _applied == key:
        return False
    shutdown_telemetry()
    if meter_provider is None or tracer_provider is None:
        built_mp, built_tp = _build(endpoint, service_name, metric_readers, span_exporters,
                                    protocol, console, export_interval,
                                    meters=meter_provider is None,
                                    tracers=tracer_provider is None)
        _owned.extend(p for p in (built_mp, built_tp) if p is not None)
        if set_global:
            from opentelemetry import metrics, trace

            current_mp, current_tp = _configured_globals()
            if built_mp is not None and current_mp is None:
                metrics.set_meter_provider(built_mp)
            if built_tp is not None and current_tp is None:
                trace.set_tracer_provider(built_tp)
        meter_provider = meter_provider or built_mp
        tracer_provider = tracer_provider or built_tp
    _explicit = True
    _applied = key if plain else None
    _use(meter_provider, tracer_provider)
    return True


def _build(endpoint: str | None, service_name: str, metric_readers: Sequence[MetricReader],
           span_exporters: Sequence[SpanExporter], protocol: str | None, console: bool,
           export_interval: float, *, meters: bool, tracers: bool) -> tuple[Any, Any]:
    try:
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    readers: list[Any] = list(metric_readers)
    exporters: list[Any] = list(span_exporters)
    if endpoint is not None or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            metric_exporter, span_exporter = _otlp_exporters(endpoint, protocol)
        except ImportError as exc:
            log.warning("%s; telemetry is not exported to OTLP", exc)
            warnings.warn(f"{exc}; telemetry is not exported to OTLP", RuntimeWarning,
                          stacklevel=3)
        else:
            readers.append(PeriodicExportingMetricReader(
                metric_exporter, export_interval_millis=export_interval * 1000))
            exporters.append(span_exporter)
    if console:
        readers.append(PeriodicExportingMetricReader(
            ConsoleMetricExporter(), export_interval_millis=export_interval * 1000))
        exporters.append(ConsoleSpanExporter())
    resource = Resource.create({"service.name": service_name})
    # A signal with nowhere to go gets no provider: it stays off and costs nothing.
    mp = SdkMeterProvider(resource=resource, metric_readers=readers) \
        if meters and readers else None
    tp = SdkTracerProvider(resource=resource) if tracers and exporters else None
    if tp is not None:
        for exporter in exporters:
            tp.add_span_processor(BatchSpanProcessor(exporter))
    return mp, tp


def shutdown_telemetry() -> None:
    """Turn Awa's instrumentation off; flush and shut down providers `init_telemetry` built."""
    global _metrics, _tracer, _explicit, _applied
    _metrics, _tracer, _explicit, _applied = None, None, False, None
    _queues.at, _queues.depth, _queues.lag = float("-inf"), {}, {}
    owned, _owned[:] = list(_owned), []
    for provider in owned:
        try:
            provider.shutdown()
        except Exception:
            log.warning("telemetry provider did not shut down cleanly", exc_info=True)


def prometheus_label(value: str) -> str:
    """A label value escaped for the Prometheus text format (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
