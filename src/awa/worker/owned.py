"""Caller-owned completion: the handler's writes and the job's completion
commit in one transaction, or neither does.

``@client.task(Args, completion="caller")`` hands the handler an open
transaction as ``job.transaction`` (an `awa.Transaction`: ``execute``,
``fetch_*``, ``insert`` for follow-up jobs, ``connection`` for the driver).
When the handler returns normally, the runtime completes the job *in that
transaction* under the run lease and commits: both happen or neither. A
stale lease (the attempt was rescued and re-claimed) rolls everything back,
as does an exception (the job then retries as usual) or any other outcome
(retry, snooze, cancel, callback: written the normal way, without the
handler's writes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from awa.core.errors import AwaError
from awa.core.model import Job, Outcome
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.enqueue.transaction import Transaction
from awa.worker.context import AttemptControl, JobContext
from awa.worker.followups import insert_followups


class OwnedTransaction(Transaction):
    """The handler's transaction; only the runtime may end it."""

    async def commit(self) -> None:
        raise AwaError("a caller-owned transaction commits with the job's completion: "
                       "return from the handler instead")

    async def rollback(self) -> None:
        raise AwaError("a caller-owned transaction rolls back when the handler raises")


async def _keep(_conn: Conn) -> None:
    return None


async def run(handler: Callable[[Any], Awaitable[Any]], ctx: JobContext, job: Job,
              outcome_of: Callable[[Any, Job], Outcome], retention: timedelta) -> Outcome:
    """Run ``handler`` inside a transaction and complete ``job`` in it (see module doc).

    Returns the `Outcome`: ``completed`` with ``committed=True`` when the
    completion committed, ``lost`` when the lease was stale (nothing
    committed), or the handler's other outcome (its writes rolled back).
    Exceptions from the handler propagate after the rollback.
    """
    control = AttemptControl(ctx)
    db = control.db
    assert db is not None
    async with db.pool.acquire() as conn:
        tx = OwnedTransaction(conn, db.q, _keep, router=ctx.staging.router)
        raw = tx._tx  # the runtime starts and ends it; the handler only uses ``tx``
        finished = False

        async def end(commit: bool) -> None:
            nonlocal finished
            finished = True
            with translated():
                await (raw.commit() if commit else raw.rollback())

        with translated():
            await raw.start()
        control.lend_transaction(tx)
        try:
            outcome = outcome_of(await handler(ctx), job)
            staged = ctx.staging.seal() if outcome.kind == "completed" else []
            if outcome.kind != "completed" or ctx.staging.poison is not None:
                await end(commit=False)  # written the usual way, without the handler's rows
                return outcome
            if staged:
                await insert_followups(conn, db.q, staged, trigger_id=job.id)
            output = outcome.output_json if outcome.output_json is not None else ctx.output_json
            with translated():
                done = await conn.fetch(db.q["attempt_complete_batch"], [job.id],
                                        [job.run_lease], [output], retention,
                                        [job.receipt_slot])
                if not done and job.receipt_slot is not None:
                    # Moved to the mutable lane while this waited: finished there, by
                    # a statement that sees the move (Completer._complete_rows).
                    done = await conn.fetch(db.q["attempt_complete_batch"], [job.id],
                                            [job.run_lease], [output], retention, None)
            if not done:
                await end(commit=False)
                return Outcome("lost", error="run lease is stale: nothing committed")
            await end(commit=True)
            return Outcome("completed", output_json=output, committed=True)
        except BaseException:
            if not finished:
                try:
                    await raw.rollback()
                except Exception:
                    pass  # the connection is gone; the server rolled back
            raise
        finally:
            control.lend_transaction(None)
