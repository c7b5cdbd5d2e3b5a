"""``AsyncLock``: the asyncio face of the lock (same kind, keys, scripts and errors as ``Lock``).

An ``AsyncLock`` and a ``Lock`` on one name exclude each other and hand over to each other. What
differs is only how it waits and talks to Redis:

- scripts go through a ``redis.asyncio`` client built from the same ``CACHES`` entry, one per
  event loop, closed when ``asyncio.run`` ends the loop;
- a waiter sleeps on a future of its loop that the process's wake-up listener resolves — no
  polling, no connection held while waiting;
- renewal is the watchdog thread's, with a sync connection, so held locks stay renewed while the
  event loop is busy with CPU-bound work;
- a cancelled acquire or release is settled by its attempt id in the background: a cancelled
  waiter leaves no queue entry and no hold, a cancelled release still releases.

**Owner.** By default the owner is the (process, asyncio task) pair: two tasks are two owners,
one task nests. One exception makes ``await asyncio.wait_for(lock.acquire(), 5)`` work on every
supported Python (on 3.10 and 3.11 ``wait_for`` runs the acquire in a task of its own): a hold
this *object* took for a task that has finished since is adopted by the next task that uses the
object, which may then release it (or nest in it). A finished task can do nothing with a hold,
so adopting it never takes a lock away from anyone who could still use it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from django_redislock.face import AsyncFace
from django_redislock.kinds import LockKind
from django_redislock.runtime import runtime
from django_redislock.validation import check_bool

__all__ = ["AsyncLock"]

logger = logging.getLogger("django_redislock")


class AsyncLock(AsyncFace):
    """A distributed, re-entrant, fenced lock for asyncio code.

    ``AsyncLock(name, *, timeout=None, blocking=True, blocking_timeout=None, auto_renew=None,
    reentrant=True, using=None, owner=None)``; every argument is validated here.
    ``on_commit`` is accepted for symmetry with ``Lock`` but async code does not run inside
    ``transaction.atomic`` (Django's transactions are sync-only), so it releases at once.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = True,
        using: str | None = None,
        owner: str | None = None,
        task_id: str | None = None,
        queued: bool = False,
        stats_name: str | None = None,
        on_commit: bool | str = False,
        quiet: bool = False,
        report_busy: bool = True,
    ) -> None:
        super().__init__(
            name,
            kind=LockKind(reentrant=bool(check_bool(reentrant, "reentrant"))),
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
            owner=owner,
            task_id=task_id,
            queued=queued,
            stats_name=stats_name,
            on_commit=on_commit,
            quiet=quiet,
            report_busy=report_busy,
        )
        #: owner -> the task this object took a hold for (see the module docstring).
        self._tasks: dict[str, weakref.ref[asyncio.Task[Any]]] = {}

    def _default_owner(self) -> str:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        own = runtime.task_owner(task)
        if self._tasks and own not in self._tasks:
            for owner, ref in list(self._tasks.items()):
                gone = ref()
                if (gone is None or gone.done()) and self._hold(owner) is not None:
                    return owner  # adopt the hold of a finished task
        return own

    def _took(self, owner: str, hold: Any) -> None:
        super()._took(owner, hold)
        if self._owner is None:
            try:
                task = asyncio.current_task()
            except RuntimeError:
                task = None
            if task is not None and owner not in self._tasks:
                self._tasks[owner] = weakref.ref(task)
            if len(self._tasks) > 64:
                self._tasks = {o: r for o, r in self._tasks.items() if self._hold(o) is not None}

    async def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        A task cancelled while releasing still releases: the cancellation is raised at once and
        the release is finished in the background by its attempt id, which drops exactly that
        hold (never a hold the task took again meanwhile).
        """
        await self._release_now(all_holds, self.owner)

    async def __aenter__(self) -> AsyncLock:
        await super().__aenter__()
        return self
