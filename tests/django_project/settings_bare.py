"""The test project without its app: no installed app has a ``tasks`` module, so
the worker starts knowing no task (they live in ``tests.django_project.djtasks``)."""

from __future__ import annotations

from tests.django_project.settings import *  # noqa: F403
from tests.django_project.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tests.django_project.shop"]
