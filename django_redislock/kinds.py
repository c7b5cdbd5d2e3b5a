"""What varies between primitives, in one small object each: a *kind*.

A kind says which keys a primitive uses, which scripts it runs with which arguments, and what
their replies mean. Everything else — waiting, hand-offs, deadlines, holds, the watchdog,
statistics, signals, the sync and asyncio faces — is written once (:mod:`django_redislock.flow`,
:mod:`django_redislock.face`) and composed with a kind: ``Lock`` is the blocking face with a
:class:`LockKind`, ``Semaphore`` the same face with a :class:`SemaphoreKind`. A new primitive is
a new kind, not a new subclass of a lock.

Calls are returned as ``(script, keys, args)``; every script is idempotent per attempt id (see
``lua/acquire.lua``), so any of them may be resent, and an attempt whose outcome is unknown can
be cancelled by its id (``cancel_call``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_redislock import scripts
from django_redislock.scripts import Script

__all__ = [
    "BUSY",
    "HELD",
    "REFUSED",
    "VOID",
    "AcquireReply",
    "Decision",
    "DropReply",
    "Inspection",
    "LockKind",
    "RateKind",
    "ReadWriteKind",
    "SemaphoreKind",
]

Call = tuple[Script, list[str], list[Any]]

#: The lease a clean-up assumes when it does not know it (it only bounds a reserved hand-off's
#: claim window, see targets.CLAIM_WINDOW).
CLAIM_DEFAULT = 2.0

#: States of an acquire reply.
BUSY, HELD, REFUSED, VOID = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class AcquireReply:
    state: int
    token: int = 0
    count: int = 0
    #: Busy: ms until the holder's lease (or the first permit's) ends; -1 for no expiry.
    wait_ms: int = -1


@dataclass(frozen=True, slots=True)
class DropReply:
    """What a release or a cancel did."""

    #: Holds of the owner left after it (-1: it held nothing to drop).
    left: int = -1
    #: A cancel that claimed the attempt's hold: it is held, with this token and count.
    held: bool = False
    token: int = 0
    count: int = 0
    #: A waiter of this process the lock went to: (waiter id, token or None).
    handed_here: tuple[str, int | None] | None = None

    @property
    def dropped(self) -> bool:
        """Something was dropped (a hold released, or handed on)."""
        return self.left >= 0 and not self.held


@dataclass(frozen=True, slots=True)
class Inspection:
    """``locked()`` / ``owned()``: what the holder key holds."""

    held: bool
    owned: bool
    #: False when the value is not a lock record (written by something else, or corrupted).
    readable: bool = True
    excerpt: str = ""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cancel(
    script: Any,
    keys: list[str],
    target: Any,
    name: str,
    owner: str,
    attempt: str,
    take: bool,
    lease: float,
    void_ms: int,
    last: str,
) -> Call:
    """A call of ``cancel.lua``, ``sem_cancel.lua`` or ``rw_cancel.lua``: the same keys (the
    kind's, then the attempt's void marker) and arguments, but for the last, which is each
    script's own."""
    args = [
        owner,
        attempt,
        "1" if take else "0",
        max(1, int(lease * 1000)),
        *target.wake_args(name, lease),
        void_ms,
        last,
    ]
    return script, [*keys, target.keys.void(name, attempt)], args


def _acquire(
    script: Any,
    keys: list[str],
    target: Any,
    name: str,
    *,
    owner: str,
    attempt: str,
    meta: str,
    lease: float,
    queue: bool,
    entry_ms: int,
    extra: list[Any],
) -> Call:
    """A call of an acquire script: the kind's keys, then the attempt's void marker; the
    arguments every acquire script starts with, then the kind's own (``extra``)."""
    args = [owner, max(1, int(lease * 1000)), meta, attempt, "1" if queue else "0", entry_ms]
    return script, [*keys, target.keys.void(name, attempt)], [*args, *extra]


def _read_acquire(reply: Any) -> AcquireReply:
    """An acquire script's answer: busy (with the wait), void, or held/refused (token, count)."""
    state = int(reply[0])
    if state == BUSY:
        return AcquireReply(BUSY, wait_ms=int(reply[1]))
    if state == VOID:
        return AcquireReply(VOID)
    return AcquireReply(state, token=int(reply[1]), count=int(reply[2]))


def _one_deployment(target: Any, what: str) -> None:
    """Primitives whose state is one set of keys cannot be spread over a quorum of masters."""
    if target.quorum:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"{what} need one Redis (single, Sentinel or Cluster): REDISLOCK['CACHE'] lists "
            "independent masters (Redlock). Pass using=<one alias>."
        )


