"""Redlock: a lock over independent Redis masters (``REDISLOCK["CACHE"] = [a, b, c]``).

The same scripts run on every master (:class:`QuorumTransport`); a lock is held when a majority
took it within its validity (the lease minus the time the attempt took minus a clock-drift
allowance), as in Redis's own Redlock description. A quorum is a *target*
(:func:`django_redislock.targets.quorum_target`), chosen where targets are chosen; what differs
from one Redis:

- **No hand-off.** One master cannot hand a majority over, so a release (on every master) wakes
  every queued waiter of that name instead: they try again at once, after a small random delay
  that keeps symmetric racers from splitting the masters for ever (:func:`acquire`).
- **Give back what did not make a majority.** An attempt that took a minority, or that too few
  masters answered, cancels itself by its attempt id on every master before it reports; a
  master that did not answer is cleaned up as soon as it does.
- **Renewal** by the watchdog on every master; the hold is lost when a majority no longer has it.
- **Fencing tokens** are the highest of the majority's: each master's tokens are at least its
  clock in microseconds, so they increase while the masters' clocks do.

When *not* to use it: Redlock relies on bounded process pauses, network delays and clock drift
(Kleppmann, "How to do distributed locking", 2016). A pause or a clock jump longer than the
validity lets two holders overlap; only fencing tokens checked by the protected resource can
prevent harm then. For availability through a failover, Sentinel or Cluster with
``REDISLOCK["REPLICAS"]`` is simpler.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from django_redislock import scripts
from django_redislock.exceptions import LockBackendError, LockNotAcquiredError
from django_redislock.flow import Acquired, Flow, NotAcquired, Plan, Subscribe, Wait
from django_redislock.kinds import HELD, REFUSED
from django_redislock.scripts import Script
from django_redislock.transport import NoReply

__all__ = ["DRIFT_FACTOR", "QuorumTransport", "acquire"]

#: Clock drift allowed for, as a share of the lease (plus 2 ms), as Redlock prescribes.
DRIFT_FACTOR = 0.01
#: Upper bound of the random delay before retrying after a wake-up (decorrelates racers).
RETRY_JITTER = 0.02


def majority(count: int) -> int:
    return count // 2 + 1


def _answered(replies: list[Any], action: str) -> list[Any]:
    """The replies that are not errors; :class:`NoReply` when too few masters answered."""
    ok = [r for r in replies if not isinstance(r, LockBackendError)]
    needed = majority(len(replies))
    if len(ok) < needed:
        errors = [r for r in replies if isinstance(r, LockBackendError)]
        raise NoReply(
            f"only {len(ok)} of {len(replies)} Redis masters answered while trying to {action}; "
            f"a majority ({needed}) is needed. First error: {errors[0]}"
        ) from errors[0]
    return ok


def _release(replies: list[Any], action: str) -> Any:
    """Released (0, or holds left) when a majority had it; -1 (not ours) otherwise."""
    counts = [int(r) if not isinstance(r, list) else 0 for r in _answered(replies, action)]
    held = [c for c in counts if c >= 0]
    return min(held) if len(held) >= majority(len(replies)) else -1


def _renew(replies: list[Any], action: str) -> int:
    renewed = sum(int(r) == 1 for r in _answered(replies, action))
    return 1 if renewed >= majority(len(replies)) else 0


def _cancel(replies: list[Any], action: str) -> Any:
    """Done only when every master answered (each may hold a part of the attempt)."""
    errors = [r for r in replies if isinstance(r, LockBackendError)]
    if errors:
        raise NoReply(
            f"{len(errors)} of {len(replies)} Redis masters did not answer while trying to "
            f"{action}: {errors[0]}"
        ) from errors[0]
    dropped = [r for r in replies if isinstance(r, list) or int(r) >= 0]
    return 0 if dropped else -1


def _inspect(replies: list[Any], action: str) -> list[int]:
    answered = _answered(replies, action)
    needed = majority(len(replies))
    held = sum(int(r[0]) for r in answered) >= needed
    owned = sum(int(r[1]) for r in answered) >= needed
    return [int(held), int(owned), 1, b""]  # type: ignore[list-item]


_COMBINE: dict[str, Callable[[list[Any], str], Any]] = {
    scripts.RELEASE.filename: _release,
    scripts.RENEW.filename: _renew,
    scripts.CANCEL.filename: _cancel,
    scripts.INSPECT.filename: _inspect,
}


class QuorumTransport:
    """Runs a script on every master: one combined answer, or each master's (``run_each``)."""

    cluster = False
    #: Independent masters are single servers (or Sentinel services): classic ``PUBLISH``.
    sharded = False

    def __init__(self, transports: Sequence[Any]) -> None:
        self.transports = tuple(transports)
        self.client = self.transports[0].client

    def run_each(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str
    ) -> list[Any]:
        replies: list[Any] = []
        for transport in self.transports:
            try:
                replies.append(transport.run(script, keys, args, action))
            except LockBackendError as exc:
                replies.append(exc)
        return replies

    async def arun_each(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str
    ) -> list[Any]:
        async def one(transport: Any) -> Any:
            try:
                return await transport.arun(script, keys, args, action)
            except LockBackendError as exc:
                return exc

        return list(await asyncio.gather(*(one(t) for t in self.transports)))

    def _combine(self, script: Script, replies: list[Any], action: str) -> Any:
        combine = _COMBINE.get(script.filename)
        if combine is None:
            raise LockBackendError(f"{script.filename} does not run on independent masters")
        return combine(replies, action)

    def run(self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str) -> Any:
        return self._combine(script, self.run_each(script, keys, args, action), action)

    async def arun(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str
    ) -> Any:
        return self._combine(script, await self.arun_each(script, keys, args, action), action)

    def run_waited(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        raise LockBackendError("REDISLOCK['REPLICAS'] does not apply to independent masters")

    def run_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        raise LockBackendError("independent masters renew one lock per call")

    def pubsub(self, node: Any = None) -> Any:
        raise LockBackendError("independent masters listen on each master")

    def shard_node(self, channel: str) -> Any:
        raise LockBackendError("independent masters have no shards")

    def refresh_topology(self) -> None:
        pass

    def close(self) -> None:
        for transport in self.transports:
            transport.close()


def acquire(plan: Plan) -> Flow:
    """Take a majority of the masters within the validity time (the quorum's
    :func:`django_redislock.flow.acquire`)."""
    kind, members = plan.kind, plan.target.members
    needed = majority(len(members))
    contended = False
    while True:
        began = plan.clock()
        call = plan.acquire_call()
        call.each = True
        replies: list[Any] = yield call
        results = [r if isinstance(r, LockBackendError) else kind.read_acquire(r) for r in replies]
        answered = [r for r in results if not isinstance(r, LockBackendError)]
        held = [r for r in answered if r.state == HELD]
        drift = plan.lease * DRIFT_FACTOR + 0.002
        validity = plan.lease - (plan.clock() - began) - drift
        if len(held) >= needed and validity > 0:
            return Acquired(max(r.token for r in held), min(r.count for r in held), contended)
        if held or len(answered) < len(results):
            # A minority (or too late), or masters that did not answer: give back everywhere.
            give_back = plan.cancel_call(take=False)
            give_back.each = True
            yield give_back
        if len(answered) < needed:
            errors = [r for r in results if isinstance(r, LockBackendError)]
            raise NoReply(
                f"only {len(answered)} of {len(results)} Redis masters answered; a majority "
                f"({needed}) is needed. First error: {errors[0]}"
            ) from errors[0]
        if sum(r.state == REFUSED for r in answered) >= needed:
            raise LockNotAcquiredError(
                plan.name,
                f"Lock {plan.name!r} is already held by this owner and reentrant=False: "
                "acquiring it again would deadlock.",
            )
        contended = True
        if not plan.blocking:
            return NotAcquired(contended)
        if not plan.queue:
            yield Subscribe(plan.target.subscribe_timeout)
            plan.queue = True
            continue
        now = plan.clock()
        span = min(plan.deadline - now, plan.lease)
        left = [r.wait_ms for r in answered if r.wait_ms >= 0]
        holder_left = min(left) / 1000 if left else span
        yield Wait(plan.deadline, now + max(0.001, min(holder_left, span)))
        if plan.clock() >= plan.deadline:
            leave = plan.cancel_call(take=False)
            leave.each = True
            yield leave
            return NotAcquired(True)
        pause = plan.clock() + random.uniform(0, RETRY_JITTER)
        yield Wait(min(pause, plan.deadline), pause)
