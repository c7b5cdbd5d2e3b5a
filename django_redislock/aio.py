"""``AsyncLock``: the asyncio face of the lock engine (:mod:`django_redislock.engine`).

Same keys, scripts, settings, signals, statistics and errors as :class:`~django_redislock.Lock`;
an ``AsyncLock`` and a ``Lock`` on one name exclude each other and hand over to each other. What
differs is only how it waits and talks to Redis:

- commands go through a ``redis.asyncio`` client built from the same ``CACHES`` entry, one per
  event loop, closed when ``asyncio.run`` ends the loop;
- the default owner is the (process, asyncio task) pair: two tasks are two owners, one task nests;
- a waiter sleeps on an ``asyncio.Event`` that the process's wake-up listener sets — no polling,
  no connection held while waiting;
- renewal is the watchdog thread's, with a sync connection, so held locks stay renewed while the
  event loop is busy with CPU-bound work;
- cancelling a waiting task leaves no queue entry (and passes on a lock reserved for it);
  cancelling a task inside ``release()`` still releases (finished by a task of its own).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django_redislock import connection, engine, holds
from django_redislock.exceptions import LockBackendError, LockNotOwnedError

__all__ = ["AsyncLock"]

logger = logging.getLogger("django_redislock")

#: Releases being finished after a cancellation (a reference, so they are not collected).
_settling: set[asyncio.Task[None]] = set()


class AsyncLock(engine.LockBase):
    """A distributed, re-entrant, fenced lock for asyncio code. See ``API.md`` ("asyncio").

    ``AsyncLock(name, *, timeout=None, blocking=True, blocking_timeout=None, auto_renew=None,
    reentrant=True, using=None, owner=None)``; every argument is validated here.
    ``on_commit`` is accepted for symmetry with ``Lock`` but async code does not run inside
    ``transaction.atomic`` (Django's transactions are sync-only), so it releases at once.
    """

    _default_owner = staticmethod(holds.async_owner)

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return asyncio.get_running_loop()

    async def _aclient(self) -> Any:
        return await connection.async_client_for(self._target().client)

    async def _arunner(self) -> Any:
        client = self._target().client
        return connection.cached_async_runner(client) or await connection.async_runner_for(client)

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        attempt = self._begin(blocking, blocking_timeout)  # None: independent masters' flow
        work = attempt or self._acquire_flow(blocking, blocking_timeout)
        return bool(await engine.adrive(self, work))

    async def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        A task cancelled while releasing still releases: the cancellation is raised at once and
        the release is finished by a task of its own.

        Why not simply ``asyncio.shield``: it runs every release in a new task, two extra turns
        of the event loop per release (≈ 20 µs) although almost no release is ever cancelled.
        A lock release of a hold this process knows runs inline instead; if it is cancelled
        with the reply outstanding, :meth:`_settle_release` reads the lock record to learn
        whether Redis ran it (this owner's hold count changes by nobody else's hand) and runs it
        only if not, so a nested hold is never dropped twice. That reasoning needs the owner to
        be this task (the default): other releases — an explicit ``owner=`` (other tasks may
        change its count meanwhile), semaphore permits, independent masters, holds taken
        elsewhere — keep the shield.
        """
        owner = self.owner
        call, hold = self._release_call(all_holds, owner)
        if hold is None or self._owner is not None or self.kind != "lock" or self._target().masters:
            await asyncio.shield(self._release_shielded(call, hold, owner))
            return
        before = hold.count
        try:
            left = await call.async_(self)
        except asyncio.CancelledError:
            settling = asyncio.ensure_future(self._settle_release(call, hold, owner, before))
            _settling.add(settling)
            settling.add_done_callback(_settling.discard)
            raise
        self._released(hold, int(left), owner)

    async def _release_shielded(self, call: engine.Call, hold: Any, owner: str) -> None:
        self._released(hold, int(await self._io(call).async_(self)), owner)

    async def _settle_release(self, call: engine.Call, hold: Any, owner: str, before: int) -> None:
        """Finish a release whose reply a cancellation cut off (see :meth:`release`)."""
        try:
            record = await self._owned_op().async_(self)
            ours = record is not None and record.owner == owner and not record.unreadable
            if not ours:  # it ran (freed or handed over), or the lease ended meanwhile
                left = 0
            elif record.count == before:  # it did not run: run it now
                left = int(await call.async_(self))
            else:
                left = record.count
            self._released(hold, left, owner)
        except Exception:  # nobody awaits this task: log it; the lease ends the lock anyway
            logger.warning(
                "django_redislock: could not finish the cancelled release of %r",
                self.name,
                exc_info=True,
            )

    async def renew(self) -> None:
        """Reset the lease to ``timeout``; :class:`LockNotOwnedError` if no longer held."""
        self._renewed(
            int(await self._io(self._renew_call(self._spec().lease_ms, "set")).async_(self))
        )

    async def extend(self, additional_time: float) -> None:
        """Add ``additional_time`` seconds to the remaining lease (owner-checked)."""
        ms = self._extend_ms(additional_time)
        self._renewed(int(await self._io(self._renew_call(ms, "add")).async_(self)))

    async def locked(self) -> bool:
        """Held by anyone (one round trip)."""
        return self._locked_from(await self._locked_op().async_(self))

    async def owned(self) -> bool:
        """Held by this owner (this task, by default)."""
        return self._owned_from(await self._owned_op().async_(self))

    def detach(self) -> tuple[int, int | None]:
        """See :meth:`Lock.detach`."""
        return self._detach()

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire():
            raise self._not_acquired()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._release_on_exit(exc_info[1]):
            try:
                await self.release()
            except (LockNotOwnedError, LockBackendError) as err:
                self._release_failed_on_exit(exc_info[1], err)
