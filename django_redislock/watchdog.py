"""One background thread per process: it renews held locks, and settles calls whose outcome
was unknown.

**Renewal.** A held lock with ``auto_renew`` is registered after it is acquired and unregistered
*before* it is released, so the watchdog never renews a lock after release. Renewals falling due
close together go out together: on one standalone Redis as one ``renew_many`` script per few
hundred locks; elsewhere one script per lock. Async locks are renewed here too, with the sync
client of the same server, so a held lock stays renewed while its event loop is busy. A renewal
that finds the lock gone marks the hold lost; one that fails because Redis is unreachable is
retried within :data:`RETRY_AFTER` seconds (the lock is lost only when Redis says so).

**Settling.** A call whose reply never came (:class:`~django_redislock.LockOutcomeUnknown`) may
have taken a hold, queued a waiter or not finished a release. Its clean-up — cancel that
attempt by its id, idempotent — is handed to :meth:`Watchdog.settle`, which runs it at once and
retries it until Redis answers; the owner's next call on the same lock runs it first itself
(:meth:`Watchdog.pending`). Each settled one sends ``lock_outcome_resolved``.

The thread starts lazily and is recreated in a forked child, whose holds are not its parent's.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django_redislock import scripts, signals
from django_redislock.exceptions import LockBackendError
from django_redislock.holds import Hold, HoldTable

__all__ = ["RETRY_AFTER", "Resolution", "Watchdog"]

logger = logging.getLogger("django_redislock")

#: A renewal or a clean-up retried after a connection error waits this long (a renewal at most
#: a third of its lease).
RETRY_AFTER = 1.0
#: Seconds the exit handler spends settling what is still unknown.
EXIT_BUDGET = 2.0
#: Locks per ``renew_many`` call: a script blocks Redis while it runs (~0.3 µs per lock).
RENEW_BATCH = 500


@dataclass(eq=False, kw_only=True)
class Resolution:
    """The clean-up of one attempt whose outcome is unknown: cancel it by its id."""

    target: Any
    kind: Any
    name: str
    owner: str
    attempt: str
    action: str  # what the unknown call was doing: "acquire", "release"
    #: (target alias, holder key, owner): the owner's next call on that lock settles it first.
    ident: tuple[str, str, str]
    #: Milliseconds the attempt stays void (its delayed request changes nothing); 0 for a release.
    void_ms: int = 0
    sender: Any = None
    next_try: float = field(default_factory=time.monotonic)

    def call(self) -> tuple[Any, list[str], list[Any]]:
        return self.kind.cancel_call(  # type: ignore[no-any-return]
            self.target, self.name, self.owner, self.attempt, take=False, void_ms=self.void_ms
        )

    def run(self) -> None:
        """Run the clean-up (raises :class:`LockBackendError` while Redis does not answer)."""
        script, keys, args = self.call()
        reply = self.target.transport.run(
            script, keys, args, f"clean up an unfinished {self.action} of {self.name!r}"
        )
        self.done(reply)

    async def arun(self) -> None:
        script, keys, args = self.call()
        reply = await self.target.transport.arun(
            script, keys, args, f"clean up an unfinished {self.action} of {self.name!r}"
        )
        self.done(reply)

    def done(self, reply: Any) -> None:
        outcome = self.kind.read_cancel(reply)
        self.target.wake_local(outcome.handed_here)
        result = "undone" if outcome.dropped else "absent"
        logger.info(
            "django_redislock: settled the unfinished %s of %r (attempt %s): %s",
            self.action,
            self.name,
            self.attempt,
            result,
        )
        if signals.lock_outcome_resolved.receivers:
            signals.lock_outcome_resolved.send_robust(
                self.sender,
                name=self.name,
                attempt=self.attempt,
                action=self.action,
                outcome=result,
            )


class Watchdog:
    def __init__(self, holds: HoldTable) -> None:
        self.holds = holds
        self._cond = threading.Condition(threading.Lock())
        self._holds: set[Hold] = set()
        self._pending: dict[tuple[str, str, str], list[Resolution]] = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        holds.on_drop.append(self.unregister)

    # -- renewals ------------------------------------------------------------------------------
    def register(self, hold: Hold) -> None:
        """Start renewing ``hold`` (a third of its lease from now, then every third)."""
        hold.next_renewal = time.monotonic() + hold.lease / 3
        hold.registered = True
        with self._cond:
            self._holds.add(hold)
            self._start()
            if hold.next_renewal < self._wake_at:
                self._cond.notify()

    def unregister(self, hold: Hold) -> None:
        hold.registered = False
        with self._cond:
            self._holds.discard(hold)

    def __len__(self) -> int:
        return len(self._holds)

    # -- unknown outcomes ----------------------------------------------------------------------
    def settle(self, resolution: Resolution) -> None:
        """Clean up an attempt whose outcome is unknown, now and until Redis answers."""
        with self._cond:
            self._pending.setdefault(resolution.ident, []).append(resolution)
            self._start()
            self._cond.notify()

    def pending(self, ident: tuple[str, str, str]) -> list[Resolution]:
        """The unsettled clean-ups of one (lock, owner): its next call runs them first."""
        if not self._pending:
            return []
        with self._cond:
            return list(self._pending.get(ident, ()))

    def settled(self, resolution: Resolution) -> None:
        with self._cond:
            found = self._pending.get(resolution.ident)
            if found is not None and resolution in found:
                found.remove(resolution)
                if not found:
                    del self._pending[resolution.ident]

    def forget_pending(self, where: Any = None) -> None:
        """Drop pending clean-ups (those ``where`` accepts) without running them: for test
        suites that flush Redis between tests."""
        with self._cond:
            for ident in list(self._pending):
                kept = [r for r in self._pending[ident] if where is not None and not where(r)]
                if kept:
                    self._pending[ident] = kept
                else:
                    del self._pending[ident]

    def unsettled(self) -> list[Resolution]:
        with self._cond:
            return [r for group in self._pending.values() for r in group]

    def settle_now(self, budget: float = EXIT_BUDGET) -> None:
        """Try every pending clean-up once, within ``budget`` seconds (at exit)."""
        give_up = time.monotonic() + budget
        for resolution in self.unsettled():
            if time.monotonic() > give_up:
                return
            self._try(resolution)

    def _try(self, resolution: Resolution) -> None:
        try:
            resolution.run()
        except LockBackendError as exc:
            resolution.next_try = time.monotonic() + RETRY_AFTER
            logger.debug("django_redislock: clean-up of %r not done yet: %s", resolution.name, exc)
        except Exception:
            resolution.next_try = time.monotonic() + RETRY_AFTER
            logger.exception("django_redislock: clean-up of %r failed", resolution.name)
        else:
            self.settled(resolution)

    # -- the thread ----------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the thread if needed (called with the condition held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="django-redislock-watchdog", daemon=True
            )
            self._thread.start()

    def _due(self) -> tuple[list[Hold], list[Resolution]]:
        """Wait until something is due; return the holds due now or soon (batched) and the
        clean-ups due now."""
        with self._cond:
            while True:
                self._wake_at = float("inf")
                now = time.monotonic()
                held = tuple(self._holds)
                resolutions = [r for group in self._pending.values() for r in group]
                first = min((h.next_renewal for h in held), default=float("inf"))
                first = min([first, *(r.next_try for r in resolutions)])
                if first <= now:
                    # Renew early whatever falls due within the next sixth of its lease, so
                    # renewals of many locks coalesce into few round trips.
                    return (
                        [h for h in held if h.next_renewal - h.lease / 6 <= now],
                        [r for r in resolutions if r.next_try <= now],
                    )
                self._wake_at = first
                self._cond.wait(min(first - now, 60.0))

    def _run(self) -> None:
        while True:
            try:
                due, resolutions = self._due()
                for resolution in resolutions:
                    self._try(resolution)
                self.renew_now(due)
            except Exception:  # never let the thread die: held locks depend on it
                logger.exception("django_redislock watchdog: unexpected error")
                time.sleep(RETRY_AFTER)

    def renew_now(self, due: list[Hold]) -> None:
        """Renew ``due``; mark the ones found gone as lost."""
        batches: dict[int, tuple[Any, list[Hold]]] = {}
        singles: list[Hold] = []
        for hold in due:
            if hold.target.batch_renewals and hold.kind.batch_renewals:
                batches.setdefault(id(hold.target), (hold.target, []))[1].append(hold)
            else:
                singles.append(hold)
        for target, group in batches.values():
            self._renew_batch(target, group)
        for hold in singles:
            self._settle(hold, self._renew_one(hold))

    def _renew_batch(self, target: Any, group: list[Hold]) -> None:
        """Lock leases on one standalone Redis: one ``renew_many`` script per lease and batch."""
        by_lease: dict[int, list[Hold]] = {}
        for hold in group:
            by_lease.setdefault(int(hold.lease * 1000), []).append(hold)
        chunks = [
            (ms, holds[i : i + RENEW_BATCH])
            for ms, holds in by_lease.items()
            for i in range(0, len(holds), RENEW_BATCH)
        ]
        calls = [
            ([h.target.keys.lock(h.name) for h in chunk], [ms, *[h.owner for h in chunk]])
            for ms, chunk in chunks
        ]
        try:
            replies: list[Any] = target.transport.run_many(scripts.RENEW_MANY, calls)
        except Exception as exc:  # the whole pipeline failed: unknown, retry soon
            replies = [exc] * len(chunks)
        for (_, chunk), reply in zip(chunks, replies, strict=True):
            for index, hold in enumerate(chunk):
                self._settle(hold, reply if isinstance(reply, Exception) else reply[index])

    @staticmethod
    def _renew_one(hold: Hold) -> Any:
        script, keys, args = hold.renewal(int(hold.lease * 1000))
        target = hold.target
        action = f"renew {hold.kind.name} {hold.name!r}"
        try:
            if target.durable:
                reply, acks = target.transport.run_waited(
                    script,
                    keys,
                    args,
                    target.replicas,
                    target.replicas_timeout_ms,
                    action,
                    aof=(target.aof_local, target.aof_replicas),
                )
                missing = acks.shortfall(target.replicas, target.aof_local, target.aof_replicas)
                if missing:
                    return LockBackendError(f"the renewal was not made durable: {missing}")
                return reply
            return target.transport.run(script, keys, args, action)
        except LockBackendError as exc:
            return exc

    def _settle(self, hold: Hold, result: Any) -> None:
        now = time.monotonic()
        if isinstance(result, Exception):
            # Unknown outcome: keep the hold and try again soon, before the lease runs out.
            logger.warning("django_redislock: could not renew %r: %s", hold.name, result)
            hold.next_renewal = now + min(RETRY_AFTER, hold.lease / 3)
        elif int(result) == 1:
            hold.next_renewal = now + hold.lease / 3
        elif hold.registered:
            self.holds.mark_lost(hold)

    def clear(self) -> None:
        """A forked child: nothing of the parent's is ours; the thread is not running here."""
        self._cond = threading.Condition(threading.Lock())
        self._holds = set()
        self._pending = {}
        self._thread = None
        self._wake_at = float("inf")


def _at_exit(watchdog: Watchdog) -> None:
    if watchdog._pending:
        watchdog.settle_now()


def install_exit_handler(watchdog: Watchdog) -> None:
    """Settle what is still unknown when the interpreter exits (the thread is a daemon)."""
    atexit.register(_at_exit, watchdog)