def _dropped(reply: Any) -> DropReply:
    """release.lua / cancel.lua's answer for a dropped hold."""
    if isinstance(reply, list):
        if int(reply[0]) == 1:  # a claim (cancel with take)
            return DropReply(
                left=int(reply[2]), held=True, token=int(reply[1]), count=int(reply[2])
            )
        token = int(reply[2])
        return DropReply(left=0, handed_here=(_text(reply[1]), token if token >= 0 else None))
    return DropReply(left=int(reply))


class _Queued:
    """What the kinds with a queue share: the acquire call (``acquire_script`` with the
    arguments every acquire script starts with, then the kind's own from ``_extra``)."""

    acquire_script: Script
    cancel_script: Script

    def _keys(self, target: Any, name: str) -> list[str]:
        raise NotImplementedError

    def _extra(self, target: Any, name: str, lease: float, known: str) -> list[Any]:
        raise NotImplementedError

    def acquire_call(
        self,
        target: Any,
        name: str,
        *,
        owner: str,
        attempt: str,
        meta: str,
        lease: float,
        queue: bool,
        entry_ms: int,
        known: str = "",
    ) -> Call:
        return _acquire(
            self.acquire_script,
            self._keys(target, name),
            target,
            name,
            owner=owner,
            attempt=attempt,
            meta=meta,
            lease=lease,
            queue=queue,
            entry_ms=entry_ms,
            extra=self._extra(target, name, lease, known),
        )

    def read_acquire(self, reply: Any) -> AcquireReply:
        return _read_acquire(reply)

    def _cancel_last(self, meta: str, here: str) -> str:
        """The cancel script's last argument, each script's own."""
        raise NotImplementedError

    def cancel_call(
        self,
        target: Any,
        name: str,
        owner: str,
        attempt: str,
        *,
        take: bool = False,
        lease: float = CLAIM_DEFAULT,
        void_ms: int = 0,
        meta: str = "{}",
        here: str = "",
    ) -> Call:
        """Cancel ``attempt`` by its id (``lua/cancel.lua``); ``take``: keep a hold it got."""
        keys = self._keys(target, name)
        last = self._cancel_last(meta, here)
        return _cancel(
            self.cancel_script, keys, target, name, owner, attempt, take, lease, void_ms, last
        )


class LockKind(_Queued):
    """A mutex: one owner at a time, re-entrant per owner (unless ``reentrant=False``)."""

    name = "lock"
    acquire_script = scripts.ACQUIRE
    cancel_script = scripts.CANCEL
    #: Leases of many holds may be reset by one ``renew_many`` script.
    batch_renewals = True
    #: One hold per owner, shared by every object of the name (re-entrancy across objects).
    per_owner = True

    def __init__(self, *, reentrant: bool = True) -> None:
        self.reentrant = reentrant

    def check_target(self, target: Any) -> None:
        """Locks run everywhere: one Redis, Sentinel, a Cluster, a quorum of masters."""

    def holder_key(self, target: Any, name: str) -> str:
        return target.keys.lock(name)  # type: ignore[no-any-return]

    def hold_ident(self, target: Any, name: str, owner: str, token: int) -> tuple[str, str, str]:
        """One hold per (lock, owner), however often it nests."""
        return (target.alias, target.keys.lock(name), owner)

    def _keys(self, target: Any, name: str) -> list[str]:
        keys = target.keys
        return [keys.lock(name), keys.fence(name), keys.queue(name), keys.waiters(name)]

    def _extra(self, target: Any, name: str, lease: float, known: str) -> list[Any]:
        """``known``: see ``lua/acquire.lua`` (what this process knows of the owner's holds)."""
        return ["0" if self.reentrant else "1", *target.wake_args(name, lease), known]

    def refusal(self, name: str) -> str:
        """Why an acquisition was refused at once (a REFUSED reply)."""
        return (
            f"Lock {name!r} is already held by this owner and reentrant=False: acquiring it "
            "again would deadlock."
        )

    def _cancel_last(self, meta: str, here: str) -> str:
        return here

    def read_cancel(self, reply: Any) -> DropReply:
        return _dropped(reply)

    def release_call(
        self,
        target: Any,
        name: str,
        owner: str,
        *,
        attempt: str,
        token: int | None,
        all_holds: bool,
        lease: float,
        here: str,
    ) -> Call:
        args = [owner, attempt, "1" if all_holds else "0", *target.wake_args(name, lease), here]
        return scripts.RELEASE, self._keys(target, name), args

    def read_release(self, reply: Any) -> DropReply:
        return _dropped(reply)

    def renew_call(
        self, target: Any, name: str, owner: str, token: int, ms: int, mode: str
    ) -> Call:
        return scripts.RENEW, [target.keys.lock(name)], [owner, ms, mode]

    def inspect_call(self, target: Any, name: str, owner: str) -> Call:
        return scripts.INSPECT, [target.keys.lock(name)], [owner]

    def read_inspect(self, reply: Any) -> Inspection:
        raw = reply[3]
        return Inspection(
            held=bool(int(reply[0])),
            owned=bool(int(reply[1])),
            readable=bool(int(reply[2])),
            excerpt=raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw),
        )


