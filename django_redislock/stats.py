"""Per-name lock statistics: cheap counters on the hot path, flushed to Redis in the background.

Why this shape:

- The signal receivers only add numbers to an in-process dict under a mutex (a few hundred
  nanoseconds), so an application that takes thousands of locks a second does not pay a Redis
  round trip per event.
- A small daemon thread (started lazily by the first event, restarted after ``fork``) flushes that
  dict every :data:`FLUSH_INTERVAL` seconds and at interpreter exit, with ONE pipeline per Redis
  connection: ``HINCRBY``/``HINCRBYFLOAT`` for counters and totals, ``ZADD GT`` for maxima (an
  atomic "keep the larger" without Lua; needs Redis >= 6.2), and ``EXPIRE`` so figures of names no
  longer used vanish :data:`STATS_TTL` seconds after their last update.
- Memory stays bounded: figures are aggregated per ``lock.stats_name``, which
  :func:`~django_redislock.distributed_lock` sets to the key *template* (``"invoice:{id}"``), not
  to every rendered name; the dict is emptied by every flush and holds at most
  :data:`MAX_PENDING_NAMES` names between flushes.

Redis layout (per namespace ``<ns>``, see :mod:`django_redislock.client`):

- ``<ns>:stats:<stats_name>`` HASH: ``acquired contended failed released lost force_released``
  (integers), ``wait_total hold_total`` (float seconds), ``updated_at`` (epoch seconds).
- ``<ns>:stats-max:<stats_name>`` ZSET: members ``wait`` and ``hold``, score = maximum seconds.

Waits are those of *successful* acquisitions (a timed-out wait is a ``failed`` count); holds are
those reported by ``lock_released``. A force release is counted under the lock *name* (the operator
does not know the template); the holder's own ``lock_lost`` is counted under its ``stats_name``.

Turn everything off with ``REDISLOCK = {"STATS": False}``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "FLUSH_INTERVAL",
    "STATS_TTL",
    "LockStats",
    "connect_receivers",
    "disconnect_receivers",
    "flush",
    "get_stats",
    "iter_stats",
    "record",
]

logger = logging.getLogger(__name__)

#: Seconds between two background flushes.
FLUSH_INTERVAL = 5.0
#: Seconds a name's figures survive in Redis after their last update.
STATS_TTL = 24 * 3600
#: Names kept in memory between flushes; past this a flush is requested early, and if Redis is
#: unreachable the events of further *new* names are dropped (and logged once per flush).
MAX_PENDING_NAMES = 10_000

_INT_FIELDS = ("acquired", "contended", "failed", "released", "lost", "force_released")
_FLOAT_FIELDS = ("wait_total", "hold_total")
_MAX_FIELDS = ("wait", "hold")


class _Tally:
    """Figures gathered since the last flush for one (cache alias, stats name)."""

    __slots__ = (
        "acquired",
        "contended",
        "failed",
        "force_released",
        "hold_max",
        "hold_total",
        "lost",
        "released",
        "wait_max",
        "wait_total",
    )

    def __init__(self) -> None:
        self.acquired = self.contended = self.failed = 0
        self.released = self.lost = self.force_released = 0
        self.wait_total = self.wait_max = self.hold_total = self.hold_max = 0.0

    def merge(self, other: _Tally) -> None:
        for name in (*_INT_FIELDS, *_FLOAT_FIELDS):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wait_max = max(self.wait_max, other.wait_max)
        self.hold_max = max(self.hold_max, other.hold_max)


_Key = tuple[str | None, str]  # (cache alias or None for REDISLOCK["CACHE"], stats name)

_mutex = threading.Lock()
_pending: dict[_Key, _Tally] = {}
_wake = threading.Event()
_flusher: threading.Thread | None = None
_dropped = 0


def _default_alias() -> str:

    from django_redislock.connection import resolve_alias

    return resolve_alias(None)


def _enabled() -> bool:
    from django_redislock.conf import get_settings

    return get_settings().stats


def _tally(key: _Key) -> _Tally | None:
    """The tally for ``key``, created on first use. Call with ``_mutex`` held."""
    global _dropped
    tally = _pending.get(key)
    if tally is None:
        if len(_pending) >= MAX_PENDING_NAMES:
            _dropped += 1
            _wake.set()
            return None
        tally = _pending[key] = _Tally()
        if len(_pending) >= MAX_PENDING_NAMES // 2:
            _wake.set()
    return tally


def _ensure_flusher() -> None:
    global _flusher
    if _flusher is not None:
        return
    with _mutex:
        if _flusher is not None:
            return
        thread = threading.Thread(target=_flush_forever, name="redislock-stats", daemon=True)
        _flusher = thread
    thread.start()


def _flush_forever() -> None:
    while True:
        _wake.wait(FLUSH_INTERVAL)
        _wake.clear()
        try:
            flush()
        except Exception:  # never let the thread die; flush() logs Redis problems itself
            logger.exception("django_redislock: statistics flush failed")


# --- recording (hot path: no I/O, no signal dispatch) ---------------------------------------


def record(
    using: str | None,
    stats_name: str,
    event: str,
    seconds: float = 0.0,
    contended: bool = False,
) -> None:
    """Count one event of ``stats_name``: ``"acquired"`` (``seconds`` waited), ``"failed"``,
    ``"released"`` (``seconds`` held), ``"lost"`` or ``"force_released"``.

    The engine calls this directly (a dict update under a mutex), so statistics cost no signal
    dispatch per event; the signals are sent only when someone else listens.
    """
    if not _enabled():
        return
    with _mutex:
        tally = _tally((using, stats_name))
        if tally is not None:
            if event == "acquired":
                tally.acquired += 1
                tally.contended += bool(contended)
                tally.wait_total += seconds
                tally.wait_max = max(tally.wait_max, seconds)
            elif event == "released":
                tally.released += 1
                tally.hold_total += seconds
                tally.hold_max = max(tally.hold_max, seconds)
            else:
                setattr(tally, event, getattr(tally, event) + 1)
    _ensure_flusher()


def connect_receivers() -> None:
    """Kept for compatibility: statistics are recorded by the engine directly (see
    :func:`record`), not through signal receivers any more."""


def disconnect_receivers() -> None:
    """Kept for compatibility (see :func:`connect_receivers`); turn statistics off with
    ``REDISLOCK["STATS"] = False``."""


# --- flushing ----------------------------------------------------------------------------------


def flush() -> None:
    """Write everything gathered so far to Redis now (one pipeline per cache alias).

    Called by the background thread and at exit; tests call it to read figures back at once.
    If Redis cannot be reached the figures are kept for the next flush (bounded, see
    :data:`MAX_PENDING_NAMES`) and a warning is logged.
    """
    global _pending, _dropped
    with _mutex:
        if not _pending and not _dropped:
            return
        batch, _pending = _pending, {}
        dropped, _dropped = _dropped, 0
    if dropped:
        logger.warning(
            "django_redislock: statistics of %d events were dropped (more than %d "
            "names between two flushes).",
            dropped,
            MAX_PENDING_NAMES,
        )
    by_alias: dict[str | None, dict[str, _Tally]] = {}
    for (alias, stats_name), tally in batch.items():
        by_alias.setdefault(alias, {})[stats_name] = tally
    for alias, tallies in by_alias.items():
        try:
            _write(alias, tallies)
        except ImproperlyConfigured:
            # The alias is gone from the settings (reconfigured, or a test's temporary cache):
            # there is nowhere to write these figures any more.
            logger.debug("django_redislock: statistics of unknown cache %r dropped", alias)
        except Exception as exc:
            logger.warning(
                "django_redislock: could not write lock statistics to cache %r (%s); "
                "keeping them for the next flush.",
                alias or _default_alias(),
                exc,
            )
            with _mutex:
                for stats_name, tally in tallies.items():
                    kept = _tally((alias, stats_name))
                    if kept is not None:
                        kept.merge(tally)


def _write(alias: str | None, tallies: dict[str, _Tally]) -> None:
    from django_redislock.client import StatsUpdate, write_stats
    from django_redislock.connection import get_client
    from django_redislock.keys import keyspace

    space = keyspace(alias)
    updates = [
        StatsUpdate(
            key=space.stats(stats_name),
            max_key=space.stats_max(stats_name),
            counters={f: getattr(t, f) for f in _INT_FIELDS if getattr(t, f)},
            totals={f: getattr(t, f) for f in _FLOAT_FIELDS if getattr(t, f)},
            maxima={m: getattr(t, f"{m}_max") for m in _MAX_FIELDS if getattr(t, f"{m}_max")},
        )
        for stats_name, t in tallies.items()
    ]
    write_stats(get_client(alias), updates, now=time.time(), ttl=STATS_TTL)


def _after_fork_in_child() -> None:
    """A forked child starts with no figures (the parent flushes its own) and no flusher."""
    global _mutex, _pending, _wake, _flusher, _dropped
    _mutex = threading.Lock()
    _pending = {}
    _wake = threading.Event()
    _flusher = None
    _dropped = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _flush_at_exit() -> None:
    try:
        flush()
    except Exception:  # the interpreter is going away; nothing sensible to do
        logger.debug("django_redislock: final statistics flush failed", exc_info=True)


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockStats:
    """Figures of one stats name, summed over every process since they were first recorded."""

    name: str
    acquired: int = 0
    contended: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    force_released: int = 0
    wait_total: float = 0.0
    wait_max: float = 0.0
    hold_total: float = 0.0
    hold_max: float = 0.0
    updated_at: datetime | None = field(default=None, compare=False)

    @property
    def attempts(self) -> int:
        return self.acquired + self.failed

    @property
    def success_rate(self) -> float | None:
        """Share of acquisition attempts that got the lock (``None`` before the first attempt)."""
        return self.acquired / self.attempts if self.attempts else None

    @property
    def mean_wait(self) -> float | None:
        return self.wait_total / self.acquired if self.acquired else None

    @property
    def mean_hold(self) -> float | None:
        return self.hold_total / self.released if self.released else None


def _parse(
    stats_name: str, raw: dict[bytes, bytes], maxima: list[tuple[bytes, float]]
) -> LockStats:
    def text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    values = {text(k): text(v) for k, v in raw.items()}
    kwargs: dict[str, Any] = {}
    for name in _INT_FIELDS:
        kwargs[name] = int(values.get(name, 0))
    for name in _FLOAT_FIELDS:
        kwargs[name] = float(values.get(name, 0.0))
    for member, score in maxima:
        kwargs[f"{text(member)}_max"] = float(score)
    updated = values.get("updated_at")
    if updated:
        kwargs["updated_at"] = datetime.fromtimestamp(float(updated), tz=timezone.utc)
    return LockStats(name=stats_name, **kwargs)


def _read(alias: str | None, names: list[str]) -> list[LockStats]:
    from django_redislock.client import read_stats
    from django_redislock.connection import backend_errors, get_client
    from django_redislock.keys import keyspace

    if not names:
        return []
    space = keyspace(alias)
    with backend_errors("read lock statistics"):
        replies = read_stats(
            get_client(alias), [(space.stats(n), space.stats_max(n)) for n in names]
        )
    return [_parse(n, raw, maxima) for n, (raw, maxima) in zip(names, replies, strict=True) if raw]


def get_stats(name_or_template: str, using: str | None = None) -> LockStats | None:
    """Figures of one stats name (a lock name, or a ``distributed_lock`` key template).

    ``None`` when nothing was recorded in the last :data:`STATS_TTL` seconds. Figures still in
    some process's memory (up to :data:`FLUSH_INTERVAL` seconds old) are not included; call
    :func:`flush` first to include this process's.
    """
    found = _read(using, [name_or_template])
    return found[0] if found else None


def get_many_stats(names: list[str], using: str | None = None) -> dict[str, LockStats]:
    """Figures of several stats names in one round trip (names without figures are left out)."""
    return {s.name: s for s in _read(using, list(dict.fromkeys(names)))}


def iter_stats(using: str | None = None, *, batch: int = 200) -> Iterator[LockStats]:
    """Figures of every stats name of the namespace (SCAN, never ``KEYS``), in no fixed order."""
    from django_redislock.client import scan_keys
    from django_redislock.connection import backend_errors, get_client
    from django_redislock.keys import escape_glob, keyspace

    space = keyspace(using)
    head = space.stats("")
    pattern = escape_glob(head) + "*"
    client = get_client(using)
    cursor = 0
    seen: set[str] = set()
    while True:
        with backend_errors("list lock statistics"):
            cursor, keys = scan_keys(client, pattern, cursor=cursor, count=batch)
        names = []
        for key in keys:
            stats_name = key[len(head) :]
            if stats_name not in seen:
                seen.add(stats_name)
                names.append(stats_name)
        yield from _read(using, names)
        if int(cursor) == 0:
            return
