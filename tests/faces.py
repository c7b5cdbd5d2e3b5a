"""Run the ``Lock`` contract tests against ``AsyncLock`` too, without copying them.

:class:`AsyncFace` is a blocking wrapper around an ``AsyncLock``. Every call a test thread makes
through it runs inside ONE long-lived asyncio task of an event loop dedicated to that thread, so
"another thread" in a test is "another task" for the async lock — exactly the owner semantics
the contract describes (the same task nests, another task waits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from django_redislock import AsyncLock

__all__ = ["AsyncFace", "stop_runners"]


class _Runner:
    """An event loop in its own thread with one task executing what one test thread sends."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.queue: asyncio.Queue[Any] = asyncio.run_coroutine_threadsafe(
            self._make_queue(), self.loop
        ).result(10)
        self.task = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)

    async def _make_queue(self) -> asyncio.Queue[Any]:
        return asyncio.Queue()

    async def _serve(self) -> None:
        while True:
            work, future = await self.queue.get()
            if work is None:
                return
            try:
                future.set_result(await work())
            except BaseException as exc:  # handed to the test thread
                future.set_exception(exc)

    def run(self, work: Callable[[], Awaitable[Any]]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (work, future))
        return future.result(120)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (None, None))
        self.task.result(10)
        asyncio.run_coroutine_threadsafe(self.loop.shutdown_asyncgens(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


_local = threading.local()
_runners: list[_Runner] = []
_runners_mutex = threading.Lock()


def _runner() -> _Runner:
    runner = getattr(_local, "runner", None)
    if runner is None:
        runner = _local.runner = _Runner()
        with _runners_mutex:
            _runners.append(runner)
    return runner


def stop_runners() -> None:
    with _runners_mutex:
        runners = list(_runners)
        _runners.clear()
    for runner in runners:
        runner.stop()


async def _value(read: Callable[[], Any]) -> Any:
    return read()


class AsyncFace:
    """``Lock``'s blocking interface, implemented by an ``AsyncLock`` (see the module doc)."""

    def __init__(self, name: Any, *, make: Callable[..., Any] = AsyncLock, **options: Any) -> None:
        """``make(name, **options)`` builds the asyncio object (an ``AsyncLock`` by default)."""
        self._lock = make(name, **options)

    def _run(self, work: Callable[[], Awaitable[Any]]) -> Any:
        return _runner().run(work)

    def _read(self, attribute: str) -> Any:
        return self._run(lambda: _value(lambda: getattr(self._lock, attribute)))

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def owner(self) -> str:
        return self._read("owner")

    @property
    def hold_count(self) -> int:
        return self._read("hold_count")

    @property
    def fencing_token(self) -> int | None:
        return self._read("fencing_token")

    @property
    def lost(self) -> bool:
        return self._read("lost")

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return self._run(lambda: self._lock.acquire(*args, **kwargs))

    def release(self, **kwargs: Any) -> None:
        self._run(lambda: self._lock.release(**kwargs))

    def renew(self) -> None:
        self._run(self._lock.renew)

    def extend(self, additional_time: float) -> None:
        self._run(lambda: self._lock.extend(additional_time))

    def locked(self) -> bool:
        return self._run(self._lock.locked)

    def owned(self) -> bool:
        return self._run(self._lock.owned)

    def detach(self) -> tuple[int, int | None]:
        return self._run(lambda: _value(self._lock.detach))

    def __enter__(self) -> AsyncFace:
        self._run(self._lock.__aenter__)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._run(lambda: self._lock.__aexit__(*exc_info))
