"""``@distributed_lock``: run a function (or a management command) under a lock named from its
arguments."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockNotAcquiredError
from django_redislock.lock import Lock
from django_redislock.naming import KeySpec, compile_key

__all__ = ["CommandLockNotAcquiredError", "distributed_lock"]

logger = logging.getLogger("django_redislock")

F = TypeVar("F", bound=Callable[..., Any])
OnBusy = Literal["raise", "skip"] | Callable[..., Any]


class CommandLockNotAcquiredError(LockNotAcquiredError, CommandError):
    """Busy lock in a management command: a ``CommandError`` (non-zero exit) that is also a
    :class:`LockNotAcquiredError`."""


def _busy_handler(on_busy: OnBusy) -> Callable[..., Any] | None:
    if on_busy in ("raise", "skip"):
        return None
    if not callable(on_busy):
        raise ValueError(f"on_busy must be 'raise', 'skip' or a callable, not {on_busy!r}")
    try:
        takes_nothing = not inspect.signature(on_busy).parameters
    except (TypeError, ValueError):
        takes_nothing = False
    if takes_nothing:
        return lambda *args, **kwargs: on_busy()
    return on_busy


def distributed_lock(
    key: KeySpec = None,
    *,
    timeout: float | None = None,
    blocking: bool = True,
    blocking_timeout: float | None = None,
    on_busy: OnBusy = "raise",
    using: str | None = None,
) -> Callable[[F], F]:
    """Run the decorated function only while holding the lock named by ``key``.

    ``key`` is a ``str.format`` template over the function's bound arguments (defaults applied),
    a callable taking the same arguments, or ``None`` for ``module.qualname``. When the lock is
    busy: ``on_busy="raise"`` raises :class:`LockNotAcquiredError` (a ``CommandError`` inside a
    management command's ``handle``), ``"skip"`` returns ``None`` without calling the function,
    and a callable's return value is returned instead (it receives the same arguments, unless it
    takes none).
    """
    handler = _busy_handler(on_busy)

    def decorate(func: F) -> F:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"distributed_lock does not support coroutine functions ({func!r}).")
        name_of = compile_key(key, func)
        if isinstance(key, str):
            stats_name = key
        elif key is None:
            stats_name = f"{func.__module__}.{func.__qualname__}"
        else:
            key_name = getattr(key, "__qualname__", repr(key))
            stats_name = f"{func.__module__}.{func.__qualname__}[{key_name}]"

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = Lock(
                name_of(*args, **kwargs),
                timeout=timeout,
                blocking=blocking,
                blocking_timeout=blocking_timeout,
                using=using,
                stats_name=stats_name,
            )
            if not lock.acquire():
                if on_busy == "skip":
                    logger.info(
                        "django_redislock: %s skipped, lock %r is busy",
                        func.__qualname__,
                        lock.name,
                    )
                    return None
                if handler is not None:
                    return handler(*args, **kwargs)
                if args and isinstance(args[0], BaseCommand):
                    raise CommandLockNotAcquiredError(
                        lock.name,
                        f"Lock {lock.name!r} is held by someone else: another run "
                        "of this command is already running.",
                    )
                raise LockNotAcquiredError(lock.name)
            with _Held(lock):
                return func(*args, **kwargs)

        wrapper.lock_name = name_of  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


class _Held:
    """Context manager for an already acquired lock: ``Lock.__exit__`` semantics on exit."""

    def __init__(self, lock: Lock) -> None:
        self.lock = lock

    def __enter__(self) -> Lock:
        return self.lock

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.__exit__(*exc_info)
