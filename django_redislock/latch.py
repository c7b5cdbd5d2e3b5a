"""Count-down latches and barriers shared by every process: :class:`CountDownLatch`,
:class:`Barrier` and their asyncio twins.

Why: a ``threading`` latch or barrier coordinates the threads of one process; deployments need
the same between processes and hosts ("start the import once the 8 shard exports are done",
"the 4 workers of a benchmark start together"). The state lives in Redis, one hash tag per name
(``{name}``), so every key of one latch or barrier shares a Cluster slot and one script reads and
changes them atomically.

How:

- **Latch.** ``<ns>:latch:{name}`` holds the initial and the remaining count; ``count_down`` is
  one script call that decrements (never below 0) and, at 0, publishes a wake-up to every
  registered waiter (``<ns>:latchw:{name}``, waiter id -> entry expiry). Each ``count_down``
  carries an id of its own, remembered among the last :data:`RECENT_COUNT_DOWNS` in
  ``<ns>:latchd:{name}``: a resend after a lost reply counts nothing.
- **Barrier.** ``<ns>:barrier:{name}`` holds the parties and whether it is broken;
  ``<ns>:barrierw:{name}`` the parties of the current round, each scored by the end of its
  lease; ``<ns>:barrierx:{name}`` each party's record (waiting, passed, broken) and its arrival
  index. The last arrival ends the round (the barrier is cyclic) and wakes the others; a party
  whose lease ended (its process was killed, stopped or lost Redis), a wait that timed out,
  ``abort()`` or a cancelled wait break it: every waiter raises :class:`BrokenBarrierError`.
- **Waiting** is the engine's: the waiter's id is an attempt id (``<process token>.<n>``), the
  scripts publish ``r <waiter id> 0`` on the channel of its process, the process's one wake-up
  listener wakes it. Nobody polls: a waiting party re-checks every ``timeout / 3`` (the
  barrier's lease renewal and the keys' refresh, a safety net for a lost message too) and when
  another party's lease would end.
- **Keys expire** ``timeout`` seconds after the last call (waiting calls included): a latch or
  barrier nobody uses leaves nothing behind, and a new object of that name starts over.

The protocol is written once, as generators of the engine's operations
(:class:`~django_redislock.flow.Call`, :class:`~django_redislock.flow.Subscribe`,
:class:`~django_redislock.flow.Wait`), run by :func:`~django_redislock.drivers.drive` for the
blocking classes and :func:`~django_redislock.drivers.adrive` for the asyncio ones; the drivers
resend a call once when its connection was lost (every call here is idempotent per id, but
``reset()``, which is not resent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.core.exceptions import ImproperlyConfigured

from django_redislock.conf import MIN_LEASE, check_seconds, get_settings
from django_redislock.drivers import Attempt, adrive, drive
from django_redislock.exceptions import LockError
from django_redislock.flow import Call, Plan, Subscribe, Wait
from django_redislock.keys import tag_of
from django_redislock.runtime import runtime
from django_redislock.scripts import (
    BARRIER_INSPECT,
    BARRIER_WAIT,
    LATCH_COUNT_DOWN,
    LATCH_INSPECT,
    LATCH_WAIT,
)
from django_redislock.validation import check_name

__all__ = [
    "BARRIER_INSPECT",
    "BARRIER_WAIT",
    "LATCH_COUNT_DOWN",
    "LATCH_INSPECT",
    "LATCH_WAIT",
    "MAX_COUNT",
    "RECENT_COUNT_DOWNS",
    "AsyncBarrier",
    "AsyncCountDownLatch",
    "Barrier",
    "BrokenBarrierError",
    "CountDownLatch",
]

logger = logging.getLogger("django_redislock")


#: Largest count of a latch and number of parties of a barrier.
MAX_COUNT = 10**9
#: How many ``count_down`` ids a latch remembers: a resend (after a lost reply, within the
#: socket timeout) of one of them counts nothing.
RECENT_COUNT_DOWNS = 1000
#: Extra validity of a latch waiter's entry beyond its next planned re-check (seconds).
ENTRY_MARGIN = 2.0
#: A barrier party re-checks this long after another party's lease would end (seconds).
LEASE_MARGIN = 0.005

T = TypeVar("T")
Op = Call | Subscribe | Wait
Flow = Generator[Op, Any, T]


class BrokenBarrierError(LockError, threading.BrokenBarrierError):
    """A :class:`Barrier` is broken: a party's lease ended before the round passed, a wait
    timed out or was cancelled, or ``abort()``/``reset()`` was called. ``except
    threading.BrokenBarrierError`` catches it too.

    ``name`` is the barrier's name; ``reason`` one of ``"lease"``, ``"timeout"``, ``"abort"``,
    ``"reset"``, ``"lost"`` (its keys expired or were deleted while a party waited).
    """

    def __init__(self, message: str = "", *, name: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.name = name
        self.reason = reason


_REASONS = {
    "lease": "a party's lease ended before all parties arrived (its process died, was stopped, "
    "or could not reach Redis for its timeout)",
    "timeout": "a party's wait timed out",
    "abort": "abort() was called (or a waiting party was cancelled)",
    "reset": "reset() was called while this party waited",
    "lost": "its state in Redis was lost while this party waited (the keys expired or were "
    "deleted)",
}


def _check_count(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= MAX_COUNT:
        raise ValueError(f"{what} must be between {minimum} and {MAX_COUNT}, not {value}")
    return value


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class _Job(Generic[T]):
    """One method call, ready to drive: its target, its flow and the id its calls are
    idempotent for (``None``: not idempotent, never resent; no waiting either)."""

    target: Any
    flow: Flow[T]
    ident: str | None
    #: The latch's or barrier's name (its wake-ups come on this name's channel).
    name: str = ""


def _attempt(job: _Job[Any], loop: asyncio.AbstractEventLoop | None) -> Attempt | None:
    """The drivers' bookkeeping of one waiting party: its waiter (registered when it first
    waits, unregistered at the end) and the resend of a call whose connection was lost. Only
    the target and the id of the plan are used."""
    if job.ident is None:
        return None
    plan = Plan(
        kind=None,
        target=job.target,
        name=job.name,
        owner="",
        attempt=job.ident,
        meta="",
        lease=0.0,
        blocking=True,
        started=0.0,
        deadline=math.inf,
        queue=True,
        action="wait",
    )
    return Attempt(plan=plan, loop=loop)


def _drive(job: _Job[T]) -> T:
    # The drivers' flows are typed as acquisitions; any flow of their operations runs.
    flow: Any = job.flow
    return drive(flow, _attempt(job, None), job.target)  # type: ignore[no-any-return]


async def _adrive(job: _Job[T]) -> T:
    attempt = _attempt(job, asyncio.get_running_loop())
    flow: Any = job.flow
    return await adrive(flow, attempt, job.target)  # type: ignore[no-any-return]


def _subscribed(listening: bool, what: str) -> None:
    if not listening:
        logger.warning(
            "django_redislock: cannot subscribe for wake-ups of %s; waiting with periodic "
            "re-checks only.",
            what,
        )


class _Shared:
    """What a primitive's blocking and asyncio classes share: the checked arguments, the
    target, the timeout."""

    kind = ""

    def __init__(self, name: str, *, timeout: float | None, using: str | None) -> None:
        self.name = check_name(name, f"{self.kind.capitalize()} name")
        self._timeout = check_seconds(timeout, "timeout", minimum=MIN_LEASE, allow_none=True)
        if using is not None and (not isinstance(using, str) or not using):
            raise TypeError(
                f"using must be a CACHES alias (a non-empty str) or None, not {using!r}"
            )
        self.using = using

    @property
    def timeout(self) -> float:
        """Seconds the keys live after the last call (and a barrier party's lease):
        ``REDISLOCK["TIMEOUT"]`` unless given."""
        return self._timeout if self._timeout is not None else get_settings().timeout

    def _target(self) -> Any:
        target = runtime.target(self.using)
        if target.quorum:
            raise ImproperlyConfigured(
                f"A {self.kind} needs one Redis (single, Sentinel or Cluster): "
                "REDISLOCK['CACHE'] lists independent masters (Redlock). Pass using=<one alias>."
            )
        return target

    def _deadline(self, timeout: object) -> float:
        wait = check_seconds(timeout, "timeout", allow_none=True)
        return math.inf if wait is None else time.monotonic() + wait


# -- latch -------------------------------------------------------------------------------------


class _Latch(_Shared):
    kind = "latch"

    def __init__(
        self, name: str, count: int, *, timeout: float | None = None, using: str | None = None
    ) -> None:
        super().__init__(name, timeout=timeout, using=using)
        self.initial_count = _check_count(count, "count", 0)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} count={self.initial_count}>"

    def keys(self, target: Any) -> list[str]:
        """The latch's keys where ``target`` lives: state, waiters, recent count-down ids."""
        ns, tag = target.keys.namespace, tag_of(self.name)
        return [f"{ns}:latch:{{{tag}}}", f"{ns}:latchw:{{{tag}}}", f"{ns}:latchd:{{{tag}}}"]

    def _count_down(self) -> _Job[None]:
        target = self._target()
        ident = runtime.new_attempt_id()
        wake = target.channel_args(self.name)
        args = [self.initial_count, ident, _ms(self.timeout), *wake, RECENT_COUNT_DOWNS]
        call = Call(LATCH_COUNT_DOWN, self.keys(target), args, f"count down latch {self.name!r}")
        return _Job(target, _discard(call), ident, self.name)

    def _read(self) -> _Job[int]:
        target = self._target()
        keys = self.keys(target)[:1]
        call = Call(LATCH_INSPECT, keys, [], f"read latch {self.name!r}")
        return _Job(target, self._read_flow(call), runtime.new_attempt_id(), self.name)

    def _read_flow(self, call: Call) -> Flow[int]:
        remaining = int((yield call))
        return self.initial_count if remaining < 0 else remaining

    def _wait(self, timeout: object) -> _Job[bool]:
        deadline = self._deadline(timeout)
        target = self._target()
        waiter = runtime.new_attempt_id()
        return _Job(target, self._wait_flow(target, waiter, deadline), waiter, self.name)

    def _wait_flow(self, target: Any, waiter: str, deadline: float) -> Flow[bool]:
        """A first look (as nobody's waiter); then, subscribed, as a registered waiter until the
        count is 0 or the deadline passes (the last look drops the entry)."""
        keys, ttl = self.keys(target), self.timeout
        action = f"wait for latch {self.name!r}"
        registered = False
        while True:
            now = time.monotonic()
            last = now >= deadline
            span = max(0.0, min(ttl / 3, deadline - now))
            stay = "1" if registered and not last else "0"
            args = [self.initial_count, waiter, stay, _ms(span + ENTRY_MARGIN), _ms(ttl)]
            remaining = int((yield Call(LATCH_WAIT, keys, args, action)))
            if remaining == 0:
                return True
            if last:
                return False
            if not registered:
                # Listen before registering: the last count-down's message cannot be missed.
                _subscribed((yield Subscribe(target.subscribe_timeout)), f"latch {self.name!r}")
                registered = True
                continue
            yield Wait(deadline, now + span)


def _discard(call: Call) -> Flow[None]:
    yield call


class CountDownLatch(_Latch):
    """A count shared by every process; waiters are released when it reaches 0.

    ``CountDownLatch(name, count, *, timeout=None, using=None)``: ``count_down()`` decrements
    (never below 0; the last one wakes every waiter), ``wait(timeout=None)`` blocks until the
    count is 0 (``True``, at once when it is already) or ``timeout`` seconds passed
    (``False``), ``count`` reads the remaining count. Creating the object writes nothing: the
    first ``count_down()`` or ``wait()`` of a name creates its state with ``count`` (a later
    object with another ``count`` uses the existing state). The keys expire ``timeout`` seconds
    (``REDISLOCK["TIMEOUT"]`` unless given) after the last call; waiting calls refresh them.
    """

    def count_down(self) -> None:
        _drive(self._count_down())

    def wait(self, timeout: float | None = None) -> bool:
        return _drive(self._wait(timeout))

    @property
    def count(self) -> int:
        """The remaining count (one round trip); the initial count while no state exists."""
        return _drive(self._read())


class AsyncCountDownLatch(_Latch):
    """:class:`CountDownLatch` for asyncio code: ``await latch.count_down()``, ``await
    latch.wait(timeout=None)`` and ``await latch.get_count()`` (a read is a round trip, so it
    is a coroutine, not a property). A name shared with blocking latches is one latch."""

    async def count_down(self) -> None:
        await _adrive(self._count_down())

    async def wait(self, timeout: float | None = None) -> bool:
        return await _adrive(self._wait(timeout))

    async def get_count(self) -> int:
        """The remaining count; the initial count while no state exists."""
        return await _adrive(self._read())


# -- barrier -----------------------------------------------------------------------------------

WAITING, PASSED, BROKEN, REFUSED = 0, 1, 2, 3


@dataclass(frozen=True)
class _Round:
    """What ``barrier_wait.lua`` answered."""

    state: int
    index: int
    #: Seconds until another party's lease ends (``None``: no other party).
    other_left: float | None
    why: str

    @classmethod
    def read(cls, reply: Any) -> _Round:
        ms = int(reply[2])
        return cls(int(reply[0]), int(reply[1]), None if ms < 0 else ms / 1000, _text(reply[3]))


class _Barrier(_Shared):
    kind = "barrier"

    def __init__(
        self, name: str, parties: int, *, timeout: float | None = None, using: str | None = None
    ) -> None:
        super().__init__(name, timeout=timeout, using=using)
        self._parties = _check_count(parties, "parties", 1)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} parties={self._parties}>"

    @property
    def parties(self) -> int:
        """The number of parties this object trips the barrier with."""
        return self._parties

    def keys(self, target: Any) -> list[str]:
        """The barrier's keys where ``target`` lives: state, current round, parties' records."""
        ns, tag = target.keys.namespace, tag_of(self.name)
        return [f"{ns}:barrier:{{{tag}}}", f"{ns}:barrierw:{{{tag}}}", f"{ns}:barrierx:{{{tag}}}"]

    def _call(self, target: Any, op: str, waiter: str) -> Call:
        lease = self.timeout
        wake = target.channel_args(self.name)
        args = [op, waiter, self._parties, _ms(lease), _ms(lease), *wake]
        return Call(BARRIER_WAIT, self.keys(target), args, f"{op} at barrier {self.name!r}")

    def _broken(self, why: str) -> BrokenBarrierError:
        said = _REASONS.get(why, why)
        return BrokenBarrierError(
            f"Barrier {self.name!r} is broken: {said}. Call reset() to use it again.",
            name=self.name,
            reason=why,
        )

    def _outcome(self, result: _Round) -> int | None:
        """The arrival index once the round passed, ``None`` while waiting; raises when broken."""
        if result.state == PASSED:
            return result.index
        if result.state == BROKEN:
            raise self._broken(result.why)
        if result.state == REFUSED:
            raise ValueError(
                f"Barrier {self.name!r} is in use with {result.index} parties, not "
                f"{self._parties}: every party must give the same number (reset() adopts a "
                "new one)."
            )
        return None

    def _wait(self, timeout: object) -> _Job[int]:
        deadline = self._deadline(timeout)
        target = self._target()
        waiter = runtime.new_attempt_id()
        return _Job(target, self._wait_flow(target, waiter, deadline), waiter, self.name)

    def _wait_flow(self, target: Any, waiter: str, deadline: float) -> Flow[int]:
        """Arrive; then re-check when woken, every ``timeout / 3`` (renewing the lease) and when
        another party's lease would end; give up (breaking the barrier) at the deadline."""
        lease = self.timeout
        listening = target.listening(self.name).ready.is_set()
        op = "arrive"
        while True:
            result = _Round.read((yield self._call(target, op, waiter)))
            index = self._outcome(result)
            if index is not None:
                return index
            if not listening:
                # Arrived before listening: re-check once subscribed (a message sent meanwhile
                # was not heard).
                listening = True
                _subscribed((yield Subscribe(target.subscribe_timeout)), f"barrier {self.name!r}")
                op = "check"
                continue
            now = time.monotonic()
            if now >= deadline:
                op = "timeout"
                continue
            op = "check"
            recheck = now + lease / 3
            if result.other_left is not None:
                recheck = min(recheck, now + result.other_left + LEASE_MARGIN)
            yield from self._sleep(target, waiter, deadline, recheck)

    def _sleep(self, target: Any, waiter: str, deadline: float, recheck: float) -> Flow[None]:
        """Wait for a wake-up or the re-check; a wait interrupted (a cancelled task, Ctrl-C)
        breaks the barrier at once rather than when this party's lease ends."""
        try:
            yield Wait(deadline, recheck)
        except GeneratorExit:
            raise
        except BaseException:
            with contextlib.suppress(Exception):
                yield self._call(target, "abort", waiter)
            raise

    def _change(self, op: str) -> _Job[None]:
        target = self._target()
        return _Job(target, _discard(self._call(target, op, "")), None, self.name)

    def _inspect(self) -> _Job[tuple[int, int, bool]]:
        target = self._target()
        call = Call(BARRIER_INSPECT, self.keys(target)[:2], [], f"read barrier {self.name!r}")
        return _Job(target, self._inspect_flow(call), runtime.new_attempt_id(), self.name)

    @staticmethod
    def _inspect_flow(call: Call) -> Flow[tuple[int, int, bool]]:
        reply = yield call
        return int(reply[0]), int(reply[1]), bool(int(reply[2]))


