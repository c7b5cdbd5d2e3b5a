"""Every setting of django-redislock, read and validated in one place.

Settings come from ``settings.REDISLOCK`` (all keys optional). They are read lazily and cached;
the cache is dropped on Django's ``setting_changed`` signal so ``override_settings`` works in tests.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

__all__ = ["DEFAULTS", "LockSettings", "get_settings", "validate_settings"]

DEFAULTS: Mapping[str, Any] = {
    "CACHE": "default",
    "KEY_PREFIX": "redislock",
    "TIMEOUT": 30.0,
    "AUTO_RENEW": True,
    "BLOCKING_TIMEOUT": None,
    "STATS": True,
}


@dataclass(frozen=True)
class LockSettings:
    cache: str
    key_prefix: str
    timeout: float
    auto_renew: bool
    blocking_timeout: float | None
    stats: bool


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_settings(raw: object) -> list[tuple[str, str, str]]:
    """Return ``(id, message, hint)`` for every problem in a ``REDISLOCK`` value.

    Shared by :func:`get_settings` (which raises on the first problem) and the system checks (which
    report them all), so the two can never disagree.
    """
    if not isinstance(raw, Mapping):
        return [
            (
                "E002",
                f"REDISLOCK must be a dict, not {type(raw).__name__}.",
                "Set REDISLOCK = {...} or remove it to use the defaults.",
            )
        ]
    problems: list[tuple[str, str, str]] = []
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        problems.append(
            (
                "E003",
                f"Unknown REDISLOCK key(s): {', '.join(map(str, unknown))}.",
                f"Valid keys are {', '.join(DEFAULTS)}.",
            )
        )
    cache = raw.get("CACHE", DEFAULTS["CACHE"])
    if not isinstance(cache, str) or not cache:
        problems.append(
            (
                "E004",
                "REDISLOCK['CACHE'] must be a non-empty string (a CACHES alias).",
                "For example REDISLOCK = {'CACHE': 'default'}.",
            )
        )
    prefix = raw.get("KEY_PREFIX", DEFAULTS["KEY_PREFIX"])
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{}*?[]\\ \n"):
        problems.append(
            (
                "E005",
                "REDISLOCK['KEY_PREFIX'] must be a non-empty string without "
                "braces, glob characters or whitespace.",
                "Braces would break the Redis Cluster hash tag of every lock key.",
            )
        )
    timeout = raw.get("TIMEOUT", DEFAULTS["TIMEOUT"])
    if not _is_number(timeout) or timeout <= 0:
        problems.append(
            (
                "E006",
                f"REDISLOCK['TIMEOUT'] must be a positive number of seconds, not {timeout!r}.",
                "A lease of 10-60 seconds suits most jobs.",
            )
        )
    blocking = raw.get("BLOCKING_TIMEOUT", DEFAULTS["BLOCKING_TIMEOUT"])
    if blocking is not None and (not _is_number(blocking) or blocking < 0):
        problems.append(
            (
                "E007",
                f"REDISLOCK['BLOCKING_TIMEOUT'] must be None or a number >= 0, not {blocking!r}.",
                "None waits forever; 0 does not wait.",
            )
        )
    for key in ("AUTO_RENEW", "STATS"):
        if not isinstance(raw.get(key, DEFAULTS[key]), bool):
            problems.append(("E008", f"REDISLOCK['{key}'] must be True or False.", ""))
    return problems


@functools.lru_cache(maxsize=1)
def get_settings() -> LockSettings:
    """The validated settings; raises ``ImproperlyConfigured`` on the first problem."""
    from django.core.exceptions import ImproperlyConfigured

    raw = getattr(settings, "REDISLOCK", None)
    raw = {} if raw is None else raw
    problems = validate_settings(raw)
    if problems:
        ident, message, hint = problems[0]
        raise ImproperlyConfigured(f"django_redislock.{ident}: {message} {hint}".strip())
    merged = {**DEFAULTS, **raw}
    blocking = merged["BLOCKING_TIMEOUT"]
    return LockSettings(
        cache=merged["CACHE"],
        key_prefix=merged["KEY_PREFIX"],
        timeout=float(merged["TIMEOUT"]),
        auto_renew=merged["AUTO_RENEW"],
        blocking_timeout=None if blocking is None else float(blocking),
        stats=merged["STATS"],
    )


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: object) -> None:
    if setting in ("REDISLOCK", "CACHES"):
        get_settings.cache_clear()
        from django_redislock import client

        client.reset()
