"""System checks: configuration mistakes surface in ``manage.py check``, not at the first lock.

Settings checks run on every ``manage.py`` call and never touch the network. The eviction-policy
check asks the server, so it is tagged ``deploy`` (``manage.py check --deploy``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import ERROR, CheckMessage, Error, Tags, Warning, register

from django_redislock.conf import DEFAULTS, validate_settings
from django_redislock.connection import (
    backend_kind,
    configured_socket_timeout,
    options_problems,
    shared_cache_aliases,
)

__all__ = ["check_cluster_client", "check_eviction_policy", "check_settings", "register_checks"]

_LOWER_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


def register_checks() -> None:
    """Called from ``AppConfig.ready``; registering twice is harmless (checks are a set)."""
    register(check_settings, Tags.caches)
    register(check_eviction_policy, Tags.caches, deploy=True)
    register(check_cluster_client, Tags.caches, deploy=True)


def _lock_aliases() -> list[str]:
    """The ``CACHES`` aliases the locks use (none when ``CLIENT`` replaces them)."""
    raw = getattr(settings, "REDISLOCK", None) or {}
    if not isinstance(raw, dict) or (raw.get("CLIENT") and "CACHE" not in raw):
        return []
    cache = raw.get("CACHE", DEFAULTS["CACHE"])
    aliases = list(cache) if isinstance(cache, (list, tuple)) else [cache]
    return [a for a in aliases if isinstance(a, str) and a]


def _client_messages(path: object) -> list[CheckMessage]:
    """``REDISLOCK["CLIENT"]`` must import and be callable (it is called at first use)."""
    if not isinstance(path, str) or "." not in path:
        return []  # reported by validate_settings (E011)
    from django.utils.module_loading import import_string

    try:
        factory = import_string(path)
    except ImportError as exc:
        return [
            Error(
                f"REDISLOCK['CLIENT'] is {path!r}, which cannot be imported: {exc}.",
                hint="Point it at a zero-argument callable returning a redis-py client.",
                id="django_redislock.E011",
            )
        ]
    if not callable(factory):
        return [
            Error(
                f"REDISLOCK['CLIENT'] is {path!r}, which is not callable.",
                hint="Point it at a zero-argument callable returning a redis-py client.",
                id="django_redislock.E011",
            )
        ]
    return []


def _backend_messages(alias: str, config: dict[str, Any]) -> list[CheckMessage]:
    """Spelling and timeout checks that know each backend's own OPTIONS spelling."""
    kind = backend_kind(config.get("BACKEND"))
    options = config.get("OPTIONS") or {}
    if kind is None:
        return [
            Error(
                f"CACHES[{alias!r}] uses {config.get('BACKEND')!r}, which is not Redis-backed.",
                hint="Use django_redis.cache.RedisCache or "
                "django.core.cache.backends.redis.RedisCache for the lock cache.",
                id="django_redislock.E009",
            )
        ]
    messages: list[CheckMessage] = [
        (Error if ident.startswith("E") else Warning)(
            message, hint=hint, id=f"django_redislock.{ident}"
        )
        for ident, message, hint in options_problems(alias, config)
    ]
    if kind == "builtin" and messages:
        return messages  # the timeout check below would read the misspelled keys
    if kind == "django-redis":
        lower = sorted(k for k in _LOWER_TIMEOUTS if k in options)
        if lower:
            messages.append(
                Warning(
                    f"CACHES[{alias!r}] (django-redis) has OPTIONS {', '.join(lower)}, which "
                    "django-redis ignores.",
                    hint="django-redis spells them in upper case: OPTIONS = "
                    "{'SOCKET_CONNECT_TIMEOUT': 2, 'SOCKET_TIMEOUT': 5}.",
                    id="django_redislock.W002",
                )
            )
    if configured_socket_timeout(config) is None:
        spelling = (
            "OPTIONS = {'SOCKET_CONNECT_TIMEOUT': 2, 'SOCKET_TIMEOUT': 5} (django-redis)"
            if kind == "django-redis"
            else "OPTIONS = {'socket_connect_timeout': 2, 'socket_timeout': 5} (Django's "
            "RedisCache)"
        )
        messages.append(
            Warning(
                f"CACHES[{alias!r}] sets no socket timeout and this redis-py applies none: if "
                "Redis hangs, lock calls hang with it.",
                hint=f"Set {spelling}.",
                id="django_redislock.W001",
            )
        )
    return messages


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "REDISLOCK", None)
    raw = {} if raw is None else raw
    messages: list[CheckMessage] = [
        Error(message, hint=hint or None, id=f"django_redislock.{ident}")
        for ident, message, hint in validate_settings(raw)
    ]
    if isinstance(raw, dict) and raw.get("CLIENT"):
        messages += _client_messages(raw["CLIENT"])
    caches = getattr(settings, "CACHES", {})
    for alias in _lock_aliases():
        if alias not in caches:
            messages.append(
                Error(
                    f"REDISLOCK['CACHE'] names {alias!r}, but CACHES has no such alias.",
                    hint=f"Add CACHES[{alias!r}] (django_redis.cache.RedisCache) or point "
                    f"REDISLOCK['CACHE'] at one of: {', '.join(caches) or 'none defined'}.",
                    id="django_redislock.E001",
                )
            )
        else:
            messages += _backend_messages(alias, caches[alias])
            messages += _shared_cache_messages(alias)
    return messages


