"""``Lock``: a distributed, re-entrant, fenced mutex with blocking calls.

The blocking face (:class:`~django_redislock.face.SyncFace`) of the lock kind
(:class:`~django_redislock.kinds.LockKind`). In brief (the docs' "How it works" has the rest):

- A lock is one Redis string holding a JSON record (owner, holds, fencing token, metadata) with a
  lease (``PX``). Acquire, release, renew and force-release are single Lua scripts, each atomic
  and one round trip, each idempotent per attempt id.
- Re-entrancy is per owner: by default the (process, thread) pair, so the same thread nests and
  other threads or processes wait. Callers that need another identity (a Celery task published
  by one process and run by another) pass ``owner=``.
- Waiters queue in Redis (FIFO) and sleep without holding a connection; a release hands the lock
  to the oldest live waiter, whose process is woken through its one wake-up subscription.
- Held locks are renewed by the process's watchdog; a call whose reply is lost is cleaned up by
  its attempt id (:class:`~django_redislock.LockOutcomeUnknown`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from django_redislock.exceptions import LockError
from django_redislock.face import SyncFace
from django_redislock.kinds import LockKind
from django_redislock.runtime import register_task_id_provider, runtime
from django_redislock.validation import check_bool

__all__ = ["Lock", "default_owner", "register_task_id_provider"]

logger = logging.getLogger("django_redislock")


def default_owner() -> str:
    """The owner id of the calling (process, thread) pair."""
    return runtime.thread_owner()


class Lock(SyncFace):
    """A distributed, re-entrant, fenced lock on Redis.

    ``Lock(name, *, timeout=None, blocking=True, blocking_timeout=None, auto_renew=None,
    reentrant=True, using=None, owner=None, task_id=None, queued=False, stats_name=None,
    on_commit=False)``: ``None`` options take the ``REDISLOCK`` settings. Every argument is
    validated here (``TypeError`` / ``ValueError`` naming the allowed range), never at first use.
    ``on_commit=True`` (or a database alias) makes a release inside ``transaction.atomic`` wait for
    the end of the transaction — commit or rollback — so no other worker reads data the holder
    has not committed yet.
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

    def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        Raises :class:`~django_redislock.LockNotOwnedError` (and changes nothing in Redis) when
        this owner does not hold the lock — never held, already released, expired, or
        force-released. With ``on_commit``, inside a transaction the release happens when it
        ends.
        """
        owner = self.owner
        if self.on_commit and self._defer(lambda: self._release_now(all_holds, owner)):
            return
        self._release_now(all_holds, owner)

    def _defer(self, release: Callable[[], None]) -> bool:
        """Run ``release`` when the current transaction of ``on_commit``'s database ends.

        Django has hooks for commit only. The callback is registered with ``on_commit`` and is
        referenced by nothing else, so when Django discards it on a rollback it is garbage
        collected and its ``weakref.finalize`` releases the lock; on commit Django calls it and
        it runs the same finalizer (which runs once). Returns False outside a transaction.
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

    def __enter__(self) -> Lock:
        super().__enter__()
        return self


class _AtTransactionEnd:
    """``on_commit`` callback whose collection (rollback) runs the same finalizer."""

    finalizer: Any = None

    def __call__(self) -> None:
        self.finalizer()
