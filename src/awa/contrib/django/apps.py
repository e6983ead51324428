"""The Django app: provides the ``awa_worker`` and ``awa_migrate`` commands."""

from __future__ import annotations

from django.apps import AppConfig


class AwaConfig(AppConfig):  # type: ignore[misc]
    """Awa's Django app (no models: Awa's tables live in their own schema)."""

    name = "awa.contrib.django"
    label = "awa"
    verbose_name = "Awa"
