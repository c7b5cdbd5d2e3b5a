"""``@distributed_lock``: run a function (or a management command) under a lock named from its
arguments."""

from __future__ import annotations

import functools
import inspect
import logging
import string
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockNotAcquiredError
from django_redislock.lock import Lock

__all__ = ["CommandLockNotAcquiredError", "compile_key", "distributed_lock"]

logger = logging.getLogger("django_redislock")

F = TypeVar("F", bound=Callable[..., Any])
KeySpec = str | Callable[..., str] | None
OnBusy = Literal["raise", "skip"] | Callable[..., Any]


class CommandLockNotAcquiredError(LockNotAcquiredError, CommandError):
    """Busy lock in a management command: a ``CommandError`` (non-zero exit) that is also a
    :class:`LockNotAcquiredError`."""


def template_fields(template: str) -> list[str]:
    """The root names a ``str.format`` template refers to (``"{options[x]}"`` -> ``options``)."""
    roots = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(
                f"Lock key template {template!r} uses a positional field {{{field}}}; name the "
                "parameter instead, e.g. '{invoice_id}'."
            )
        roots.append(root)
    return roots


def compile_key(
    key: KeySpec, func: Callable[..., Any], *, skip: tuple[str, ...] = ()
) -> Callable[..., str]:
    """Turn a key spec into ``name(*args, **kwargs) -> str`` for calls of ``func``.

    Templates are checked *now*: a field naming no parameter of ``func`` raises ``ValueError``
    at decoration time instead of at the first call in production. ``skip`` lists parameters that
    templates must not use (e.g. ``self`` of a bound Celery task).
    """
    if key is None:
        fixed = f"{func.__module__}.{func.__qualname__}"
        return lambda *args, **kwargs: fixed
    if callable(key):
        key_func = key

        def from_callable(*args: Any, **kwargs: Any) -> str:
            name = key_func(*args, **kwargs)
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"Lock key callable {key_func!r} returned {name!r}, not a non-empty str"
                )
            return name

        return from_callable
    if not isinstance(key, str) or not key:
        raise TypeError(f"Lock key must be a str template, a callable or None, not {key!r}")
    signature = inspect.signature(func)
    params = set(signature.parameters) - set(skip)
    unknown = [f for f in template_fields(key) if f not in params]
    if unknown:
        raise ValueError(
            f"Lock key template {key!r} names {', '.join(repr(u) for u in unknown)}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not parameters of "
            f"{func.__qualname__}{signature}."
        )

    def from_template(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return key.format(**bound.arguments)

    return from_template


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
            )
            lock.stats_name = stats_name
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
