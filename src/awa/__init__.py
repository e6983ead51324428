"""Awa: a Postgres-native background job queue for Python.

Pipeline: producer → Postgres → dispatcher → executor → completion.
"""

from __future__ import annotations

from awa import bridge, callback_contract, web
from awa.batch import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)
from awa.client import AsyncClient
from awa.context import CallbackWaitAborted, JobContext
from awa.db.migrations import (
    current_migration_version,
    migrations,
    migrations_range,
    schema_patches,
)
from awa.dlq import DlqEntry
from awa.errors import (
    AwaError,
    BatchOperationNotFound,
    CallbackNotFound,
    DatabaseError,
    JobNotFound,
    LiveRuntimesRequireExclusiveWindow,
    RuntimeVersionFloorNotMet,
    SchemaNotMigrated,
    SerializationError,
    StagingError,
    StorageNotFinalized,
    TerminalError,
    UniqueConflict,
    UnknownJobKind,
    ValidationError,
)
from awa.followups import EnqueueRequest, JobEvent, OutcomeContext
from awa.model import (
    CallbackToken,
    Cancel,
    Job,
    Output,
    QueueStat,
    ResolveResult,
    RetryAfter,
    RetryFailedResult,
    Snooze,
    WaitForCallback,
)
from awa.partitioned import PartitionedQueue
from awa.producer import derive_kind, max_payload_bytes, set_max_payload_bytes
from awa.runtime import HealthCheck, QueueHealth
from awa.states import JobState
from awa.sync import Client, SyncTransaction
from awa.telemetry import init_telemetry, shutdown_telemetry
from awa.transaction import Transaction

__version__ = "0.1.0"

#: `awa-pg` exports its native client as ``RawClient``; here it is `AsyncClient`.
RawClient = AsyncClient


async def migrate(database_url: str | None = None, *, schema: str = "awa") -> list[int]:
    """Apply pending migrations to ``database_url``; returns the versions applied."""
    async with AsyncClient(database_url, max_connections=1, schema=schema) as client:
        return await client.migrate()


__all__ = [
    "AsyncClient",
    "AwaError",
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationNotFound",
    "BatchOperationPreview",
    "BatchOperationState",
    "CallbackNotFound",
    "CallbackToken",
    "CallbackWaitAborted",
    "Cancel",
    "Client",
    "DatabaseError",
    "DlqEntry",
    "EnqueueRequest",
    "HealthCheck",
    "Job",
    "JobContext",
    "JobEvent",
    "JobNotFound",
    "JobState",
    "LiveRuntimesRequireExclusiveWindow",
    "OutcomeContext",
    "Output",
    "PartitionedQueue",
    "QueueHealth",
    "QueueStat",
    "RawClient",
    "ResolveResult",
    "RetryAfter",
    "RetryFailedResult",
    "RuntimeVersionFloorNotMet",
    "SchemaNotMigrated",
    "SerializationError",
    "Snooze",
    "StagingError",
    "StorageNotFinalized",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UnknownJobKind",
    "ValidationError",
    "WaitForCallback",
    "bridge",
    "callback_contract",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "max_payload_bytes",
    "migrate",
    "migrations",
    "migrations_range",
    "schema_patches",
    "set_max_payload_bytes",
    "shutdown_telemetry",
    "web",
]
