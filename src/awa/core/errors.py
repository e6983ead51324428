"""The one error tree. Driver errors are translated to it in `awa.db.errors`."""

from __future__ import annotations


class AwaError(Exception):
    """Base of every error Awa raises on purpose."""


class ValidationError(AwaError, ValueError):
    """Input broke a documented rule; raised before anything is written."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class ConfigError(ValidationError):
    """A worker setting (`start()` options, queue configs) broke a rule; ``str()`` is
    the whole message, as `awa-pg` words it where the two share the setting."""

    def __init__(self, message: str, *, field: str = "") -> None:
        AwaError.__init__(self, message)
        self.field = field
        self.rule = message


class ConfigTypeError(ConfigError, TypeError):
    """A worker setting of the wrong type (also a `TypeError`, as in `awa-pg`)."""


class SerializationError(AwaError):
    """Args or metadata could not be converted to or from JSON."""


class ArgsTypeError(ValidationError, SerializationError):
    """Args of a type that cannot be a job's args (not a dataclass, pydantic model or
    dict): a `ValidationError` as in `awa-pg`, and a `SerializationError` as before."""

    def __init__(self, message: str) -> None:
        AwaError.__init__(self, message)
        self.field = "args"
        self.rule = message


class UniqueConflict(AwaError):
    """A job with the same unique key already exists in a blocking state."""

    def __init__(self, message: str, *, unique_key: bytes | None = None,
                 conflicting_job_id: int | None = None) -> None:
        super().__init__(message)
        self.unique_key = unique_key
        self.conflicting_job_id = conflicting_job_id


class SchemaNotMigrated(AwaError):
    """The database schema is missing, behind, or newer than this code."""


class StorageNotFinalized(SchemaNotMigrated):
    """`awa-pg` 0.7 refuses to migrate mid storage transition. Awa has one storage
    design and never raises it; defined so ``except`` clauses written for awa-pg work."""


class LiveRuntimesRequireExclusiveWindow(AwaError):
    """`awa-pg` 0.7: a migration that needs its workers stopped. Awa's migrations run
    beside live workers, so it is never raised; defined for ``except`` clauses."""


class RuntimeVersionFloorNotMet(AwaError):
    """`awa-pg` 0.7: live workers older than a migration's floor. Never raised by Awa
    (a worker refuses a schema other than its own instead: `SchemaNotMigrated`)."""


class UnknownJobKind(AwaError):
    """No handler is registered for a job's kind."""


class JobNotFound(AwaError, LookupError):
    """No job (active, finished or dead-lettered) has this id."""


class WaitTimeout(AwaError, TimeoutError):
    """`wait_for` gave up: the job did not finish within the timeout.

    Also a builtin `TimeoutError`. The job is untouched (still queued or
    running); ``state`` is what it was last seen as."""

    def __init__(self, job_id: int, timeout: float, state: str | None) -> None:
        super().__init__(f"job {job_id} did not finish within {timeout:g}s "
                         f"(last seen {state or 'unknown'})")
        self.job_id = job_id
        self.timeout = timeout
        self.state = state


class QueueFull(AwaError):
    """An insert with ``backpressure=Reject(limit)`` found ``depth >= limit``
    available jobs in ``queue``; nothing was written."""

    def __init__(self, queue: str, depth: int, limit: int) -> None:
        super().__init__(f"queue {queue!r} has {depth} available jobs (limit {limit}); "
                         "nothing was inserted")
        self.queue = queue
        self.depth = depth
        self.limit = limit


class BatchOperationNotFound(AwaError, LookupError):
    """No batch operation has this (well-formed) id."""


class DatabaseError(AwaError):
    """A database failure that is not one of the specific errors above."""


class CallbackNotFound(AwaError):
    """The callback id is unknown, already resolved, or superseded."""


class TerminalError(AwaError):
    """Raised by a handler to fail the job now, without further attempts."""


class StagingError(TerminalError):
    """A follow-up could not be staged; the attempt fails terminally."""
