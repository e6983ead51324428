"""Telemetry: a leaf the pipeline calls, importing nothing above the core.

`otel` holds the OpenTelemetry metrics and traces (every hook is a no-op until
`init_telemetry` or a configured global provider turns it on); `joblog` the
``awa.jobs`` log of each job's life.
"""

from awa.telemetry.otel import init_telemetry, shutdown_telemetry

__all__ = ["init_telemetry", "shutdown_telemetry"]
