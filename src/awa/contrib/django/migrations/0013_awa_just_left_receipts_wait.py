"""The receipts of the slot just left wait without a count while its ready rows are there
(Awa migration 0032), via Awa's migrations."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from awa.contrib.django.schema import migrate_for_connection

AWA_SCHEMA_VERSION = 32


class Migration(migrations.Migration):  # type: ignore[misc]
    # Awa's migrations run on their own connection and take their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("awa", "0012_awa_reclaim_counts_once")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_for_connection, migrations.RunPython.noop, elidable=False),
    ]
