"""Maintenance: periodic services of one shape, run inside worker processes.

Every service has an interval, an optional leader gate and a ``run_once``
that tests can call directly. Fleet-wide work (promotion, rescue, cleanup)
runs only on the elected leader; heartbeats run in every process.
"""

from awa.maintenance.base import PeriodicService

__all__ = ["PeriodicService"]
