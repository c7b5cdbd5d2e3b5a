"""The Redis connection, the key layout, and every Redis command that is not in ``lua/``.

The connection comes from a ``CACHES`` alias so a project configures Redis once: django-redis
(through ``get_redis_connection``, so Sentinel and replication setups work) or Django's built-in
``RedisCache``. Nothing else in the package talks to Redis except through this module and
:mod:`django_redislock.scripts`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis import Redis
from redis import exceptions as redis_errors

from django_redislock.conf import get_settings
from django_redislock.exceptions import LockBackendError

__all__ = [
    "KeySpace",
    "LockRecord",
    "backend_errors",
    "blocking_pop",
    "get_client",
    "keyspace",
    "read_locks",
    "read_stats",
    "reset",
    "scan_keys",
    "write_stats",
]

_GLOB_SPECIALS = "\\*?[]"


def escape_glob(text: str) -> str:
    """Escape Redis glob characters so ``text`` only ever matches itself."""
    return "".join("\\" + c if c in _GLOB_SPECIALS else c for c in text)


@dataclass(frozen=True)
class KeySpace:
    """Key names of one namespace.

    Every key of one lock carries the lock name as its Redis Cluster hash tag (``{name}``) so each
    script touches one slot; the type segment comes *before* the tag so it cannot change the slot.
    """

    namespace: str

    def lock(self, name: str) -> str:
        return f"{self.namespace}:lock:{{{name}}}"

    def fence(self, name: str) -> str:
        return f"{self.namespace}:fence:{{{name}}}"

    def queue(self, name: str) -> str:
        return f"{self.namespace}:queue:{{{name}}}"

    def wake_prefix(self, name: str) -> str:
        return f"{self.namespace}:wake:{{{name}}}:"

    def stats(self, stats_name: str) -> str:
        return f"{self.namespace}:stats:{stats_name}"

    def stats_max(self, stats_name: str) -> str:
        # Not "<ns>:stats:..." so that a SCAN for stats hashes never meets it.
        return f"{self.namespace}:stats-max:{stats_name}"

    def lock_pattern(self, match: str | None = None) -> str:
        """SCAN pattern for lock keys; ``match`` is a glob on the lock *name* only.

        The namespace is escaped, so neither it nor the user's glob can reach keys outside
        ``<namespace>:lock:{...}``.
        """
        return f"{escape_glob(self.namespace)}:lock:{{{match or '*'}}}"

    def name_of(self, key: str) -> str:
        head = f"{self.namespace}:lock:{{"
        if not (key.startswith(head) and key.endswith("}")):
            raise ValueError(f"{key!r} is not a lock key of namespace {self.namespace!r}")
        return key[len(head) : -1]


@dataclass(frozen=True)
class LockRecord:
    """A lock's stored value plus its remaining lease (what ``GET`` + ``PTTL`` return)."""

    key: str
    owner: str
    count: int
    token: int
    acquired_at_ms: int
    meta: dict[str, Any]
    pttl_ms: int

    @classmethod
    def parse(cls, key: str, raw: bytes | str, pttl_ms: int) -> LockRecord:
        data = json.loads(raw)
        return cls(
            key=key,
            owner=data["o"],
            count=int(data["n"]),
            token=int(data["t"]),
            acquired_at_ms=int(data["at"]),
            meta=data.get("m") or {},
            pttl_ms=int(pttl_ms),
        )


_clients: dict[str, Redis] = {}
_keyspaces: dict[str, KeySpace] = {}
_clients_lock = threading.Lock()


def reset() -> None:
    """Forget cached clients and key layouts (settings changed)."""
    with _clients_lock:
        _clients.clear()
        _keyspaces.clear()


def _alias(using: str | None) -> str:
    return using or get_settings().cache


def get_client(using: str | None = None) -> Redis:
    """The redis-py client behind a ``CACHES`` alias (cached per process; pools are fork-safe)."""
    alias = _alias(using)
    client = _clients.get(alias)
    if client is not None:
        return client
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache as BuiltinRedisCache
    from django.core.exceptions import ImproperlyConfigured

    try:
        cache = caches[alias]
    except Exception as exc:
        raise ImproperlyConfigured(
            f"django_redislock: CACHES has no alias {alias!r} (REDISLOCK['CACHE'] / using=)."
        ) from exc
    if isinstance(cache, BuiltinRedisCache):
        client = cache._cache.get_client(write=True)
    elif hasattr(cache, "client") and hasattr(cache.client, "get_client"):
        from django_redis import get_redis_connection

        client = get_redis_connection(alias, write=True)
    else:
        raise ImproperlyConfigured(
            f"django_redislock: CACHES[{alias!r}] uses {type(cache).__module__}."
            f"{type(cache).__name__}, which is not Redis-backed. Use django_redis.cache.RedisCache "
            "or django.core.cache.backends.redis.RedisCache."
        )
    with _clients_lock:
        _clients[alias] = client
    return client


