"""The worker main process's part: free the key of a task whose pool child cannot.

A body releases its own key when it ends. It cannot when its pool child dies (SIGKILL, OOM), is
terminated (``revoke(terminate=True)``, hard time limit), or when the message never reaches a
child (revoked or expired before it started): the worker's main process releases it then.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.exceptions import Terminated
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from django_redislock.celery.headers import HEADER_KEY, HEADER_USING, headers_of
from django_redislock.celery.task import SingleFlightTask
from django_redislock.exceptions import LockBackendError, LockNotOwnedError
from django_redislock.lock import Lock

__all__ = ["SingleFlightRequest", "on_task_revoked", "release_for_request"]

logger = logging.getLogger("django_redislock.celery")


def release_for_request(
    task: Any, task_id: str | None, request: Any, args: Any = None, kwargs: Any = None
) -> bool:
    """Release every hold of ``task_id`` on its key; for code that outlives the run (revoke,
    a dead pool child). Returns whether something was released."""
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
    lock = Lock(key, owner=task_id, using=headers.get(HEADER_USING) or task.lock_using)
    try:
        lock.release(all_holds=True)
    except LockNotOwnedError:
        return False
    except LockBackendError:
        logger.warning(
            "Could not release lock %r of %s[%s]; it expires within its lease.",
            key,
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    logger.info("Released lock %r of %s[%s] for the worker.", key, task.name, task_id)
    return True


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
