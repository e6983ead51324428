"""An outage is logged once per subsystem, not once per retry."""

from __future__ import annotations

import logging

import pytest

from awa.telemetry.failures import FailureLog


def test_first_failure_has_the_traceback_repeats_are_quiet_recovery_is_said(
        caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("awa.test_failures")
    failures = FailureLog(log, repeat_every=3600)
    caplog.set_level(logging.WARNING, logger="awa.test_failures")
    for i in range(50):
        try:
            raise ValueError(f"bad {i}")
        except ValueError as exc:
            failures.failed("claim from 'q'", exc)
    assert failures.failures("claim from 'q'") == 50
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None
    failures.ok("claim from 'q'")
    failures.ok("claim from 'q'")  # said once, not on every later success
    assert [r.getMessage() for r in caplog.records[1:]] == [
        "claim from 'q' works again (after 50 failures)"]
    assert failures.failures("claim from 'q'") == 0


def test_a_long_outage_is_reminded_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("awa.test_failures")
    failures = FailureLog(log, repeat_every=0)
    caplog.set_level(logging.WARNING, logger="awa.test_failures")
    failures.failed("promote pass", TimeoutError("slow"))
    failures.failed("promote pass", TimeoutError("slower"))
    assert caplog.records[1].getMessage() == "promote pass still failing (2 times): " \
                                            "TimeoutError('slower')"
    assert caplog.records[1].exc_info is None


def test_a_lost_database_is_one_line_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncpg

    from awa.core.errors import DatabaseError

    log = logging.getLogger("awa.test_failures")
    caplog.set_level(logging.WARNING, logger="awa.test_failures")
    lost: list[BaseException] = [
        ConnectionRefusedError(111, "Connect call failed"),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.InterfaceError("pool is closing"),
        # a statement on a connection the server ended between two statements
        asyncpg.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress")]
    wrapped = DatabaseError("ConnectionRefusedError: refused")
    wrapped.__cause__ = ConnectionRefusedError(111, "refused")
    for i, exc in enumerate([*lost, wrapped]):
        failures = FailureLog(log, repeat_every=3600)
        for _ in range(20):
            failures.failed(f"subsystem {i}", exc)
    assert len(caplog.records) == 6  # one line per subsystem, however many retries
    assert all(r.exc_info is None for r in caplog.records)
    assert all("the database is unreachable" in r.getMessage() for r in caplog.records)
    caplog.clear()
    FailureLog(log).failed("promote pass", TimeoutError("slow"))  # not a lost database
    assert caplog.records[0].exc_info is not None
