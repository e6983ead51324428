"""Insert options shared by every enqueue path (client, transaction, bridge, Django)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict

from awa.core.backpressure import Backpressure

#: ``on_parent_failure``: what happens to a job when a job it waits for fails.
Policy = Literal["cancel", "run_anyway", "discard"]


class InsertOptions(TypedDict, total=False):
    """Keyword options of an insert (docs/guide/concepts.md, "Insert options"):
    what the job row carries. Unknown keys raise TypeError.
    """

    kind: str | None
    queue: str
    priority: int
    max_attempts: int
    tags: Sequence[str] | None
    metadata: Mapping[str, Any] | None
    run_at: datetime | str | None
    unique_opts: Mapping[str, Any] | None
    ordering_key: str | bytes | None
    concurrency_key: str | None
    max_in_flight: int | None


class EnqueueOptions(InsertOptions, total=False):
    """Every keyword option of an enqueue call: the job's `InsertOptions` plus how
    the call writes it (``after`` / ``on_parent_failure``: docs/guide/workflows.md;
    ``backpressure``: docs/guide/backpressure.md). Declared once, here, for every
    surface (`awa.enqueue.pipeline` runs them)."""

    after: Iterable[Any] | None
    on_parent_failure: Policy
    backpressure: Backpressure


#: The keys of `EnqueueOptions` that are not the job's own (`InsertOptions`).
CALL_OPTIONS = frozenset({"after", "on_parent_failure", "backpressure"})
