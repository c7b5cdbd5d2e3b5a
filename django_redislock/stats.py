"""Per-name lock statistics: cheap counters on the hot path, flushed to Redis in the background.

Why this shape:

- The engine calls :func:`record`, which only appends the event to an in-process list (no
  lock, a few hundred nanoseconds), so an application that takes thousands of locks a second
  pays neither a Redis round trip nor a contended mutex per event; the flusher folds the list
  into per-name tallies (a bucket found by ``bisect`` on a tuple) before it writes them.
- A small daemon thread (started lazily by the first event, restarted after ``fork``) flushes that
  dict every :data:`FLUSH_INTERVAL` seconds and at interpreter exit, with ONE pipeline per Redis
  connection: ``HINCRBY``/``HINCRBYFLOAT`` for counters, histogram buckets and totals, ``ZADD GT``
  for maxima (an atomic "keep the larger" without Lua; needs Redis >= 6.2), and ``EXPIRE`` so
  figures of names no longer used vanish :data:`STATS_TTL` seconds after their last update.
- Memory stays bounded: figures are aggregated per ``lock.stats_name``, which
  :func:`~django_redislock.distributed_lock` sets to the key *template* (``"invoice:{id}"``), not
  to every rendered name; the dict is emptied by every flush and holds at most
  :data:`MAX_PENDING_NAMES` names between flushes.

Histograms: waits (of successful acquisitions) and holds (up to the release of the last hold)
are counted in the fixed buckets :data:`BUCKETS` — upper bounds in seconds, inclusive like
Prometheus' ``le`` — plus a last bucket for anything longer (``+Inf``). Fixed buckets make the
figures of every process and machine add up, and let :mod:`django_redislock.prometheus` export
real histograms (``histogram_quantile`` works on them).

Redis layout (per namespace ``<ns>``, see :mod:`django_redislock.keys` and
:mod:`django_redislock.client`):

- ``<ns>:stats:<stats_name>`` HASH: ``acquired contended failed released lost force_released
  skipped deduplicated allowed limited throttled`` (integers), ``wait_total hold_total`` (float
  seconds), ``updated_at``
  (epoch seconds), and one integer per non-empty histogram bucket: ``wait_le_<bound>`` and
  ``hold_le_<bound>``, ``<bound>`` being the bucket's upper bound as ``%g`` (``0.005``, ``30``)
  or ``inf``. Expires :data:`STATS_TTL` after its last update.
- ``<ns>:stats-max:<stats_name>`` ZSET: members ``wait`` and ``hold``, score = maximum seconds.
- ``<ns>:stats-minutes:<hour>:<stats_name>`` HASH, one per clock hour (``<hour>`` = epoch seconds
  // 3600): fields ``a:<minute>`` (acquisitions) and ``f:<minute>`` (failed attempts) per epoch
  minute (epoch seconds // 60) of that hour. Each expires :data:`SERIES_TTL` (a bit over two
  hours) after its last update, so at most three exist per name and the last
  :data:`SERIES_MINUTES` minutes can always be read from the current hour's and the previous
  hour's hash. This is the "acquisitions over time" series of the admin's chart.

What counts as what:

- ``acquired``/``contended``/waits: successful acquisitions (the outermost of re-entrant ones);
  ``failed``: attempts that timed out or found the lock busy without waiting, when that was a
  failure for the caller. ``success_rate`` is ``acquired / (acquired + failed)``.
- ``allowed``/``limited``: decisions of a rate limiter (:mod:`django_redislock.ratelimit`); on
  its row they also make the per-minute series (``a:`` allowed, ``f:`` refused). ``throttled``:
  task runs re-published because a ``lock_rate``/``task_rate``/``task_permits`` limit was
  reached. None of the three is an acquisition attempt.
- ``skipped`` and ``deduplicated`` are busy locks that worked as intended and are *not* attempts:
  a call ``distributed_lock(on_busy="skip")`` (or an ``on_busy`` callable that returned) did not
  make, a single-flight delivery skipped or rescheduled because its key was held (``skipped``), a
  single-flight publish folded into the one queued or running (``deduplicated``).
- Holds are those ended by a release. A force release is counted once per call, on the row of
  the holder (the lock record keeps the holder's key template when it has one; otherwise the
  shape of the name, as a plain ``Lock``'s row), so the operator's ``force_released`` and the
  holder's own ``lost`` (counted when it finds out) land on one row.
- A leader lease (:class:`~django_redislock.leader.LeaderLease`: a standby beat,
  ``redislock run``) records no ``failed`` attempt while it waits: standing by is what a standby
  is for. Its takeovers are counted as acquisitions.

Turn everything off with ``REDISLOCK = {"STATS": False}`` (OpenTelemetry spans, see
:mod:`django_redislock.tracing`, do not depend on it).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_redislock import tracing
from django_redislock.runtime import runtime

__all__ = [
    "BUCKETS",
    "FLUSH_INTERVAL",
    "SERIES_MINUTES",
    "SERIES_TTL",
    "STATS_TTL",
    "LockStats",
    "Minute",
    "connect_receivers",
    "disconnect_receivers",
    "flush",
    "get_many_stats",
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

#: Upper bounds (seconds, inclusive) of the wait and hold histogram buckets; one more bucket
#: (``+Inf``) takes anything longer than the last. From a millisecond (an uncontended lock on a
#: nearby Redis) to half an hour (a long task's hold), about two buckets per factor of ten.
#: Changing them orphans the recorded buckets of the old bounds (their fields are ignored).
BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
#: Minutes of the "acquisitions over time" series (the admin's chart shows them all).
SERIES_MINUTES = 60
#: Seconds an hour's per-minute hash survives its last update (see the module docstring).
SERIES_TTL = 2 * 3600 + 60

_INT_FIELDS = (
    "acquired",
    "contended",
    "failed",
    "released",
    "lost",
    "force_released",
    "skipped",
    "deduplicated",
    "allowed",
    "limited",
    "throttled",
)
_FLOAT_FIELDS = ("wait_total", "hold_total")
_MAX_FIELDS = ("wait", "hold")
_BUCKET_LABELS = (*(f"{bound:g}" for bound in BUCKETS), "inf")
_WAIT_FIELDS = tuple(f"wait_le_{label}" for label in _BUCKET_LABELS)
_HOLD_FIELDS = tuple(f"hold_le_{label}" for label in _BUCKET_LABELS)
_NO_COUNTS = (0,) * len(_BUCKET_LABELS)


class _Tally:
    """Figures gathered since the last flush for one (cache alias, stats name)."""

    __slots__ = (
        "acquired",
        "allowed",
        "contended",
        "deduplicated",
        "failed",
        "force_released",
        "hold_buckets",
        "hold_max",
        "hold_total",
        "limited",
        "lost",
        "minutes",
        "released",
        "skipped",
        "throttled",
        "wait_buckets",
        "wait_max",
        "wait_total",
    )

    def __init__(self) -> None:
        self.acquired = self.contended = self.failed = 0
        self.released = self.lost = self.force_released = 0
        self.skipped = self.deduplicated = 0
        self.allowed = self.limited = self.throttled = 0
        self.wait_total = self.wait_max = self.hold_total = self.hold_max = 0.0
        self.wait_buckets = [0] * len(_BUCKET_LABELS)
        self.hold_buckets = [0] * len(_BUCKET_LABELS)
        #: epoch minute -> [acquisitions, failed attempts]
        self.minutes: dict[int, list[int]] = {}

    def merge(self, other: _Tally) -> None:
        for name in (*_INT_FIELDS, *_FLOAT_FIELDS):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wait_max = max(self.wait_max, other.wait_max)
        self.hold_max = max(self.hold_max, other.hold_max)
        for i, count in enumerate(other.wait_buckets):
            self.wait_buckets[i] += count
        for i, count in enumerate(other.hold_buckets):
            self.hold_buckets[i] += count
        oldest = int(time.time() // 60) - SERIES_MINUTES  # kept back while Redis is down
        for minute, (acquired, failed) in other.minutes.items():
            if minute > oldest:
                slot = self.minutes.setdefault(minute, [0, 0])
                slot[0] += acquired
                slot[1] += failed


_Key = tuple[str | None, str]  # (cache alias or None for REDISLOCK["CACHE"], stats name)

_mutex = threading.Lock()
#: Held by a flush from taking the figures until they are written, so that a flush returns only
#: after everything recorded before it is in Redis, also what another thread's flush had taken
#: and was still writing. Never taken by :func:`record`; taken before ``_mutex``, never after.
_flushing = threading.Lock()
#: Seconds the flush at exit waits for another thread's write in flight before it gives up.
EXIT_FLUSH_WAIT = 5.0
_pending: dict[_Key, _Tally] = {}
#: Events recorded since the last fold: ``(key, event, seconds, contended, time.time())``.
#: Appending is all :func:`record` does (no lock: ``list.append`` is atomic); :func:`_fold`
#: turns them into tallies when the figures are flushed.
_events: list[tuple[_Key, str, float, bool, float]] = []
#: Events after which the flusher is woken early; at four times as many the recording thread
#: folds them itself (the flusher is behind), so memory stays bounded.
MAX_EVENTS = 10_000
_wake = threading.Event()
_flusher: threading.Thread | None = None
_dropped = 0


def _default_alias() -> str:

    from django_redislock.connection import resolve_alias

    return resolve_alias(None)


#: ``REDISLOCK["STATS"]``, read on first use and again after Django's ``setting_changed`` for
#: ``REDISLOCK`` (``override_settings``): :func:`record` must not look the setting up per call.
_on: bool | None = None


def _enabled() -> bool:
    global _on
    if _on is None:
        from django_redislock.conf import get_settings

        _on = get_settings().stats
    return _on


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: object) -> None:
    global _on
    if setting in ("REDISLOCK", "CACHES"):
        _on = None


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


#: Bound once: ``None`` unless ``opentelemetry`` is importable (see :mod:`.tracing`).
_emit_span = tracing.emit


def record(
    using: str | None,
    stats_name: str,
    event: str,
    seconds: float = 0.0,
    contended: bool = False,
    name: str | None = None,
    token: int | None = None,
) -> None:
    """Count one event of ``stats_name``: ``"acquired"`` (``seconds`` waited), ``"failed"``
    (``seconds`` waited in vain), ``"released"`` (``seconds`` held), ``"lost"`` (``seconds``
    held until then), ``"force_released"``, ``"skipped"`` or ``"deduplicated"`` (see the module
    docstring for what each counts).

    The engine calls this directly — one list append, no lock (see :func:`_fold`) — so
    statistics cost no signal dispatch per event; the signals are sent only when someone else
    listens. ``name`` (the lock name) and ``token`` (its fencing token) are only for the
    OpenTelemetry spans (:mod:`django_redislock.tracing`), which are made here too when
    ``opentelemetry`` is installed.
    """
    if _emit_span is not None:
        _emit_span(event, stats_name, name, seconds, contended, token)
    if not (_on if _on is not None else _enabled()):
        return
    events = _events
    events.append(((using, stats_name), event, seconds, contended, time.time()))
    if len(events) >= MAX_EVENTS:
        if not _wake.is_set():  # set() takes a Condition's lock: only once per backlog
            _wake.set()
        if len(events) >= 4 * MAX_EVENTS:
            with _mutex:
                _fold()
    if _flusher is None:
        _ensure_flusher()


def _fold() -> None:
    """Turn the recorded events into tallies. Call with ``_mutex`` held.

    Only the events present when it starts are taken (and deleted from the front): threads
    appending meanwhile add at the end, so nothing is lost without a lock on the hot path.
    """
    events = _events
    count = len(events)
    if not count:
        return
    batch = events[:count]
    del events[:count]
    for key, event, seconds, contended, now in batch:
        tally = _tally(key)
        if tally is None:
            continue
        if event == "acquired":
            tally.acquired += 1
            if contended:
                tally.contended += 1
            tally.wait_total += seconds
            if seconds > tally.wait_max:
                tally.wait_max = seconds
            tally.wait_buckets[bisect_left(BUCKETS, seconds)] += 1
            _per_minute(tally, now, 0)
        elif event == "released":
            tally.released += 1
            tally.hold_total += seconds
            if seconds > tally.hold_max:
                tally.hold_max = seconds
            tally.hold_buckets[bisect_left(BUCKETS, seconds)] += 1
        elif event == "failed":
            tally.failed += 1
            _per_minute(tally, now, 1)
        elif event == "allowed":  # a rate limiter's row: its decisions are its series
            tally.allowed += 1
            _per_minute(tally, now, 0)
        elif event == "limited":
            tally.limited += 1
            _per_minute(tally, now, 1)
        else:
            setattr(tally, event, getattr(tally, event) + 1)


def _per_minute(tally: _Tally, now: float, column: int) -> None:
    """Count one acquisition (``column`` 0) or failure (1) in the minute of ``now``."""
    minute = int(now // 60)
    slot = tally.minutes.get(minute)
    if slot is None:
        slot = tally.minutes[minute] = [0, 0]
    slot[column] += 1


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
    When it returns, every event recorded before the call has been written, including those
    another thread's flush was writing meanwhile. If Redis cannot be reached the figures are
    kept for the next flush (bounded, see :data:`MAX_PENDING_NAMES`) and a warning is logged.
    """
    with _flushing:
        _flush(final=False)


