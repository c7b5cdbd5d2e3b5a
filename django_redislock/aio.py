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
  cancelling a task inside ``release()`` still releases (the release is shielded).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django_redislock import connection, engine, holds
from django_redislock.exceptions import LockBackendError, LockNotOwnedError

__all__ = ["AsyncLock"]

logger = logging.getLogger("django_redislock")


class AsyncLock(engine.LockBase):
    """A distributed, re-entrant, fenced lock for asyncio code. See ``API.md`` ("asyncio").

    ``AsyncLock(name, *, timeout=None, blocking=True, blocking_timeout=None, auto_renew=None,
    reentrant=True, using=None, owner=None)``; every argument is validated here.
    ``on_commit`` is accepted for symmetry with ``Lock`` but async code does not run inside
    ``transaction.atomic`` (Django's transactions are sync-only), so it releases at once.
    """

    def _default_owner(self) -> str:
        return holds.async_owner()

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return asyncio.get_running_loop()

    async def _aclient(self) -> Any:
        return await connection.async_client_for(self._target().client)

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        return bool(await engine.adrive(self, self._acquire_flow(blocking, blocking_timeout)))

    async def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        Shielded: a task cancelled while releasing still releases (the cancellation is
        delivered once the release is done).
        """
        await asyncio.shield(self._release_now(all_holds, self.owner))

    async def _release_now(self, all_holds: bool, owner: str) -> None:
        call, hold = self._release_call(all_holds, owner)
        self._released(hold, int(await self._io(call).async_(self)), owner)

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
