"""The names `awa-pg`'s native extension module exposes, for code that imports them.

`awa-pg` builds ``awa._awa`` in Rust and re-exports most of it from ``awa``;
some user code and tests import from ``awa._awa`` directly. Awa is pure
Python, so this module only re-exports the same names from where they live
here. ``Client`` is `AsyncClient` (the native client is async-first).
"""

from __future__ import annotations

from awa.callback_contract import (
    DEFAULT_HEARTBEAT_TIMEOUT_SECS as CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS,
)
from awa.callback_contract import DEFAULT_PATH_PREFIX as CALLBACK_DEFAULT_PATH_PREFIX
from awa.callback_contract import SIGNATURE_HEADER as CALLBACK_SIGNATURE_HEADER
from awa.callback_contract import build_callback_url
from awa.callback_contract import sign as sign_callback
from awa.callback_contract import verify as verify_callback
from awa.client import AsyncClient as Client
from awa.db.migrations import (
    current_migration_version,
    migrations,
    migrations_range,
    schema_patches,
)
from awa.dlq import DlqEntry
from awa.errors import (
    AwaError,
    CallbackNotFound,
    DatabaseError,
    LiveRuntimesRequireExclusiveWindow,
    RuntimeVersionFloorNotMet,
    SchemaNotMigrated,
    SerializationError,
    StorageNotFinalized,
    TerminalError,
    UniqueConflict,
    UnknownJobKind,
    ValidationError,
)
from awa.model import (
    CallbackToken,
    Cancel,
    Job,
    QueueStat,
    ResolveResult,
    RetryAfter,
    RetryFailedResult,
    Snooze,
    WaitForCallback,
)
from awa.partitioned import PartitionedQueue
from awa.producer import derive_kind
from awa.runtime import HealthCheck, QueueHealth
from awa.states import JobState
from awa.sync import SyncTransaction
from awa.telemetry import init_telemetry, shutdown_telemetry
from awa.transaction import Transaction


async def migrate(database_url: str | None = None, *, schema: str = "awa") -> list[int]:
    """Apply pending migrations to ``database_url``; returns the versions applied."""
    from awa import migrate as run

    return await run(database_url, schema=schema)


__all__ = [
    "CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS",
    "CALLBACK_DEFAULT_PATH_PREFIX",
    "CALLBACK_SIGNATURE_HEADER",
    "AwaError",
    "CallbackNotFound",
    "CallbackToken",
    "Cancel",
    "Client",
    "DatabaseError",
    "DlqEntry",
    "HealthCheck",
    "Job",
    "JobState",
    "LiveRuntimesRequireExclusiveWindow",
    "PartitionedQueue",
    "QueueHealth",
    "QueueStat",
    "ResolveResult",
    "RetryAfter",
    "RetryFailedResult",
    "RuntimeVersionFloorNotMet",
    "SchemaNotMigrated",
    "SerializationError",
    "Snooze",
    "StorageNotFinalized",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UnknownJobKind",
    "ValidationError",
    "WaitForCallback",
    "build_callback_url",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "migrate",
    "migrations",
    "migrations_range",
    "schema_patches",
    "shutdown_telemetry",
    "sign_callback",
    "verify_callback",
]
