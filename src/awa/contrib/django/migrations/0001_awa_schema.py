"""Awa's schema (its own awa schema, not Django tables), via Awa's migrations.

Each Awa release whose schema changes adds a migration here that runs the same
operation, so manage.py migrate keeps it current (AWA_SCHEMA_VERSION:
the Awa migration it brings the database to; a test checks it is the latest).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from awa.contrib.django.schema import migrate_for_connection

AWA_SCHEMA_VERSION = 19


class Migration(migrations.Migration):  # type: ignore[misc]
    # Awa's migrations run on their own connection and take their own lock.
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_for_connection, migrations.RunPython.noop, elidable=False),
    ]
