"""The ring's current slot is planned once per session, not per statement
(Awa migration 0033), via Awa's migrations."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from awa.contrib.django.schema import migrate_for_connection

AWA_SCHEMA_VERSION = 33


class Migration(migrations.Migration):  # type: ignore[misc]
    # Awa's migrations run on their own connection and take their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("awa", "0013_awa_just_left_receipts_wait")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_for_connection, migrations.RunPython.noop, elidable=False),
    ]
