"""System checks: configuration mistakes surface in ``manage.py check``, not at the first lock."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.utils.module_loading import import_string

from django_redislock.conf import DEFAULTS, validate_settings

__all__ = ["check_settings"]

_REDIS_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


def _is_redis_backend(path: str) -> bool:
    try:
        backend = import_string(path)
    except ImportError:
        return False
    for candidate in _REDIS_BACKENDS:
        try:
            if issubclass(backend, import_string(candidate)):
                return True
        except ImportError:
            continue
    return False


def _has_socket_timeout(config: dict[str, Any]) -> bool:
    options = config.get("OPTIONS") or {}
    return any(options.get(k) for k in ("SOCKET_TIMEOUT", "socket_timeout"))


def register_checks() -> None:
    """Called from ``AppConfig.ready``; registering twice is harmless (checks are a set)."""
    register(check_settings)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "REDISLOCK", None)
    raw = {} if raw is None else raw
    messages: list[CheckMessage] = [
        Error(message, hint=hint or None, id=f"django_redislock.{ident}")
        for ident, message, hint in validate_settings(raw)
    ]
    if not isinstance(raw, dict):
        return messages
    alias = raw.get("CACHE", DEFAULTS["CACHE"])
    if not isinstance(alias, str) or not alias:
        return messages
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        messages.append(
            Error(
                f"REDISLOCK['CACHE'] is {alias!r}, but CACHES has no such alias.",
                hint=f"Add CACHES[{alias!r}] (django_redis.cache.RedisCache) or point "
                f"REDISLOCK['CACHE'] at one of: {', '.join(caches) or 'none defined'}.",
                id="django_redislock.E001",
            )
        )
        return messages
    backend = str(caches[alias].get("BACKEND", ""))
    if not _is_redis_backend(backend):
        messages.append(
            Error(
                f"CACHES[{alias!r}] uses {backend!r}, which is not Redis-backed.",
                hint="Use django_redis.cache.RedisCache or "
                "django.core.cache.backends.redis.RedisCache for the lock cache.",
                id="django_redislock.E009",
            )
        )
    elif not _has_socket_timeout(caches[alias]):
        messages.append(
            Warning(
                f"CACHES[{alias!r}] sets no socket timeout: "
                "if Redis hangs, lock calls hang with it.",
                hint="Set OPTIONS SOCKET_TIMEOUT (django-redis) or socket_timeout (Django's "
                "RedisCache), e.g. 5 seconds.",
                id="django_redislock.W001",
            )
        )
    return messages
