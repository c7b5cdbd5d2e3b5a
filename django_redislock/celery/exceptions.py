"""Errors of the Celery integration."""

from __future__ import annotations

from typing import Any

from django_redislock.exceptions import LockNotAcquiredError

__all__ = ["DuplicateTaskError"]


class DuplicateTaskError(LockNotAcquiredError):
    """A task with the same lock key is already queued or running; nothing was published.

    ``task_id`` is the id of the queued/running task (``None`` when the key is held by code that is
    not a task, e.g. ``distributed_lock`` on the same name); ``name`` is the lock key.
    """

    def __init__(self, task_id: str | None, name: str = "", message: str | None = None) -> None:
        self.task_id = task_id
        if message is None:
            holder = f"task {task_id}" if task_id else "a holder that is not a task"
            message = (
                f"Lock {name!r} is held by {holder}: a task with the same key is already "
                "queued or running, so nothing was published."
            )
        super().__init__(name, message)
        self.message = message
        # Celery's JSON result backend rebuilds exceptions as ``cls(*args)``.
        self.args = (task_id, name, message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)
