"""One renewal thread per process for every held lock.

A held lock with ``auto_renew`` is registered here after it is acquired and unregistered *before* it
is released, so the watchdog never renews a lock after release or after an interrupted acquire.
Renewals that fall due close together are sent as one pipeline per Redis client (one round trip
for hundreds of locks). A renewal that finds the lock gone marks the hold as lost, logs a WARNING
and sends :data:`~django_redislock.signals.lock_lost`.

The thread starts lazily on the first registration and is recreated in a forked child (Celery
prefork, gunicorn), where the parent's holds are not the child's and are forgotten.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis import Redis
from redis import exceptions as redis_errors

from django_redislock import scripts

if TYPE_CHECKING:
    from django_redislock.lock import Lock

__all__ = ["Hold", "Watchdog", "watchdog"]

logger = logging.getLogger("django_redislock")

#: A renewal retried after a connection error waits this long (capped by a third of the lease).
RETRY_AFTER = 1.0


@dataclass(eq=False)
class Hold:
    """What this process knows about one lock it holds (shared by its owner's ``Lock``s)."""

    client: Redis
    name: str
    key: str
    owner: str
    lease: float
    token: int
    count: int
    auto_renew: bool
    acquired_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    lock_ref: Callable[[], Lock | None] = field(default=lambda: None)
    next_renewal: float = 0.0
    registered: bool = False

    def set_lock(self, lock: Lock) -> None:
        self.lock_ref = weakref.ref(lock)


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds: set[Hold] = set()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        self._idle_wait = 10.0  # shortest renewal interval seen, see _due()
        self.on_lost: Callable[[Hold], None] = lambda hold: None

    def register(self, hold: Hold) -> None:
        interval = hold.lease / 3
        hold.next_renewal = time.monotonic() + interval
        with self._cond:
            self._idle_wait = max(0.5, min(self._idle_wait, interval))
            hold.registered = True
            self._holds.add(hold)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-redislock-watchdog", daemon=True
                )
                self._thread.start()
            elif hold.next_renewal < self._wake_at:
                self._cond.notify()

    def unregister(self, hold: Hold) -> None:
        with self._cond:
            hold.registered = False
            self._holds.discard(hold)

    def __len__(self) -> int:
        return len(self._holds)

    def _due(self) -> list[Hold]:
        """Wait until some renewal is due; return every hold due now or soon (batched)."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._holds:
                    first = min(h.next_renewal for h in self._holds)
                    if first <= now:
                        # Renew early whatever falls due within the next sixth of its lease, so
                        # renewals of many locks coalesce into few round trips.
                        return [h for h in self._holds if h.next_renewal - h.lease / 6 <= now]
                    self._wake_at = first
                    self._cond.wait(first - now)
                else:
                    # Idle: plan a wake-up no later than any new hold's first renewal, so that
                    # register() need not notify (a lock taken and released in a loop would
                    # otherwise wake this thread, and take the GIL, on every acquisition).
                    self._wake_at = now + self._idle_wait
                    self._cond.wait(self._idle_wait)

    def _run(self) -> None:
        while True:
            try:
                self.renew_now(self._due())
            except Exception:  # never let the thread die: held locks depend on it
                logger.exception("django_redislock watchdog: unexpected error")
                time.sleep(RETRY_AFTER)

    def renew_now(self, holds: list[Hold]) -> None:
        """Renew ``holds`` with one pipeline per client; mark the ones found gone as lost."""
        by_client: dict[int, list[Hold]] = {}
        for hold in holds:
            by_client.setdefault(id(hold.client), []).append(hold)
        for group in by_client.values():
            calls = [([h.key], [h.owner, int(h.lease * 1000)]) for h in group]
            try:
                results: list[Any] = scripts.run_pipeline(group[0].client, scripts.RENEW, calls)
            except redis_errors.RedisError as exc:
                results = [exc] * len(group)
            now = time.monotonic()
            for hold, result in zip(group, results, strict=True):
                if isinstance(result, Exception):
                    # Unknown outcome: keep the hold and try again soon, before the lease runs out.
                    logger.warning("django_redislock: could not renew %r: %s", hold.name, result)
                    hold.next_renewal = now + min(RETRY_AFTER, hold.lease / 3)
                elif int(result) == 1:
                    hold.next_renewal = now + hold.lease / 3
                elif hold.registered:
                    self.unregister(hold)
                    hold.lost = True
                    logger.warning(
                        "django_redislock: lock %r was lost (expired or force-released) while held "
                        "by %s; the protected work may now overlap with another holder.",
                        hold.name,
                        hold.owner,
                    )
                    self.on_lost(hold)

    def _after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds = set()
        self._thread = None
        self._wake_at = float("inf")


watchdog = Watchdog()
os.register_at_fork(after_in_child=watchdog._after_fork)
