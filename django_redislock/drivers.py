"""Running a flow (:mod:`django_redislock.flow`): :func:`drive` with blocking calls, :func:`adrive`
with ``await``. The same steps either way; only how a call is made and how a waiter sleeps
differ.

An attempt's call whose connection was lost (:attr:`~django_redislock.transport.NoReply.lost`:
closed or reset, not timed out) is resent once, at once, on a fresh connection: every lock
script is idempotent per attempt id, so the resend finds the hold or queue entry the first one
made and adds nothing, and a connection dropped by a server restart, ``CLIENT KILL``, a proxy or
a load balancer's idle timeout costs no unknown outcome. A rate limiter's calls (no attempt)
are not idempotent and are never resent.

A driver owns the attempt's :class:`~django_redislock.wakeups.Waiter`: it registers it when the
flow first waits (a hand-off that came earlier is kept for it by the registry), resets it before
each call (a message arriving while the call is in flight still counts), and unregisters it at
the end, whatever the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from django_redislock.flow import (
    Call,
    Flow,
    NotReplicated,
    Plan,
    Sleep,
    Subscribe,
    Wait,
    Woken,
)
from django_redislock.transport import NoReply
from django_redislock.wakeups import Listening, Waiter

__all__ = [
    "Attempt",
    "SimpleFlow",
    "adrive",
    "arun_attempt_call",
    "arun_call",
    "drive",
    "run_attempt_call",
    "run_call",
]

#: A flow that only calls and sleeps (a rate limiter's): no waiter, no attempt to clean up.
SimpleFlow = Generator[Call | Sleep, Any, Any]


@dataclass(kw_only=True)
class Attempt:
    """The I/O side of one acquisition: its plan, waiter and whether a call went out."""

    plan: Plan
    #: The event loop an async waiter sleeps in (``None``: a thread).
    loop: asyncio.AbstractEventLoop | None = None
    #: The subscription that hears the wake-ups of the plan's name (its target's listener, or
    #: on sharded Pub/Sub that name's shard channel).
    listening: Listening = field(init=False)
    #: The subscription's count when the attempt began: a renewed subscription since then (its
    #: messages meanwhile are lost) makes the waiter re-check at once.
    generation: int = field(init=False)
    waiter: Waiter | None = None
    #: Set once a call may have reached Redis: only then can anything need cleaning up.
    sent: bool = False
    #: Calls sent so far, and calls that got a reply (which may have queued or taken something).
    calls: int = 0
    replies: int = 0

    def __post_init__(self) -> None:
        self.listening = self.plan.target.listening(self.plan.name)
        self.generation = self.listening.connections

    def _waiter(self) -> Waiter:
        waiter = self.waiter
        if waiter is None:
            listening = self.listening
            waiter = Waiter(self.plan.attempt, loop=self.loop, channel=listening.channel)
            self.waiter = waiter
            self.plan.target.waiters.register(waiter)
            if listening.connections != self.generation:
                waiter.recheck_at = 0.0
        return waiter

    def subscribed(self, listening: bool) -> None:
        """The flow made sure this process listens, and queues only after that: nothing sent
        to the subscription it found can be lost, so it is the one the waiter compares with."""
        if listening:
            self.generation = self.listening.connections

    def before_call(self) -> None:
        self.sent = True
        self.calls += 1
        if self.waiter is not None:
            self.waiter.reset()

    def wait_started(self, op: Wait) -> Waiter:
        waiter = self._waiter()
        waiter.recheck_at = min(waiter.recheck_at, op.recheck_at)
        return waiter

    def resubscribe(self) -> bool:
        """Whether the listener stopped since the attempt queued (it stops when no waiter is
        registered, and this waiter registers only now): subscribe again, then re-check at
        once, since a hand-off meanwhile went unheard."""
        return not self.listening.ready.is_set()

    def close(self) -> None:
        if self.waiter is not None:
            self.plan.target.waiters.unregister(self.waiter)


def run_call(target: Any, call: Call) -> Any:
    """One script call with blocking I/O (then ``WAIT`` when it asks for replicas)."""
    if call.each:
        return target.transport.run_each(call.script, call.keys, call.args, call.action)
    if not (call.replicas or call.aof_local or call.aof_replicas):
        return target.transport.run(call.script, call.keys, call.args, call.action)
    reply, acks = target.transport.run_waited(
        call.script,
        call.keys,
        call.args,
        call.replicas,
        call.replicas_timeout_ms,
        call.action,
        aof=(call.aof_local, call.aof_replicas),
    )
    missing = acks.shortfall(call.replicas, call.aof_local, call.aof_replicas)
    if missing:
        raise NotReplicated(
            call.action,
            reply,
            acks.replicas,
            call.replicas,
            call.replicas_timeout_ms,
            shortfall=missing,
        )
    return reply


async def arun_call(target: Any, call: Call) -> Any:
    """:func:`run_call` for asyncio (``WAIT`` blocks: it runs in a thread, on the sync client)."""
    if call.each:
        return await target.transport.arun_each(call.script, call.keys, call.args, call.action)
    if call.replicas or call.aof_local or call.aof_replicas:
        return await asyncio.to_thread(run_call, target, call)
    return await target.transport.arun(call.script, call.keys, call.args, call.action)


def run_attempt_call(target: Any, call: Call) -> Any:
    """:func:`run_call` for an attempt's call: resent once when its connection was lost."""
    try:
        return run_call(target, call)
    except NoReply as exc:
        if not exc.lost:
            raise
    return run_call(target, call)


