"""``Lock``: the blocking face of the lock engine (:mod:`django_redislock.engine`).

Design in brief (the README has the long version):

- A lock is one Redis string holding a JSON record (owner, hold count, fencing token, metadata)
  with a lease (``PX``). Acquire, release, renew and force-release are single Lua scripts, so each
  is atomic and costs one round trip.
- Re-entrancy is per owner: by default the (process, thread) pair, so the same thread nests and
  other threads or processes wait. Callers that need another identity (a Celery task published by
  one process and run by another) pass ``owner=``.
- Waiters queue in Redis (FIFO) and sleep without holding a connection; a release hands the lock
  to the oldest live waiter, whose process is woken through its single wake-up subscription
  (:mod:`django_redislock.wakeups`). No polling, no thundering herd, no barging.
- Holds of this process are tracked in :mod:`django_redislock.holds` and renewed by
  :mod:`django_redislock.watchdog`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from django_redislock import engine
from django_redislock.exceptions import LockBackendError, LockError, LockNotOwnedError
from django_redislock.holds import register_task_id_provider, thread_owner

__all__ = ["Lock", "default_owner", "register_task_id_provider"]

logger = logging.getLogger("django_redislock")


def default_owner() -> str:
    """The owner id of the calling (process, thread) pair."""
    return thread_owner()


class Lock(engine.LockBase):
    """A distributed, re-entrant, fenced lock on Redis. See ``API.md`` for the contract.

    ``Lock(name, *, timeout=None, blocking=True, blocking_timeout=None, auto_renew=None,
    reentrant=True, using=None, owner=None, task_id=None, queued=False, stats_name=None,
    on_commit=False)``: ``None`` options take the ``REDISLOCK`` settings. Every argument is
    validated here (``TypeError`` / ``ValueError`` naming the allowed range), never at first use.
    ``on_commit=True`` (or a database alias) makes a release inside ``transaction.atomic`` wait for
    the end of the transaction — commit or rollback — so no other worker reads data the holder
    has not committed yet.
    """

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        attempt = self._begin(blocking, blocking_timeout)  # None: independent masters' flow
        work = attempt or self._acquire_flow(blocking, blocking_timeout)
        return bool(engine.drive(self, work))

    def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        Raises :class:`LockNotOwnedError` (and changes nothing in Redis) when this owner does not
        hold the lock — never held, already released, expired, or force-released. With
        ``on_commit``, inside a transaction the release happens when it ends.
        """
        owner = self._owner or self._default_owner()
        if self.on_commit and self._defer(lambda: self._release_now(all_holds, owner)):
            return
        self._release_now(all_holds, owner)

    def _release_now(self, all_holds: bool, owner: str) -> None:
        call, hold = self._release_call(all_holds, owner)
        self._released(hold, int(self._io(call).sync(self)), owner)

    def renew(self) -> None:
        """Reset the lease to ``timeout``; :class:`LockNotOwnedError` if no longer held."""
        self._renewed(int(self._io(self._renew_call(self._spec().lease_ms, "set")).sync(self)))

    def extend(self, additional_time: float) -> None:
        """Add ``additional_time`` seconds to the remaining lease (as redis-py's ``extend``).

        Owner-checked like :meth:`renew`, which instead resets the lease to ``timeout``.
        """
        ms = self._extend_ms(additional_time)
        self._renewed(int(self._io(self._renew_call(ms, "add")).sync(self)))

    def locked(self) -> bool:
        """Held by anyone (one round trip)."""
        return self._locked_from(self._locked_op().sync(self))

    def owned(self) -> bool:
        """Held by this owner; :class:`LockError` if the stored value is not a lock record."""
        return self._owned_from(self._owned_op().sync(self))

    def detach(self) -> tuple[int, int | None]:
        """Forget this process's record of the hold, leaving the lock in Redis untouched.

        For hand-overs: a lock taken here on behalf of another process (a Celery task published
        here and run by a worker, with ``owner=`` the task id) must not be renewed by this
        process's watchdog nor kept in its table of holds. Returns ``(hold_count, fencing_token)``
        as this process knew them (``0`` when it knew of no hold).
        """
        return self._detach()

    # -- transactions -------------------------------------------------------------------------
    def _defer(self, release: Callable[[], None]) -> bool:
        """Run ``release`` when the current transaction of ``on_commit``'s database ends.

        Django has hooks for commit only. The callback is registered with ``on_commit`` and is
        referenced by nothing else, so when Django discards it on a rollback it is garbage
        collected and its ``weakref.finalize`` releases the lock; on commit Django calls it and it
        runs the same finalizer (which runs once). Returns False outside a transaction.
        """
        from django.db import DEFAULT_DB_ALIAS, connections, transaction

        alias = self.on_commit if isinstance(self.on_commit, str) else DEFAULT_DB_ALIAS
        if not connections[alias].in_atomic_block:
            return False
        name = self.name

        def run() -> None:
            try:
                release()
            except LockError:
                logger.warning(
                    "django_redislock: deferred release of %r failed", name, exc_info=True
                )

        callback = _AtTransactionEnd()
        callback.finalizer = weakref.finalize(callback, run)
        transaction.on_commit(callback, using=alias)
        return True

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._release_on_exit(exc_info[1]):
            try:
                self.release()
            except (LockNotOwnedError, LockBackendError) as err:
                self._release_failed_on_exit(exc_info[1], err)


class _AtTransactionEnd:
    """``on_commit`` callback whose collection (rollback) runs the same finalizer."""

    finalizer: Any = None

    def __call__(self) -> None:
        self.finalizer()
