"""Management-command integration: how lock outcomes end a command.

``distributed_lock`` knows nothing about management commands; it asks the adapters registered
with :func:`django_redislock.decorators.register_adapter`. :data:`command_adapter` (registered in
``AppConfig.ready``) makes a decorated ``handle`` behave as a command should: a busy lock or a
lock failure (Redis down, lock lost) ends it with one ``CommandError`` line and exit status 1,
never a traceback, and a run skipped with ``on_busy="skip"`` says why unless ``-v 0``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockError, LockNotAcquiredError

__all__ = ["CommandAdapter", "CommandLockNotAcquiredError", "command_adapter"]


class CommandLockNotAcquiredError(LockNotAcquiredError, CommandError):
    """Busy lock in a management command: a ``CommandError`` (non-zero exit) that is also a
    :class:`LockNotAcquiredError`."""


class CommandAdapter:
    """Lock outcomes of a decorated ``handle(self, *args, **options)`` of a ``BaseCommand``."""

    @staticmethod
    def _command(args: tuple[Any, ...]) -> BaseCommand | None:
        return args[0] if args and isinstance(args[0], BaseCommand) else None

    def busy_error(self, args: tuple[Any, ...], name: str) -> LockNotAcquiredError | None:
        if self._command(args) is None:
            return None
        return CommandLockNotAcquiredError(
            name,
            f"Lock {name!r} is held by someone else: another run of this command is already "
            "running.",
        )

    def skipped(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
        command = self._command(args)
        if command is None or int(kwargs.get("verbosity", 1)) < 1:
            return
        from django_redislock.operations import describe_holder, get_lock_info

        try:
            info = get_lock_info(name)
        except LockError:
            info = None
        holder = f" (held by {describe_holder(info)})" if info is not None else ""
        command.stdout.write(f"Skipped: lock {name!r} is busy{holder}.")

    def failed(self, args: tuple[Any, ...], exc: LockError) -> BaseException | None:
        command = self._command(args)
        if command is None or isinstance(exc, CommandError):
            return None
        describe = getattr(command, "lock_error_message", None)  # LockedCommand's wording
        return CommandError(describe(exc) if callable(describe) else str(exc), returncode=1)


command_adapter = CommandAdapter()
