"""Django settings for the test-suite: real Redis, started on import if none is given."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_server import session_server

REDIS_URL = session_server()

SECRET_KEY = "django-redislock-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REDISLOCK_TEST_DB", str(Path(__file__).parent / "test.sqlite3")),
        "TEST": {"NAME": os.environ.get("REDISLOCK_TEST_DB_TEST")},
    }
}

STATIC_URL = "/static/"

_TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5}

#: The lock cache as users configure it. REDISLOCK_TEST_CACHE picks the flavour the whole suite
#: runs with (CI runs each): "options" (django-redis with timeouts, the default), "bare"
#: (django-redis without OPTIONS: redis-py's own defaults) or "builtin" (Django's RedisCache,
#: without OPTIONS).
_FLAVOURS: dict[str, dict[str, Any]] = {
    "options": {"BACKEND": "django_redis.cache.RedisCache", "OPTIONS": dict(_TIMEOUTS)},
    "bare": {"BACKEND": "django_redis.cache.RedisCache"},
    "builtin": {"BACKEND": "django.core.cache.backends.redis.RedisCache"},
}
CACHE_FLAVOUR = os.environ.get("REDISLOCK_TEST_CACHE", "options")

CACHES = {
    "default": {**_FLAVOURS[CACHE_FLAVOUR], "LOCATION": f"{REDIS_URL}/0"},
    # Same database, another site: its locks must be invisible to "default".
    "site2": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"{REDIS_URL}/0",
        "KEY_PREFIX": "site2",
        "OPTIONS": dict(_TIMEOUTS),
    },
    # Django's own Redis backend.
    "builtin": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{REDIS_URL}/0",
        "KEY_PREFIX": "builtin",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 5},
    },
    # What a new user writes: no OPTIONS at all (redis-py's defaults apply).
    "bare": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{REDIS_URL}/0"},
    "bare-builtin": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{REDIS_URL}/0",
    },
    # A small connection pool, for many threads of one process.
    "small-pool": {
        "BACKEND": "django_redis.cache.RedisCache",
        # Same database, another URL spelling: django-redis shares one pool per URL string, and
        # this pool must really be small (not "default"'s, whichever alias came first).
        "LOCATION": f"{REDIS_URL}?db=0",
        "OPTIONS": {**_TIMEOUTS, "CONNECTION_POOL_KWARGS": {"max_connections": 10}},
    },
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}

REDISLOCK: dict[str, object] = {}
# The suite's caches share one server and database on purpose (several flavours of one lock
# cache): W005 would print before every management command the tests run as a subprocess.
# tests/test_checks.py tests W005 itself (check_settings() reports silenced checks too).
SILENCED_SYSTEM_CHECKS = ["django_redislock.W005"]
#: REDISLOCK_TEST_TRANSPORT runs the suite on another transport (`make test-flavours`: "lean").
if os.environ.get("REDISLOCK_TEST_TRANSPORT"):
    REDISLOCK["TRANSPORT"] = os.environ["REDISLOCK_TEST_TRANSPORT"]
if os.environ.get("REDISLOCK_TEST_CLUSTER_NODES"):
    # A child process of a cluster test (a Celery worker): locks on the test's Redis Cluster.
    REDISLOCK = {"CLIENT": "tests.topology_clients.client"}

CELERY_BROKER_URL = f"{REDIS_URL}/1"
CELERY_RESULT_BACKEND = f"{REDIS_URL}/2"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_redislock": {"handlers": ["console"], "level": "WARNING"}},
}
