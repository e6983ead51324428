"""The test project without its app: no installed app has a ``tasks`` module, so
the worker starts knowing no task (they live in ``tests.django_project.djtasks``).
``$AWA_TEST_WORKER_OPTIONS`` (JSON) adds `start()` options, e.g. fast rescue."""

from __future__ import annotations

import json
import os

from tests.django_project.settings import *  # noqa: F403
from tests.django_project.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tests.django_project.shop"]

_options = TASKS["default"]["OPTIONS"]
TASKS = {"default": {**TASKS["default"], "OPTIONS": {
    **_options,
    "WORKER": {**_options["WORKER"], **json.loads(os.environ.get("AWA_TEST_WORKER_OPTIONS", "{}"))},
}}}
