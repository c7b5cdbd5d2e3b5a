"""Every setting of django-redislock, read and validated in one place.

Settings come from ``settings.REDISLOCK`` (all keys optional). They are read lazily and cached;
the cache is dropped on Django's ``setting_changed`` signal so ``override_settings`` works in tests.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

__all__ = [
    "DEFAULTS",
    "MAX_SECONDS",
    "MIN_LEASE",
    "LockSettings",
    "check_seconds",
    "get_settings",
    "not_installed_problem",
    "suggest",
    "validate_settings",
]

#: Shortest lease: Redis expires keys with millisecond resolution.
MIN_LEASE = 0.001
#: Longest lease or wait (about 31.7 years): Redis accepts it as a ``PX`` value, the watchdog and
#: ``threading`` accept it as a wait, and milliseconds stay exact in Lua's doubles.
MAX_SECONDS = 1e9

DEFAULTS: Mapping[str, Any] = {
    "CACHE": "default",
    "KEY_PREFIX": "redislock",
    "TIMEOUT": 30.0,
    "AUTO_RENEW": True,
    "BLOCKING_TIMEOUT": None,
    "STATS": True,
    "CLIENT": None,
    "REPLICAS": 0,
    "REPLICAS_TIMEOUT": 1.0,
    "DURABILITY": None,
    "TRANSPORT": "redis-py",
    "FUNCTIONS": True,
}

#: The transports: how scripts reach Redis (see ``transport.py``). Both use redis-py's public
#: API only; "lean" keeps a connection per thread (opt-in: connections grow with threads).
TRANSPORTS = ("redis-py", "lean")


@dataclass(frozen=True)
class LockSettings:
    #: The ``CACHES`` alias (the first one when ``CACHE`` is a list).
    cache: str
    key_prefix: str
    timeout: float
    auto_renew: bool
    blocking_timeout: float | None
    stats: bool
    #: Every alias of ``CACHE``: more than one means independent masters (Redlock).
    caches: tuple[str, ...] = ()
    #: Dotted path of a zero-argument callable returning a redis-py client (instead of CACHE).
    client: str | None = None
    #: Replicas that must acknowledge an acquisition or renewal (``WAIT``), and for how long.
    replicas: int = 0
    replicas_timeout: float = 1.0
    #: ``WAITAOF``: 1 when the primary must have fsynced the write to its append-only file, and
    #: how many replicas must have (``DURABILITY``'s ``aof_local`` / ``aof_replicas``).
    aof_local: int = 0
    aof_replicas: int = 0
    #: How scripts reach Redis (``TRANSPORTS``).
    transport: str = "redis-py"
    #: Run the scripts as a Redis Functions library where the server has Functions (``FCALL``),
    #: else ``EVALSHA``; False: always ``EVALSHA``.
    functions: bool = True


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds_problem(value: object, *, minimum: float) -> tuple[type[Exception], str] | None:
    """Why ``value`` is not a number of seconds in ``[minimum, MAX_SECONDS]``, or ``None``."""
    if not _is_number(value):
        return TypeError, f"must be a number of seconds (int or float), not {type(value).__name__}"
    number = float(value)  # type: ignore[arg-type]
    if number != number or number in (float("inf"), float("-inf")):
        return ValueError, f"must be a finite number of seconds, not {value!r}"
    if not minimum <= number <= MAX_SECONDS:
        return ValueError, f"must be between {minimum:g} and {MAX_SECONDS:g} seconds, not {value!r}"
    return None


def check_seconds(
    value: object, what: str, *, minimum: float = 0.0, allow_none: bool = False
) -> float | None:
    """Validate a duration argument once, where it is given (``Lock(...)``, decorator, task).

    ``None`` passes through when ``allow_none`` (it means "the settings default" or "for ever");
    ``bool``, strings and other types raise ``TypeError``; NaN, infinities and values outside
    ``[minimum, MAX_SECONDS]`` raise ``ValueError`` naming the allowed range. Nothing invalid ever
    reaches Redis (which would answer "invalid expire time") or the watchdog.
    """
    kind = type(value)
    if (kind is float or kind is int) and minimum <= value <= MAX_SECONDS:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]  # the usual case (NaN fails the compare)
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{what} must be a number of seconds, not None")
    problem = _seconds_problem(value, minimum=minimum)
    if problem is not None:
        error, message = problem
        hint = " (use None to wait for ever)" if "blocking" in what else ""
        raise error(f"{what} {message}{hint}")
    return float(value)  # type: ignore[arg-type]


def suggest(word: object, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to a mistyped ``word`` (case-insensitive), or ``None``."""
    if not isinstance(word, str):
        return None
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.75)
    return by_lower[close[0]] if close else None


