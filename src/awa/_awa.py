"""The names `awa-pg`'s native extension module exposes, for code that imports them.

`awa-pg` builds ``awa._awa`` in Rust and re-exports most of it from ``awa``;
some user code and tests import from ``awa._awa`` directly. Awa is pure
Python, so this module only re-exports the same names from where they live
here. ``Client`` is `AsyncClient` (the native client is async-first).
"""

from __future__ import annotations

from awa import (
    AwaError,
    CallbackNotFound,
    CallbackToken,
    Cancel,
    DatabaseError,
    DlqEntry,
    HealthCheck,
    Job,
    JobState,
    LiveRuntimesRequireExclusiveWindow,
    PartitionedQueue,
    QueueHealth,
    QueueStat,
    ResolveResult,
    RetryAfter,
    RetryFailedResult,
    RuntimeVersionFloorNotMet,
    SchemaNotMigrated,
    SerializationError,
    Snooze,
    StorageNotFinalized,
    SyncTransaction,
    TerminalError,
    Transaction,
    UniqueConflict,
    UnknownJobKind,
    ValidationError,
    WaitForCallback,
    current_migration_version,
    derive_kind,
    init_telemetry,
    migrate,
    migrations,
    migrations_range,
    schema_patches,
    shutdown_telemetry,
)
from awa.client import AsyncClient as Client
from awa.core.callback_contract import (
    DEFAULT_HEARTBEAT_TIMEOUT_SECS as CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS,
)
from awa.core.callback_contract import DEFAULT_PATH_PREFIX as CALLBACK_DEFAULT_PATH_PREFIX
from awa.core.callback_contract import SIGNATURE_HEADER as CALLBACK_SIGNATURE_HEADER
from awa.core.callback_contract import build_callback_url
from awa.core.callback_contract import sign as sign_callback
from awa.core.callback_contract import verify as verify_callback

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
