"""Settings of the django-redislock demo.

Everything a demo writes lives in the folder of its port, ``var/<DEMO_PORT>/`` (default port
8000; ``DEMO_VAR_ROOT`` moves ``var/``, ``DEMO_VAR_DIR`` names the folder outright), so two demos
from one checkout never share a database, a beat schedule or a Redis.

Redis: ``REDIS_URL`` when set (``redis://host:port``; the demo uses databases 0 = cache,
1 = Celery broker, 2 = Celery results, 3 = locks), else the embedded server that ``run_demo.py``
started for that port (it writes its URL to ``var/<port>/redis.url`` while it runs, so
``manage.py`` in another terminal finds it; ``DEMO_PORT=8001 manage.py ...`` for the demo on
port 8001).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
DEMO_PORT = os.environ.get("DEMO_PORT") or "8000"
VAR_DIR = Path(
    os.environ.get("DEMO_VAR_DIR")
    or Path(os.environ.get("DEMO_VAR_ROOT") or BASE_DIR / "var") / DEMO_PORT
)


def _redis_server_url() -> str:
    url = os.environ.get("REDIS_URL", "").strip()
    if not url:
        url_file = VAR_DIR / "redis.url"
        if not url_file.exists():
            # Guessing 127.0.0.1:6379 would talk to some other Redis, or hang on none.
            raise ImproperlyConfigured(
                f"No demo is running with {VAR_DIR} (no redis.url there). Start one with "
                f"`make demo PORT={DEMO_PORT}`, set DEMO_PORT to the port of the demo you "
                "started, or set REDIS_URL=redis://host:port."
            )
        url = url_file.read_text().strip()
    # Keep scheme, credentials, host and port; the database number is chosen per use below.
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))


REDIS_URL = _redis_server_url()
VAR_DIR.mkdir(parents=True, exist_ok=True)  # only once a demo (or REDIS_URL) is known


def _redis_db(db: int) -> str:
    parts = urlsplit(REDIS_URL)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


SECRET_KEY = os.environ.get("DEMO_SECRET_KEY", "django-redislock-demo-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "demo.urls"
WSGI_APPLICATION = "demo.wsgi.application"
ASGI_APPLICATION = "demo.asgi.application"  # what `make demo` serves, with uvicorn
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
    "reports",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
        "NAME": VAR_DIR / "db.sqlite3",
        # Two worker processes and the web server write execution rows at the same time.
        "OPTIONS": {"timeout": 20},
    }
}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _redis_db(0),
        "KEY_PREFIX": "demo",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
    },
    # Locks get an alias and a database of their own: `cache.clear()` on "default" runs FLUSHDB
    # on its database, which would drop every held lock (and fencing counter) with the cache.
    "locks": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _redis_db(3),
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
    },
}

# CACHE: the dedicated alias above. Short leases so that a killed worker's lock visibly expires
# within seconds in the demo; production code would keep the default 30 s.
REDISLOCK = {"CACHE": "locks", "TIMEOUT": 10.0}

CELERY_BROKER_URL = _redis_db(1)
CELERY_RESULT_BACKEND = _redis_db(2)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_TRACK_STARTED = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = False

# How long the demo jobs take, and how often beat fires the inventory sync; the end-to-end test
# shortens them through the environment.
DEMO_REPORT_SECONDS = float(os.environ.get("DEMO_REPORT_SECONDS", "4"))
DEMO_SYNC_SECONDS = float(os.environ.get("DEMO_SYNC_SECONDS", "6"))
DEMO_SYNC_INTERVAL = float(os.environ.get("DEMO_SYNC_INTERVAL", "4"))

CELERY_BEAT_SCHEDULE = {
    # Fires every DEMO_SYNC_INTERVAL seconds but each run takes DEMO_SYNC_SECONDS: without the
    # single-flight lock two syncs would overlap; with it, a tick that finds one running is folded
    # into it (nothing is published).
    "inventory-sync": {"task": "reports.tasks.sync_inventory", "schedule": DEMO_SYNC_INTERVAL},
}

# `make demo` runs two beats: the leader sends the schedule, the other stands by and takes over
# within one lease (REDISLOCK["TIMEOUT"], 10 s here) after the leader stops. Both log which they
# are. A short loop interval: a standby reports "standing by" (and answers a remote-control ping)
# within a second instead of after a whole lease.
CELERY_BEAT_SCHEDULER = "django_redislock.celery.beat:LeaderScheduler"
CELERY_BEAT_MAX_LOOP_INTERVAL = 1.0

# Celery's worker and beat replace the root handler with their own, so log through the root only.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django_redislock": {"level": "INFO"},
        "reports": {"level": "INFO"},
        # Not a WARNING per 409 of the counter view: the demo's traffic gives up on purpose.
        "django.request": {"level": "ERROR"},
    },
}
