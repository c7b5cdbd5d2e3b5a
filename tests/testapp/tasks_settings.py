"""Settings of the Django-tasks subprocesses (``db_worker``, the enqueuing client): the test
settings plus the ``django_tasks`` backport and its database backend, on a file-based SQLite
database (``REDISLOCK_TASKS_DB``) that every process shares."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks", "django_tasks_db"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["REDISLOCK_TASKS_DB"],
        # Workers take exclusive transactions to claim a row; wait for them rather than fail.
        "OPTIONS": {"timeout": 30},
    }
}

#: "parked" is consumed by no worker; "kill" only by the worker a test kills.
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "parked", "kill"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_redislock": {"handlers": ["console"], "level": "INFO"},
        "django_tasks_db": {"handlers": ["console"], "level": "INFO"},
    },
}
