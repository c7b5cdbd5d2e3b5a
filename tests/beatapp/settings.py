"""Settings of the beat test project: ``tests.settings`` plus what the environment asks for."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import CACHES, INSTALLED_APPS, LOGGING, REDIS_URL

#: Where beats record what they publish: the suite's own server, which stays up when a test
#: stops the locks' server.
RECORD_URL = f"{REDIS_URL}/0"

_lock_url = os.environ.get("REDISLOCK_TEST_LOCK_REDIS_URL")
if _lock_url:
    CACHES = {**CACHES, "default": {**CACHES["default"], "LOCATION": f"{_lock_url}/0"}}

if os.environ.get("REDISLOCK_TEST_DJANGO_CELERY_BEAT"):
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]

# State changes of the leader lease are logged at INFO; Celery's own handler prints them (no
# second console handler: every line would appear twice).
LOGGING = {**LOGGING, "loggers": {"django_redislock": {"level": "INFO"}}}
