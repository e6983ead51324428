"""``manage.py awa_migrate``: create or upgrade Awa's schema in the task database."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import awa
from awa.contrib.django.management.commands._common import awa_backend
from awa.core.errors import AwaError


class Command(BaseCommand):  # type: ignore[misc]
    help = "Apply Awa's schema migrations to the task backend's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias of the Awa backend (default: default).")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = awa_backend(options["backend"])
        try:
            applied = asyncio.run(awa.migrate(backend.worker_database_url(),
                                              schema=backend.schema))
        except AwaError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"applied migrations {applied}" if applied
                          else "Awa schema is up to date")
