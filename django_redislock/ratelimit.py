"""Rate limiters shared by every process: GCRA (the generic cell rate algorithm) on Redis.

Why GCRA: no fixed windows, so no double burst at a window edge; one key per name holding one
number (the *theoretical arrival time*), so a decision is one round trip and its state expires
by itself once the limiter has rested; and the server's clock decides, so clients with skewed
clocks agree. ``burst`` requests may pass at once after a quiet period, then one per
``period / count``.

Where the server has a native ``GCRA`` command (detected once per server with ``COMMAND
INFO``, see :func:`django_redislock.client.gcra_unit`), it decides; else ``lua/rate.lua`` does,
on the same key layout with the same arithmetic (``tests/test_ratelimit.py`` checks the script
against a transcription of the server's algorithm). The native command takes whole-second
periods of at least 1 s only; other rates always use the script.

**Unknown outcomes.** A decision whose reply is lost raises
:class:`~django_redislock.LockBackendError` and is never resent: had it been allowed, the
request it counted did not happen, so the limiter errs on the strict side (fewer requests pass,
never more). A refused decision writes nothing. With ``REDISLOCK["REPLICAS"]`` an allowance
counts only once that many replicas acknowledged it (``WAIT``), so a failover cannot forget an
allowance that was acted on; without it, a failover that loses the last writes forgets the
allowances they recorded, and up to that many more requests may pass (``docs/guarantees.md``).

``RateLimiter`` and ``AsyncRateLimiter`` are one sans-I/O flow (:func:`_decide`) run by the
drivers of :mod:`django_redislock.drivers` (without an attempt: nothing to clean up);
``acquire`` sleeps exactly the server's retry-after (plus :data:`SLEEP_MARGIN`), never polls.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from django_redislock import client as redis_client
from django_redislock import stats
from django_redislock.conf import check_seconds
from django_redislock.drivers import adrive, drive
from django_redislock.exceptions import RateLimited
from django_redislock.flow import Call, NotReplicated, Sleep
from django_redislock.kinds import Decision, RateKind
from django_redislock.naming import stats_shape
from django_redislock.runtime import runtime
from django_redislock.transport import backend_errors
from django_redislock.validation import check_name

__all__ = [
    "MAX_BURST",
    "MAX_RATE_PER_SECOND",
    "SLEEP_MARGIN",
    "AsyncRateLimiter",
    "RateDecision",
    "RateLimiter",
    "parse_rate",
]

#: Largest ``burst`` accepted.
MAX_BURST = 1_000_000
#: Fastest rate accepted: the server counts in microseconds.
MAX_RATE_PER_SECOND = 1_000_000
#: Longest time a full burst takes to rest (``burst / rate``): Redis keeps the state as an
#: expiry, and beyond this a limiter is a quota, not a rate (use a counter).
MAX_REST_SECONDS = 366 * 86400.0
#: Slept beyond the server's retry-after, so the next decision does not arrive a hair early
#: by this machine's clock (the server's decides).
SLEEP_MARGIN = 0.001

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d{1,10})\s*/\s*([smhd])\s*$")


def parse_rate(rate: object) -> tuple[int, float]:
    """``(count, seconds)`` of a rate: ``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/d"`` or a ``(count,
    seconds)`` tuple. ``TypeError`` for another type, ``ValueError`` for a value out of range."""
    if isinstance(rate, str):
        match = _RATE.match(rate)
        if match is None:
            raise ValueError(
                f"rate must look like '10/s', '10/m', '10/h' or '10/d', not {rate[:40]!r}"
            )
        count, period = int(match.group(1)), _UNITS[match.group(2)]
    elif isinstance(rate, tuple):
        if len(rate) != 2:
            raise ValueError(f"rate must be a (count, seconds) pair, not {len(rate)} values")
        count, seconds = rate
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"a rate's count must be an int, not {type(count).__name__}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"a rate's seconds must be a number, not {type(seconds).__name__}")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"a rate's seconds must be a finite number > 0, not {seconds!r}")
        period = float(seconds)
    else:
        raise TypeError(
            f"rate must be a str like '10/m' or a (count, seconds) tuple, not {type(rate).__name__}"
        )
    if count < 1:
        raise ValueError(f"a rate's count must be at least 1, not {count}")
    if count / period > MAX_RATE_PER_SECOND:
        raise ValueError(
            f"rate {count}/{period:g}s is faster than {MAX_RATE_PER_SECOND:,} per second, "
            "which the server's microsecond clock cannot space"
        )
    if period / count > MAX_REST_SECONDS:
        raise ValueError(f"rate {count}/{period:g}s is slower than one per {MAX_REST_SECONDS:g} s")
    return count, period


def _check_burst(burst: object, count: int, period: float) -> int:
    if burst is None:
        return 1
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise TypeError(f"burst must be an int or None, not {type(burst).__name__}")
    if not 1 <= burst <= MAX_BURST:
        raise ValueError(f"burst must be between 1 and {MAX_BURST:,}, not {burst}")
    if burst * period / count > MAX_REST_SECONDS:
        raise ValueError(
            f"burst {burst} at {count}/{period:g}s takes longer than {MAX_REST_SECONDS:g} s to "
            "rest; lower it"
        )
    return burst


@dataclass(frozen=True)
class RateDecision:
    """What a rate limiter decided: truthy when allowed.

    ``retry_after``: seconds until the ``n`` requests would be allowed (0.0 when allowed);
    ``remaining``: requests that could pass right now after this decision.
    """

    allowed: bool
    retry_after: float
    remaining: int

    def __bool__(self) -> bool:
        return self.allowed


#: Per target: the server's native GCRA unit, or None (the script). Targets are rebuilt when
#: settings change, so a new server is probed anew.
_native: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def _native_unit(target: Any, name: str) -> str | None:
    if target in _native:
        return _native[target]
    try:
        with backend_errors("look for the server's GCRA command"):
            unit = redis_client.gcra_unit(target.client, target.keys.rate(f"{name}:gcra-probe"))
    except Exception:  # the script works everywhere; a failed probe is asked again next time
        return None
    _native[target] = unit
    return unit


class _Limiter:
    """What both faces share: the validated arguments, the flow, the statistics."""

    def __init__(
        self,
        name: str,
        rate: object,
        *,
        burst: int | None = None,
        using: str | None = None,
        stats_name: str | None = None,
    ) -> None:
        self.name = check_name(name, "Rate limiter name")
        count, period = parse_rate(rate)
        self.rate = rate
        self.kind = RateKind(count=count, period=period, burst=_check_burst(burst, count, period))
        if using is not None and (not isinstance(using, str) or not using):
            raise TypeError(
                f"using must be a CACHES alias (a non-empty str) or None, not {using!r}"
            )
        self.using = using
        if stats_name is not None:
            check_name(stats_name, "stats_name")
        self.stats_name = stats_name or stats_shape(self.name)

    @property
    def burst(self) -> int:
        return self.kind.burst

    def __repr__(self) -> str:
        kind = self.kind
        rate = f"{kind.count}/{kind.period:g}s"
        return f"<{type(self).__name__} {self.name!r} {rate} burst={kind.burst}>"

    def _target(self) -> Any:
        target = runtime.target(self.using)
        self.kind.check_target(target)
        return target

    def _check_n(self, n: object) -> int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if not 1 <= n <= self.kind.burst:
            raise ValueError(
                f"n must be between 1 and the burst ({self.kind.burst}), not {n}: more than "
                "the burst could never pass at once"
            )
        return n

    def _decide(
        self, target: Any, native: str | None, n: int, wait: bool, timeout: float | None
    ) -> Generator[Call | Sleep, Any, RateDecision]:
        kind = self.kind
        action = f"decide rate limit {self.name!r}"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            script, keys, args = kind.decide_call(target, self.name, n, native)
            # With REDISLOCK["REPLICAS"], an allowance counts once replicated (a failover could
            # lose it and allow again): unacknowledged, NotReplicated (a LockBackendError) goes
            # up and the request does not pass. The state stays: the strict side.
            call = Call(script, keys, args, action, **target.wait_fields())
            try:
                reply = yield call
            except NotReplicated as exc:
                # A refusal wrote nothing (WAIT gave up on earlier writes of the connection).
                reply = exc.reply
                if kind.read_decision(reply, native, script=script).allowed:
                    raise
            decision: Decision = kind.read_decision(reply, native, script=script)
            retry_after = decision.retry_after_us / 1_000_000
            outcome = RateDecision(decision.allowed, retry_after, decision.remaining)
            stats.record(
                self.using, self.stats_name, "allowed" if outcome else "limited", name=self.name
            )
            if outcome.allowed or not wait:
                return outcome
            if deadline is not None and time.monotonic() + retry_after > deadline:
                raise RateLimited(self.name, retry_after)
            yield Sleep(retry_after + SLEEP_MARGIN)

    def _book(
        self, target: Any, n: int, max_wait: float, *, schedule: bool = False
    ) -> Generator[Call | Sleep, Any, float | None]:
        """One decision that books a refused request's place if it comes within ``max_wait``:
        the seconds to wait before acting (0.0: now), or ``None`` (nothing booked).
        ``schedule``: on the limiter's schedule, not its own state (no statistics)."""
        kind = self.kind
        reserve_us = max(1, int(max_wait * 1_000_000))
        key = target.keys.rate_schedule(self.name) if schedule else None
        script, keys, args = kind.decide_call(target, self.name, n, reserve_us=reserve_us, key=key)
        action = f"book rate limit {self.name!r}"
        try:
            reply = yield Call(script, keys, args, action, **target.wait_fields())
        except NotReplicated as exc:  # as in _decide: only what wrote something must count
            decided = kind.read_decision(exc.reply)
            if decided.allowed or decided.booked:
                raise
            reply = exc.reply
        decision: Decision = kind.read_decision(reply)
        booked = decision.allowed or decision.booked
        if not schedule:
            event = "allowed" if booked else "limited"
            stats.record(self.using, self.stats_name, event, name=self.name)
        return decision.retry_after_us / 1_000_000 if booked else None

    def _reset_call(self, target: Any) -> Call:
        script, keys, args = self.kind.reset_call(target, self.name)
        return Call(script, keys, args, f"reset rate limit {self.name!r}")


