"""Inspection and operator actions: listing, paging, sorting and force-releasing locks.

The admin pages and the ``redislock`` management command are built on exactly these functions,
so a page and a command line never disagree about what is held, in which order, or what a force
release released.

Several :class:`LockInfo` may share a name (one per held permit of a semaphore), so everything
here identifies a holder by ``(name, fencing_token)``, never by name alone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as redis_errors

from django_redislock import client as redis_client
from django_redislock import connection, scripts, signals, stats
from django_redislock.exceptions import LockBackendError
from django_redislock.keys import KeySpace
from django_redislock.kinds import rw_keys
from django_redislock.naming import stats_shape
from django_redislock.records import LockRecord, parse_record
from django_redislock.runtime import get_client, keyspace, runtime
from django_redislock.targets import CLAIM_WINDOW, Target
from django_redislock.transport import backend_errors

__all__ = [
    "SORTS",
    "BackendProblem",
    "LockInfo",
    "LockPage",
    "backend_problem",
    "describe_holder",
    "force_release",
    "force_release_info",
    "get_lock_info",
    "list_locks",
    "lock_holders",
    "lock_page",
    "page_locks",
    "rate_limit_info",
    "reset_rate_limit",
]


@dataclass(frozen=True)
class LockInfo:
    """A snapshot of one active lock."""

    name: str
    owner: str
    host: str
    pid: int | None
    thread: str
    task_id: str | None
    fencing_token: int
    hold_count: int
    acquired_at: dt.datetime
    expires_in: float
    #: ``"lock"``, ``"semaphore"`` (one ``LockInfo`` per held permit), ``"rwlock"`` (a
    #: read-write lock: one per reader, or its writer; see ``mode``), or one of the kinds
    #: nobody holds (``owner``/``host`` empty, ``fencing_token`` 0): ``"rate"`` (a rate
    #: limiter with a history; ``expires_in``: until it is rested), ``"latch"`` (``hold_count``:
    #: the count left of ``permits``) or ``"barrier"`` (``hold_count``: parties arrived of
    #: ``permits``; ``mode`` ``"broken"`` when broken).
    kind: str = "lock"
    #: How many holders the name admits at once (1 for a lock).
    permits: int = 1
    #: Held for a published Celery task that no worker has started yet: ``host``/``pid``/``thread``
    #: are the publisher's. Once a worker runs the task they are the worker's.
    queued: bool = False
    #: The stored value is not a record this version can read (written by something else, or
    #: corrupted): the holder fields are empty, ``fencing_token`` is 0, and it can still be
    #: force-released (with ``token=0`` or no token).
    unreadable: bool = False
    #: The start of an unreadable value, for operators ("" for a readable record).
    raw_excerpt: str = ""
    #: A read-write lock's holder (``kind == "rwlock"``): ``"read"`` or ``"write"``; a broken
    #: barrier: ``"broken"``; else "".
    mode: str = ""

    @property
    def held_for(self) -> float:
        """Seconds since acquisition, by this machine's clock."""
        return max(0.0, (dt.datetime.now(dt.timezone.utc) - self.acquired_at).total_seconds())

    @property
    def expires(self) -> bool:
        """Whether the value has a lease (only something else writes values without one)."""
        return self.expires_in != float("inf")

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields (``acquired_at`` as ISO 8601; ``expires_in`` ``None``: never)."""
        return {
            "name": self.name,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "task_id": self.task_id,
            "fencing_token": self.fencing_token,
            "hold_count": self.hold_count,
            "acquired_at": self.acquired_at.isoformat(),
            # JSON has no infinity; null says "no lease" without breaking strict parsers.
            "expires_in": self.expires_in if self.expires else None,
            "kind": self.kind,
            "mode": self.mode,
            "permits": self.permits,
            "queued": self.queued,
            "unreadable": self.unreadable,
            "raw_excerpt": self.raw_excerpt,
        }


def describe_holder(info: LockInfo) -> str:
    """Who holds a lock, as one plain line for terminals and logs.

    The worker running it (``host pid N thread T``), or for a Celery task no worker has started
    yet, who published it; an unreadable value has no holder.
    """
    if info.unreadable:
        return f"nobody: the value is not a lock record (it starts {info.raw_excerpt!r})"
    if info.queued:
        return (
            f"Celery task {info.task_id}, queued (published by {info.host} pid {info.pid}), "
            f"fencing token {info.fencing_token}"
        )
    task = f", Celery task {info.task_id}" if info.task_id else ""
    return (
        f"{info.host} pid {info.pid} thread {info.thread}{task}, fencing token {info.fencing_token}"
    )


def _info(keys: KeySpace, record: LockRecord, permits: int = 1) -> LockInfo:
    meta = record.meta
    pid = meta.get("pid")
    kind, mode = keys.kind_of(record.key) or "lock", ""
    if kind.startswith("rwlock"):
        kind, mode = "rwlock", "read" if kind == "rwlock-readers" else "write"
    try:
        pid = int(pid) if pid is not None else None
    except (TypeError, ValueError):
        pid = None
    return LockInfo(
        name=keys.name_of(record.key),
        owner=record.owner,
        host=str(meta.get("host") or ""),
        pid=pid,
        thread=str(meta.get("thread") or ""),
        task_id=meta.get("task_id") or None,
        fencing_token=record.token,
        hold_count=record.count,
        acquired_at=dt.datetime.fromtimestamp(record.acquired_at_ms / 1000, tz=dt.timezone.utc),
        # A value without a TTL (pttl -1: only something else writes such values) never expires.
        expires_in=record.pttl_ms / 1000 if record.pttl_ms >= 0 else float("inf"),
        queued=bool(meta.get("queued")),
        kind=kind,
        mode=mode,
        permits=permits,
        unreadable=record.unreadable,
        raw_excerpt=record.raw_excerpt,
    )


def _identity(info: LockInfo) -> tuple[str, str, int]:
    """What tells two holders apart: a semaphore has several per name, each with its token, and
    a rate limiter may share a lock's name."""
    return info.kind, info.name, info.fencing_token


