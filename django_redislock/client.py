"""Every Redis command the package sends that is not in ``lua/``.

Reads for listings (``GET`` + ``PTTL`` pipelines, ``SCAN``), the statistics pipelines, and the
blocking pop a waiter waits on. The client comes from :mod:`django_redislock.connection`, key
names from :mod:`django_redislock.keys`, parsing from :mod:`django_redislock.records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from django_redislock.records import LockRecord, parse_record

__all__ = [
    "StatsUpdate",
    "alock_exists",
    "aread_lock",
    "blocking_pop",
    "eviction_policy",
    "lock_exists",
    "read_beat_state",
    "read_lock",
    "read_locks",
    "read_stats",
    "scan_keys",
    "write_beat_state",
    "write_stats",
]


def blocking_pop(client: Any, key: str, timeout: float) -> bytes | str | None:
    """``BLPOP`` one value, waiting at most ``timeout`` seconds (> 0); ``None`` on timeout."""
    result = client.blpop([key], timeout=timeout)
    return None if result is None else result[1]


def read_lock(client: Any, key: str) -> LockRecord | None:
    return next(iter(read_locks(client, [key])), None)


def _queue_reads(pipe: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    return pipe


def _parse_reads(keys: Sequence[str], values: Sequence[Any]) -> list[LockRecord]:
    records = []
    for i, key in enumerate(keys):
        raw, pttl = values[2 * i], values[2 * i + 1]
        if isinstance(pttl, Exception):
            raise pttl
        if isinstance(raw, ResponseError):  # not a string (WRONGTYPE): not one of our records
            raw = f"<{str(raw).split(' ', 1)[0]}: not a string value>"
        if raw is not None and pttl is not None and int(pttl) != -2:
            records.append(parse_record(key, raw, int(pttl)))
    return records


def read_locks(client: Any, keys: Sequence[str]) -> list[LockRecord]:
    """Records of the given lock keys in one round trip; vanished keys are skipped."""
    if not keys:
        return []
    pipe = _queue_reads(client.pipeline(transaction=False), keys)
    return _parse_reads(keys, pipe.execute(raise_on_error=False))


async def aread_lock(client: Any, key: str) -> LockRecord | None:
    """:func:`read_lock` with a ``redis.asyncio`` client."""
    values = await _queue_reads(client.pipeline(transaction=False), [key]).execute(
        raise_on_error=False
    )
    return next(iter(_parse_reads([key], values)), None)


def lock_exists(client: Any, key: str) -> bool:
    return bool(client.exists(key))


async def alock_exists(client: Any, key: str) -> bool:
    return bool(await client.exists(key))


def scan_keys(
    client: Any, pattern: str, *, cursor: int = 0, count: int = 500
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


def write_stats(client: Any, updates: Sequence[StatsUpdate], *, now: float, ttl: int) -> None:
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
    client: Any, keys: Sequence[tuple[str, str]]
) -> list[tuple[dict[Any, Any], list[tuple[Any, float]]]]:
    """``(hash, maxima)`` of each ``(stats key, max key)`` pair, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key, max_key in keys:
        pipe.hgetall(key)
        pipe.zrange(max_key, 0, -1, withscores=True)
    replies = pipe.execute()
    return [(replies[2 * i], replies[2 * i + 1]) for i in range(len(keys))]


def eviction_policy(client: Any) -> str | None:
    """The server's ``maxmemory_policy`` from ``INFO memory`` (``None`` when not reported)."""
    info = client.info("memory")
    policy = info.get("maxmemory_policy")
    return None if policy is None else str(policy)


def read_beat_state(client: Any, key: str) -> dict[str, str]:
    """Every field of a beat-state hash (``HGETALL``), decoded: entry name -> JSON record."""
    raw = client.hgetall(key)
    return {_decoded(k): _decoded(v) for k, v in raw.items()}


def write_beat_state(client: Any, key: str, entry: str, record: str) -> None:
    """Record the last run of one schedule entry (``HSET``); the hash has no expiry: a weekly
    entry must still find its last run next week."""
    client.hset(key, entry, record)


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