class SemaphoreKind(_Queued):
    """At most ``permits`` holders at once; every acquisition is a permit of its own, with its
    own lease and fencing token (not re-entrant)."""

    name = "semaphore"
    acquire_script = scripts.SEM_ACQUIRE
    cancel_script = scripts.SEM_CANCEL
    batch_renewals = False
    #: One hold per acquisition (permit), known to the object that took it.
    per_owner = False
    reentrant = False

    def __init__(self, *, permits: int) -> None:
        self.permits = permits

    def check_target(self, target: Any) -> None:
        _one_deployment(target, "Semaphores")

    def holder_key(self, target: Any, name: str) -> str:
        return target.keys.semaphore(name)  # type: ignore[no-any-return]

    def hold_ident(self, target: Any, name: str, owner: str, token: int) -> tuple[str, str, str]:
        """One hold per permit: an owner may hold several permits of one semaphore."""
        return (target.alias, target.keys.semaphore(name), f"{owner}#{token}")

    def _keys(self, target: Any, name: str) -> list[str]:
        keys = target.keys
        return [
            keys.semaphore(name),
            keys.semaphore_records(name),
            keys.fence(name),
            keys.semaphore_queue(name),
            keys.semaphore_waiters(name),
        ]

    def _extra(self, target: Any, name: str, lease: float, known: str) -> list[Any]:
        return [self.permits, *target.wake_args(name, lease)]

    def read_acquire(self, reply: Any) -> AcquireReply:
        state = int(reply[0])
        if state == BUSY:
            return AcquireReply(BUSY, wait_ms=int(reply[1]))
        if state == VOID:
            return AcquireReply(VOID)
        return AcquireReply(HELD, token=int(reply[1]), count=1)

    def _cancel_last(self, meta: str, here: str) -> str:
        return meta

    def read_cancel(self, reply: Any) -> DropReply:
        if isinstance(reply, list):
            return DropReply(left=1, held=True, token=int(reply[1]), count=1)
        return DropReply(left=int(reply))

    def release_call(
        self,
        target: Any,
        name: str,
        owner: str,
        *,
        attempt: str,
        token: int | None,
        all_holds: bool,
        lease: float,
        here: str,
    ) -> Call:
        args = [owner, token or 0, *target.wake_args(name, lease)]
        return scripts.SEM_RELEASE, self._keys(target, name), args

    def read_release(self, reply: Any) -> DropReply:
        return DropReply(left=int(reply))

    def renew_call(
        self, target: Any, name: str, owner: str, token: int, ms: int, mode: str
    ) -> Call:
        return scripts.SEM_RENEW, self._keys(target, name)[:2], [owner, token, ms, mode]

    def inspect_call(self, target: Any, name: str, owner: str) -> Call:
        return scripts.SEM_INSPECT, self._keys(target, name)[:2], [owner]

    def read_inspect(self, reply: Any) -> Inspection:
        """Held: a live permit exists; owned: this owner holds one."""
        return Inspection(held=int(reply[0]) > 0, owned=int(reply[1]) > 0)


@dataclass(frozen=True, slots=True)
class Decision:
    """A rate limiter's answer, in the server's units (microseconds)."""

    allowed: bool
    remaining: int
    retry_after_us: int
    reset_after_us: int
    #: A refused request's place was booked (``reserve``): it may act in ``retry_after_us``.
    booked: bool = False


