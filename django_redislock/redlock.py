"""Redlock: a lock over independent Redis masters (``REDISLOCK["CACHE"] = [a, b, c]``).

The same scripts run on every master; a lock is held when a majority took it within its validity
(the lease minus the time the attempt took minus a clock-drift allowance), as in Redis's own
Redlock description. What differs from a single Redis:

- **No hand-off.** One master cannot hand a majority over, so a release (on every master) wakes
  every queued waiter of that name instead (``hand_off`` with a claim window of 0): they try again
  at once, after a small random delay that keeps symmetric racers from splitting the masters
  forever. Waiting still holds no connection and never polls; a lost wake-up costs at most the
  holder's lease, as for a single Redis.
- **Renewal** by the watchdog on every master; the hold is lost when a majority no longer has it.
- **Fencing tokens** are the highest of the majority's per-master counters: increasing as long as
  the masters keep their data, but not a guarantee across a master's restart without persistence.

When *not* to use it: Redlock relies on bounded process pauses, network delays and clock drift
(Kleppmann, "How to do distributed locking", 2016). A GC pause or a clock jump longer than the
validity lets two holders overlap, and no lease-based lock can prevent that; only fencing tokens
checked by the protected resource can. For availability through a failover, Sentinel or Cluster
with ``REDISLOCK["REPLICAS"]`` is simpler and keeps tokens strictly monotonic.

This module plugs itself into :data:`django_redislock.engine.quorum`; the engine does not import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django_redislock import connection, engine, holds, scripts, wakeups
from django_redislock.conf import check_seconds
from django_redislock.engine import Call, Flow, LockBase, Op
from django_redislock.exceptions import LockBackendError, LockNotAcquiredError

__all__ = ["DRIFT_FACTOR", "QuorumCall"]

#: Clock drift allowed for, as a share of the lease (plus 2 ms), as Redlock prescribes.
DRIFT_FACTOR = 0.01
#: Upper bound of the random delay before retrying after a wake-up (decorrelates racers).
RETRY_JITTER = 0.02


def _majority(masters: Sequence[Any]) -> int:
    return len(masters) // 2 + 1


@dataclass
class QuorumCall(Op):
    """Run one script call on every master; ``combine`` turns the replies into one answer.

    A master that cannot be reached contributes its :class:`LockBackendError` instead of a reply.
    ``args`` may differ per master (queue entries carry each master's own clock).
    """

    call: Call
    per_master_args: list[list[Any]] | None = None
    combine: Callable[[list[Any], int], Any] | None = None

    @property
    def shield(self) -> bool:
        """Clean-up calls are shielded from a second cancellation (see ``engine.adrive``)."""
        return self.call.shield

    def _args(self, index: int) -> list[Any]:
        return self.per_master_args[index] if self.per_master_args else self.call.args

    def _result(self, replies: list[Any], masters: Sequence[Any]) -> Any:
        return self.combine(replies, _majority(masters)) if self.combine else replies

    def sync(self, face: LockBase) -> Any:
        masters = face._target().masters
        replies: list[Any] = []
        for index, client in enumerate(masters):
            try:
                with connection.backend_errors(self.call.action):
                    replies.append(self.call.script(client, self.call.keys, self._args(index)))
            except LockBackendError as exc:
                replies.append(exc)
        return self._result(replies, masters)

    async def async_(self, face: LockBase) -> Any:
        masters = face._target().masters

        async def one(index: int, client: Any) -> Any:
            try:
                with connection.backend_errors(self.call.action):
                    async_client = await connection.async_client_for(client)
                    return await self.call.script.acall(
                        async_client, self.call.keys, self._args(index)
                    )
            except LockBackendError as exc:
                return exc

        replies = await asyncio.gather(*(one(i, c) for i, c in enumerate(masters)))
        return self._result(list(replies), masters)


def _answered(replies: list[Any], needed: int) -> list[Any]:
    """The replies that are not errors; raise when too few masters answered to decide."""
    ok = [r for r in replies if not isinstance(r, LockBackendError)]
    if len(ok) < needed:
        errors = [r for r in replies if isinstance(r, LockBackendError)]
        raise LockBackendError(
            f"Only {len(ok)} of {len(replies)} Redis masters answered; a majority ({needed}) is "
            f"needed. First error: {errors[0]}"
        ) from errors[0]
    return ok


def _combine_release(replies: list[Any], needed: int) -> int:
    """Released (0, or holds left) when a majority had it; -1 (not ours) otherwise."""
    counts = [int(r) for r in _answered(replies, needed)]
    held = [c for c in counts if c >= 0]
    return min(held) if len(held) >= needed else -1


def _combine_renew(replies: list[Any], needed: int) -> int:
    return 1 if sum(int(r) == 1 for r in _answered(replies, needed)) >= needed else 0


def quorum_op(face: LockBase, call: Call) -> Op:
    """A release or renewal of ``face`` on every master (engine hook)."""
    if call.script in (scripts.RELEASE,):
        return QuorumCall(call, combine=_combine_release)
    return QuorumCall(call, combine=_combine_renew)


def acquire_flow(face: LockBase, blocking: bool | None, blocking_timeout: float | None) -> Flow:
    """Take a majority of the masters within the validity time (engine hook)."""
    blocking = face._blocking if blocking is None else bool(blocking)
    limit = face._wait_limit(blocking_timeout)
    check_seconds(limit, "blocking_timeout", allow_none=True)
    started = time.monotonic()
    deadline = float("inf") if limit is None else started + limit
    spec = face._spec()
    masters = spec.target.masters
    needed = _majority(masters)
    owner = face.owner
    meta = holds.metadata(face._task_id, queued=face._queued)
    queue = blocking and limit != 0
    waiter = wakeups.Waiter(holds.new_waiter_id(), loop=face._loop()) if queue else None
    listener = spec.target.listener() if queue else None
    if waiter is not None:
        wakeups.register(waiter)
    queued = listener is not None and listener.ready.is_set()
    entries = [""] * len(masters)
    contended = False
    try:
        while True:
            attempt = time.monotonic()
            span = min(deadline - attempt, spec.lease)
            entry_ms = int((max(span, 0.0) + engine.ENTRY_MARGIN) * 1000)
            if waiter is not None:
                waiter.handed = False
                waiter.recheck_at = float("inf")
            base = face._acquire_call(
                spec, owner, meta, waiter.id if waiter and queued else "", "", entry_ms
            )
            per_master = [[*base.args[:5], entries[i], *base.args[6:]] for i in range(len(masters))]
            replies = [
                engine._taken(r) for r in (yield QuorumCall(base, per_master_args=per_master))
            ]
            answered = _answered(replies, needed)
            if sum(int(r[0]) == 2 for r in answered) >= needed:
                raise LockNotAcquiredError(
                    face.name,
                    f"Lock {face.name!r} is already held by this owner and "
                    "reentrant=False: acquiring it again would deadlock.",
                )
            held = [r for r in answered if int(r[0]) == 1]
            drift = spec.lease * DRIFT_FACTOR + 0.002
            validity = spec.lease - (time.monotonic() - attempt) - drift
            if len(held) >= needed and validity > 0:
                entries = [""] * len(masters)
                token = max(int(r[1]) for r in held)
                count = min(int(r[2]) for r in held)
                return face._acquired(spec, owner, token, count, started, contended)
            if held:  # a minority (or too late): give it back everywhere
                yield QuorumCall(face._release_call(False, owner)[0], combine=lambda r, n: 0)
            entries = [
                "" if isinstance(r, LockBackendError) or int(r[0]) != 0 else engine._text(r[2])
                for r in replies
            ]
            contended = True
            if waiter is None or listener is None:
                return face._failed(started)
            if not queued:
                listener.ensure(engine._subscribe_timeout(spec.target))
                queued = True
                continue
            left = [int(r[1]) for r in answered if int(r[0]) == 0 and int(r[1]) >= 0]
            holder_left = min(left) / 1000 if left else span
            planned = time.monotonic() + max(0.001, min(holder_left, span))
            waiter.recheck_at = min(waiter.recheck_at, planned)
            if time.monotonic() < deadline:
                yield engine.Wait(waiter, deadline)
            if time.monotonic() >= deadline:
                yield _cancel_everywhere(face, spec, owner, waiter.id, entries)
                entries = [""] * len(masters)
                return face._failed(started)
            yield engine.Sleep(random.uniform(0, RETRY_JITTER))
    except BaseException:
        if waiter is not None and any(entries):
            cleanup = _cancel_everywhere(face, spec, owner, waiter.id, entries)
            cleanup.call.shield = True
            # The interruption matters more; unremoved entries expire anyway.
            with contextlib.suppress(Exception):
                yield cleanup
        raise
    finally:
        if waiter is not None:
            wakeups.unregister(waiter)


def _cancel_everywhere(
    face: LockBase, spec: Any, owner: str, waiter: str, entries: list[str]
) -> QuorumCall:
    base = face._cancel_call(spec, owner, waiter, "", take=False)
    per_master = [[entries[i], *base.args[1:]] for i in range(len(entries))]
    return QuorumCall(base, per_master_args=per_master, combine=lambda r, n: 0)


class _QuorumPipeline:
    """What the watchdog's ``run_pipeline`` needs of a client, over every master."""

    def __init__(self, masters: Sequence[Any]) -> None:
        self._masters = masters
        self._calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def evalsha(self, *args: Any, **kwargs: Any) -> None:
        self._calls.append((args, kwargs))

    def execute_command(self, *args: Any, **kwargs: Any) -> None:
        self._calls.append((("__command__", *args), kwargs))

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        per_master: list[list[Any]] = []
        for client in self._masters:
            pipe = client.pipeline(transaction=False)
            for args, kwargs in self._calls:
                if args and args[0] == "__command__":
                    pipe.execute_command(*args[1:], **kwargs)
                else:
                    pipe.evalsha(*args, **kwargs)
            try:
                per_master.append(pipe.execute(raise_on_error=False))
            except Exception as exc:  # an unreachable master: every call failed there
                per_master.append([exc] * len(self._calls))
        needed = _majority(self._masters)
        results: list[Any] = []
        for i in range(len(self._calls)):
            replies = [r[i] for r in per_master]
            renewed = sum(not isinstance(r, Exception) and int(r) == 1 for r in replies)
            gone = sum(not isinstance(r, Exception) and int(r) == 0 for r in replies)
            if renewed >= needed:
                results.append(1)
            elif gone > len(replies) - needed:
                results.append(0)  # a majority no longer has it: lost
            else:
                results.append(next(r for r in replies if isinstance(r, Exception)))
        return results


class QuorumRenewer:
    """A client-like object through which the watchdog renews a hold on every master."""

    #: Renewals are combined per call (a majority renewed it); no batched RENEW_MANY replies.
    batch_renewals = False

    def __init__(self, masters: Sequence[Any]) -> None:
        self.masters = tuple(masters)

    def pipeline(self, transaction: bool = False) -> _QuorumPipeline:
        return _QuorumPipeline(self.masters)

    def script_load(self, source: str) -> None:
        for client in self.masters:
            with contextlib.suppress(Exception):  # an unreachable master: retried next round
                client.script_load(source)


_renewers: dict[tuple[int, ...], QuorumRenewer] = {}


def renewer(masters: Sequence[Any]) -> QuorumRenewer:
    key = tuple(id(m) for m in masters)
    found = _renewers.get(key)
    if found is None:
        found = _renewers[key] = QuorumRenewer(masters)
    return found


engine.quorum.acquire_flow = acquire_flow
engine.quorum.op = quorum_op
engine.quorum.renewer = renewer
