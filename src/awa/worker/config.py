"""Worker configuration: frozen, validated objects with `timedelta`, not ``*_ms``.

`start()` takes the reference SDK's keyword names (``heartbeat_interval_ms``,
...); `RuntimeConfig.from_start_kwargs` maps them onto these objects in this
one place and rejects contradictions with `ConfigError` (a `ValueError`, and
a `TypeError` too where a value has the wrong type), worded as `awa-pg` words
the settings the two share.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from awa.core import states
from awa.core.errors import ConfigError, ConfigTypeError, ValidationError
from awa.core.validate import check_name
from awa.db.queries import validate_schema

if TYPE_CHECKING:
    from awa.maintenance.cron import CronSchedule
    from awa.worker.tasks import Registry

DEFAULT_MAX_WORKERS = 10


def _ms(name: str, value: Any, *, allow_zero: bool = False) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number of milliseconds", field=name)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}", field=name)
    return timedelta(milliseconds=value)


def _hours(name: str, value: Any, unit: float = 3_600_000) -> timedelta:
    """A non-negative finite number of hours (or days, with ``unit``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative finite number", field=name)
    return timedelta(milliseconds=float(value) * unit)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(f"{name} must be an integer", field=name)
    if value < 1:
        raise ConfigError(f"{name} must be > 0", field=name)
    return value


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Token bucket: ``max_rate`` jobs per second, bursts up to ``burst``."""

    max_rate: float
    burst: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_rate) and self.max_rate > 0):
            raise ConfigError("rate_limit max_rate must be > 0.0", field="rate_limit")
        _positive_int("rate_limit burst", self.burst)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """How one process serves one queue."""

    name: str
    max_workers: int = DEFAULT_MAX_WORKERS  #: reserved mode: this queue's own slots
    min_workers: int = 0  #: weighted mode: guaranteed slots
    weight: int = 1  #: weighted mode: share of the slots above the minimums
    rate_limit: RateLimit | None = None
    priority_aging_interval: timedelta = states.PRIORITY_AGING_INTERVAL  #: 0 = off
    deadline: timedelta = states.DEADLINE  #: 0 = no hard deadline
    claim_batch_size: int = states.CLAIM_BATCH_SIZE
    dlq_enabled: bool | None = None  #: None = the runtime's default
    #: Per-key concurrency: the max_in_flight of this queue's keyed jobs that
    #: name none (written to awa.queues, so every worker enforces the same).
    key_max_in_flight: int | None = None
    #: `awa-pg` knobs accepted for compatibility: claim loops per queue (one
    #: dispatcher claims in batches here) and per-queue retention (validated;
    #: the process-wide retention applies, see docs/compatibility.md).
    claimers: int = 1
    completed_retention: timedelta | None = None
    failed_retention: timedelta | None = None

    @classmethod
    def parse(cls, spec: Any, *, weighted: bool) -> QueueConfig:
        """Build from a ``(name, max_workers)`` tuple or a config dict."""
        if isinstance(spec, tuple | list):
            if weighted:
                raise ConfigError("tuple queue config is not supported with global_max_workers;"
                                  " use dict form with min_workers/weight", field="queues")
            if len(spec) != 2 or isinstance(spec[1], bool) or not isinstance(spec[1], int):
                raise ConfigTypeError("queue config must be a (name, max_workers) tuple or a "
                                      "dict", field="queues")
            name, max_workers = spec
            return cls(name=_queue_name(name), max_workers=_positive_int("max_workers",
                                                                        max_workers))
        if not isinstance(spec, Mapping):
            raise ConfigTypeError("queue config must be a (name, max_workers) tuple or a dict, "
                                  f"got {type(spec).__name__}", field="queues")
        if "name" not in spec:
            raise ConfigError("queue config dict must have 'name' key", field="name")
        unknown = set(spec) - _DICT_KEYS
        if unknown:
            raise ConfigError(f"unknown queue config keys {sorted(unknown)}", field="queues")
        if "max_workers" in spec and "min_workers" in spec:
            raise ConfigError("use max_workers for hard-reserved mode or min_workers for "
                              "weighted mode, not both", field="min_workers")
        if weighted and "max_workers" in spec:
            raise ConfigError("weighted queue configs use min_workers, not max_workers",
                              field="max_workers")
        if not weighted and "min_workers" in spec:
            raise ConfigError("min_workers needs global_max_workers (weighted mode)",
                              field="min_workers")
        kwargs: dict[str, Any] = {"name": _queue_name(spec["name"])}
        for key in ("max_workers", "weight", "claim_batch_size", "claimers"):
            if key in spec:
                kwargs[key] = _positive_int(key, spec[key])
        if "min_workers" in spec:
            value = spec["min_workers"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError("min_workers must be an integer >= 0", field="min_workers")
            kwargs["min_workers"] = value
        if spec.get("rate_limit") is not None:
            rate = spec["rate_limit"]
            if not isinstance(rate, tuple | list) or len(rate) != 2 \
                    or not all(isinstance(v, int | float) and not isinstance(v, bool)
                               for v in rate):
                raise ConfigTypeError("rate_limit must be a (max_rate: float, burst: int) "
                                      "tuple or None", field="rate_limit")
            kwargs["rate_limit"] = RateLimit(float(rate[0]), rate[1])
        if "priority_aging_interval_ms" in spec:
            kwargs["priority_aging_interval"] = _ms(
                "priority_aging_interval_ms", spec["priority_aging_interval_ms"], allow_zero=True)
        if "deadline_duration_ms" in spec:
            kwargs["deadline"] = _ms("deadline_duration_ms", spec["deadline_duration_ms"],
                                     allow_zero=True)
        if spec.get("key_max_in_flight") is not None:
            limit = _positive_int("key_max_in_flight", spec["key_max_in_flight"])
            if limit > states.MAX_IN_FLIGHT_MAX:
                raise ConfigError(f"key_max_in_flight must be <= {states.MAX_IN_FLIGHT_MAX}",
                                  field="key_max_in_flight")
            kwargs["key_max_in_flight"] = limit
        if "dlq_enabled" in spec:
            kwargs["dlq_enabled"] = bool(spec["dlq_enabled"])
        if spec.get("retention") is not None:
            kwargs.update(_queue_retention(spec["retention"]))
        return cls(**kwargs)


_DICT_KEYS = frozenset({"name", "max_workers", "min_workers", "weight", "rate_limit",
                        "priority_aging_interval_ms", "deadline_duration_ms",
                        "claim_batch_size", "dlq_enabled", "claimers", "retention",
                        "key_max_in_flight"})


def _queue_retention(spec: Any) -> dict[str, timedelta]:
    """A queue dict's ``retention``: ``{"completed_hours": h, "failed_hours": h}``."""
    if not isinstance(spec, Mapping):
        raise ConfigTypeError("retention must be a dict with completed_hours / failed_hours",
                              field="retention")
    unknown = set(spec) - {"completed_hours", "failed_hours"}
    if unknown:
        raise ConfigError(f"unknown retention keys {sorted(unknown)}", field="retention")
    out = {}
    for key, field_name in (("completed_hours", "completed_retention"),
                            ("failed_hours", "failed_retention")):
        if spec.get(key) is not None:
            out[field_name] = _hours(f"retention {key}", spec[key])
    return out


def _queue_name(name: Any) -> str:
    try:
        return check_name("queue", name)
    except ValidationError as exc:
        raise ConfigError(str(exc), field="name") from exc


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything a worker process needs to know; shared defaults come from `awa.core.states`."""

    queues: tuple[QueueConfig, ...] = ()
    global_max_workers: int | None = None  #: set → weighted mode
    poll_interval: timedelta = timedelta(milliseconds=200)
    heartbeat_interval: timedelta = states.HEARTBEAT_INTERVAL
    heartbeat_staleness: timedelta = states.HEARTBEAT_STALENESS
    heartbeat_rescue_interval: timedelta = states.RESCUE_INTERVAL
    deadline_rescue_interval: timedelta = states.RESCUE_INTERVAL
    callback_rescue_interval: timedelta = states.RESCUE_INTERVAL
    promote_interval: timedelta = timedelta(milliseconds=250)
    leader_election_interval: timedelta = timedelta(seconds=5)
    cleanup_interval: timedelta = timedelta(seconds=60)
    completed_retention: timedelta = states.COMPLETED_RETENTION
    failed_retention: timedelta = states.FAILED_RETENTION
    cleanup_batch_size: int = 1000
    dlq_enabled_by_default: bool = False
    dlq_retention: timedelta = states.DLQ_RETENTION
    cron_interval: timedelta = timedelta(seconds=1)
    batch_interval: timedelta = timedelta(seconds=1)  #: how often the leader looks for batch ops
    batch_chunk_size: int = 500  #: jobs per batch-operation transaction
    listen: bool = True  #: use LISTEN/NOTIFY for wake-ups (polling always runs too)
    health_addr: str | None = None  #: "host:port" of the health listener (None: off)

    @property
    def weighted(self) -> bool:
        return self.global_max_workers is not None

    def dlq_enabled(self, queue: QueueConfig) -> bool:
        """Whether failures on ``queue`` go to the dead letter queue."""
        return self.dlq_enabled_by_default if queue.dlq_enabled is None else queue.dlq_enabled

    def queue(self, name: str) -> QueueConfig:
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(name)

    @classmethod
    def from_start_kwargs(cls, queues: Iterable[Any] | None, default_queues: Iterable[str],
                          **kwargs: Any) -> RuntimeConfig:
        """Map `start()`'s keyword arguments (``*_ms``, hours) onto a config."""
        config = cls()
        values: dict[str, Any] = {}
        gmw = kwargs.pop("global_max_workers", None)
        if gmw is not None:
            values["global_max_workers"] = _positive_int("global_max_workers", gmw)
        check_compat_options(kwargs)
        for key, value in list(kwargs.items()):
            if value is None:
                kwargs.pop(key)
                continue
            if key in _MS_FIELDS:
                values[_MS_FIELDS[key]] = _ms(key, kwargs.pop(key))
            elif key in _HOUR_FIELDS:
                values[_HOUR_FIELDS[key]] = _hours(key, kwargs.pop(key))
            elif key == "dlq_retention_days":
                values["dlq_retention"] = _ms(key, float(kwargs.pop(key)) * 86_400_000)
        for key in ("batch_chunk_size", "cleanup_batch_size"):
            if key in kwargs:
                values[key] = _positive_int(key, kwargs.pop(key))
        if "dlq_enabled_by_default" in kwargs:
            values["dlq_enabled_by_default"] = bool(kwargs.pop("dlq_enabled_by_default"))
        if "listen" in kwargs:
            values["listen"] = bool(kwargs.pop("listen"))
        addr = kwargs.pop("health_addr", None) or os.environ.get("AWA_HEALTH_ADDR")
        if addr:
            parse_addr(addr)
            values["health_addr"] = addr
        for key in list(kwargs):
            if key in COMPAT_KEYS:
                kwargs.pop(key)
        if kwargs:
            raise TypeError(f"start() got unexpected keyword arguments {sorted(kwargs)}")
        weighted = "global_max_workers" in values
        if queues is None:
            if weighted:
                raise ConfigError("weighted mode requires explicit queue configs "
                                  "(global_max_workers set but queues=None)", field="queues")
            parsed = tuple(QueueConfig(name=n) for n in dict.fromkeys(default_queues))
        else:
            if isinstance(queues, str | bytes | Mapping):
                raise ConfigTypeError("queues must be a list of (name, max_workers) tuples "
                                      "or queue config dicts", field="queues")
            parsed = tuple(QueueConfig.parse(q, weighted=weighted) for q in queues)
        seen: set[str] = set()
        for qc in parsed:
            if qc.name in seen:
                raise ConfigError(f"queue {qc.name!r} configured more than once", field="queues")
            seen.add(qc.name)
        if not parsed:
            raise ConfigError("no queues to serve: register a task or pass queues",
                              field="queues")
        if weighted:
            total_min = sum(q.min_workers for q in parsed)
            if total_min > values["global_max_workers"]:
                raise ConfigError(f"sum of min_workers ({total_min}) exceeds "
                                  f"global_max_workers ({values['global_max_workers']})",
                                  field="global_max_workers")
        config = replace(config, queues=parsed, **values)
        if config.heartbeat_staleness <= config.heartbeat_interval:
            raise ConfigError("heartbeat_staleness_ms must exceed heartbeat_interval_ms",
                              field="heartbeat_staleness_ms")
        return config


_MS_FIELDS = {
    "poll_interval_ms": "poll_interval",
    "heartbeat_interval_ms": "heartbeat_interval",
    "heartbeat_staleness_ms": "heartbeat_staleness",
    "heartbeat_rescue_interval_ms": "heartbeat_rescue_interval",
    "deadline_rescue_interval_ms": "deadline_rescue_interval",
    "callback_rescue_interval_ms": "callback_rescue_interval",
    "promote_interval_ms": "promote_interval",
    "leader_election_interval_ms": "leader_election_interval",
    "cleanup_interval_ms": "cleanup_interval",
    "cron_interval_ms": "cron_interval",
    "batch_interval_ms": "batch_interval",
}
_HOUR_FIELDS = {
    "completed_retention_hours": "completed_retention",
    "failed_retention_hours": "failed_retention",
}
#: `awa-pg` storage knobs: validated as `awa-pg` validates them, then unused (one
#: storage design here; see docs/compatibility.md). Count knobs must be > 0.
_COMPAT_COUNTS = ("queue_storage_queue_slot_count", "queue_storage_lease_slot_count",
                  "queue_storage_claim_slot_count", "queue_storage_queue_stripe_count",
                  "claimers")
_COMPAT_INTERVALS = ("queue_storage_queue_rotate_interval_ms",
                     "queue_storage_lease_rotate_interval_ms",
                     "queue_storage_claim_rotate_interval_ms",
                     "terminal_count_rollup_interval_ms")
STORAGE_TRANSITION_ROLES = ("auto", "canonical_drain", "queue_storage_target")
COMPAT_KEYS = frozenset({*_COMPAT_COUNTS, *_COMPAT_INTERVALS, "queue_storage_schema",
                         "storage_transition_role", "descriptor_retention_days"})


def check_compat_options(kwargs: Mapping[str, Any]) -> None:
    """Validate the `awa-pg` storage knobs in ``kwargs`` (None means the default)."""
    for key in _COMPAT_COUNTS:
        if kwargs.get(key) is not None:
            _positive_int(key, kwargs[key])
    for key in _COMPAT_INTERVALS:
        if kwargs.get(key) is not None:
            _ms(key, kwargs[key])
    role = kwargs.get("storage_transition_role")
    if role is not None and role not in STORAGE_TRANSITION_ROLES:
        raise ConfigError("storage_transition_role must be one of 'auto', 'canonical_drain', "
                          f"or 'queue_storage_target' (got {role!r})",
                          field="storage_transition_role")
    schema = kwargs.get("queue_storage_schema")
    if schema is not None:
        if not isinstance(schema, str):
            raise ConfigTypeError("queue_storage_schema must be a string",
                                  field="queue_storage_schema")
        try:
            validate_schema(schema)
        except ValidationError as exc:
            raise ConfigError(f"invalid queue_storage_schema: {exc}",
                              field="queue_storage_schema") from exc
    days = kwargs.get("descriptor_retention_days")
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, int | float) \
                or not math.isfinite(days) or days < 0:
            raise ConfigError("descriptor_retention_days must be a non-negative finite number "
                              "(0 disables)", field="descriptor_retention_days")