def _flush(*, final: bool) -> None:
    """:func:`flush` (call with ``_flushing`` held); ``final`` (at exit): figures that cannot be
    written are not kept."""
    global _pending, _dropped
    with _mutex:
        _fold()
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
            if final:
                logger.warning(
                    "django_redislock: could not write the last lock statistics of this "
                    "process to cache %r (%s); they are lost.",
                    alias or _default_alias(),
                    exc,
                )
                continue
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
    from django_redislock.runtime import get_client, keyspace

    space = keyspace(alias)
    updates = []
    for stats_name, t in tallies.items():
        counters = {f: getattr(t, f) for f in _INT_FIELDS if getattr(t, f)}
        for fields, counts in ((_WAIT_FIELDS, t.wait_buckets), (_HOLD_FIELDS, t.hold_buckets)):
            counters.update((f, n) for f, n in zip(fields, counts, strict=True) if n)
        series: dict[str, dict[str, int]] = {}
        for minute, (acquired, failed) in t.minutes.items():
            per_hour = series.setdefault(space.stats_minutes(stats_name, minute // 60), {})
            if acquired:
                per_hour[f"a:{minute}"] = acquired
            if failed:
                per_hour[f"f:{minute}"] = failed
        updates.append(
            StatsUpdate(
                key=space.stats(stats_name),
                max_key=space.stats_max(stats_name),
                counters=counters,
                totals={f: getattr(t, f) for f in _FLOAT_FIELDS if getattr(t, f)},
                maxima={m: getattr(t, f"{m}_max") for m in _MAX_FIELDS if getattr(t, f"{m}_max")},
                series=series,
            )
        )
    write_stats(get_client(alias), updates, now=time.time(), ttl=STATS_TTL, series_ttl=SERIES_TTL)


def _after_fork_in_child() -> None:
    """A forked child starts with no figures (the parent flushes its own) and no flusher."""
    global _mutex, _flushing, _pending, _events, _wake, _flusher, _dropped
    _mutex = threading.Lock()
    _flushing = threading.Lock()
    _pending = {}
    _events = []
    _wake = threading.Event()
    _flusher = None
    _dropped = 0


runtime.on_fork(_after_fork_in_child)


@atexit.register
def _flush_at_exit() -> None:
    # A write in flight in the flusher thread may hang on an unreachable Redis without a
    # socket timeout: exit waits for it a bounded time, then writes what it can itself.
    held = _flushing.acquire(timeout=EXIT_FLUSH_WAIT)
    try:
        _flush(final=True)
    except Exception:  # the interpreter is going away; nothing sensible to do
        logger.debug("django_redislock: final statistics flush failed", exc_info=True)
    finally:
        if held:
            _flushing.release()


# --- reading -----------------------------------------------------------------------------------


class Minute(NamedTuple):
    """One minute of the "acquisitions over time" series."""

    #: Start of the minute (aware, UTC).
    start: datetime
    acquired: int
    failed: int


@dataclass(frozen=True)
class LockStats:
    """Figures of one stats name, summed over every process since they were first recorded.

    ``wait_buckets``/``hold_buckets``: how many waits/holds fell in each bucket of
    :data:`BUCKETS` (bucket ``i`` counts values in ``(BUCKETS[i-1], BUCKETS[i]]``; the last one,
    index ``len(BUCKETS)``, counts values above ``BUCKETS[-1]``) — not cumulative.
    ``per_minute``: the last :data:`SERIES_MINUTES` minutes, oldest first, when read with
    ``series=True`` (else empty).
    """

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
    skipped: int = 0
    deduplicated: int = 0
    #: Rate limiters: decisions that allowed / refused requests (their per-minute series too).
    allowed: int = 0
    limited: int = 0
    #: Task runs re-published because a rate or a cap was reached (not attempts either).
    throttled: int = 0
    wait_buckets: tuple[int, ...] = _NO_COUNTS
    hold_buckets: tuple[int, ...] = _NO_COUNTS
    per_minute: tuple[Minute, ...] = field(default=(), compare=False)

    @property
    def attempts(self) -> int:
        """Acquisition attempts: acquired or failed (skips and deduplications are not)."""
        return self.acquired + self.failed

    @property
    def success_rate(self) -> float | None:
        """Share of acquisition attempts that got the lock (``None`` before the first attempt).

        Busy locks that worked as intended (``skipped``, ``deduplicated``) are not attempts, so a
        single-flight task whose duplicates were folded keeps a 100 % success rate.
        """
        return self.acquired / self.attempts if self.attempts else None

    @property
    def wait_count(self) -> int:
        """Waits in the histogram (equals ``acquired`` unless figures predate the histograms)."""
        return sum(self.wait_buckets)

    @property
    def hold_count(self) -> int:
        """Holds in the histogram (equals ``released`` unless figures predate the histograms)."""
        return sum(self.hold_buckets)

    @property
    def mean_wait(self) -> float | None:
        return self.wait_total / self.acquired if self.acquired else None

    @property
    def mean_hold(self) -> float | None:
        return self.hold_total / self.released if self.released else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse(
    stats_name: str,
    raw: dict[Any, Any],
    maxima: list[tuple[Any, float]],
    hours: list[dict[Any, Any]] | None,
    last_minute: int,
) -> LockStats:
    values = {_text(k): _text(v) for k, v in raw.items()}
    kwargs: dict[str, Any] = {}
    for name in _INT_FIELDS:
        kwargs[name] = int(values.get(name, 0))
    for name in _FLOAT_FIELDS:
        kwargs[name] = float(values.get(name, 0.0))
    kwargs["wait_buckets"] = tuple(int(values.get(f, 0)) for f in _WAIT_FIELDS)
    kwargs["hold_buckets"] = tuple(int(values.get(f, 0)) for f in _HOLD_FIELDS)
    for member, score in maxima:
        kwargs[f"{_text(member)}_max"] = float(score)
    updated = values.get("updated_at")
    if updated:
        kwargs["updated_at"] = datetime.fromtimestamp(float(updated), tz=timezone.utc)
    if hours is not None:
        counts: dict[str, int] = {}
        for fields in hours:
            counts.update((_text(k), int(v)) for k, v in fields.items())
        first = last_minute - SERIES_MINUTES + 1
        kwargs["per_minute"] = tuple(
            Minute(
                datetime.fromtimestamp(minute * 60, tz=timezone.utc),
                counts.get(f"a:{minute}", 0),
                counts.get(f"f:{minute}", 0),
            )
            for minute in range(first, last_minute + 1)
        )
    return LockStats(name=stats_name, **kwargs)


def _read(alias: str | None, names: list[str], *, series: bool = False) -> list[LockStats]:
    from django_redislock.client import read_stats
    from django_redislock.runtime import get_client, keyspace
    from django_redislock.transport import backend_errors

    if not names:
        return []
    space = keyspace(alias)
    last_minute = int(time.time() // 60)
    # The series' minutes lie in this hour and the previous one (SERIES_MINUTES <= 60).
    hours = sorted({(last_minute - SERIES_MINUTES + 1) // 60, last_minute // 60})
    keys = [
        (
            space.stats(n),
            space.stats_max(n),
            *((space.stats_minutes(n, hour) for hour in hours) if series else ()),
        )
        for n in names
    ]
    with backend_errors("read lock statistics"):
        replies = read_stats(get_client(alias), keys)
    return [
        _parse(n, raw, maxima, per_hour if series else None, last_minute)
        for n, (raw, maxima, per_hour) in zip(names, replies, strict=True)
        if raw
    ]


def get_stats(
    name_or_template: str, using: str | None = None, *, series: bool = False
) -> LockStats | None:
    """Figures of one stats name (a lock name, or a ``distributed_lock`` key template).

    ``None`` when nothing was recorded in the last :data:`STATS_TTL` seconds. Figures still in
    some process's memory (up to :data:`FLUSH_INTERVAL` seconds old) are not included; call
    :func:`flush` first to include this process's. ``series=True`` also reads
    :attr:`LockStats.per_minute` (two more reads per name).
    """
    found = _read(using, [name_or_template], series=series)
    return found[0] if found else None


def get_many_stats(
    names: list[str], using: str | None = None, *, series: bool = False
) -> dict[str, LockStats]:
    """Figures of several stats names in one round trip (names without figures are left out)."""
    return {s.name: s for s in _read(using, list(dict.fromkeys(names)), series=series)}


def iter_stats(
    using: str | None = None, *, batch: int = 200, series: bool = False
) -> Iterator[LockStats]:
    """Figures of every stats name of the namespace (SCAN, never ``KEYS``), in no fixed order."""
    from django_redislock.client import scan_keys
    from django_redislock.keys import escape_glob
    from django_redislock.runtime import get_client, keyspace
    from django_redislock.transport import backend_errors

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
        yield from _read(using, names, series=series)
        if int(cursor) == 0:
            return
