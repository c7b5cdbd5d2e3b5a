"""What the app wires up in ``AppConfig.ready()`` when Celery is installed.

Nothing here is connected at import time: importing :mod:`django_redislock.celery` has no side
effects, and a project without ``django_redislock`` in ``INSTALLED_APPS`` gets none.
"""

from __future__ import annotations

from celery._state import get_current_task
from celery.signals import task_revoked, worker_init

from django_redislock import signals as lock_signals
from django_redislock.celery import periodic, runs, worker
from django_redislock.lock import register_task_id_provider

__all__ = ["celery_task_id", "connect"]


def celery_task_id() -> str | None:
    """The id of the Celery task this thread (or greenlet) runs, for the holder metadata of any
    lock taken inside a task (``list_locks`` and the admin show it).

    Called on every acquisition: reads Celery's task stack directly (what the ``current_task``
    proxy does, without the proxy's overhead)."""
    task = get_current_task()
    if task is None:
        return None
    return getattr(getattr(task, "request", None), "id", None)


def connect() -> None:
    """Connect the receivers (idempotent: every connection has a ``dispatch_uid``)."""
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
    # Single flight chosen per schedule entry by a message header (no task code changes).
    periodic.connect()