class Barrier(_Barrier):
    """``parties`` processes (or threads) wait for each other, across hosts; like
    :class:`threading.Barrier`.

    ``Barrier(name, parties, *, timeout=None, using=None)``: ``wait(timeout=None)`` blocks until
    ``parties`` parties called it, then returns this party's arrival index (0 for the first to
    arrive, ``parties - 1`` for the last), and the barrier is ready for the next round. Unlike
    ``threading.Barrier``, ``timeout`` here is each waiting party's lease and the keys' expiry
    (``REDISLOCK["TIMEOUT"]`` unless given), not a default for ``wait``: a waiting party renews
    its lease every ``timeout / 3``, and one whose lease ends (its process was killed or
    stopped) breaks the barrier. A broken barrier raises :class:`BrokenBarrierError` in every
    waiter and in every later ``wait`` until ``reset()``. A ``wait`` that times out breaks it
    too, as does ``abort()``. ``n_waiting`` and ``broken`` read the current round.
    """

    def wait(self, timeout: float | None = None) -> int:
        return _drive(self._wait(timeout))

    def reset(self) -> None:
        """Back to an empty round (adopting this object's ``parties``); the parties waiting now
        raise :class:`BrokenBarrierError`."""
        _drive(self._change("reset"))

    def abort(self) -> None:
        """Break the barrier: waiting and later parties raise :class:`BrokenBarrierError` until
        ``reset()``."""
        _drive(self._change("abort"))

    @property
    def n_waiting(self) -> int:
        """The live parties waiting in the current round (one round trip)."""
        return _drive(self._inspect())[1]

    @property
    def broken(self) -> bool:
        """Whether the barrier is broken, or will be at the next call: a waiting party's lease
        ended (one round trip)."""
        return _drive(self._inspect())[2]


class AsyncBarrier(_Barrier):
    """:class:`Barrier` for asyncio code: ``await barrier.wait(timeout=None)``, ``await
    barrier.reset()``, ``await barrier.abort()``, and the reads ``await
    barrier.get_n_waiting()`` and ``await barrier.get_broken()`` (round trips, so coroutines
    rather than properties). A name shared with blocking barriers is one barrier. Cancelling a
    waiting task breaks the barrier, as a party's death would, but at once."""

    async def wait(self, timeout: float | None = None) -> int:
        return await _adrive(self._wait(timeout))

    async def reset(self) -> None:
        await _adrive(self._change("reset"))

    async def abort(self) -> None:
        await _adrive(self._change("abort"))

    async def get_n_waiting(self) -> int:
        return (await _adrive(self._inspect()))[1]

    async def get_broken(self) -> bool:
        return (await _adrive(self._inspect()))[2]
