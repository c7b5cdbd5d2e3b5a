"""Settings of the django-redislock demo.

Redis: ``REDIS_URL`` when set (``redis://host:port``; the demo uses databases 0 = cache and locks,
1 = Celery broker, 2 = Celery results), else the embedded server that ``run_demo.py`` started
(it writes its URL to ``var/redis.url`` while it runs, so ``manage.py`` in another terminal finds
it), else ``redis://127.0.0.1:6379``. Everything the demo writes lives under ``var/``
(``DEMO_VAR_DIR`` moves it; the end-to-end test points it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DEMO_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _redis_server_url() -> str:
    url = os.environ.get("REDIS_URL", "").strip()
    if not url:
        url_file = VAR_DIR / "redis.url"
        url = url_file.read_text().strip() if url_file.exists() else "redis://127.0.0.1:6379"
    # Keep scheme, credentials, host and port; the database number is chosen per use below.
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))


REDIS_URL = _redis_server_url()


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
    }
}

# Short leases so that a killed worker's lock visibly expires within seconds in the demo;
# production code would keep the default 30 s.
REDISLOCK = {"TIMEOUT": 10.0}

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

# Celery's worker and beat replace the root handler with their own, so log through the root only.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"django_redislock": {"level": "INFO"}, "reports": {"level": "INFO"}},
}
