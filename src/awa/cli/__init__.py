"""The ``awa`` command line (also ``python -m awa``).

`root` holds the group (`main`) and the schema and worker commands; each
other module adds one noun's commands to it (jobs, queues and more, batch
operations, overrides, the web UI). Importing this package registers them all.
"""

from awa.cli import batch, jobs, operations, overrides, serve, workflow
from awa.cli.root import configure_logging, main

__all__ = ["batch", "configure_logging", "jobs", "main", "operations", "overrides", "serve",
           "workflow"]