# -- reading ---------------------------------------------------------------------------------------


def lock_page(
    *, cursor: int = 0, match: str | None = None, count: int = 500, using: str | None = None
) -> tuple[int, list[LockInfo]]:
    """One SCAN step of active locks: ``(next_cursor, infos)``; ``next_cursor == 0`` when done.

    Two round trips whatever the page size (SCAN, then one pipeline of GET+PTTL). SCAN may
    return a key twice across steps; :func:`page_locks` and :func:`list_locks` dedupe.
    """
    client = get_client(using)
    keys = keyspace(using)
    with backend_errors("list locks"):
        next_cursor, found = redis_client.scan_keys(
            client, keys.holder_pattern(match), cursor=cursor, count=count
        )
        infos = _read_holders(client, keys, found)
    return next_cursor, infos


def _read_holders(client: Any, keys: KeySpace, found: list[str]) -> list[LockInfo]:
    """Infos of lock, semaphore and rate limiter keys (other keys are ignored), in one round
    trip per kind found."""
    lock_keys = [k for k in found if keys.kind_of(k) == "lock"]
    sem_keys = [k for k in found if keys.kind_of(k) == "semaphore"]
    rate_keys = [k for k in found if keys.kind_of(k) == "rate"]
    lock_keys += [k for k in found if keys.kind_of(k) == "rwlock"]
    infos = [_info(keys, r) for r in redis_client.read_locks(client, lock_keys)]
    pairs = [(k, keys.semaphore_records(keys.name_of(k))) for k in sem_keys]
    pairs += [
        (k, keys.rw_records(keys.name_of(k))) for k in found if keys.kind_of(k) == "rwlock-readers"
    ]
    for _, permits, records in redis_client.read_semaphores(client, pairs):
        infos.extend(_info(keys, r, permits) for r in records)
    now = dt.datetime.now(dt.timezone.utc)
    if rate_keys:
        for key, pttl in redis_client.read_rates(client, rate_keys):
            infos.append(_rate_info(keys, key, pttl, now))
    latch_keys = [k for k in found if keys.kind_of(k) == "latch"]
    for key, left, count, pttl in redis_client.read_latches(client, latch_keys):
        infos.append(_coordination_info(keys, key, "latch", left, count, pttl, now))
    barrier_keys = [
        (k, k.replace(":barrier:", ":barrierw:", 1)) for k in found if keys.kind_of(k) == "barrier"
    ]
    for key, parties, arrived, broken, pttl in redis_client.read_barriers(client, barrier_keys):
        info = _coordination_info(keys, key, "barrier", arrived, parties, pttl, now)
        infos.append(dataclasses.replace(info, mode="broken" if broken else ""))
    return infos


