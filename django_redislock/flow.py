"""How an acquisition proceeds, without I/O: a generator that yields operations and receives
their results (httpx's ``auth_flow`` shape).

:func:`acquire` is the whole protocol of taking a lock or a permit on one Redis deployment:
queue behind the holder, sleep until handed the lock or until the holder's lease would end,
claim a reserved hand-off, give up at the deadline (claiming a hand-off that raced it). It yields
:class:`Call` (run a script), :class:`Subscribe` (make sure this process listens for hand-offs)
and :class:`Wait` (sleep, holding no connection), and returns :class:`Acquired` or
:class:`NotAcquired`. The drivers (:mod:`django_redislock.drivers`) run it with blocking calls or
with ``await``; the faces (:mod:`django_redislock.face`) record what it returns. What the
protocol needs to know about the primitive comes from its kind (:mod:`django_redislock.kinds`).

Nothing here is resent (the drivers resend a call once when its connection was lost): an error
from a call goes up to the face, which cancels the attempt by its id (see
:class:`django_redislock.LockOutcomeUnknown`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from django_redislock.exceptions import LockBackendError, LockNotAcquiredError
from django_redislock.kinds import BUSY, HELD, REFUSED, VOID
from django_redislock.scripts import Script

__all__ = [
    "ENTRY_MARGIN",
    "Acquired",
    "Call",
    "Flow",
    "NotAcquired",
    "NotReplicated",
    "Plan",
    "Sleep",
    "Subscribe",
    "Wait",
    "Woken",
    "acquire",
]

logger = logging.getLogger("django_redislock")

#: Extra validity of a waiter's queue entry beyond its next planned re-check (seconds).
ENTRY_MARGIN = 2.0


# -- operations --------------------------------------------------------------------------------


@dataclass(slots=True)
class Call:
    """Run a script where the attempt's target lives (with ``replicas``: then ``WAIT``)."""

    script: Script
    keys: list[str]
    args: list[Any]
    action: str
    replicas: int = 0
    replicas_timeout_ms: int = 0
    #: ``WAITAOF`` after the script (``DURABILITY``): the primary's fsync (1) and replicas'.
    aof_local: int = 0
    aof_replicas: int = 0
    #: On a quorum target: run on every master and return each one's reply (or its
    #: :class:`~django_redislock.LockBackendError`) instead of one combined answer.
    each: bool = False


@dataclass(slots=True)
class Subscribe:
    """Make sure this process listens for hand-offs (bounded wait); returns whether it does."""

    timeout: float


@dataclass(slots=True)
class Wait:
    """Sleep until handed the lock, ``recheck_at`` or ``until`` (monotonic), holding no
    connection; returns :class:`Woken`."""

    until: float
    recheck_at: float


