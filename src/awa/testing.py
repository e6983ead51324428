"""Test your handlers without running a fleet (docs/guide/testing.md).

- `AwaTestClient(client)`: ``insert``, ``migrate``, ``clean``, ``work_one``
  (claim one job, run a handler, and apply exactly the runtime's completion
  rules, staged follow-ups and poisoning included) and ``drain`` (run the
  client's registered handlers until the queue is empty).
- `HandlerJob`: a stand-in ``job`` for unit tests with no database; its
  ``enqueue_on_completion`` validates and enforces the limits like the real
  one and records requests in ``job.staged``.
- The ``awa_client`` pytest fixture (this module is a pytest plugin), which
  deletes every job of the database it uses: ``$AWA_TEST_DATABASE_URL`` if set,
  else a database of its own, ``<name>_awa_test``, created next to the one
  ``$DATABASE_URL`` (or the embedded server) names, which it never touches;
  override the ``awa_database_url`` fixture to point it elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Unpack
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from awa.client import AsyncClient
from awa.core import states
from awa.core.callback_rules import compile_rules
from awa.core.errors import ConfigError
from awa.core.model import CallbackToken, Job, Outcome
from awa.core.options import EnqueueOptions, InsertOptions
from awa.core.outcomes import OUTCOMES
from awa.db import dsn
from awa.db.pool import resolve_database_url
from awa.db.queries import queries
from awa.enqueue.producer import PreparedJob
from awa.maintenance.services import DependencyReleaser
from awa.worker.completion import Completer
from awa.worker.context import AttemptDb
from awa.worker.executor import JobExecutor
from awa.worker.finalize import Finalizer
from awa.worker.followups import StagingBuffer
from awa.worker.tasks import Handler, Registry, make_spec

#: What `WorkResult.outcome` calls each outcome kind, from the one table (`OUTCOMES`).
OUTCOME_NAMES: dict[str, str] = {kind: o.state for kind, o in OUTCOMES.items()
                                 if o.state is not None}


class _NoJob:
    """No job was available."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoJob"


NoJob = _NoJob()


@dataclass(slots=True)
class JobRow:
    """The job as it stands after `work_one` ran it: ``state`` is the state's name
    (``"completed"``, ...), as in `awa-pg`; ``snapshot`` is the full `Job`."""

    id: int
    kind: str
    queue: str
    args: dict[str, Any]
    attempt: int
    max_attempts: int
    priority: int
    tags: list[str]
    state: str | None = None
    snapshot: Job | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_job(cls, job: Job) -> JobRow:
        """The row view of ``job``."""
        return cls(id=job.id, kind=job.kind, queue=job.queue, args=job.args,
                   attempt=job.attempt, max_attempts=job.max_attempts, priority=job.priority,
                   tags=list(job.tags), state=str(job.state), snapshot=job)


@dataclass(frozen=True, slots=True)
class WorkResult:
    """What `AwaTestClient.work_one` did."""

    job: JobRow | _NoJob
    outcome: str
    error: str | None = None

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_retryable(self) -> bool:
        return self.outcome == "retryable"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_cancelled(self) -> bool:
        return self.outcome == "cancelled"

    def is_snoozed(self) -> bool:
        return self.outcome == "snoozed"

    def is_waiting(self) -> bool:
        return self.outcome == "waiting_external"

    def is_no_job(self) -> bool:
        return self.outcome == "no_job"


