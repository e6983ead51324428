"""Finished jobs listed by kind or queue through a bloom index (Awa migration
0027), via Awa's migrations."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from awa.contrib.django.schema import migrate_for_connection

AWA_SCHEMA_VERSION = 27


class Migration(migrations.Migration):  # type: ignore[misc]
    # Awa's migrations run on their own connection and take their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("awa", "0007_awa_reclaim_beside_readers")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_for_connection, migrations.RunPython.noop, elidable=False),
    ]