@dataclass(frozen=True, slots=True)
class Woken:
    handed: bool
    #: The token of a lock handed over outright; ``None`` when it must be claimed.
    token: int | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep this long (seconds), holding no connection: a rate limiter waiting for exactly its
    retry-after, which no release can shorten."""

    seconds: float


Op = Call | Subscribe | Wait
Flow = Generator[Op, Any, "Acquired | NotAcquired"]


@dataclass(frozen=True, slots=True)
class Acquired:
    token: int
    count: int
    contended: bool


@dataclass(frozen=True, slots=True)
class NotAcquired:
    contended: bool


class NotReplicated(LockBackendError):
    """A write was not acknowledged as ``REDISLOCK["REPLICAS"]`` / ``["DURABILITY"]`` ask, in
    time; ``reply`` is what the script answered (an acquisition it reports is undone before this
    is raised)."""

    def __init__(
        self,
        action: str,
        reply: Any,
        acked: int,
        needed: int,
        timeout_ms: int,
        *,
        shortfall: str = "",
    ) -> None:
        said = shortfall or (
            f"{acked} of the {needed} replicas REDISLOCK['REPLICAS'] asks for acknowledged it"
        )
        super().__init__(
            f"Redis did not make the write durable while trying to {action}: {said} within "
            f"{timeout_ms} ms. A crash or failover now could lose it, so it does not count."
        )
        self.reply = reply


# -- the plan of one attempt -------------------------------------------------------------------


@dataclass(kw_only=True)
class Plan:
    """Everything an acquisition attempt needs to build its calls: data and arithmetic only."""

    kind: Any
    target: Any
    name: str
    owner: str
    attempt: str
    meta: str
    lease: float
    blocking: bool
    started: float
    deadline: float  # monotonic; inf: wait for ever
    #: Whether calls ask to queue when busy: once hand-offs can reach this process.
    queue: bool
    #: What this process knows of the owner's holds (see ``lua/acquire.lua``): "" for an owner
    #: shared between processes, "-" for none, else the attempt id of the hold it knows.
    known: str = ""
    clock: Callable[[], float] = time.monotonic
    action: str = field(default="")

    def __post_init__(self) -> None:
        self.action = self.action or f"acquire {self.kind.name} {self.name!r}"

    def _replicated(self, script: Script, keys: list[str], args: list[Any], action: str) -> Call:
        target = self.target
        return Call(script, keys, args, action, **target.wait_fields())

    def entry_ms(self) -> int:
        """How long a queue entry stays valid: until the next planned re-check — the deadline
        or the holder's longest lease, whichever is first — plus a margin."""
        left = self.deadline - self.clock()
        return int((max(min(left, self.lease), 0.0) + ENTRY_MARGIN) * 1000)

    def acquire_call(self) -> Call:
        script, keys, args = self.kind.acquire_call(
            self.target,
            self.name,
            owner=self.owner,
            attempt=self.attempt,
            meta=self.meta,
            lease=self.lease,
            queue=self.queue,
            entry_ms=self.entry_ms(),
            known=self.known,
        )
        return self._replicated(script, keys, args, self.action)

    def cancel_call(self, *, take: bool, void_ms: int = 0) -> Call:
        script, keys, args = self.kind.cancel_call(
            self.target,
            self.name,
            self.owner,
            self.attempt,
            take=take,
            lease=self.lease,
            void_ms=void_ms,
            meta=self.meta,
        )
        return self._replicated(script, keys, args, f"stop waiting for {self.name!r}")

    @property
    def void_ms(self) -> int:
        """How long a cancelled attempt stays void: its delayed request could still arrive."""
        return int(max(60.0, 2 * self.lease) * 1000)


# -- the protocol ------------------------------------------------------------------------------


def acquire(plan: Plan) -> Flow:
    """Take the lock (or a permit); :class:`NotAcquired` when not in time. One deadline covers
    every wait."""
    kind = plan.kind
    contended = False
    while True:
        try:
            reply = yield plan.acquire_call()
        except NotReplicated as exc:
            if kind.read_acquire(exc.reply).state == HELD:
                yield plan.cancel_call(take=False)  # undo it, then say so
                raise
            reply = exc.reply  # only a queue entry went unacknowledged
        result = kind.read_acquire(reply)
        if result.state == HELD:
            return Acquired(result.token, result.count, contended)
        if result.state == REFUSED:
            raise LockNotAcquiredError(plan.name, kind.refusal(plan.name))
        if result.state == VOID:
            raise LockBackendError(
                f"The attempt to acquire {plan.name!r} was cancelled before its call reached "
                "Redis; nothing was taken."
            )
        assert result.state == BUSY
        contended = True
        if not plan.blocking:
            return NotAcquired(contended)
        if not plan.queue:
            if not (yield Subscribe(plan.target.subscribe_timeout)):
                logger.warning(
                    "django_redislock: cannot subscribe for wake-ups of %r; waiting with "
                    "re-checks at the holder's lease end only.",
                    plan.name,
                )
            plan.queue = True
            continue
        now = plan.clock()
        span = min(plan.deadline - now, plan.lease)
        holder_left = result.wait_ms / 1000 if result.wait_ms >= 0 else span
        woken = yield Wait(plan.deadline, now + max(0.001, min(holder_left, span)))
        if woken.handed and woken.token is not None:
            # Handed over outright: held, with its full lease, already.
            return Acquired(woken.token, 1, True)
        if not woken.handed and plan.clock() >= plan.deadline:
            # Out of time: leave the queue, but keep a hand-off that raced the deadline.
            try:
                reply = yield plan.cancel_call(take=True)
            except NotReplicated as exc:
                if kind.read_cancel(exc.reply).held:
                    yield plan.cancel_call(take=False)
                raise
            dropped = kind.read_cancel(reply)
            if dropped.held:
                return Acquired(dropped.token, dropped.count, True)
            return NotAcquired(True)