#: Kinds listed although nobody holds them: nothing to force-release, no holder, token 0.
HOLDS_NOTHING = frozenset({"rate", "latch", "barrier"})


def _coordination_info(
    keys: KeySpace, key: str, kind: str, number: int, of: int, pttl_ms: int, now: dt.datetime
) -> LockInfo:
    """A latch (``hold_count``: the count left, ``permits``: its initial count) or a barrier
    (``hold_count``: parties arrived in this round, ``permits``: its parties; ``mode``
    ``"broken"`` when broken) as a listing row; ``expires_in``: until its keys expire unused."""
    return LockInfo(
        name=keys.name_of(key),
        owner="",
        host="",
        pid=None,
        thread="",
        task_id=None,
        fencing_token=0,
        hold_count=number,
        acquired_at=now,
        expires_in=pttl_ms / 1000 if pttl_ms >= 0 else float("inf"),
        kind=kind,
        permits=of,
    )


def _rate_info(keys: KeySpace, key: str, pttl_ms: int, now: dt.datetime) -> LockInfo:
    """A rate limiter with a history, as a listing row (nobody holds it)."""
    return _coordination_info(keys, key, "rate", 0, 0, pttl_ms, now)


def list_locks(*, match: str | None = None, using: str | None = None) -> Iterator[LockInfo]:
    """Every active lock (``SCAN``, never ``KEYS``); ``match`` is a glob on the lock name."""
    seen: set[tuple[str, str, int]] = set()
    cursor = 0
    while True:
        cursor, infos = lock_page(cursor=cursor, match=match, using=using)
        for info in infos:
            if _identity(info) not in seen:
                seen.add(_identity(info))
                yield info
        if cursor == 0:
            return


def get_lock_info(name: str, *, using: str | None = None) -> LockInfo | None:
    """The active lock called ``name``, or ``None``; for a semaphore, its oldest permit."""
    holders = lock_holders(name, using=using)
    return holders[0] if holders else None


def lock_holders(name: str, *, using: str | None = None) -> list[LockInfo]:
    """Every holder of ``name``: one entry for a lock, one per held permit of a semaphore
    (oldest permit first). A rate limiter of that name holds nothing and is not listed here
    (:func:`rate_limit_info`), so code that asks who holds a name never meets one."""
    client = get_client(using)
    keys = keyspace(using)
    with backend_errors(f"inspect lock {name!r}"):
        infos = _read_holders(client, keys, _holder_keys(keys, name))
    return sorted(infos, key=lambda info: (info.kind != "lock", info.fencing_token))


def _holder_keys(keys: KeySpace, name: str) -> list[str]:
    """The keys that can name a holder of ``name``: a lock, a semaphore, a read-write lock."""
    return [keys.lock(name), keys.semaphore(name), keys.rw_write(name), keys.rw_readers(name)]


def rate_limit_info(name: str, *, using: str | None = None) -> LockInfo | None:
    """The rate limiter ``name`` as a listing row (``kind="rate"``), or ``None`` when it has
    no history (rested, or never used)."""
    client = get_client(using)
    keys = keyspace(using)
    with backend_errors(f"inspect rate limit {name!r}"):
        infos = _read_holders(client, keys, [keys.rate(name)])
    return infos[0] if infos else None


# -- paging and sorting ----------------------------------------------------------------------------