def _with_suggestion(key: object) -> str:
    match = suggest(key, DEFAULTS)
    return f"{key} (did you mean {match}?)" if match else str(key)


#: The keys of ``REDISLOCK["DURABILITY"]`` and their upper bounds (``timeout``: seconds).
DURABILITY_KEYS = {"replicas": 100, "aof_local": 1, "aof_replicas": 100, "timeout": None}


def _durability_problems(raw: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``DURABILITY``: ``None`` or a dict of :data:`DURABILITY_KEYS`; not with ``REPLICAS``."""
    value = raw.get("DURABILITY")
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [
            (
                "E016",
                f"REDISLOCK['DURABILITY'] must be None or a dict, not {type(value).__name__}.",
                "For example {'replicas': 1, 'aof_local': 1, 'aof_replicas': 1, 'timeout': 1.0}.",
            )
        ]
    problems = []
    unknown = sorted(set(map(str, value)) - set(DURABILITY_KEYS))
    if unknown:
        problems.append(
            (
                "E016",
                f"REDISLOCK['DURABILITY'] has unknown keys {unknown}: it takes "
                f"{', '.join(DURABILITY_KEYS)}.",
                "",
            )
        )
    for key, most in DURABILITY_KEYS.items():
        if key not in value:
            continue
        number = value[key]
        if most is None:
            problem = _seconds_problem(number, minimum=MIN_LEASE)
            if problem is not None:
                problems.append(("E016", f"REDISLOCK['DURABILITY']['timeout'] {problem[1]}.", ""))
        elif isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= most:
            problems.append(
                (
                    "E016",
                    f"REDISLOCK['DURABILITY'][{key!r}] must be an int from 0 to {most}, not "
                    f"{number!r}.",
                    "",
                )
            )
    if "REPLICAS" in raw or "REPLICAS_TIMEOUT" in raw:
        problems.append(
            (
                "E017",
                "REDISLOCK sets both DURABILITY and REPLICAS/REPLICAS_TIMEOUT.",
                "REPLICAS and REPLICAS_TIMEOUT are shorthands for DURABILITY's 'replicas' and "
                "'timeout': keep one of the two.",
            )
        )
    return problems


def _durability(merged: Mapping[str, Any]) -> dict[str, Any]:
    """The durability fields of :class:`LockSettings`, from ``DURABILITY`` or its shorthands."""
    durability = merged.get("DURABILITY")
    if durability is None:
        return {
            "replicas": merged["REPLICAS"],
            "replicas_timeout": float(merged["REPLICAS_TIMEOUT"]),
        }
    return {
        "replicas": int(durability.get("replicas", 0)),
        "replicas_timeout": float(durability.get("timeout", DEFAULTS["REPLICAS_TIMEOUT"])),
        "aof_local": int(durability.get("aof_local", 0)),
        "aof_replicas": int(durability.get("aof_replicas", 0)),
    }


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
    unknown = sorted(set(raw) - set(DEFAULTS), key=str)
    if unknown:
        problems.append(
            (
                "E003",
                f"Unknown REDISLOCK key(s): {', '.join(map(_with_suggestion, unknown))}.",
                f"Valid keys are {', '.join(DEFAULTS)}.",
            )
        )
    cache = raw.get("CACHE", DEFAULTS["CACHE"])
    aliases = list(cache) if isinstance(cache, (list, tuple)) else [cache]
    if (
        not aliases
        or not all(isinstance(a, str) and a for a in aliases)
        or len(set(aliases)) != len(aliases)
    ):
        problems.append(
            (
                "E004",
                "REDISLOCK['CACHE'] must be a CACHES alias, or a list of distinct aliases of "
                "independent Redis masters (Redlock).",
                "For example REDISLOCK = {'CACHE': 'default'} or {'CACHE': ['a', 'b', 'c']}.",
            )
        )
    client = raw.get("CLIENT", DEFAULTS["CLIENT"])
    if client is not None and (not isinstance(client, str) or "." not in client):
        problems.append(
            (
                "E011",
                f"REDISLOCK['CLIENT'] must be a dotted path to a callable, not {client!r}.",
                "For example 'myproject.redis.lock_client', returning a redis-py client.",
            )
        )
    problems += _durability_problems(raw)
    replicas = raw.get("REPLICAS", DEFAULTS["REPLICAS"])
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= 100:
        problems.append(
            ("E012", f"REDISLOCK['REPLICAS'] must be an int from 0 to 100, not {replicas!r}.", "")
        )
    replicas_timeout = raw.get("REPLICAS_TIMEOUT", DEFAULTS["REPLICAS_TIMEOUT"])
    problem = _seconds_problem(replicas_timeout, minimum=MIN_LEASE)
    if problem is not None:
        problems.append(("E013", f"REDISLOCK['REPLICAS_TIMEOUT'] {problem[1]}.", ""))
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
    problem = _seconds_problem(timeout, minimum=MIN_LEASE)
    if problem is not None:
        problems.append(
            (
                "E006",
                f"REDISLOCK['TIMEOUT'] {problem[1]}.",
                "A lease of 10-60 seconds suits most jobs.",
            )
        )
    blocking = raw.get("BLOCKING_TIMEOUT", DEFAULTS["BLOCKING_TIMEOUT"])
    problem = None if blocking is None else _seconds_problem(blocking, minimum=0.0)
    if problem is not None:
        problems.append(
            (
                "E007",
                f"REDISLOCK['BLOCKING_TIMEOUT'] must be None or a number of seconds: it "
                f"{problem[1]}.",
                "None waits forever; 0 does not wait.",
            )
        )
    transport = raw.get("TRANSPORT", DEFAULTS["TRANSPORT"])
    if transport not in TRANSPORTS:
        problems.append(
            (
                "E015",
                f"REDISLOCK['TRANSPORT'] must be one of {', '.join(map(repr, TRANSPORTS))}, not "
                f"{transport!r}.",
                "Leave it out for the default ('redis-py'), or 'lean' for a connection kept "
                "per thread.",
            )
        )
    for key in ("AUTO_RENEW", "STATS", "FUNCTIONS"):
        if not isinstance(raw.get(key, DEFAULTS[key]), bool):
            problems.append(("E008", f"REDISLOCK['{key}'] must be True or False.", ""))
    return problems


def not_installed_problem() -> str | None:
    """Why the package cannot be used as configured when ``django_redislock`` is missing from
    ``INSTALLED_APPS`` (``None`` when it is there, or before the app registry is populated).

    Without the app nothing wires the package up: no system checks, no ``manage.py redislock``,
    no admin pages, and no Celery receivers (a revoked task would keep its key until its lease
    ran out). Locks used like that would seem to work, so the first use says so instead.
    """
    from django.apps import apps

    if not apps.apps_ready or apps.is_installed("django_redislock"):
        return None
    return (
        "django_redislock is not in INSTALLED_APPS: add 'django_redislock' to INSTALLED_APPS. "
        "The app wires up its system checks, the `manage.py redislock` command, the admin pages "
        "and the Celery receivers that free the lock of a revoked task."
    )


@functools.lru_cache(maxsize=1)
def get_settings() -> LockSettings:
    """The validated settings; raises ``ImproperlyConfigured`` on the first problem, and when
    ``django_redislock`` is not in ``INSTALLED_APPS`` (see :func:`not_installed_problem`)."""
    from django.core.exceptions import ImproperlyConfigured

    missing = not_installed_problem()
    if missing is not None:
        raise ImproperlyConfigured(missing)
    raw = getattr(settings, "REDISLOCK", None)
    raw = {} if raw is None else raw
    problems = validate_settings(raw)
    if problems:
        ident, message, hint = problems[0]
        raise ImproperlyConfigured(f"django_redislock.{ident}: {message} {hint}".strip())
    merged = {**DEFAULTS, **raw}
    blocking = merged["BLOCKING_TIMEOUT"]
    cache = merged["CACHE"]
    caches = tuple(cache) if isinstance(cache, (list, tuple)) else (cache,)
    return LockSettings(
        cache=caches[0],
        caches=caches,
        client=merged["CLIENT"],
        **_durability(merged),
        key_prefix=merged["KEY_PREFIX"],
        timeout=float(merged["TIMEOUT"]),
        auto_renew=merged["AUTO_RENEW"],
        blocking_timeout=None if blocking is None else float(blocking),
        stats=merged["STATS"],
        transport=merged["TRANSPORT"],
        functions=merged["FUNCTIONS"],
    )


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: object) -> None:
    if setting in ("REDISLOCK", "CACHES", "INSTALLED_APPS"):
        get_settings.cache_clear()
