"""Every Redis command the package sends that is not in ``lua/``.

Reads for listings (``GET`` + ``PTTL`` pipelines, ``SCAN``), the statistics pipelines, and the
blocking pop a waiter waits on. The client comes from :mod:`django_redislock.connection`, key
names from :mod:`django_redislock.keys`, parsing from :mod:`django_redislock.records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from django_redislock.connection import is_cluster
from django_redislock.records import LockRecord, parse_record

__all__ = [
    "StatsUpdate",
    "ahas_field_ttl",
    "alock_exists",
    "aread_lock",
    "blocking_pop",
    "delete_keys",
    "eviction_policy",
    "gcra_unit",
    "has_field_ttl",
    "lock_exists",
    "read_beat_state",
    "read_lock",
    "read_locks",
    "read_rates",
    "read_semaphores",
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


def read_semaphores(
    client: Any, keys: Sequence[tuple[str, str]]
) -> list[tuple[str, int, list[LockRecord]]]:
    """Permits of semaphores in one round trip: ``(sem key, permits, records)`` per
    ``(sem key, records key)``; each record's ``pttl_ms`` is its permit's remaining lease.
    Permits whose lease ended (not yet purged) are left out."""
    if not keys:
        return []
    cluster = is_cluster(client)
    pipe = client.pipeline(transaction=False)
    if not cluster:
        pipe.time()  # the server's clock: permits expire by it
    for sem_key, rec_key in keys:
        pipe.zrange(sem_key, 0, -1, withscores=True)
        pipe.hgetall(rec_key)
    values = pipe.execute(raise_on_error=False)
    if cluster:  # cluster pipelines refuse keyless commands: ask one node for the time
        values.insert(0, client.time())
    seconds, micros = values[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    found = []
    for i, (sem_key, _) in enumerate(keys):
        scores, fields = values[1 + 2 * i], values[2 + 2 * i]
        if isinstance(scores, Exception) or isinstance(fields, Exception):
            continue
        text = {_text(k): v for k, v in fields.items()}
        records = []
        for token, expiry in scores:
            left = int(expiry) - now_ms
            raw = text.get(_text(token))
            if left > 0 and raw is not None:
                records.append(parse_record(sem_key, raw, left))
        permits = int(text.get("permits") or 1)
        if records:
            found.append((sem_key, permits, records))
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def lock_exists(client: Any, key: str) -> bool:
    return bool(client.exists(key))


async def alock_exists(client: Any, key: str) -> bool:
    return bool(await client.exists(key))


#: A Cluster cursor packs (node cursor, primary index): the index in the low bits.
_NODE_BITS = 10


def scan_keys(
    client: Any, pattern: str, *, cursor: int = 0, count: int = 500
) -> tuple[int, list[str]]:
    """One ``SCAN`` step (never ``KEYS``): the next cursor (0 = done) and the keys it returned.

    On a Redis Cluster the steps walk every primary in turn (sorted by node name), so one
    integer cursor still describes the position, as the admin's paging expects.
    """
    if not is_cluster(client):
        next_cursor, keys = client.scan(cursor=cursor, match=pattern, count=count)
        return int(next_cursor), [_text(k) for k in keys]
    primaries = sorted(client.get_primaries(), key=lambda node: node.name)
    index, node_cursor = cursor & ((1 << _NODE_BITS) - 1), cursor >> _NODE_BITS
    if index >= len(primaries):  # the cluster shrank since the cursor was handed out
        return 0, []
    reply, keys = client.scan(
        cursor=node_cursor, match=pattern, count=count, target_nodes=primaries[index]
    )
    node_next = int(next(iter(reply.values())) if isinstance(reply, dict) else reply)
    if node_next == 0:
        index += 1
        if index == len(primaries):
            return 0, [_text(k) for k in keys]
    return (node_next << _NODE_BITS) | index, [_text(k) for k in keys]


def delete_keys(client: Any, keys: Sequence[str]) -> int:
    """``DEL`` the given keys (testing's flush of one namespace); returns how many existed.

    redis-py's ``RedisCluster`` splits a multi-key ``DEL`` by slot itself.
    """
    return int(client.delete(*keys)) if keys else 0


@dataclass(frozen=True)
class StatsUpdate:
    """Figures to add to one statistics hash (see :mod:`django_redislock.stats`).

    ``counters`` are integers (counts and histogram buckets), ``totals`` floats, ``maxima`` kept
    only when larger; ``series`` adds per-minute counts: ``{hash key: {field: count}}``.
    """

    key: str
    max_key: str
    counters: dict[str, int]
    totals: dict[str, float]
    maxima: dict[str, float]
    series: dict[str, dict[str, int]] = field(default_factory=dict)


def write_stats(
    client: Any,
    updates: Sequence[StatsUpdate],
    *,
    now: float,
    ttl: int,
    series_ttl: int | None = None,
) -> None:
    """Add figures to statistics hashes in one pipeline.

    Maxima use ``ZADD GT`` (an atomic "keep the larger", Redis >= 6.2); every touched key expires
    ``ttl`` seconds after its last update (the per-minute hashes ``series_ttl``, default ``ttl``),
    which keeps memory bounded.
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
        for series_key, counts in update.series.items():
            for field_name, count in counts.items():
                pipe.hincrby(series_key, field_name, count)
            pipe.expire(series_key, ttl if series_ttl is None else series_ttl)
    pipe.execute()


def read_stats(
    client: Any, keys: Sequence[tuple[str, ...]]
) -> list[tuple[dict[Any, Any], list[tuple[Any, float]], list[dict[Any, Any]]]]:
    """``(hash, maxima, [series hashes])`` of each ``(stats key, max key, *series keys)``, in one
    round trip (``HGETALL``, ``ZRANGE``, one ``HGETALL`` per series key)."""
    pipe = client.pipeline(transaction=False)
    for key, max_key, *series_keys in keys:
        pipe.hgetall(key)
        pipe.zrange(max_key, 0, -1, withscores=True)
        for series_key in series_keys:
            pipe.hgetall(series_key)
    replies = iter(pipe.execute())
    found = []
    for _key, _max_key, *series_keys in keys:
        raw, maxima = next(replies), next(replies)
        found.append((raw, maxima, [next(replies) for _ in series_keys]))
    return found


def eviction_policy(client: Any) -> list[str]:
    """The ``maxmemory_policy`` of the server (of every primary of a cluster), from ``INFO``."""
    info = client.info("memory")
    nodes = info.values() if info and all(isinstance(v, dict) for v in info.values()) else [info]
    return [str(n["maxmemory_policy"]) for n in nodes if n.get("maxmemory_policy")]


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


#: ``COMMAND GETKEYS`` of a per-field expiry: an error where the server has no ``HPEXPIREAT``.
#: (One command name, as redis-py's own commands parser sends it: redis-py would read the reply
#: of a plain "COMMAND" as COMMAND's table.)
FIELD_TTL_PROBE = ("COMMAND GETKEYS", "HPEXPIREAT", "k", 1, "FIELDS", 1, "f")


def has_field_ttl(client: Any) -> bool:
    """Whether the server expires hash fields (``HPEXPIREAT``: Redis 7.4+, Valkey 9); asked once
    per deployment by the transport. ``COMMAND GETKEYS`` sends nothing to any key."""
    try:
        client.execute_command(*FIELD_TTL_PROBE)
    except ResponseError:
        return False
    return True


async def ahas_field_ttl(client: Any) -> bool:
    """:func:`has_field_ttl` for an asyncio client."""
    try:
        await client.execute_command(*FIELD_TTL_PROBE)
    except ResponseError:
        return False
    return True


def gcra_unit(client: Any, probe_key: str) -> str | None:
    """Whether the server has a ``GCRA`` command, and the unit of its retry-after: ``"ms"``,
    ``"s"`` (its builds differ), or ``None`` (no such command).

    ``COMMAND GETKEYS`` answers an error for a command the server does not know (``COMMAND
    INFO`` would answer nil, which some redis-py versions fail to parse). Then two decisions on
    a scratch key (``probe_key``, deleted after) at 1 per 1000 s: the second is refused,
    retrying after about 1000 s, which tells the unit. Nothing else is touched.
    """
    try:
        client.execute_command("COMMAND GETKEYS", "GCRA", probe_key, 0, 1, 1000)
    except ResponseError:
        return None
    try:
        client.execute_command("GCRA", probe_key, 0, 1, 1000)
        reply = client.execute_command("GCRA", probe_key, 0, 1, 1000)
    except ResponseError:
        return None
    finally:
        client.delete(probe_key)
    return "ms" if int(reply[3]) > 100_000 else "s"


def read_rates(client: Any, keys: Sequence[str]) -> list[tuple[str, int]]:
    """``(key, milliseconds until rested)`` of each rate limiter key that exists (one pipeline
    of ``PTTL``; a key without an expiry reports -1)."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
    found = []
    for key, pttl in zip(keys, pipe.execute(), strict=True):
        if int(pttl) != -2:
            found.append((key, int(pttl)))
    return found


def read_latches(client: Any, keys: Sequence[str]) -> list[tuple[str, int, int, int]]:
    """``(key, remaining, initial count, ms until it expires)`` of each latch key that exists
    (one pipeline of ``HMGET`` + ``PTTL``)."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "c", "n")
        pipe.pttl(key)
    values = pipe.execute(raise_on_error=False)
    found = []
    for i, key in enumerate(keys):
        fields, pttl = values[2 * i], values[2 * i + 1]
        if isinstance(fields, Exception) or isinstance(pttl, Exception) or fields[0] is None:
            continue
        found.append((key, int(fields[0]), int(fields[1] or 0), int(pttl)))
    return found


def read_barriers(
    client: Any, keys: Sequence[tuple[str, str]]
) -> list[tuple[str, int, int, bool, int]]:
    """``(key, parties, arrived, broken, ms until it expires)`` of each barrier key that exists,
    given ``(barrier key, its parties' key)`` pairs (one pipeline)."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key, parties_key in keys:
        pipe.hmget(key, "p", "b")
        pipe.pttl(key)
        pipe.zcard(parties_key)
    values = pipe.execute(raise_on_error=False)
    found = []
    for i, (key, _) in enumerate(keys):
        fields, pttl, arrived = values[3 * i : 3 * i + 3]
        if any(isinstance(v, Exception) for v in (fields, pttl, arrived)) or fields[0] is None:
            continue
        broken = fields[1] not in (None, b"0", "0")
        found.append((key, int(fields[0]), int(arrived), broken, int(pttl)))
    return found