def _shared_cache_messages(alias: str) -> list[CheckMessage]:
    """W005: the locks' database is also a cache's, so ``cache.clear()`` (``FLUSHDB``) drops
    every held lock; see :func:`~django_redislock.connection.shared_cache_aliases`."""
    shared = shared_cache_aliases(alias)
    if not shared:
        return []
    what = []
    if alias in shared:
        what.append("Django's default cache")
    others = [a for a in shared if a != alias]
    if others:
        names = ", ".join(f"CACHES[{a!r}]" for a in others)
        what.append(f"the Redis database of {names}")
    return [
        Warning(
            f"Locks are stored in CACHES[{alias!r}], which is also {' and '.join(what)}: "
            "cache.clear() there runs FLUSHDB and silently drops every held lock and fencing "
            "counter (a holder then finds its lock lost, and a second owner may take it).",
            hint="Give locks an alias and a database of their own, e.g. CACHES['locks'] = "
            "{'BACKEND': ..., 'LOCATION': 'redis://127.0.0.1:6379/1'} with REDISLOCK = "
            "{'CACHE': 'locks'}; or, if nothing ever clears that cache, silence this with "
            "SILENCED_SYSTEM_CHECKS = ['django_redislock.W005'].",
            id="django_redislock.W005",
        )
    ]


def _settings_broken() -> bool:
    """Whether the settings have an error (the server checks then have nothing to ask);
    warnings such as W005 do not stop them."""
    return any(m.level >= ERROR for m in check_settings())


def check_eviction_policy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn unless the lock server's ``maxmemory-policy`` is ``noeviction``.

    Every lock key has a TTL, so any ``allkeys-*`` *or* ``volatile-*`` policy may evict a held
    lock under memory pressure, and a second owner then acquires it. Read through ``INFO memory``
    (works where ``CONFIG`` is renamed or disabled); a server that cannot be asked is skipped.
    """
    if _settings_broken():
        return []
    from django_redislock.client import eviction_policy
    from django_redislock.runtime import get_client

    messages: list[CheckMessage] = []
    raw = getattr(settings, "REDISLOCK", None) or {}
    targets: list[tuple[str, str | None]] = [(alias, alias) for alias in _lock_aliases()]
    if isinstance(raw, dict) and raw.get("CLIENT"):
        targets.append(("REDISLOCK['CLIENT']", None))
    for label, alias in targets:
        try:
            policies = eviction_policy(get_client(alias))
        except Exception:  # unreachable or INFO refused: nothing to say about the policy
            continue
        for policy in policies:
            if policy == "noeviction":
                continue
            messages.append(
                Warning(
                    f"The Redis server of {label} has maxmemory-policy {policy!r}: under memory "
                    "pressure it may evict a held lock (every lock key has a TTL), and a second "
                    "owner would then acquire it.",
                    hint="Use maxmemory-policy noeviction on the lock server, or a dedicated "
                    "Redis for locks.",
                    id="django_redislock.W003",
                )
            )
            break
    return messages


def check_cluster_client(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Error when a lock cache points a plain client at a Redis Cluster node.

    A plain client can send a lock's script to a cluster node, which then answers ``MOVED`` or
    "Keys in request don't hash to the same slot" for every lock the node does not serve. Asks
    the server (``INFO cluster``), so it is tagged ``deploy`` like the eviction check; the
    first lock call names the same cause if the check was not run.
    """
    if _settings_broken():
        return []
    from django_redislock.connection import is_cluster
    from django_redislock.runtime import get_client

    messages: list[CheckMessage] = []
    for alias in _lock_aliases():
        try:
            client = get_client(alias)
            if is_cluster(client):
                continue
            enabled = int(client.info("cluster").get("cluster_enabled", 0))
        except Exception:  # unreachable or INFO refused: nothing to say
            continue
        if enabled:
            messages.append(
                Error(
                    f"CACHES[{alias!r}] points a plain Redis client at a Redis Cluster node: lock "
                    "scripts would be refused for every name the node does not serve.",
                    hint="Set REDISLOCK['CLIENT'] to the dotted path of a function returning a "
                    "redis.cluster.RedisCluster (see the docs: Beyond one Redis).",
                    id="django_redislock.E014",
                )
            )
    return messages
