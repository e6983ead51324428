"""The state machine is one table in `awa.core.states`; the sets are read off it."""

from __future__ import annotations

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

    from awa.admin.ops import AdminOps
    from awa.core import callback_contract
    from awa.enqueue import bridge
    from awa.testing import HandlerJob
    from awa.worker import callbacks
    from awa.worker.context import JobContext

    default = states.CALLBACK_TIMEOUT.total_seconds()
    functions = [AdminOps.heartbeat_callback, callbacks.heartbeat_callback,
                 JobContext.register_callback, HandlerJob.register_callback,
                 bridge.heartbeat_callback_in, bridge.heartbeat_callback_in_sync]
    for function in functions:
        parameter = inspect.signature(function).parameters["timeout_seconds"]
        assert parameter.default == default, function
    assert callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS == default