class AwaTestClient:
    """Drive handlers one job at a time against a real database."""

    def __init__(self, client: AsyncClient) -> None:
        if not isinstance(client, AsyncClient):
            raise TypeError("AwaTestClient needs an awa.AsyncClient")
        self.client = client
        self._threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="awa-test")

    async def migrate(self) -> None:
        await self.client.migrate()

    async def clean(self) -> None:
        """Delete every job, claim and pause switch in this client's schema."""
        pool = await self.client.pool()
        await pool.execute(self.client._q["storage_reset"])
        await pool.execute(self.client._q["queue_unpause_all"])

    async def insert(self, args: Any, **opts: Unpack[EnqueueOptions]) -> Job:
        """`AsyncClient.insert` on the client under test."""
        return await self.client.insert(args, **opts)

    async def work_one(self, args_type: Any, handler: Handler, *, kind: str | None = None,
                       queue: str = states.DEFAULT_QUEUE) -> WorkResult:
        """Claim the next job of this kind in ``queue``, run ``handler``, record the outcome."""
        spec = make_spec(args_type, handler, kind=kind, queue=queue)
        registry = Registry()
        registry.add(spec)
        return await self._work(registry, queue, spec.kind)

    async def drain(self, queue: str = states.DEFAULT_QUEUE, *, include_scheduled: bool = False,
                    max_jobs: int = 10_000) -> list[WorkResult]:
        """Run the client's registered handlers on ``queue`` until nothing is available.

        Follow-ups inserted into the queue are drained too, and so are the children
        of a finished parent, however many (as a worker's release service would); with
        ``include_scheduled``, scheduled and retryable jobs are made due first.
        """
        results: list[WorkResult] = []
        pool = await self.client.pool()
        q = self.client._q
        while len(results) < max_jobs:
            if include_scheduled:
                await pool.execute(q["queue_make_due"], queue)
            # The queue's available ring jobs move to awa.jobs, where the kinds
            # are read and the harness's claim looks.
            await pool.fetchval(q["job_ring_queue_to_mutable"], queue)
            kinds = [r["kind"] for r in await pool.fetch(q["queue_available_kinds"], queue)]
            runnable = [k for k in kinds if self.client._registry.get(k) is not None]
            if not runnable:
                # Children a parent's finish left to the workers' release service
                # (a fan-out of more than 1,000): released here, as a worker would.
                releaser = DependencyReleaser(pool, q, states.DEPENDENCY_RELEASE_INTERVAL)
                await releaser.run_once()
                if releaser.chunks == 0:
                    return results
                continue
            for kind in runnable:
                result = await self._work(self.client._registry, queue, kind)
                if not result.is_no_job():
                    results.append(result)
        return results

    async def _work(self, registry: Registry, queue: str, kind: str) -> WorkResult:
        pool = await self.client.pool()
        q = self.client._q
        # The next job of the kind, if it is in the ring, moves to awa.jobs
        # first: the harness's claim reads that table only.
        await pool.fetchval(q["job_ring_next_to_mutable"], queue, kind)
        row = await pool.fetchrow(q["attempt_claim_one_kind"], queue, kind)
        if row is None:
            return WorkResult(NoJob, "no_job")
        job = Job.from_row(row)
        executor = JobExecutor(registry, self._threads, AttemptDb(pool, q, 0.05))
        ctx, early = executor.prepare(job)
        outcome: Outcome | None = early
        if ctx is not None:
            outcome = await executor.run(job, ctx)
        assert outcome is not None
        completer = Completer(pool, q, completed_retention=states.COMPLETED_RETENTION,
                              failed_retention=states.FAILED_RETENTION)
        done = await Finalizer(completer, self.client._followups).finalize(
            job, ctx, outcome, allow_batch=False)
        if done.written and done.trigger is not None:
            self.client._followups.emit(done.trigger, job, done.outcome.error)
        after = await self.client.get_job(job.id)
        error = done.outcome.error
        if done.outcome.kind == "cancel" and error is not None:
            error = error.removeprefix("cancelled: ")  # the handler's reason, as awa-pg
        return WorkResult(JobRow.from_job(after), OUTCOME_NAMES[done.outcome.kind], error)


