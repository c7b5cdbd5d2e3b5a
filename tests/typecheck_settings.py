"""Settings for mypy's django-stubs plugin only (``[tool.django-stubs]`` in pyproject.toml).

The plugin imports the settings module to learn the installed apps and models. tests/settings.py
starts the suite's redis-server on import, and mypy ends with ``os._exit``, which skips the
atexit handler that stops it: every ``make type`` left a redis-server running. This module has
what the plugin reads and starts nothing.
"""

SECRET_KEY = "django-redislock-typecheck"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_redislock",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# Never connected to: type checking opens no connection.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:6379/0",
    }
}
# Settings the tests read (`settings.X`) that the suite's own settings define: tests/settings.py
# and tests/beatapp/settings.py. Their types are what the plugin learns here.
CELERY_BROKER_URL = "redis://127.0.0.1:6379/1"
RECORD_URL = "redis://127.0.0.1:6379/0"