async def arun_attempt_call(target: Any, call: Call) -> Any:
    """:func:`run_attempt_call` for asyncio."""
    try:
        return await arun_call(target, call)
    except NoReply as exc:
        if not exc.lost:
            raise
    return await arun_call(target, call)


def drive(flow: Flow | SimpleFlow, attempt: Attempt | None, target: Any = None) -> Any:
    """Run ``flow`` with blocking I/O; returns what it returns. ``attempt`` ``None``: a flow
    of calls and sleeps only (a rate limiter's), on ``target``."""
    target = target if attempt is None else attempt.plan.target
    try:
        op = next(flow)
        while True:
            try:
                if isinstance(op, Call):
                    if attempt is None:
                        result: Any = run_call(target, op)
                    else:
                        attempt.before_call()
                        result = run_attempt_call(target, op)
                        attempt.replies += 1
                elif isinstance(op, Sleep):
                    time.sleep(op.seconds)
                    result = None
                elif attempt is None:
                    raise TypeError(f"{op!r} needs an attempt")
                elif isinstance(op, Wait):
                    waiter = attempt.wait_started(op)
                    listening = attempt.listening
                    if attempt.resubscribe() and listening.ensure(target.subscribe_timeout):
                        result = Woken(waiter.handed, waiter.token)  # re-check now
                    else:
                        waiter.wait(op.until)
                        result = Woken(waiter.handed, waiter.token)
                else:
                    assert isinstance(op, Subscribe)
                    result = attempt.listening.ensure(op.timeout)
                    attempt.subscribed(result)
            except BaseException as exc:
                op = flow.throw(exc)
            else:
                op = flow.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        if attempt is not None:
            attempt.close()


async def adrive(flow: Flow | SimpleFlow, attempt: Attempt | None, target: Any = None) -> Any:
    """Run ``flow`` with ``await``: the same steps as :func:`drive`."""
    target = target if attempt is None else attempt.plan.target
    try:
        op = next(flow)
        while True:
            try:
                if isinstance(op, Call):
                    if attempt is None:
                        result: Any = await arun_call(target, op)
                    else:
                        attempt.before_call()
                        result = await arun_attempt_call(target, op)
                        attempt.replies += 1
                elif isinstance(op, Sleep):
                    await asyncio.sleep(op.seconds)
                    result = None
                elif attempt is None:
                    raise TypeError(f"{op!r} needs an attempt")
                elif isinstance(op, Wait):
                    waiter = attempt.wait_started(op)
                    ensure = attempt.listening.ensure
                    if attempt.resubscribe() and await asyncio.to_thread(
                        ensure, target.subscribe_timeout
                    ):
                        result = Woken(waiter.handed, waiter.token)  # re-check now
                    else:
                        await waiter.await_(op.until)
                        result = Woken(waiter.handed, waiter.token)
                else:
                    assert isinstance(op, Subscribe)
                    ensure = attempt.listening.ensure
                    result = await asyncio.to_thread(ensure, op.timeout)
                    attempt.subscribed(result)
            except BaseException as exc:
                op = flow.throw(exc)
            else:
                op = flow.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        if attempt is not None:
            attempt.close()