def _timeout(timeout: object) -> float | None:
    return check_seconds(timeout, "timeout", allow_none=True)


class RateLimiter(_Limiter):
    """A rate shared by every process: ``RateLimiter("api", "10/s", burst=5)``.

    ``try_acquire(n=1)`` decides at once; ``acquire(n=1, timeout=None)`` sleeps until allowed
    (exactly the server's retry-after: no polling) or raises :class:`RateLimited` when that
    would take longer than ``timeout``; ``reset()`` forgets the history.
    """

    def _run(self, n: int, wait: bool, timeout: float | None) -> RateDecision:
        target = self._target()
        native = _native_unit(target, self.name)
        flow = self._decide(target, native, n, wait, timeout)
        return drive(flow, None, target)  # type: ignore[no-any-return]

    def try_acquire(self, n: int = 1) -> RateDecision:
        return self._run(self._check_n(n), False, None)

    def acquire(self, n: int = 1, *, timeout: float | None = None) -> RateDecision:
        return self._run(self._check_n(n), True, _timeout(timeout))

    def reserve(self, n: int = 1, *, max_wait: float) -> float | None:
        """Take ``n`` places now for the earliest time they conform, if that is within
        ``max_wait`` seconds: returns the seconds to wait before acting (0.0: at once), or
        ``None`` when it would be later (nothing taken).

        For work that is *scheduled* rather than slept for: a task run over the rate is
        re-published for exactly its booked time, so a burst of throttled runs comes back one
        place apart instead of all at once. A booked place that is not used is lost (the strict
        side). Always decided by the script (the native command cannot book).
        """
        n = self._check_n(n)
        wait = check_seconds(max_wait, "max_wait")
        target = self._target()
        return drive(self._book(target, n, wait or 0.0), None, target)  # type: ignore[no-any-return]

    def schedule(self, *, after: float, max_wait: float) -> float:
        """When to come back, for work turned away now and put off rather than slept for
        (a task run re-published): at least ``after`` seconds (the refusal's retry-after), and
        one place of this rate after every other run put off so far — so a backlog of runs
        turned away together comes back spread out at the rate, instead of all at once to be
        turned away again but one.

        The places are booked on a schedule beside the limiter (``<ns>:ratesched:{name}``),
        never on the limiter itself: each run still asks :meth:`try_acquire` when it comes
        back, so a run that arrives late or early never passes beyond the rate. Beyond
        ``max_wait`` the schedule is not booked and ``after`` is returned.
        """
        after = check_seconds(after, "after") or 0.0
        wait = check_seconds(max_wait, "max_wait") or 0.0
        target = self._target()
        booked = drive(self._book(target, 1, wait, schedule=True), None, target)
        return after if booked is None else max(after, booked)

    def reset(self) -> None:
        target = self._target()
        drive(_one(self._reset_call(target)), None, target)