def check_start(config: RuntimeConfig, registry: Registry,
                schedules: Mapping[str, CronSchedule],
                declared: Iterable[tuple[str, str]]) -> None:
    """What `start()` refuses beyond the options themselves, as `awa-pg` does (each a
    likely mistake: task modules not imported, a misspelt queue): nothing to run
    (no task, no schedule); queues that include none of the tasks' queues;
    descriptors of queues not served or of kinds neither run nor scheduled."""
    if len(registry) == 0 and not schedules:
        raise ConfigError("register at least one worker before starting the runtime "
                          "(@client.task), or declare a periodic schedule", field="queues")
    served = {qc.name for qc in config.queues}
    declared_queues = registry.queues()
    if len(registry) and not served.intersection(declared_queues):
        raise ConfigError("start() must configure the worker queues declared via "
                          f"@client.task(..., queue=...): {', '.join(declared_queues)}",
                          field="queues")
    kinds = set(registry.kinds()) | {s.kind for s in schedules.values()}
    for scope, name in declared:
        if scope == "queue" and name not in served:
            raise ConfigError(f"queue descriptor declared for unknown queue {name!r} "
                              "(not in this worker's queues)", field="queue_descriptor")
        if scope == "kind" and name not in kinds:
            raise ConfigError(f"job kind descriptor declared for unknown kind {name!r} "
                              "(no task or schedule of this client)",
                              field="job_kind_descriptor")


__all__ = ["COMPAT_KEYS", "QueueConfig", "RateLimit", "RuntimeConfig", "check_compat_options",
           "check_start"]


def parse_addr(addr: str) -> tuple[str, int]:
    """The health listener's ``host:port`` (port 0 picks a free one) → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"health address {addr!r} is not host:port")
    return host or "127.0.0.1", int(port)
