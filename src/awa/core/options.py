"""Insert options shared by every enqueue path (client, transaction, bridge)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict


class InsertOptions(TypedDict, total=False):
    """Keyword options of an insert (docs/guide/concepts.md, "Insert options").

    Unknown keys raise TypeError.
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
