"""Settings of the test Django project; the database comes from ``$DATABASE_URL``."""

from __future__ import annotations

import importlib.util
import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))

SECRET_KEY = "awa-test-project"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.django_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
        # Lets the tests count this project's connections in pg_stat_activity.
        "OPTIONS": {"application_name": os.environ.get("APP_NAME", "awa-django-test")},
    },
}

INSTALLED_APPS = [
    # The backport's app (checks, logging); Django 6 has django.tasks built in.
    *(["django_tasks"] if importlib.util.find_spec("django.tasks") is None else []),
    "awa.contrib.django",
    "tests.django_project.shop",
]

TASKS = {
    "default": {
        "BACKEND": "awa.contrib.django.AwaBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            # One attempt: a raising task is FAILED at once, as Django's own backends do.
            "MAX_ATTEMPTS": 1,
            # start() options, and the queues served when awa_worker has no --queue.
            "WORKER": {"poll_interval_ms": 50,
                       "queues": [{"name": "default", "max_workers": 4},
                                  {"name": "emails", "max_workers": 2}]},
        },
    },
}

LOGGING_CONFIG = None