#: ``sort`` values of :func:`page_locks`: the key, and whether the order is descending.
#: "held" sorts by time held, shortest first, i.e. on ``acquired_at`` (no clock reading per lock);
#: "expires" is soonest first, a value without a lease last; "-" reverses.
SORTS: dict[str, tuple[Callable[[LockInfo], Any], bool]] = {
    "name": (lambda info: (info.name, info.fencing_token), False),
    "-name": (lambda info: (info.name, info.fencing_token), True),
    "expires": (lambda info: info.expires_in, False),
    "-expires": (lambda info: info.expires_in, True),
    "held": (lambda info: info.acquired_at, True),
    "-held": (lambda info: info.acquired_at, False),
}


@dataclass(frozen=True)
class LockPage:
    """One page of active locks, as the admin list and ``manage.py redislock list`` show them.

    Unsorted pages follow ``SCAN`` (``next_cursor`` continues where this page ended); sorted
    pages are numbered (``number``), since a sort needs every lock anyway.
    """

    infos: list[LockInfo]
    sort: str | None
    #: 1-based page number (unsorted pages are numbered too, for display).
    number: int
    #: Locks per page asked for (``None``: everything on one page).
    per_page: int | None
    #: Unsorted: the SCAN cursor the next page starts from (0: this is the last page).
    next_cursor: int
    has_next: bool
    #: Sorted: more locks exist than ``sort_limit``; the order is among the first ones only.
    truncated: bool = False

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def first_index(self) -> int:
        """1-based position of the page's first lock in a sorted listing."""
        return (self.number - 1) * (self.per_page or 0) + 1


def page_locks(
    *,
    match: str | None = None,
    sort: str | None = None,
    cursor: int = 0,
    page: int = 1,
    per_page: int | None = 100,
    using: str | None = None,
    scan_count_max: int = 5000,
    sort_limit: int = 200_000,
) -> LockPage:
    """One page of active locks matching ``match`` (a glob on the name).

    Without ``sort``: at least ``per_page`` locks (unless fewer remain) in SCAN order from
    ``cursor`` on; the first page costs a few round trips however many locks exist. A page may
    hold a few more than ``per_page``, as a SCAN step cannot be cut short.

    With ``sort`` (a key of :data:`SORTS`): page ``page`` of every lock in that order. This reads
    every lock (at most ``sort_limit``, beyond which ``truncated`` is set) but keeps only the
    ``page * per_page`` best in a heap. ``per_page=None`` puts everything on one page.
    """
    if sort is not None and sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)} or None, not {sort!r}")
    page = max(page, 1)
    if sort is None:
        infos, next_cursor = _scan_page(match, max(cursor, 0), per_page, using, scan_count_max)
        return LockPage(infos, None, page, per_page, next_cursor, has_next=next_cursor != 0)
    key, descending = SORTS[sort]
    truncated = False

    def limited() -> Iterator[LockInfo]:
        nonlocal truncated
        seen: set[tuple[str, str, int]] = set()
        step = 0
        while True:
            step, infos = lock_page(cursor=step, match=match, count=scan_count_max, using=using)
            for info in infos:
                if _identity(info) in seen:
                    continue
                if len(seen) >= sort_limit:
                    truncated = True
                    return
                seen.add(_identity(info))
                yield info
            if step == 0:
                return

    if per_page is None:
        best = sorted(limited(), key=key, reverse=descending)
        return LockPage(best, sort, 1, None, 0, has_next=False, truncated=truncated)
    wanted = page * per_page + 1
    pick = heapq.nlargest if descending else heapq.nsmallest
    best = pick(wanted, limited(), key=key)
    start = (page - 1) * per_page
    return LockPage(
        best[start : start + per_page],
        sort,
        page,
        per_page,
        0,
        has_next=len(best) == wanted,
        truncated=truncated,
    )


