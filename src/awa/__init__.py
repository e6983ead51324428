"""Awa: a Postgres-native background job queue for Python.

Pipeline: producer → Postgres → dispatcher → executor → completion.
"""

from __future__ import annotations

from awa import _moved, bridge, web
from awa.admin.dlq import DlqEntry
from awa.client import AsyncClient, run
from awa.core import callback_contract
from awa.core.backpressure import QueueDepth, Reject
from awa.core.batch_spec import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)
from awa.core.errors import (
    AwaError,
    BatchOperationNotFound,
    CallbackNotFound,
    DatabaseError,
    JobNotFound,
    LiveRuntimesRequireExclusiveWindow,
    QueueFull,
    RuntimeVersionFloorNotMet,
    SchemaNotMigrated,
    SerializationError,
    StagingError,
    StorageNotFinalized,
    TerminalError,
    UniqueConflict,
    UnknownJobKind,
    ValidationError,
    WaitTimeout,
)
from awa.core.model import (
    CallbackToken,
    Cancel,
    Job,
    KeyStat,
    Output,
    QueueStat,
    ResolveResult,
    RetryAfter,
    RetryFailedResult,
    Snooze,
    WaitForCallback,
)
from awa.core.results import InsertedJob
from awa.core.serialize import derive_kind, max_payload_bytes, set_max_payload_bytes
from awa.core.states import JobState
from awa.core.version import __version__ as __version__
from awa.db.migrations import (
    current_migration_version,
    migrations,
    migrations_range,
    schema_patches,
)
from awa.enqueue.dependencies import ParentResult
from awa.enqueue.partitioned import PartitionedQueue
from awa.enqueue.transaction import Transaction
from awa.enqueue.workflow import WorkflowRun, chain, chord, group, step
from awa.sync import Client, SyncTransaction
from awa.telemetry.joblog import set_log_error_messages
from awa.telemetry.otel import init_telemetry, shutdown_telemetry
from awa.worker.context import CallbackWaitAborted, JobContext
from awa.worker.followups import EnqueueRequest, JobEvent, OutcomeContext
from awa.worker.health import HealthCheck, QueueHealth

_moved.install()

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
    "InsertedJob",
    "Job",
    "JobContext",
    "JobEvent",
    "JobNotFound",
    "JobState",
    "KeyStat",
    "LiveRuntimesRequireExclusiveWindow",
    "OutcomeContext",
    "Output",
    "ParentResult",
    "PartitionedQueue",
    "QueueDepth",
    "QueueFull",
    "QueueHealth",
    "QueueStat",
    "RawClient",
    "Reject",
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
    "WaitTimeout",
    "WorkflowRun",
    "bridge",
    "callback_contract",
    "chain",
    "chord",
    "current_migration_version",
    "derive_kind",
    "group",
    "init_telemetry",
    "max_payload_bytes",
    "migrate",
    "migrations",
    "migrations_range",
    "run",
    "schema_patches",
    "set_log_error_messages",
    "set_max_payload_bytes",
    "shutdown_telemetry",
    "step",
    "web",
]
