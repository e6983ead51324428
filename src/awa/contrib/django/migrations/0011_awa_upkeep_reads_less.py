"""The rest of the ring's upkeep reads less (Awa migration 0030), via Awa's
migrations."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from awa.contrib.django.schema import migrate_for_connection

AWA_SCHEMA_VERSION = 30


class Migration(migrations.Migration):  # type: ignore[misc]
    # Awa's migrations run on their own connection and take their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("awa", "0010_awa_reclaim_by_counts")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_for_connection, migrations.RunPython.noop, elidable=False),
    ]
