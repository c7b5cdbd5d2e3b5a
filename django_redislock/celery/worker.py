"""The worker main process's part: free the key of a task whose pool child cannot; check the pool.

A body releases its own key when it ends. It cannot when its pool child dies (SIGKILL, OOM), is
terminated (``revoke(terminate=True)``, hard time limit), or when the message never reaches a
child (revoked or expired before it started): the worker's main process releases it then, as
the task's mode says (:func:`django_redislock.singleflight.abandon`; ``until_expired`` keeps its
window whatever happens).

At start-up (``worker_init``) a greenlet pool on which concurrent tasks would share one lock
owner is refused (:func:`check_pool`).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from billiard.exceptions import Terminated
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from django_redislock import singleflight
from django_redislock.celery.headers import HEADER_ATTEMPT, HEADER_KEY, headers_of
from django_redislock.celery.task import SingleFlightTask
from django_redislock.exceptions import LockBackendError

__all__ = [
    "SingleFlightRequest",
    "UnsupportedPoolError",
    "check_pool",
    "on_task_revoked",
    "release_for_request",
]

logger = logging.getLogger("django_redislock.celery")


def release_for_request(
    task: Any, task_id: str | None, request: Any, args: Any = None, kwargs: Any = None
) -> bool:
    """Free what ``task_id`` holds for its mode (:func:`singleflight.abandon`); for code that
    outlives the run (revoke, a dead pool child). Returns whether something was released."""
    if not isinstance(task, SingleFlightTask) or not task_id:
        return False
    headers = headers_of(request) if request is not None else {}
    try:
        key = headers.get(HEADER_KEY) or task.lock_name(args, kwargs)
    except Exception:
        logger.warning(
            "Cannot compute the lock key of %s[%s] to release it.",
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    try:
        released = singleflight.abandon(
            task.flight_rules, key, task_id, attempt=headers.get(HEADER_ATTEMPT) or 0
        )
    except LockBackendError:
        logger.warning(
            "Could not release lock %r of %s[%s]; it expires within its lease.",
            key,
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    if released:
        logger.info("Released lock %r of %s[%s] for the worker.", key, task.name, task_id)
    return released


_CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class SingleFlightRequest(Request):
    """Worker-side request that frees the key when the pool child running it cannot.

    ``on_failure`` runs in the worker's main process; for a child that died (SIGKILL, OOM), was
    terminated by ``revoke(terminate=True)`` or hit the hard time limit, the body's own ``finally``
    never ran, so the key is released here, before Celery requeues or retries the message.
    """

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
        if isinstance(exc, _CHILD_GONE):
            release_for_request(self.task, self.id, self.request_dict, self.args, self.kwargs)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked`` receiver: a revoked, expired or terminated message will not run: free its
    key now."""
    if request is None:
        return
    release_for_request(
        sender,
        getattr(request, "id", None),
        request,
        getattr(request, "args", None),
        getattr(request, "kwargs", None),
    )


# -- pools -----------------------------------------------------------------------------------------
#: Pools whose tasks run as greenlets in one OS thread.
_GREENLET_POOLS = {"celery.concurrency.gevent": "gevent", "celery.concurrency.eventlet": "eventlet"}


class UnsupportedPoolError(SystemExit):
    """The worker's pool would break mutual exclusion; raised at start-up to stop the worker.

    A ``SystemExit``: Celery logs and swallows ``Exception`` raised by signal receivers, and a
    worker that starts anyway is exactly what must not happen.
    """


def _greenlet_pool(pool_cls: Any) -> str | None:
    """``"gevent"``/``"eventlet"`` when the worker's pool runs tasks as greenlets, else None.

    Decided from the name or class Celery was given, without importing a pool module (a
    ``worker_init`` receiver that monkey-patches may still run after this one).
    """
    if isinstance(pool_cls, str):
        from celery import concurrency

        aliases: dict[str, str] = getattr(concurrency, "ALIASES", {})
        path = aliases.get(pool_cls, pool_cls)
        return _GREENLET_POOLS.get(path.partition(":")[0])
    for klass in getattr(pool_cls, "__mro__", ()):
        found = _GREENLET_POOLS.get(getattr(klass, "__module__", ""))
        if found:
            return found
    return None


def _owner_of_another_greenlet(library: str) -> str:
    """:func:`~django_redislock.lock.default_owner` as seen from a freshly spawned greenlet."""
    from django_redislock.lock import default_owner

    # Imported by name: neither library is a dependency (nor typed).
    greenlets: Any = importlib.import_module(library)
    spawned = greenlets.spawn(default_owner)
    return str(spawned.get() if library == "gevent" else spawned.wait())


def check_pool(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init`` receiver: refuse a greenlet pool whose concurrent tasks share a lock owner.

    Locks taken inside task bodies (``Lock``, ``distributed_lock``) are owned by (process, thread)
    by default. ``celery worker -P gevent``/``-P eventlet`` monkey-patch ``threading``, so each
    greenlet is a thread of its own. Patched without it (``gevent.monkey.patch_all(thread=False)``,
    ``eventlet.monkey_patch(thread=False)``), every task of the worker would be the same owner:
    their locks would nest instead of excluding each other, silently. Measured: four concurrent
    tasks all inside ``with Lock("x")`` at once.
    """
    library = _greenlet_pool(getattr(sender, "pool_cls", None))
    if library is None:
        return
    from django_redislock.lock import default_owner

    if _owner_of_another_greenlet(library) != default_owner():
        return
    message = (
        f"django_redislock: the {library} pool runs every task as a greenlet of one thread, but "
        f"threading is not monkey-patched, so locks taken inside tasks would all have the same "
        f"owner and concurrent tasks would not exclude each other. Start the worker with "
        f"`celery worker -P {library}` (which patches everything before anything is imported) "
        f"or patch threading too; supported pools: prefork, threads, solo, and gevent/eventlet "
        f"with threading patched."
    )
    logger.critical(message)
    raise UnsupportedPoolError(message)
