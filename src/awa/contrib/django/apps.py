"""The Django app: the ``awa_worker`` and ``awa_migrate`` commands, and the
migration that creates Awa's schema on ``manage.py migrate``."""

from __future__ import annotations

from django.apps import AppConfig, apps


class AwaConfig(AppConfig):  # type: ignore[misc]
    """Awa's Django app (no models: Awa's tables live in their own schema)."""

    name = "awa.contrib.django"
    label = "awa"
    verbose_name = "Awa"

    def ready(self) -> None:
        from django.core import checks

        from awa.contrib.django.compat import SOURCE

        # Django 6 checks every task backend, and so does the backport's app when it
        # is installed; without it, nothing would report a non-PostgreSQL database.
        if SOURCE == "django_tasks" and not apps.is_installed("django_tasks"):
            from awa.contrib.django.checks import check_awa_backends

            checks.register(check_awa_backends)
