"""The state machine is one table in `awa.core.states`; the sets are read off it."""

from __future__ import annotations

import asyncpg

from awa.core import states
from awa.core.states import JobState as S


def test_every_state_has_a_row() -> None:
    assert set(states.TRANSITIONS) == set(S)


def test_sets_derived_from_the_table_match_the_spec() -> None:
    assert states.TERMINAL == {S.Completed, S.Failed, S.Cancelled}
    assert states.ACTIVE == {S.Scheduled, S.Available, S.Running, S.Retryable, S.WaitingExternal}
    assert states.QUEUED == {S.Scheduled, S.Available, S.Retryable}
    assert states.RETRYABLE_BY_ADMIN == {S.Failed, S.Cancelled, S.WaitingExternal}


def test_spec_transitions_are_allowed_and_others_are_not() -> None:
    allowed = [(S.Scheduled, S.Available), (S.Retryable, S.Available), (S.Available, S.Running),
               (S.Running, S.Completed), (S.Running, S.Retryable), (S.Running, S.Failed),
               (S.Running, S.Scheduled), (S.Running, S.Cancelled),
               (S.Running, S.WaitingExternal), (S.WaitingExternal, S.Running),
               (S.WaitingExternal, S.Completed), (S.WaitingExternal, S.Available)]
    assert all(states.can_transition(a, b) for a, b in allowed)
    assert not states.can_transition(S.Completed, S.Available, admin=True)
    assert not states.can_transition(S.Failed, S.Available)
    assert states.can_transition(S.Failed, S.Available, admin=True)
    assert not states.can_transition(S.Available, S.Completed)  # never without running
    for terminal in states.TERMINAL:
        assert not any(states.can_transition(terminal, t) for t in S)


def test_every_callback_timeout_default_reads_the_constant() -> None:
    """The default callback timeout is written once, in `states.CALLBACK_TIMEOUT`."""
    import inspect

    from awa import bridge
    from awa.admin.ops import AdminOps
    from awa.core import callback_contract
    from awa.testing import HandlerJob
    from awa.worker.context import JobContext

    default = states.CALLBACK_TIMEOUT.total_seconds()
    functions = [AdminOps.heartbeat_callback,
                 JobContext.register_callback, HandlerJob.register_callback,
                 bridge.heartbeat_callback_in, bridge.heartbeat_callback_in_sync]
    for function in functions:
        parameter = inspect.signature(function).parameters["timeout_seconds"]
        assert parameter.default == default, function
    assert callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS == default


def test_retry_delay_is_the_documented_formula() -> None:
    delay = states.retry_delay
    assert delay(1, 0.0).total_seconds() == 2 and delay(1, 0.999).total_seconds() < 2.5
    assert delay(10, 0.5).total_seconds() == 1024 * 1.125
    assert delay(16, 0.999) < states.BACKOFF_CAP == delay(17, 0.0) == delay(10_000, 0.5)


async def test_retry_delay_agrees_with_the_database_function(conn: asyncpg.Connection) -> None:
    """`states.retry_delay` and the SQL function ``awa.retry_delay`` that every
    retry uses compute the same delay: seeded alike, the SQL's ``random()`` is
    the jitter given to the Python one."""
    for attempt in (*range(0, 20), 25, 30, 31, 100, 2**31 - 1):
        for seed in (0.0, 0.25, -0.5, 0.9):
            await conn.execute("SELECT setseed($1)", seed)
            jitter = await conn.fetchval("SELECT random()")
            await conn.execute("SELECT setseed($1)", seed)
            sql = await conn.fetchval("SELECT extract(epoch FROM awa.retry_delay($1))", attempt)
            python = states.retry_delay(attempt, jitter).total_seconds()
            assert abs(float(sql) - python) < 1e-5, (attempt, seed, sql, python)
