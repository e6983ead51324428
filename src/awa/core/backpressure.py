"""Producer backpressure: the options an enqueue takes and the depth it reports.

An enqueue may look at how many jobs already wait in its queue before it
writes: ``backpressure="off"`` (the default: no look, no cost), ``"signal"``
(count and report the depth, write anyway), or ``Reject(limit)`` (raise
`QueueFull` before writing when the queue holds ``limit`` or more available
jobs). The depth is a bounded count of the queue's *available* jobs (due and
unclaimed: what workers have not caught up with), read from the claim index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from awa.core import states
from awa.core.errors import ValidationError
from awa.core.validate import check_int


@dataclass(frozen=True, slots=True)
class Reject:
    """``backpressure=Reject(limit)``: refuse the enqueue (`QueueFull`, nothing
    written) when its queue already holds ``limit`` or more available jobs.

    A soft bound: concurrent producers that all see ``limit - 1`` each write,
    and a batch is admitted whole, so a queue may overshoot by what they add."""

    limit: int

    def __post_init__(self) -> None:
        check_int("backpressure.limit", self.limit, 1, states.DEPTH_LIMIT_MAX)


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Available jobs of ``queue`` counted up to ``cap`` just before an enqueue."""

    queue: str
    depth: int
    cap: int

    @property
    def at_least(self) -> bool:
        """True when the count stopped at its cap: the queue holds ``depth`` or more."""
        return self.depth >= self.cap


#: What ``insert(..., backpressure=...)`` accepts.
Backpressure = Literal["off", "signal"] | Reject


def count_cap(backpressure: Any) -> int | None:
    """How far to count before an enqueue with this option; None: don't look.

    Raises `ValidationError` for anything but ``"off"``, ``"signal"`` or a `Reject`."""
    if backpressure == "off":
        return None
    if backpressure == "signal":
        return states.DEPTH_SIGNAL_CAP
    if isinstance(backpressure, Reject):
        return backpressure.limit
    raise ValidationError("backpressure", "must be 'off', 'signal' or awa.Reject(limit)")
