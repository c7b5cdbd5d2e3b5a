"""Pointing the lock cache at a test's own Redis, for pytest and for ``unittest`` alike.

A project's settings name the Redis its locks live on (``CACHES[REDISLOCK["CACHE"]]``); its tests
should use a private server instead (see :class:`~django_redislock.testing.RedisServer`), never
the developer's or CI's shared one. :func:`override_lock_cache` rewrites just the ``LOCATION``
of the lock aliases with Django's ``override_settings``, whose ``setting_changed`` signal makes
the package drop every client, key space and settings object it cached (and Django its cache
handlers), and cleans the package's namespace before and after.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django_redislock import stats
from django_redislock.connection import BUILTIN_BACKEND, DJANGO_REDIS_BACKEND, backend_kind
from django_redislock.testing.locks import flush_locks

__all__ = [
    "TEST_ALIAS",
    "clean_namespaces",
    "lock_cache_entry",
    "lock_cache_settings",
    "override_lock_cache",
]

#: The alias added to ``CACHES`` when the project's locks come from ``REDISLOCK["CLIENT"]``
#: (a callable the override cannot redirect): the locks use this cache alias instead.
TEST_ALIAS = "redislock-testing"

#: django-redis ``OPTIONS`` that pick another topology than one plain server (Sentinel, a custom
#: client or connection factory): dropped, since the test server is one plain server.
_TOPOLOGY_OPTIONS = frozenset(
    {"CLIENT_CLASS", "CONNECTION_FACTORY", "SENTINELS", "SENTINEL_KWARGS"}
)
#: Entries of a non-Redis ``CACHES`` entry that still mean something for the lock namespace.
_KEPT_OF_OTHER_BACKENDS = ("KEY_PREFIX", "VERSION")


def lock_cache_entry(original: Mapping[str, Any] | None, location: str) -> dict[str, Any]:
    """The ``CACHES`` entry a lock alias gets in tests: the project's own with ``location``.

    The backend, ``KEY_PREFIX`` (part of the lock namespace) and ``OPTIONS`` (timeouts,
    serializer...) are kept, so tests exercise the project's configuration; Sentinel/custom-client
    options are dropped. An alias that is not Redis-backed (a ``LocMemCache`` in test settings)
    becomes django-redis's ``RedisCache`` when installed, else Django's.
    """
    entry = dict(original or {})
    kind = backend_kind(entry.get("BACKEND"))
    if kind is None:
        entry = {key: entry[key] for key in _KEPT_OF_OTHER_BACKENDS if key in entry}
        has_django_redis = importlib.util.find_spec("django_redis") is not None
        entry["BACKEND"] = DJANGO_REDIS_BACKEND if has_django_redis else BUILTIN_BACKEND
    elif kind == "django-redis":
        options = dict(entry.get("OPTIONS") or {})
        entry["OPTIONS"] = {k: v for k, v in options.items() if k not in _TOPOLOGY_OPTIONS}
    entry["LOCATION"] = location
    return entry


def lock_cache_settings(
    url: str, *, extra_aliases: Sequence[str] = (), db: int = 0
) -> tuple[dict[str, Any], list[str]]:
    """The settings that put the locks on the Redis server ``url`` (``redis://host:port``), and
    the aliases they redirect: ``({"CACHES": ..., maybe "REDISLOCK": ...}, aliases)``.

    The lock aliases of ``REDISLOCK`` are redirected, and ``extra_aliases`` too (those your code
    passes as ``using=``/``lock_using=``). Alias number ``i`` gets database ``db + i``: Redlock's
    masters must not share keys. Settings a single test server cannot honour are neutralised:
    ``REDISLOCK["CLIENT"]`` is replaced by a cache alias (:data:`TEST_ALIAS`) on the server and
    ``REPLICAS`` by 0. Apply them with ``override_settings`` or pytest-django's ``settings``.
    """
    from django.conf import settings

    from django_redislock.conf import get_settings

    base = url.rstrip("/")
    raw = dict(getattr(settings, "REDISLOCK", None) or {})
    caches: dict[str, dict[str, Any]] = dict(getattr(settings, "CACHES", {}) or {})
    overrides: dict[str, Any] = {}
    lock_aliases = [TEST_ALIAS] if raw.get("CLIENT") else list(get_settings().caches)
    chosen = list(dict.fromkeys([*lock_aliases, *extra_aliases]))
    if raw.get("CLIENT") or raw.get("REPLICAS"):
        patched = {**raw, "REPLICAS": 0}
        patched.pop("CLIENT", None)
        if raw.get("CLIENT"):
            patched["CACHE"] = TEST_ALIAS
        overrides["REDISLOCK"] = patched
    for index, alias in enumerate(chosen):
        caches[alias] = lock_cache_entry(caches.get(alias), f"{base}/{db + index}")
    overrides["CACHES"] = caches
    return overrides, chosen


@contextlib.contextmanager
def override_lock_cache(
    url: str, *, extra_aliases: Sequence[str] = (), db: int = 0
) -> Iterator[list[str]]:
    """Within the block, the locks live on the Redis server ``url`` (``redis://host:port``).

    Applies :func:`lock_cache_settings` with ``override_settings``, flushes the namespace of every
    redirected alias on entry and on exit (:func:`~django_redislock.testing.flush_locks`), and
    writes pending statistics before the exit, so none reach the project's configured Redis
    later. Yields the redirected aliases. A context manager or a decorator, for ``unittest`` and
    Django ``TestCase`` tests; the pytest plugin's ``redislock`` fixture does the same with
    pytest-django's ``settings``.
    """
    from django.test.utils import override_settings

    overrides, aliases = lock_cache_settings(url, extra_aliases=extra_aliases, db=db)
    with override_settings(**overrides), clean_namespaces(aliases):
        yield aliases


@contextlib.contextmanager
def clean_namespaces(aliases: Sequence[str]) -> Iterator[None]:
    """Flush the namespaces of ``aliases`` on entry and on exit; write pending statistics
    before the exit (while the aliases still point where the test's locks were)."""
    for alias in aliases:
        flush_locks(alias)
    try:
        yield
    finally:
        stats.flush()
        for alias in aliases:
            flush_locks(alias)