class AsyncRateLimiter(_Limiter):
    """:class:`RateLimiter` for asyncio code: ``await limiter.try_acquire()``; a name shared
    with sync limiters is one limiter."""

    async def _run(self, n: int, wait: bool, timeout: float | None) -> RateDecision:
        target = self._target()
        if target in _native:
            native = _native[target]
        else:  # the probe's round trips once per server, off the event loop
            native = await asyncio.to_thread(_native_unit, target, self.name)
        flow = self._decide(target, native, n, wait, timeout)
        return await adrive(flow, None, target)  # type: ignore[no-any-return]

    async def try_acquire(self, n: int = 1) -> RateDecision:
        return await self._run(self._check_n(n), False, None)

    async def acquire(self, n: int = 1, *, timeout: float | None = None) -> RateDecision:
        return await self._run(self._check_n(n), True, _timeout(timeout))

    async def reserve(self, n: int = 1, *, max_wait: float) -> float | None:
        """:meth:`RateLimiter.reserve`, awaitable."""
        n = self._check_n(n)
        wait = check_seconds(max_wait, "max_wait")
        target = self._target()
        return await adrive(self._book(target, n, wait or 0.0), None, target)  # type: ignore[no-any-return]

    async def reset(self) -> None:
        target = self._target()
        await adrive(_one(self._reset_call(target)), None, target)


def _one(call: Call) -> Generator[Call, Any, Any]:
    return (yield call)
