"""``@distributed_lock``: run a function under a lock named from its arguments.

The key template is compiled and every option validated when the function is decorated, so a
typo or a hostile value fails at import time, not at the first call in production.

Generator and async generator functions (issue 27) hold the lock while their body runs, not
while the call that merely creates the generator runs (which would protect nothing):

- the lock is taken at the first ``next()`` / ``anext()`` — when the body starts — and released
  when the generator is exhausted, closed (``close()`` / ``aclose()``), raises, or is garbage
  collected (Python closes a collected generator; asyncio closes a collected async generator in
  a task of its own, and ``asyncio.run`` closes the ones left at its end). A generator kept
  referenced and never finished keeps its lock, renewed, like a function that never returns;
- async generators use :class:`~django_redislock.AsyncLock` (waiting does not block the loop);
- the lock's owner is fixed at the first ``next()``: the (process, thread) — or (process, task)
  — that started the body. Whoever finishes the generator (a streaming response iterated from
  another thread, the collector, asyncio's finalizer task) then releases the same hold. As for
  plain calls, re-entrancy is per that owner: the body may call other functions locked on the
  same key without deadlocking, and two generators on one key interleaved by one thread (or
  task) both run — exclusion is between threads, tasks and processes;
- ``on_busy="raise"`` raises at the first ``next()``; ``"skip"`` ends the generator at once
  (nothing yielded); a callable's return value is what the generator yields instead of the
  body's items: an iterable (another generator function makes a fallback stream), for async
  generators also an async iterable or an awaitable of one, or ``None`` for nothing. A ``str`` or
  ``bytes`` is refused (``TypeError``): a stream of single characters is never what was meant.

Refusing generators at decoration was the alternative; holding is what people decorating a
streaming export or a batch iterator mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Generator, Iterable, Iterator
from typing import Any, Literal, Protocol, TypeVar, cast

from django_redislock import stats
from django_redislock.aio import AsyncLock
from django_redislock.conf import MIN_LEASE, check_seconds
from django_redislock.exceptions import LockError, LockNotAcquiredError
from django_redislock.lock import Lock
from django_redislock.naming import KeySpec, compile_key
from django_redislock.runtime import runtime
from django_redislock.semaphore import AsyncSemaphore, Semaphore, check_permits
from django_redislock.validation import check_bool

__all__ = ["CallAdapter", "distributed_lock", "register_adapter"]

logger = logging.getLogger("django_redislock")

F = TypeVar("F", bound=Callable[..., Any])
OnBusy = Literal["raise", "skip"] | Callable[..., Any]


class CallAdapter(Protocol):
    """How an integration (management commands) wants a decorated call's lock outcomes shown.

    Each method returns ``None`` (or does nothing) for calls that are not its kind, so adapters
    are asked in turn and the decorator itself knows no integration.
    """

    def busy_error(self, args: tuple[Any, ...], name: str) -> LockNotAcquiredError | None: ...

    def skipped(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None: ...

    def failed(self, args: tuple[Any, ...], exc: LockError) -> BaseException | None: ...


_adapters: list[CallAdapter] = []


def register_adapter(adapter: CallAdapter) -> None:
    """Let an integration shape busy errors, skip notices and lock failures (idempotent)."""
    if adapter not in _adapters:
        _adapters.append(adapter)


def _busy_error(args: tuple[Any, ...], name: str) -> LockNotAcquiredError:
    for adapter in _adapters:
        error = adapter.busy_error(args, name)
        if error is not None:
            return error
    return LockNotAcquiredError(name)


def _skipped(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
    for adapter in _adapters:
        adapter.skipped(args, kwargs, name)


@contextlib.contextmanager
def _adapted_errors(args: tuple[Any, ...]) -> Iterator[None]:
    """A :class:`LockError` of a decorated call, as the adapters want it shown."""
    try:
        yield
    except LockError as exc:
        for adapter in _adapters:
            error = adapter.failed(args, exc)
            if error is not None and error is not exc:
                raise error from exc
        raise


def _busy_handler(on_busy: OnBusy) -> Callable[..., Any] | None:
    if isinstance(on_busy, str):
        if on_busy in ("raise", "skip"):
            return None
        raise ValueError(f"on_busy must be 'raise', 'skip' or a callable, not {on_busy!r}")
    if not callable(on_busy):
        raise TypeError(f"on_busy must be 'raise', 'skip' or a callable, not {on_busy!r}")
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
    on_commit: bool | str = False,
    permits: int | None = None,
) -> Callable[[F], F]:
    """Run the decorated function only while holding the lock named by ``key``.

    ``key`` is a ``str.format`` template over the function's bound arguments (defaults applied),
    a callable taking the same arguments, or ``None`` for ``module.qualname``. When the lock is
    busy: ``on_busy="raise"`` raises :class:`LockNotAcquiredError` (a ``CommandError`` inside a
    management command's ``handle``), ``"skip"`` returns ``None`` without calling the function,
    and a callable's return value is returned instead (it receives the same arguments, unless it
    takes none).

    On an ``async def`` function the lock is an :class:`~django_redislock.AsyncLock` (same
    templates, ``on_busy`` — which may then be a coroutine function — and waiting rules).

    ``permits=N`` runs at most N calls per key at once (a :class:`~django_redislock.Semaphore`,
    one permit per call) instead of one.

    Waiting: with ``on_busy="raise"`` a busy lock is waited for (``blocking_timeout``, else
    ``REDISLOCK["BLOCKING_TIMEOUT"]``). With ``"skip"`` or a callable — "skip if already running"
    — the decorator does not wait unless ``blocking_timeout`` is given.

    Statistics: a busy lock with ``on_busy="raise"`` is a failed acquisition; a skip, or an
    ``on_busy`` callable that returns, is ``skipped`` (working as intended: not an attempt, so
    not in the success rate); an ``on_busy`` callable that raises is a failed acquisition.

    Generator and async generator functions hold the lock from their first ``next()`` until
    they are exhausted, closed, raise or are collected; when busy, ``"skip"`` yields nothing
    and a callable's return value (an iterable, or ``None``) is yielded instead of the body's
    items. The module docstring has the details and the reasons.
    """
    handler = _busy_handler(on_busy)
    check_seconds(timeout, "timeout", minimum=MIN_LEASE, allow_none=True)
    check_seconds(blocking_timeout, "blocking_timeout", allow_none=True)
    check_bool(blocking, "blocking")
    if on_busy != "raise" and blocking_timeout is None:
        blocking = False
    options: dict[str, Any] = {
        "timeout": timeout,
        "blocking": blocking,
        "blocking_timeout": blocking_timeout,
        "using": using,
        "on_commit": on_commit,
        # Only "raise" makes a busy lock a failure; the other reactions are counted below.
        "report_busy": on_busy == "raise",
    }
    Lock("options-check", **options)  # validates using/on_commit now, without touching Redis
    if permits is not None:
        check_permits(permits)
        if on_commit:
            raise ValueError("on_commit is for locks: a semaphore permit is released at once")
        del options["on_commit"]
        sync_kind: Any = functools.partial(Semaphore, permits=permits)
        async_kind: Any = functools.partial(AsyncSemaphore, permits=permits)
    else:
        sync_kind, async_kind = Lock, AsyncLock

    def decorate(func: F) -> F:
        name_of = compile_key(key, func)
        if isinstance(key, str):
            stats_name = key
        elif key is None:
            stats_name = f"{func.__module__}.{func.__qualname__}"
        else:
            key_name = getattr(key, "__qualname__", repr(key))
            stats_name = f"{func.__module__}.{func.__qualname__}[{key_name}]"

        def busy(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
            if on_busy == "skip":
                logger.info(
                    "django_redislock: %s skipped, lock %r is busy", func.__qualname__, name
                )
                _skipped(args, kwargs, name)
                stats.record(using, stats_name, "skipped")
                return None
            if handler is None:
                raise _busy_error(args, name)  # counted as failed by the lock itself
            try:
                result = handler(*args, **kwargs)
            except Exception:
                stats.record(using, stats_name, "failed")
                raise
            if not inspect.isawaitable(result):
                stats.record(using, stats_name, "skipped")
            return result

        async def abusy(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
            result = busy(args, kwargs, name)
            if not inspect.isawaitable(result):
                return result
            try:
                result = await result
            except Exception:
                stats.record(using, stats_name, "failed")
                raise
            stats.record(using, stats_name, "skipped")
            return result

        if inspect.isasyncgenfunction(func):

            @functools.wraps(func)
            async def async_generator_wrapper(
                *args: Any, **kwargs: Any
            ) -> AsyncGenerator[Any, Any]:
                # Runs at the first anext(): the body's start. The owner is this task, fixed
                # now, because asyncio closes a collected generator in a task of its own.
                lock = async_kind(
                    name_of(*args, **kwargs),
                    stats_name=stats_name,
                    owner=runtime.task_owner(asyncio.current_task()),
                    **options,
                )
                with _adapted_errors(args):
                    held = await lock.acquire()
                    if held:
                        context: contextlib.AbstractAsyncContextManager[Any] = _Held(lock)
                    else:
                        items = _async_items(await abusy(args, kwargs, lock.name), func)
                        context = contextlib.nullcontext()
                    async with context:
                        if held:  # inside the hold: a call that raises still releases
                            items = func(*args, **kwargs)
                        # `yield from` for async generators: values, asend, athrow and aclose
                        # reach the body, which is closed however this generator ends.
                        try:
                            item = await items.__anext__()
                            while True:
                                try:
                                    sent = yield item
                                except GeneratorExit:
                                    raise
                                except BaseException as exc:
                                    item = await items.athrow(exc)
                                else:
                                    item = await items.asend(sent)
                        except StopAsyncIteration:
                            return
                        finally:
                            await items.aclose()

            async_generator_wrapper.lock_name = name_of  # type: ignore[attr-defined]
            return cast(F, async_generator_wrapper)

        if inspect.isgeneratorfunction(func):
            if inspect.iscoroutinefunction(on_busy) or inspect.isasyncgenfunction(on_busy):
                raise TypeError(
                    f"on_busy={on_busy!r} is asynchronous, but {func.__qualname__} is a "
                    "(synchronous) generator function: give a function returning the items to "
                    "yield instead, or None."
                )

            @functools.wraps(func)
            def generator_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
                # Runs at the first next(): the body's start. The owner is this thread, fixed
                # now, so that whoever finishes the generator (another thread, the collector)
                # releases this hold.
                lock = sync_kind(
                    name_of(*args, **kwargs),
                    stats_name=stats_name,
                    owner=runtime.thread_owner(),
                    **options,
                )
                with _adapted_errors(args):
                    if not lock.acquire():
                        return (yield from _items(busy(args, kwargs, lock.name), func))
                    with _Held(lock):
                        return (yield from func(*args, **kwargs))

            generator_wrapper.lock_name = name_of  # type: ignore[attr-defined]
            return cast(F, generator_wrapper)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                lock = async_kind(name_of(*args, **kwargs), stats_name=stats_name, **options)
                with _adapted_errors(args):
                    if not await lock.acquire():
                        return await abusy(args, kwargs, lock.name)
                    async with _Held(lock):
                        return await func(*args, **kwargs)

            async_wrapper.lock_name = name_of  # type: ignore[attr-defined]
            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = sync_kind(name_of(*args, **kwargs), stats_name=stats_name, **options)
            with _adapted_errors(args):
                if not lock.acquire():
                    return busy(args, kwargs, lock.name)
                with _Held(lock):
                    return func(*args, **kwargs)

        wrapper.lock_name = name_of  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


def _check_items(result: object, func: Callable[..., Any]) -> None:
    if isinstance(result, (str, bytes, bytearray)):
        raise TypeError(
            f"on_busy of generator function {func.__qualname__} returned {result!r}: return an "
            "iterable of the items to yield instead (e.g. a list), or None for none."
        )


def _items(result: object, func: Callable[..., Any]) -> Iterator[Any]:
    """What a busy generator yields: ``on_busy``'s return value (``None``: nothing)."""
    if result is None:
        return iter(())
    _check_items(result, func)
    try:
        return iter(result)  # type: ignore[call-overload,no-any-return]
    except TypeError:
        raise TypeError(
            f"on_busy of generator function {func.__qualname__} returned {result!r}, which is "
            "not iterable: return the items to yield instead, or None for none."
        ) from None


def _async_items(result: object, func: Callable[..., Any]) -> AsyncGenerator[Any, Any]:
    """What a busy async generator yields: ``on_busy``'s (awaited) return value as an async
    generator — itself when it is one, so ``asend``/``athrow`` reach it."""
    if inspect.isasyncgen(result):
        return result
    if isinstance(result, AsyncIterable):
        return _relay_async(result)
    return _relay(_items(result, func))


async def _relay_async(items: AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
    async for item in items:
        yield item


async def _relay(items: Iterable[Any]) -> AsyncGenerator[Any, None]:
    for item in items:
        yield item


class _Held:
    """Context manager for an already acquired lock: the face's exit semantics (release, or
    ``LockLostError`` when the lock was lost while the function ran)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __enter__(self) -> Any:
        return self.lock

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.__exit__(*exc_info)

    async def __aenter__(self) -> Any:
        return self.lock

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.lock.__aexit__(*exc_info)
