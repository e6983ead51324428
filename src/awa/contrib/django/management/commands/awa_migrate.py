"""``manage.py awa_migrate``: create or upgrade Awa's schema in the task database.

``manage.py migrate`` does the same through this app's migrations; this command
serves projects that migrate Awa apart, and backends with ``DATABASE_URL``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa.contrib.django.management.commands._common import awa_backend
from awa.contrib.django.schema import run_awa_migrations
from awa.core.errors import AwaError


class Command(BaseCommand):  # type: ignore[misc]
    help = "Apply Awa's schema migrations to the task backend's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias of the Awa backend (default: default).")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = awa_backend(options["backend"])
        try:
            applied = run_awa_migrations(backend.worker_database_url(), backend.schema)
        except AwaError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"applied migrations {applied}" if applied
                          else "Awa schema is up to date")
