"""``manage.py awa_worker``: run the Awa backend's tasks until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from awa.cli import configure_logging
from awa.cli.shutdown import exit_now
from awa.contrib.django.backend import schema_missing
from awa.contrib.django.management.commands._common import awa_backend
from awa.contrib.django.worker import log, serve
from awa.core.errors import AwaError


def parse_queue(spec: str) -> tuple[str, int]:
    """``NAME=N`` → ``(NAME, N)``."""
    name, _, count = spec.rpartition("=")
    if not name or not count.isdigit() or int(count) < 1:
        raise CommandError(f"--queue {spec!r} is not NAME=N (N >= 1)")
    return name, int(count)


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Run an Awa worker for the task backend: serves its QUEUES (or --queue) and "
            "runs the task functions; SIGTERM lets running tasks finish, then exits.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias of the Awa backend (default: default).")
        parser.add_argument("--queue", action="append", default=[], metavar="NAME=N",
                            help="Serve queue NAME with N concurrent tasks (repeatable; "
                                 "default: every queue in QUEUES, 10 each).")
        parser.add_argument("--log-level", default="INFO",
                            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                            type=str.upper, help="Retries log at WARNING, failures at ERROR.")
        parser.add_argument("--log-format", default="text", choices=["text", "json"])
        parser.add_argument("--shutdown-timeout-ms", type=int, default=5000,
                            help="How long running tasks get to finish on SIGTERM.")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = awa_backend(options["backend"])
        queues = [parse_queue(q) for q in options["queue"]] or None
        configure_logging(options["log_level"], options["log_format"])
        try:
            left = asyncio.run(serve(backend, queues,
                                     shutdown_timeout_ms=options["shutdown_timeout_ms"]))
        except (AwaError, ValueError, TypeError) as exc:
            missing = schema_missing(exc, backend.schema, backend.alias)
            raise CommandError(str(missing or exc)) from exc
        finally:
            connections.close_all()
        if left:
            # Outcomes of tasks that finished in time are written; these did not, and
            # a thread cannot be stopped: exit instead of waiting for them.
            log.warning("exiting with %d sync task(s) still running past the shutdown "
                        "timeout; rescue retries their jobs (or fails them on their last "
                        "attempt)", left)
            exit_now(0)
