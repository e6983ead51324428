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
            raise ConnectionError(f"down {i}")
        except ConnectionError as exc:
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
