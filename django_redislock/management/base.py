"""``LockedCommand``: a management command that never runs twice at once, on any machine.

Typical use is a cron job that several machines run, or one that may outlive its schedule::

    from django_redislock.management.base import LockedCommand

    class Command(LockedCommand):
        lock_key = "import:{options[source]}"    # default: "command:<command name>"

        def add_arguments(self, parser):
            parser.add_argument("source")

        def handle(self, *args, **options):
            ...

A second run while the first holds the lock exits with status 1 and "already running" on stderr,
or with status 0 and "Skipped: ... already running" on stdout when given ``--skip-if-locked`` (the
option every ``LockedCommand`` gets) or when the class sets ``lock_on_busy = "skip"``; ``-v 0``
silences that line. The lock is renewed by the watchdog while ``handle`` runs, and released when
it returns or raises.

A lock lost while ``handle`` ran (expired or force-released), Redis failing, or
``django_redislock`` missing from ``INSTALLED_APPS`` ends the command with one line on stderr and
exit status 1 — never a traceback: cron mails and CI logs then say what happened in words.

It is :func:`~django_redislock.distributed_lock` applied to ``handle`` when the class is created,
so a bad ``lock_key`` template fails at import time, not at 3 a.m.
"""

from __future__ import annotations

import dataclasses
import functools
from argparse import ArgumentParser
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock.conf import not_installed_problem
from django_redislock.decorators import distributed_lock
from django_redislock.exceptions import LockBackendError, LockError, LockLostError

if TYPE_CHECKING:
    from django_redislock.operations import LockInfo

__all__ = ["LockedCommand"]


class LockedCommand(BaseCommand):
    """Base class of management commands guarded by a distributed lock (see the module doc)."""

    #: ``str.format`` template over ``handle``'s parameters (usually ``{options[name]}``);
    #: ``None`` means ``"command:<command name>"``.
    lock_key: str | None = None
    #: Lease in seconds (renewed while ``handle`` runs); ``None`` = ``REDISLOCK["TIMEOUT"]``.
    lock_timeout: float | None = None
    #: Seconds to wait for a running instance to finish before giving up; 0 = do not wait.
    lock_wait: float = 0.0
    #: ``CACHES`` alias holding the lock; ``None`` = ``REDISLOCK["CACHE"]``.
    lock_using: str | None = None
    #: When another run holds the lock: ``"raise"`` exits with status 1 (unless the command is
    #: given ``--skip-if-locked``), ``"skip"`` always exits with status 0 saying why.
    lock_on_busy: Literal["raise", "skip"] = "raise"
    #: How many runs may go on at once across the fleet (1: a lock; more: a semaphore).
    lock_permits: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        handle = cls.__dict__.get("handle")
        if handle is None or getattr(handle, "_redislock_guarded", False):
            return
        key = cls.lock_key or f"command:{cls.command_name()}"
        guarded = distributed_lock(
            key,
            timeout=cls.lock_timeout,
            blocking=cls.lock_wait > 0,
            blocking_timeout=cls.lock_wait if cls.lock_wait > 0 else None,
            on_busy=cls._lock_busy,
            using=cls.lock_using,
            permits=cls.lock_permits if cls.lock_permits != 1 else None,
        )(handle)
        cls.handle = _lock_errors_as_command_errors(guarded)  # type: ignore[method-assign]

    def lock_error_message(self, exc: LockError) -> str:
        """The one line a lock failure is reported with (override to add advice of your own)."""
        from django_redislock.operations import backend_problem

        if isinstance(exc, LockBackendError):
            text = backend_problem(exc, using=self.lock_using).summary()
        elif isinstance(exc, LockLostError):
            text = f"{exc} Check the work this run did before trusting it."
        else:
            text = str(exc)
        return f"{self.command_name()}: {' '.join(text.split())}"

    @classmethod
    def command_name(cls) -> str:
        """The name ``manage.py`` knows this command by (its module's last component)."""
        return cls.__module__.rsplit(".", 1)[-1]

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        self._add_lock_arguments(parser)
        return parser

    @staticmethod
    def _add_lock_arguments(parser: ArgumentParser) -> None:
        parser.add_argument(
            "--skip-if-locked",
            action="store_true",
            help="Exit with status 0 instead of 1 when another run holds the lock.",
        )

    def _lock_busy(self, *args: Any, **options: Any) -> None:
        """Called by ``distributed_lock`` instead of ``handle`` when another run holds the lock."""
        from django_redislock.operations import describe_holder, get_lock_info

        name = type(self).handle.lock_name(self, *args, **options)  # type: ignore[attr-defined]
        info = get_lock_info(name, using=self.lock_using)
        holder = f" (held by {describe_holder(escaped(info))})" if info is not None else ""
        message = f"{self.command_name()} is already running: lock {name!r} is busy{holder}."
        if options.get("skip_if_locked") or self.lock_on_busy == "skip":
            if options.get("verbosity", 1) >= 1:
                self.stdout.write(f"Skipped: {message}")
            return None
        raise CommandError(message, returncode=1)


def escape(text: str) -> str:
    r"""``text`` as one unambiguous line: non-printable characters as ``repr`` escapes them
    (``\n``, ``\t``, ``\x07``, ``\u2028`` ...), a backslash as ``\\``; no quotes added.

    Why not ``repr(text)[1:-1]``: it would also escape quotes, depending on which quote ``repr``
    chose, and leave a reader guessing which one it was.
    """
    if text.isprintable() and "\\" not in text:
        return text  # the common case, in one pass
    return "".join(
        "\\\\" if ch == "\\" else ch if ch.isprintable() else repr(ch)[1:-1] for ch in text
    )


def escaped(info: LockInfo) -> LockInfo:
    """``info`` with its free-text fields escaped for a line of text (see :func:`escape`)."""
    return dataclasses.replace(
        info,
        name=escape(info.name),
        owner=escape(info.owner),
        host=escape(info.host),
        thread=escape(info.thread),
        task_id=None if info.task_id is None else escape(info.task_id),
    )


def _lock_errors_as_command_errors(handle: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a :class:`LockError` escaping ``handle`` into a one-line ``CommandError`` (exit 1).

    ``manage.py`` prints a ``CommandError`` as one line on stderr; any other exception would be
    a traceback, which hides the one fact that matters (lost lock, Redis down) in a cron mail.
    """

    @functools.wraps(handle)
    def run(self: LockedCommand, *args: Any, **options: Any) -> Any:
        missing = not_installed_problem()
        if missing is not None:  # one line, not the traceback of the first lock call
            raise CommandError(f"{self.command_name()}: {missing}", returncode=1)
        try:
            return handle(self, *args, **options)
        except CommandError:
            raise
        except LockError as exc:
            raise CommandError(self.lock_error_message(exc), returncode=1) from exc

    run._redislock_guarded = True  # type: ignore[attr-defined]
    return run
