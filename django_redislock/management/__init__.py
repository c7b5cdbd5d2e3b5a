"""Management-command integration: how a busy lock ends a command.

``distributed_lock`` knows nothing about management commands; it asks the busy-error factories
registered with :func:`django_redislock.decorators.register_busy_error`. This one (registered in
``AppConfig.ready``) turns a busy lock on a command's ``handle`` into a ``CommandError``, so the
command exits non-zero with one line instead of a traceback.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockNotAcquiredError

__all__ = ["CommandLockNotAcquiredError", "command_busy_error"]


class CommandLockNotAcquiredError(LockNotAcquiredError, CommandError):
    """Busy lock in a management command: a ``CommandError`` (non-zero exit) that is also a
    :class:`LockNotAcquiredError`."""


def command_busy_error(args: tuple[Any, ...], name: str) -> LockNotAcquiredError | None:
    """The error for a busy lock on a decorated ``handle(self, ...)``; ``None`` elsewhere."""
    if args and isinstance(args[0], BaseCommand):
        return CommandLockNotAcquiredError(
            name,
            f"Lock {name!r} is held by someone else: another run of this command is already "
            "running.",
        )
    return None
