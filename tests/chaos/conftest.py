"""Fixtures of the chaos suite: a private PostgreSQL cluster for the restart scenarios."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.chaos.pgcluster import PrivateCluster


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[PrivateCluster]:
    """A throw-away cluster (never the shared server): restarted by the tests."""
    cluster = PrivateCluster().init()
    try:
        yield cluster
    finally:
        cluster.destroy()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: the chaos suite (tests/chaos); "
                            "AWA_CHAOS_JOBS sets the jobs per scenario")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per chaos scenario run: jobs, recovery, throughput, violations."""
    from tests.chaos.harness import REPORTS

    if REPORTS:
        terminalreporter.section("chaos scenarios")
        for report in REPORTS:
            terminalreporter.write_line(report.line())