@dataclass
class HandlerJob:
    """A stand-in for the handler's ``job`` in unit tests (no database)."""

    args: Any
    id: int = 1
    attempt: int = 1
    max_attempts: int = states.MAX_ATTEMPTS_DEFAULT
    queue: str = states.DEFAULT_QUEUE
    priority: int = states.PRIORITY_DEFAULT
    deadline: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    progress: dict[str, Any] | None = None
    cancelled: bool = False
    _buffer: StagingBuffer = field(default_factory=StagingBuffer, repr=False)

    @property
    def staged(self) -> list[PreparedJob]:
        """The follow-ups staged so far, validated, in staging order."""
        return list(self._buffer.requests)

    def is_cancelled(self) -> bool:
        return self.cancelled

    def enqueue_on_completion(self, args: Any, **opts: Unpack[InsertOptions]) -> None:
        """Validate and record a follow-up exactly as the runtime would stage it."""
        self._buffer.stage(args, dict(opts))

    def seal(self) -> None:
        """Mark the handler as returned: later stages raise `StagingError`."""
        self._buffer.sealed = True

    def set_progress(self, percent: float, message: str | None = None) -> None:
        meta = (self.progress or {}).get("metadata") or {}
        self.progress = {"percent": min(100.0, max(0.0, float(percent))), "message": message,
                         "metadata": meta}

    def update_metadata(self, values: dict[str, Any]) -> None:
        current = self.progress or {"percent": 0.0, "message": None, "metadata": {}}
        self.progress = {**current, "metadata": {**current["metadata"], **values}}

    async def flush_progress(self) -> None:
        return None

    def flush_progress_sync(self) -> None:
        return None

    async def register_callback(self, timeout_seconds: float = states.CALLBACK_TIMEOUT_SECS, *,
                                filter: str | None = None, on_complete: str | None = None,
                                on_fail: str | None = None,
                                transform: str | None = None) -> CallbackToken:
        compile_rules(filter=filter, on_complete=on_complete, on_fail=on_fail,
                      transform=transform)
        return CallbackToken.new()


# -- pytest plugin -------------------------------------------------------------------

#: `awa_client`'s own database is named after the one ``$DATABASE_URL`` names, plus this.
TEST_DATABASE_SUFFIX = "_awa_test"
_created: set[str] = set()


def fixture_database_name(database: str) -> str:
    """``app`` → ``app_awa_test``: a plain identifier (at most 63 bytes), whatever ``database``."""
    base = re.sub(r"[^a-z0-9_]", "_", database.lower())[:63 - len(TEST_DATABASE_SUFFIX)]
    if not re.match(r"[a-z_]", base):
        base = "awa" + base[:60 - len(TEST_DATABASE_SUFFIX)]
    return base + TEST_DATABASE_SUFFIX


async def own_test_database(server_url: str) -> str:
    """The URL of `awa_client`'s own database on ``server_url``'s server (created when
    missing), so the fixture's cleaning never deletes the jobs of the database
    ``server_url`` names."""
    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    name = fixture_database_name(parts.path.lstrip("/") or user)
    url = urlunsplit(parts._replace(path="/" + name))
    if url in _created:
        return url
    conn = await asyncpg.connect(dsn.parse(server_url).dsn)
    try:
        if not await conn.fetchval(queries()["connection_database_exists"], name):
            try:
                # sql-safe: name is fixture_database_name()'s [a-z_][a-z0-9_]* identifier, quoted
                await conn.execute(f'CREATE DATABASE "{name}"')
            except asyncpg.DuplicateDatabaseError:
                pass  # another test process made it meanwhile
            except asyncpg.PostgresError as exc:
                raise ConfigError(
                    f"awa_client uses a database of its own and could not create {name!r} "
                    f"({type(exc).__name__}: {dsn.redact(str(exc))}); set "
                    "AWA_TEST_DATABASE_URL to a database whose jobs it may delete",
                    field="AWA_TEST_DATABASE_URL") from None
    finally:
        await conn.close()
    _created.add(url)
    return url


try:
    import pytest
    import pytest_asyncio
except ImportError:  # pragma: no cover - the plugin needs pytest and pytest-asyncio
    pass
else:
    @pytest.fixture
    def awa_database_url() -> str | None:
        """The database `awa_client` uses and cleans: ``$AWA_TEST_DATABASE_URL``, else
        None, a database of its own (`own_test_database`). Override to choose another."""
        return os.environ.get("AWA_TEST_DATABASE_URL") or None

    @pytest_asyncio.fixture
    async def awa_client(awa_database_url: str | None) -> AsyncIterator[AwaTestClient]:
        """A migrated, cleaned `AwaTestClient` (cleaning deletes every job of its database)."""
        url = awa_database_url or await own_test_database(
            await asyncio.to_thread(resolve_database_url, None))
        async with AsyncClient(url) as client:
            test_client = AwaTestClient(client)
            await test_client.migrate()
            await test_client.clean()
            yield test_client
            await asyncio.sleep(0)