class RateKind:
    """A rate limiter (GCRA): nothing is held, so nothing is released, renewed or handed over;
    a decision is one call, and a refused one changes nothing.

    ``native``: the server's own ``GCRA`` command decides instead of ``lua/rate.lua`` (same key
    layout, same arithmetic; see :mod:`django_redislock.ratelimit`), its retry-after reported in
    ``"ms"`` or whole ``"s"``; ``None``: the script.
    """

    name = "rate"

    def __init__(self, *, count: int, period: float, burst: int) -> None:
        self.count = count
        self.period = period
        self.burst = burst
        #: Microseconds between two requests at the sustained rate (the server's rounding).
        self.interval_us = max(1, int(period * 1_000_000 / count + 0.5))

    def check_target(self, target: Any) -> None:
        _one_deployment(target, "Rate limiters")

    def decide_call(
        self,
        target: Any,
        name: str,
        n: int,
        native: str | None = None,
        reserve_us: int = 0,
        key: str | None = None,
    ) -> Call:
        """``reserve_us``: book the place of a request that would have to wait at most this
        long (the native command cannot book: the script does it). ``key``: another key than
        the limiter's own (its schedule)."""
        key = key or target.keys.rate(name)
        if reserve_us:
            return scripts.RATE, [key], [self.burst, self.interval_us, n, 0, reserve_us]
        if native is not None and self.period >= 1.0:
            # GCRA key max-burst tokens-per-period period TOKENS n (max-burst: beyond the first)
            args: list[Any] = [self.burst - 1, self.count, repr(float(self.period)), "TOKENS", n]
            return scripts.NATIVE_GCRA, [key], args
        return scripts.RATE, [key], [self.burst, self.interval_us, n, 0]

    def read_decision(
        self, reply: Any, native: str | None = None, *, script: Any = None
    ) -> Decision:
        if script is scripts.NATIVE_GCRA:
            unit = 1000 if native == "ms" else 1_000_000
            limited, _, remaining, retry, reset = (int(v) for v in reply)
            return Decision(
                allowed=not limited,
                remaining=max(0, remaining),
                retry_after_us=max(0, retry) * unit if limited else 0,
                reset_after_us=max(0, reset) * unit,
            )
        allowed, remaining, retry, reset = (int(v) for v in reply)
        return Decision(allowed == 1, remaining, retry, reset, booked=allowed == 2)

    def reset_call(self, target: Any, name: str) -> Call:
        return scripts.RATE_RESET, [target.keys.rate(name)], []


def rw_keys(keys: Any, name: str) -> list[str]:
    """The keys every ``lua/rw_*.lua`` script starts with (writer, readers, their records,
    fence, queue, waiters)."""
    return [
        keys.rw_write(name),
        keys.rw_readers(name),
        keys.rw_records(name),
        keys.fence(name),
        keys.rw_queue(name),
        keys.rw_waiters(name),
    ]


class ReadWriteKind(_Queued):
    """One side of a read-write lock: ``writes`` False for the read lock, True for the write
    lock. Any number of readers (each owner its own lease) or one writer; a queued writer blocks
    new readers; re-entrant per owner; a writer may read (downgrade), a reader may not write
    (refused at once: two readers upgrading would wait for each other for ever). Both sides
    share the name's fencing counter and queue (``lua/rw_*.lua``)."""

    batch_renewals = False
    per_owner = True
    reentrant = True
    acquire_script = scripts.RW_ACQUIRE
    cancel_script = scripts.RW_CANCEL

    def __init__(self, *, writes: bool) -> None:
        self.writes = writes
        self.name = "write lock" if writes else "read lock"
        self._mode = "w" if writes else "r"

    def check_target(self, target: Any) -> None:
        _one_deployment(target, "Read-write locks")

    def holder_key(self, target: Any, name: str) -> str:
        keys = target.keys
        return keys.rw_write(name) if self.writes else keys.rw_readers(name)  # type: ignore[no-any-return]

    def hold_ident(self, target: Any, name: str, owner: str, token: int) -> tuple[str, str, str]:
        """One hold per (side, owner), however often it nests."""
        return (target.alias, self.holder_key(target, name), owner)

    def _keys(self, target: Any, name: str) -> list[str]:
        return rw_keys(target.keys, name)

    def _extra(self, target: Any, name: str, lease: float, known: str) -> list[Any]:
        return [self._mode, known]

    def refusal(self, name: str) -> str:
        return (
            f"Cannot take the write lock of {name!r}: this owner holds its read lock. An "
            "upgrade could wait for ever (two readers upgrading wait for each other); release "
            "the read lock first, or take the write lock first and then read (downgrade)."
        )

    def _cancel_last(self, meta: str, here: str) -> str:
        return self._mode

    def read_cancel(self, reply: Any) -> DropReply:
        if isinstance(reply, list):
            count = int(reply[2])
            return DropReply(left=count, held=True, token=int(reply[1]), count=count)
        return DropReply(left=int(reply))

    def release_call(
        self,
        target: Any,
        name: str,
        owner: str,
        *,
        attempt: str,
        token: int | None,
        all_holds: bool,
        lease: float,
        here: str,
    ) -> Call:
        args = [owner, attempt, "1" if all_holds else "0", *target.channel_args(name), self._mode]
        return scripts.RW_RELEASE, self._keys(target, name), args

    def read_release(self, reply: Any) -> DropReply:
        return DropReply(left=int(reply))

    def renew_call(
        self, target: Any, name: str, owner: str, token: int, ms: int, mode: str
    ) -> Call:
        return scripts.RW_RENEW, self._keys(target, name)[:3], [owner, ms, mode, self._mode]

    def inspect_call(self, target: Any, name: str, owner: str) -> Call:
        return scripts.RW_INSPECT, self._keys(target, name)[:2], [owner, self._mode]

    def read_inspect(self, reply: Any) -> Inspection:
        return Inspection(held=int(reply[0]) > 0, owned=int(reply[1]) > 0)
