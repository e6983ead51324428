"""Backpressure checks on the enqueue paths: measure a queue's depth, refuse if full.

Called by every client enqueue (`Transaction`'s and the bridge's too) with the caller's
``backpressure`` option, on the connection that will write, before anything
is written. ``"off"`` returns at once without a round trip, so producers
that don't ask pay nothing. One bounded count per distinct queue of the call
(see `awa.core.backpressure` for what the depth means; it counts ring jobs too,
`depth_available`).
"""

from __future__ import annotations

from collections.abc import Sequence

from awa.core.backpressure import QueueDepth, Reject, count_cap
from awa.core.errors import QueueFull
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.enqueue.plan import Plan, run
from awa.enqueue.producer import PreparedJob
from awa.telemetry import otel as telemetry


async def measure(conn: Conn, q: Queries, queue: str, cap: int) -> QueueDepth:
    """Count ``queue``'s available jobs in both lanes, stopping at ``cap`` (the
    claim index, then the ring's claim cursors; no spent row is read)."""
    with translated():
        depth = await conn.fetchval(q["depth_available"], queue, cap)
    return QueueDepth(queue, int(depth), cap)


def check_plan(jobs: Sequence[PreparedJob], backpressure: object) -> Plan[dict[str, QueueDepth]]:
    """`check` as a plan, for any driver (the bridge runs it on the caller's connection)."""
    cap = count_cap(backpressure)
    if cap is None or not jobs:
        return {}
    depths: dict[str, QueueDepth] = {}
    for queue in dict.fromkeys(j.queue for j in jobs):
        row = yield "depth_available", (queue, cap)
        assert row is not None  # a count always answers one row
        depths[queue] = QueueDepth(queue, int(row["depth"]), cap)
    if isinstance(backpressure, Reject):
        for depth in depths.values():
            if depth.depth >= backpressure.limit:
                telemetry.backpressure("rejected", jobs)
                raise QueueFull(depth.queue, depth.depth, backpressure.limit)
    else:
        telemetry.backpressure("signalled", jobs)
    return depths


async def check(conn: Conn, q: Queries, jobs: Sequence[PreparedJob],
                backpressure: object) -> dict[str, QueueDepth]:
    """Apply ``backpressure`` to an enqueue of ``jobs``: the depth of each of their
    queues (empty for ``"off"``), or `QueueFull` for a `Reject` whose limit is reached.

    Validates the option first, so a bad one raises before any write."""
    if count_cap(backpressure) is None or not jobs:
        return {}
    with translated():
        return await run(conn, q, check_plan(jobs, backpressure))
