"""What the app wires up in ``AppConfig.ready()`` when Celery is installed.

Nothing here is connected at import time: importing :mod:`django_redislock.celery` has no side
effects, and a project without ``django_redislock`` in ``INSTALLED_APPS`` gets none.
"""

from __future__ import annotations

import threading
from collections import Counter

from celery import current_task
from celery.signals import (
    task_postrun,
    task_prerun,
    task_revoked,
    worker_init,
    worker_ready,
    worker_shutdown,
)

from django_redislock import signals as lock_signals
from django_redislock.celery import periodic, runs, worker
from django_redislock.lock import register_task_id_provider

__all__ = ["celery_task_id", "connect"]


#: Tasks this process runs now (``task_prerun`` .. ``task_postrun``, eager runs included), by id.
_running: Counter[str] = Counter()
_running_mutex = threading.Lock()


def _task_started(task_id: str | None = None, **kwargs: object) -> None:
    if task_id:
        with _running_mutex:
            _running[task_id] += 1


def _task_finished(task_id: str | None = None, **kwargs: object) -> None:
    if task_id:
        with _running_mutex:
            _running[task_id] -= 1
            if _running[task_id] <= 0:
                del _running[task_id]


def celery_task_id() -> str | None:
    """The id of the Celery task this thread (or greenlet) runs, for the holder metadata of any
    lock taken inside a task (``list_locks`` and the admin show it).

    Called on every acquisition. A process that runs no task (a web process, a worker between
    tasks) answers from the ``_running`` tally without touching Celery's task stack, whose
    lookup raises and catches two exceptions in a thread that never ran a task. Otherwise it
    asks Celery's public ``current_task`` proxy."""
    if not _running:
        return None
    if not current_task:  # the proxy of Celery's current task: falsy outside one
        return None
    return getattr(getattr(current_task, "request", None), "id", None)


def connect() -> None:
    """Connect the receivers (idempotent: every connection has a ``dispatch_uid``)."""
    task_prerun.connect(
        _task_started, weak=False, dispatch_uid="django_redislock.celery.task_prerun"
    )
    task_postrun.connect(
        _task_finished, weak=False, dispatch_uid="django_redislock.celery.task_postrun"
    )
    register_task_id_provider(celery_task_id)
    lock_signals.lock_lost.connect(
        runs.on_lock_lost, weak=False, dispatch_uid="django_redislock.celery.lock_lost"
    )
    task_revoked.connect(
        worker.on_task_revoked, weak=False, dispatch_uid="django_redislock.celery.task_revoked"
    )
    worker_init.connect(
        worker.check_pool, weak=False, dispatch_uid="django_redislock.celery.check_pool"
    )
    worker_ready.connect(
        worker.start_rescuer, weak=False, dispatch_uid="django_redislock.celery.rescuer"
    )
    worker_shutdown.connect(
        worker.stop_rescuer, weak=False, dispatch_uid="django_redislock.celery.rescuer_stop"
    )
    # Single flight chosen per schedule entry by a message header (no task code changes).
    periodic.connect()
