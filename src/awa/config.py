"""Worker configuration: frozen, validated objects with `timedelta`, not ``*_ms``.

`start()` takes the reference SDK's keyword names (``heartbeat_interval_ms``,
...); `RuntimeConfig.from_start_kwargs` maps them onto these objects in this
one place and rejects contradictions with `ValueError`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from awa import states
from awa.producer import check_name

DEFAULT_MAX_WORKERS = 10


def _ms(name: str, value: Any, *, allow_zero: bool = False) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of milliseconds")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}")
    return timedelta(milliseconds=value)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer")
    return value


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Token bucket: ``max_rate`` jobs per second, bursts up to ``burst``."""

    max_rate: float
    burst: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_rate) and self.max_rate > 0):
            raise ValueError("rate_limit max_rate must be > 0")
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
    claim_batch_size: int = 32
    dlq_enabled: bool | None = None  #: None = the runtime's default

    @classmethod
    def parse(cls, spec: Any, *, weighted: bool) -> QueueConfig:
        """Build from a ``(name, max_workers)`` tuple or a config dict."""
        if isinstance(spec, tuple | list):
            if len(spec) != 2:
                raise ValueError("queue tuples are (name, max_workers)")
            name, max_workers = spec
            return cls(name=_queue_name(name), max_workers=_positive_int("max_workers",
                                                                        max_workers))
        if not isinstance(spec, Mapping):
            raise ValueError(f"queue config must be a (name, max_workers) tuple or a dict, "
                             f"got {type(spec).__name__}")
        unknown = set(spec) - _DICT_KEYS
        if unknown:
            raise ValueError(f"unknown queue config keys {sorted(unknown)}")
        if "name" not in spec:
            raise ValueError("queue config needs a name")
        if weighted and "max_workers" in spec:
            raise ValueError("weighted queue configs use min_workers, not max_workers")
        if not weighted and "min_workers" in spec:
            raise ValueError("min_workers needs global_max_workers (weighted mode)")
        kwargs: dict[str, Any] = {"name": _queue_name(spec["name"])}
        if "max_workers" in spec:
            kwargs["max_workers"] = _positive_int("max_workers", spec["max_workers"])
        if "min_workers" in spec:
            value = spec["min_workers"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("min_workers must be an integer >= 0")
            kwargs["min_workers"] = value
        if "weight" in spec:
            kwargs["weight"] = _positive_int("weight", spec["weight"])
        if spec.get("rate_limit") is not None:
            rate = spec["rate_limit"]
            if not isinstance(rate, tuple | list) or len(rate) != 2:
                raise ValueError("rate_limit is (max_rate, burst)")
            kwargs["rate_limit"] = RateLimit(float(rate[0]), rate[1])
        if "priority_aging_interval_ms" in spec:
            kwargs["priority_aging_interval"] = _ms(
                "priority_aging_interval_ms", spec["priority_aging_interval_ms"], allow_zero=True)
        if "deadline_duration_ms" in spec:
            kwargs["deadline"] = _ms("deadline_duration_ms", spec["deadline_duration_ms"],
                                     allow_zero=True)
        if "claim_batch_size" in spec:
            kwargs["claim_batch_size"] = _positive_int("claim_batch_size",
                                                       spec["claim_batch_size"])
        if "dlq_enabled" in spec:
            kwargs["dlq_enabled"] = bool(spec["dlq_enabled"])
        return cls(**kwargs)


_DICT_KEYS = frozenset({"name", "max_workers", "min_workers", "weight", "rate_limit",
                        "priority_aging_interval_ms", "deadline_duration_ms",
                        "claim_batch_size", "dlq_enabled"})


def _queue_name(name: Any) -> str:
    try:
        return check_name("queue", name)
    except Exception as exc:
        raise ValueError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything a worker process needs to know; defaults from spec §2.3."""

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
        for key, value in list(kwargs.items()):
            if value is None:
                kwargs.pop(key)
                continue
            if key in _MS_FIELDS:
                values[_MS_FIELDS[key]] = _ms(key, kwargs.pop(key))
            elif key in _HOUR_FIELDS:
                values[_HOUR_FIELDS[key]] = _ms(key, float(kwargs.pop(key)) * 3_600_000,
                                                allow_zero=True)
            elif key == "dlq_retention_days":
                values["dlq_retention"] = _ms(key, float(kwargs.pop(key)) * 86_400_000)
        if "batch_chunk_size" in kwargs:
            values["batch_chunk_size"] = _positive_int("batch_chunk_size",
                                                       kwargs.pop("batch_chunk_size"))
        if "cleanup_batch_size" in kwargs:
            values["cleanup_batch_size"] = _positive_int("cleanup_batch_size",
                                                         kwargs.pop("cleanup_batch_size"))
        if "dlq_enabled_by_default" in kwargs:
            values["dlq_enabled_by_default"] = bool(kwargs.pop("dlq_enabled_by_default"))
        if "listen" in kwargs:
            values["listen"] = bool(kwargs.pop("listen"))
        addr = kwargs.pop("health_addr", None) or os.environ.get("AWA_HEALTH_ADDR")
        if addr:
            from awa.web.health import parse_addr

            parse_addr(addr)
            values["health_addr"] = addr
        for key in list(kwargs):
            if key in COMPAT_KEYS:
                kwargs.pop(key)
        if kwargs:
            raise TypeError(f"start() got unexpected keyword arguments {sorted(kwargs)}")
        weighted = "global_max_workers" in values
        if queues is None:
            parsed = tuple(QueueConfig(name=n) for n in dict.fromkeys(default_queues))
        else:
            parsed = tuple(QueueConfig.parse(q, weighted=weighted) for q in queues)
        names = [q.name for q in parsed]
        if len(set(names)) != len(names):
            raise ValueError("a queue is configured twice")
        if not parsed:
            raise ValueError("no queues to serve: register a task or pass queues")
        if weighted:
            total_min = sum(q.min_workers for q in parsed)
            if total_min > values["global_max_workers"]:
                raise ValueError("the min_workers add up to more than global_max_workers")
        config = replace(config, queues=parsed, **values)
        if config.heartbeat_staleness <= config.heartbeat_interval:
            raise ValueError("heartbeat_staleness_ms must exceed heartbeat_interval_ms")
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
#: Accepted for compatibility with the reference SDK; our storage needs none of them.
COMPAT_KEYS = frozenset({
    "claimers", "terminal_count_rollup_interval_ms", "storage_transition_role",
    "queue_storage_schema", "queue_storage_queue_slot_count",
    "queue_storage_lease_slot_count", "queue_storage_claim_slot_count",
    "queue_storage_rotate_interval_ms", "queue_storage_lease_rotate_interval_ms",
    "queue_storage_claim_rotate_interval_ms",
})

__all__ = ["COMPAT_KEYS", "QueueConfig", "RateLimit", "RuntimeConfig"]