def cache_key_prefix(using: str | None = None) -> str:
    from django.conf import settings

    caches = cast(dict[str, dict[str, Any]], settings.CACHES)
    config = caches.get(_alias(using)) or {}
    return str(config.get("KEY_PREFIX") or "")


def keyspace(using: str | None = None) -> KeySpace:
    """Keys for the alias: ``<cache KEY_PREFIX>:<REDISLOCK KEY_PREFIX>`` (or the latter alone)."""
    alias = _alias(using)
    space = _keyspaces.get(alias)
    if space is None:
        own = get_settings().key_prefix
        site = cache_key_prefix(alias)
        space = _keyspaces[alias] = KeySpace(f"{site}:{own}" if site else own)
    return space


def socket_timeout(client: Redis) -> float | None:
    value = client.connection_pool.connection_kwargs.get("socket_timeout")
    return float(value) if value else None


@contextlib.contextmanager
def backend_errors(action: str) -> Iterator[None]:
    """Turn redis-py connection/timeout/server errors into :class:`LockBackendError`."""
    try:
        yield
    except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
        raise LockBackendError(
            f"Redis is unreachable while trying to {action}: {exc}. Check the CACHES LOCATION "
            "and that the server is up; the lock was not taken or changed by this call."
        ) from exc
    except redis_errors.RedisError as exc:
        raise LockBackendError(f"Redis answered an error while trying to {action}: {exc}") from exc


def blocking_pop(client: Redis, key: str, timeout: float) -> bytes | str | None:
    """``BLPOP`` one value, waiting at most ``timeout`` seconds (> 0); ``None`` on timeout."""
    result = client.blpop([key], timeout=timeout)
    return None if result is None else result[1]


def read_lock(client: Redis, key: str) -> LockRecord | None:
    return next(iter(read_locks(client, [key])), None)


def read_locks(client: Redis, keys: Sequence[str]) -> list[LockRecord]:
    """Records of the given lock keys in one round trip; vanished keys are skipped."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    values = pipe.execute()
    records = []
    for i, key in enumerate(keys):
        raw, pttl = values[2 * i], values[2 * i + 1]
        if raw is not None and pttl is not None and int(pttl) >= 0:
            records.append(LockRecord.parse(key, raw, int(pttl)))
    return records


def lock_exists(client: Redis, key: str) -> bool:
    return bool(client.exists(key))


def scan_keys(
    client: Redis, pattern: str, *, cursor: int = 0, count: int = 500
) -> tuple[int, list[str]]:
    """One ``SCAN`` step (never ``KEYS``): the next cursor (0 = done) and the keys it returned."""
    next_cursor, keys = client.scan(cursor=cursor, match=pattern, count=count)
    return int(next_cursor), [k.decode() if isinstance(k, bytes) else k for k in keys]


@dataclass(frozen=True)
class StatsUpdate:
    """Figures to add to one statistics hash (see :mod:`django_redislock.stats`)."""

    key: str
    max_key: str
    counters: dict[str, int]
    totals: dict[str, float]
    maxima: dict[str, float]


def write_stats(client: Redis, updates: Sequence[StatsUpdate], *, now: float, ttl: int) -> None:
    """Add figures to statistics hashes in one pipeline.

    Maxima use ``ZADD GT`` (an atomic "keep the larger", Redis >= 6.2); every touched key expires
    ``ttl`` seconds after its last update, which keeps memory bounded.
    """
    pipe = client.pipeline(transaction=False)
    for update in updates:
        for field_name, count in update.counters.items():
            pipe.hincrby(update.key, field_name, count)
        for field_name, total in update.totals.items():
            pipe.hincrbyfloat(update.key, field_name, total)
        pipe.hset(update.key, "updated_at", repr(now))
        pipe.expire(update.key, ttl)
        if update.maxima:
            pipe.zadd(update.max_key, update.maxima, gt=True)
            pipe.expire(update.max_key, ttl)
    pipe.execute()


def read_stats(
    client: Redis, keys: Sequence[tuple[str, str]]
) -> list[tuple[dict[Any, Any], list[tuple[Any, float]]]]:
    """``(hash, maxima)`` of each ``(stats key, max key)`` pair, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key, max_key in keys:
        pipe.hgetall(key)
        pipe.zrange(max_key, 0, -1, withscores=True)
    replies = pipe.execute()
    return [(replies[2 * i], replies[2 * i + 1]) for i in range(len(keys))]