def _scan_page(
    match: str | None, cursor: int, per_page: int | None, using: str | None, count_max: int
) -> tuple[list[LockInfo], int]:
    """Locks from ``cursor`` on until ``per_page`` are found: ``(infos, next_cursor)``.

    Each SCAN step's COUNT doubles while steps come back sparse (a namespace holds many more
    fence counters than live locks), capped by ``count_max``.
    """
    found: dict[tuple[str, str, int], LockInfo] = {}
    count = min(per_page or count_max, count_max)
    while True:
        cursor, infos = lock_page(cursor=cursor, match=match, count=count, using=using)
        for info in infos:
            found.setdefault(_identity(info), info)
        if cursor == 0 or (per_page is not None and len(found) >= per_page):
            return list(found.values()), cursor
        if len(infos) < count // 4:
            count = min(count * 2, count_max)


# -- force release ---------------------------------------------------------------------------------


def force_release_info(
    name: str, *, token: int | None = None, using: str | None = None
) -> list[LockInfo]:
    """Delete a lock whoever holds it, hand it to the next waiter, and say what was released.

    With ``token``, only a holder whose current fencing token equals it is released, so a lock
    that changed hands since an operator looked at it is left alone (``token=0`` matches an
    unreadable value). Returns the released holders as the release script saw them — one for a
    lock, one per permit of a semaphore, empty when nothing was released — so a report of "who
    held it" can never describe a holder other than the one released. Their ``expires_in`` is 0.

    Without ``token`` the current holders are read first and released by their tokens: a resent
    call (redis-py retries a call whose reply was lost) can then never release a holder that
    came after them.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
        raise TypeError(f"token must be an int or None, not {type(token).__name__}")
    target = runtime.target(using)
    released: list[LockInfo] = []
    rows: list[str] = []
    with backend_errors(f"force-release lock {name!r}"):
        for member in target.members or (target,):
            tokens = [token] if token is not None else _holder_tokens(member, name)
            for expected in tokens:
                for info, row in _force_one(member, name, expected):
                    released.append(info)
                    rows.append(row)
    current = token or (released[0].fencing_token if released else 0)
    if released:
        # Once per call, on the row the holder counts its acquisitions (and its loss) on: the
        # key template it recorded, else the shape of the name (as a plain Lock's row).
        row = next((r for r in rows if r), None) or stats_shape(name)
        stats.record(using, row, "force_released")
    if signals.lock_force_released.receivers:
        signals.lock_force_released.send_robust(
            None, name=name, token=current or None, using=using, released=bool(released)
        )
    return _unique(released)


def _holder_tokens(target: Target, name: str) -> list[int]:
    keys = target.keys
    infos = _read_holders(target.client, keys, _holder_keys(keys, name))
    return [info.fencing_token for info in infos]


def reset_rate_limit(name: str, *, using: str | None = None) -> bool:
    """Forget the history of the rate limiter ``name`` (its next request finds it rested), as
    ``RateLimiter.reset()`` does, without knowing its rate; returns whether it had a history.

    For operators (the admin's reset button, ``manage.py redislock reset-rate``); sends
    ``rate_limit_reset``. A reset is counted on the limiter's row as ``force_released``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    target = runtime.target(using)
    reset = False
    with backend_errors(f"reset rate limit {name!r}"):
        for member in target.members or (target,):
            key = member.keys.rate(name)
            action = f"reset rate limit {name!r}"
            reset |= bool(int(member.transport.run(scripts.RATE_RESET, [key], [], action)))
    if reset:
        stats.record(using, stats_shape(name), "force_released")
    if signals.rate_limit_reset.receivers:
        signals.rate_limit_reset.send_robust(None, name=name, using=using, reset=reset)
    return reset


def _force_one(target: Target, name: str, token: int) -> list[tuple[LockInfo, str]]:
    """Release the lock ``name`` (else the semaphore permit) of ``token``, on one deployment.

    Returns each released holder with the statistics row its record names ("" when none)."""
    keys = target.keys
    run = target.transport.run
    wake = target.wake_args(name, CLAIM_WINDOW)
    action = f"force-release lock {name!r}"
    lock_keys = [keys.lock(name), keys.fence(name), keys.queue(name), keys.waiters(name)]
    reply = run(scripts.FORCE_RELEASE, lock_keys, [str(token), *wake], action)
    if int(reply[0]):
        return [_released(keys, parse_record(keys.lock(name), reply[2], 0))]
    sem_keys = [
        keys.semaphore(name),
        keys.semaphore_records(name),
        keys.fence(name),
        keys.semaphore_queue(name),
        keys.semaphore_waiters(name),
    ]
    sem_reply = run(scripts.SEM_FORCE_RELEASE, sem_keys, [str(token), *wake], action)
    found = [
        _released(keys, parse_record(keys.semaphore(name), sem_reply[2 + 2 * i], 0))
        for i in range(int(sem_reply[0]))
    ]
    if found:
        return found
    rw_reply = run(
        scripts.RW_FORCE_RELEASE,
        rw_keys(keys, name),
        [str(token), *target.channel_args(name)],
        action,
    )
    found = []
    for i in range(int(rw_reply[0])):
        side, raw = rw_reply[1 + 2 * i], rw_reply[2 + 2 * i]
        key = keys.rw_write(name) if side in (b"w", "w") else keys.rw_readers(name)
        found.append(_released(keys, parse_record(key, raw, 0)))
    return found


def _released(keys: KeySpace, record: LockRecord) -> tuple[LockInfo, str]:
    row = record.meta.get("stats")
    return _info(keys, record), row if isinstance(row, str) else ""


def _unique(infos: list[LockInfo]) -> list[LockInfo]:
    """One entry per holder (independent masters each report the same one)."""
    seen: set[tuple[str, str, int]] = set()
    found = []
    for info in infos:
        if _identity(info) not in seen:
            seen.add(_identity(info))
            found.append(info)
    return found


def force_release(name: str, *, token: int | None = None, using: str | None = None) -> bool:
    """Delete a lock whoever holds it, and hand it to the next waiter.

    With ``token``, only a lock whose current fencing token equals it is released, so a lock that
    changed hands since an operator looked at it is left alone. Returns whether a lock was
    released. The former holder finds out at its next renewal (``lost``) or release.
    """
    return bool(force_release_info(name, token=token, using=using))


# -- when Redis fails ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendProblem:
    """What an operator needs to fix a failed Redis call: where, what happened, what to check."""

    #: The ``CACHES`` alias the locks are read from.
    alias: str
    #: Its ``LOCATION``, with any password masked.
    location: str
    #: Connection refused, timed out, pool exhausted (as opposed to Redis answering an error).
    unreachable: bool
    #: What redis-py said.
    detail: str

    def summary(self) -> str:
        """One line for a terminal or a log."""
        where = f"cache {self.alias!r} at {self.location}" if self.location else repr(self.alias)
        if self.unreachable:
            return (
                f"Redis is unreachable ({where}): {self.detail}. Check that the Redis server is "
                f"running and reachable from this machine, and CACHES[{self.alias!r}]['LOCATION']."
            )
        return f"Redis answered an error ({where}): {self.detail}"


def backend_problem(exc: LockBackendError, *, using: str | None = None) -> BackendProblem:
    """Describe a :class:`LockBackendError` for the cache ``using`` (default: the setting)."""
    alias = connection.resolve_alias(using)
    cause = _redis_cause(exc)
    unreachable = isinstance(cause, (redis_errors.ConnectionError, redis_errors.TimeoutError))
    detail = str(cause) if cause is not None else str(exc)
    return BackendProblem(
        alias=alias,
        location=_masked_location(alias),
        unreachable=unreachable,
        detail=" ".join(detail.split()).rstrip("."),
    )


def _redis_cause(exc: BaseException) -> BaseException | None:
    """The redis-py error behind ``exc`` (its cause, or its cause's cause, ...)."""
    seen: set[int] = set()
    cause = exc.__cause__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, redis_errors.RedisError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def _masked_location(alias: str) -> str:
    from django.conf import settings

    caches: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {})
    location = (caches.get(alias) or {}).get("LOCATION") or ""
    locations = [location] if isinstance(location, str) else list(location)
    return ", ".join(_mask_password(str(url)) for url in locations)


def _mask_password(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host`` (pages and logs show it)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
