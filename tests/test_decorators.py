"""``@distributed_lock`` on functions, methods and management commands."""

from __future__ import annotations

import asyncio
import gc
import inspect
import io
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_redislock import (
    AsyncLock,
    Lock,
    LockNotAcquiredError,
    distributed_lock,
    get_lock_info,
)


def test_template_over_arguments_with_defaults():
    seen = []

    @distributed_lock("invoice:{invoice_id}:{mode}", timeout=5)
    def pay(invoice_id, mode="full"):
        seen.append(get_lock_info(f"invoice:{invoice_id}:{mode}"))
        return invoice_id

    assert pay(7) == 7
    assert seen[0] is not None and seen[0].name == "invoice:7:full"
    assert get_lock_info("invoice:7:full") is None


def test_template_with_item_and_attribute_access():
    names = []

    class Account:
        pk = 3

    @distributed_lock("import:{options[source]}:{account.pk}", timeout=5)
    def run(account, **options):
        names.append([i.name for i in __import__("django_redislock").list_locks()])

    run(Account(), source="crm")
    assert names == [["import:crm:3"]]


def test_unknown_template_field_fails_at_decoration_time():
    with pytest.raises(ValueError, match="invoice"):

        @distributed_lock("invoice:{invoice}")
        def pay(invoice_id):
            pass


def test_positional_template_field_fails_at_decoration_time():
    with pytest.raises(ValueError):

        @distributed_lock("x:{0}")
        def f(a):
            pass


def test_callable_key_gets_the_same_arguments():
    @distributed_lock(lambda user, **kw: f"user:{user}", timeout=5)
    def work(user, flag=False):
        return get_lock_info(f"user:{user}") is not None

    assert work("bob", flag=True) is True


def test_default_key_is_module_and_qualname():
    @distributed_lock(timeout=5)
    def job():
        return [i.name for i in __import__("django_redislock").list_locks()]

    assert job() == [f"{__name__}.test_default_key_is_module_and_qualname.<locals>.job"]


def _hold_in_thread(name: str, ready: threading.Event, done: threading.Event) -> threading.Thread:
    def hold() -> None:
        with Lock(name, timeout=10):
            ready.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    ready.wait(5)
    return t


@pytest.fixture
def busy():
    """Make a lock busy from another thread for the duration of a test."""
    holders = []

    def make(name: str) -> None:
        ready, done = threading.Event(), threading.Event()
        holders.append((done, _hold_in_thread(name, ready, done)))

    yield make
    for done, t in holders:
        done.set()
        t.join(5)


def test_on_busy_raise(busy):
    busy("r")

    @distributed_lock("r", blocking=False)
    def f():
        return 1

    with pytest.raises(LockNotAcquiredError):
        f()


def test_on_busy_skip_returns_none_and_logs(busy, caplog):
    busy("s")
    calls = []

    @distributed_lock("s", blocking_timeout=0.1, on_busy="skip")
    def f():
        calls.append(1)

    with caplog.at_level(logging.INFO, logger="django_redislock"):
        assert f() is None
    assert calls == []
    assert "skipped" in caplog.text


@pytest.mark.parametrize("on_busy", ["skip", lambda: "busy"])
def test_skip_does_not_wait_unless_told_to(busy, on_busy):
    """`@distributed_lock("job", on_busy="skip")` means "skip if already running": no wait."""
    busy("skip-now")
    calls = []

    @distributed_lock("skip-now", on_busy=on_busy)
    def f():
        calls.append(1)

    started = time.monotonic()
    f()
    assert time.monotonic() - started < 0.5 and calls == []


def test_skip_waits_when_given_a_blocking_timeout(busy):
    busy("skip-later")

    @distributed_lock("skip-later", on_busy="skip", blocking_timeout=0.4)
    def f():
        return 1

    started = time.monotonic()
    assert f() is None
    assert 0.35 < time.monotonic() - started < 2.0


def test_raise_still_waits_by_default(settings, busy):
    settings.REDISLOCK = {"BLOCKING_TIMEOUT": 0.3}
    busy("raise-waits")

    @distributed_lock("raise-waits")
    def f():
        return 1

    started = time.monotonic()
    with pytest.raises(LockNotAcquiredError):
        f()
    assert time.monotonic() - started >= 0.25


def test_on_busy_callable_result_is_returned(busy):
    busy("c:5")

    @distributed_lock("c:{n}", blocking=False, on_busy=lambda n: f"busy {n}")
    def f(n):
        return "ran"

    assert f(5) == "busy 5"

    @distributed_lock("c:{n}", blocking=False, on_busy=lambda: "busy")
    def g(n):
        return "ran"

    assert g(5) == "busy"


def test_methods_use_self_in_templates():
    class Sync:
        def __init__(self, pk):
            self.pk = pk

        @distributed_lock("sync:{self.pk}", timeout=5)
        def run(self):
            return get_lock_info(f"sync:{self.pk}") is not None

    assert Sync(9).run() is True


def test_management_command_busy_is_a_command_error(busy):
    busy("cmd:nightly")

    class Command(BaseCommand):
        @distributed_lock("cmd:{options[job]}", blocking=False)
        def handle(self, *args, **options):
            return "ran"

    with pytest.raises(CommandError, match="already running"):
        Command().handle(job="nightly")
    with pytest.raises(LockNotAcquiredError):
        Command().handle(job="nightly")


def test_lock_is_released_when_the_function_raises():
    @distributed_lock("boom", timeout=5)
    def f():
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        f()
    assert not Lock("boom").locked()


# -- on a management command's handle: the command adapter -----------------------------------


class _Guarded(BaseCommand):
    @distributed_lock("adapter-skip", on_busy="skip")
    def handle(self, *args, **options):
        self.stdout.write("ran")


class _Lost(BaseCommand):
    @distributed_lock("adapter-lost", timeout=0.3)
    def handle(self, *args, **options):
        from django_redislock import force_release

        force_release("adapter-lost")


def test_a_skipped_command_says_why_unless_verbosity_0(busy):
    busy("adapter-skip")
    out = io.StringIO()
    call_command(_Guarded(), stdout=out)
    assert "Skipped: lock 'adapter-skip' is busy (held by" in out.getvalue()
    quiet = io.StringIO()
    call_command(_Guarded(), stdout=quiet, verbosity=0)
    assert quiet.getvalue() == ""


def test_a_lock_lost_in_a_command_is_a_command_error():
    with pytest.raises(CommandError, match="was lost") as raised:
        call_command(_Lost())
    assert raised.value.returncode == 1


# -- generators and async generators: the lock is held while the body runs -------------------


def _acquire_in_another_thread(name: str) -> bool:
    """Whether another thread (another owner) can take ``name`` now; released at once."""
    result: list[bool] = []

    def attempt() -> None:
        lock = Lock(name, timeout=5, blocking=False)
        result.append(lock.acquire())
        if result[0]:
            lock.release()

    t = threading.Thread(target=attempt)
    t.start()
    t.join(10)
    return result[0]


def test_a_generator_holds_the_lock_from_its_first_next_until_it_is_exhausted():
    seen = []

    @distributed_lock("gen:{n}", timeout=5)
    def count(n: int) -> Iterator[int]:
        for i in range(n):
            seen.append(Lock(f"gen:{n}").locked())
            yield i

    gen = count(2)
    assert not Lock("gen:2").locked()  # created, not started: nothing taken yet
    assert next(gen) == 0
    assert Lock("gen:2").locked()
    assert _acquire_in_another_thread("gen:2") is False
    assert list(gen) == [1]
    assert seen == [True, True]
    assert not Lock("gen:2").locked()
    assert inspect.isgeneratorfunction(count)


def test_a_generator_passes_send_and_its_return_value_through():
    @distributed_lock("gen-send", timeout=5)
    def echo() -> Generator[str, str, str]:
        got = yield "ready"
        return f"got {got}"

    gen = echo()
    assert next(gen) == "ready"
    assert Lock("gen-send").locked()
    with pytest.raises(StopIteration) as stopped:
        gen.send("x")
    assert stopped.value.value == "got x"
    assert not Lock("gen-send").locked()


def test_a_generator_releases_on_close_and_on_an_exception():
    @distributed_lock("gen-close", timeout=5)
    def rows() -> Generator[int, None, None]:
        yield 1
        yield 2

    gen = rows()
    next(gen)
    assert Lock("gen-close").locked()
    gen.close()
    assert not Lock("gen-close").locked()

    gen = rows()
    next(gen)
    assert Lock("gen-close").locked()
    with pytest.raises(KeyError):
        gen.throw(KeyError("from the consumer"))
    assert not Lock("gen-close").locked()

    @distributed_lock("gen-raises", timeout=5)
    def broken() -> Iterator[int]:
        yield 1
        raise RuntimeError("from the body")

    raising = broken()
    next(raising)
    assert Lock("gen-raises").locked()
    with pytest.raises(RuntimeError):
        next(raising)
    assert not Lock("gen-raises").locked()


def test_an_abandoned_generator_releases_when_collected():
    @distributed_lock("gen-gc", timeout=5)
    def rows() -> Iterator[int]:
        yield 1
        yield 2

    gen = rows()
    next(gen)
    assert Lock("gen-gc").locked()
    del gen
    gc.collect()
    assert not Lock("gen-gc").locked()


def test_a_generator_closed_by_another_thread_still_releases():
    """The owner is fixed at the first next(): a consumer thread may finish what another began
    (a streaming response, a finalizer on another thread)."""

    @distributed_lock("gen-thread", timeout=5)
    def rows() -> Iterator[int]:
        yield 1
        yield 2

    gen = rows()
    next(gen)
    assert _acquire_in_another_thread("gen-thread") is False
    errors: list[BaseException] = []

    def finish() -> None:
        try:
            assert list(gen) == [2]
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    t = threading.Thread(target=finish)
    t.start()
    t.join(10)
    assert errors == []
    assert not Lock("gen-thread").locked()


def test_a_busy_generator_raises_at_its_first_next(busy):
    busy("gen-busy")

    @distributed_lock("gen-busy", blocking=False)
    def rows() -> Iterator[int]:
        yield 1

    gen = rows()
    with pytest.raises(LockNotAcquiredError):
        next(gen)


def test_a_busy_generator_with_skip_yields_nothing(busy, caplog):
    busy("gen-skip")
    ran = []

    @distributed_lock("gen-skip", on_busy="skip")
    def rows() -> Iterator[int]:
        ran.append(1)
        yield 1

    with caplog.at_level(logging.INFO, logger="django_redislock"):
        assert list(rows()) == []
    assert ran == [] and "skipped" in caplog.text


def test_a_busy_generator_yields_what_its_on_busy_callable_returns(busy):
    busy("gen-fallback:3")

    def fallback(n: int) -> Iterator[str]:
        yield f"busy {n}"

    @distributed_lock("gen-fallback:{n}", on_busy=fallback)
    def rows(n: int) -> Iterator[str]:
        yield "ran"

    assert list(rows(3)) == ["busy 3"]

    @distributed_lock("gen-fallback:{n}", on_busy=lambda: None)
    def quiet(n: int) -> Iterator[str]:
        yield "ran"

    assert list(quiet(3)) == []

    @distributed_lock("gen-fallback:{n}", on_busy=lambda: "busy")
    def text(n: int) -> Iterator[str]:
        yield "ran"

    with pytest.raises(TypeError, match="iterable"):
        list(text(3))


def test_an_async_generator_holds_an_async_lock_while_it_runs():
    seen = []

    @distributed_lock("agen:{n}", timeout=5)
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            seen.append(await AsyncLock(f"agen:{n}").locked())
            yield i

    async def main() -> None:
        agen = count(2)
        assert not await AsyncLock("agen:2").locked()
        assert await agen.__anext__() == 0

        async def other() -> bool:
            return await AsyncLock("agen:2").acquire(blocking=False)

        assert await asyncio.create_task(other()) is False  # another task: another owner
        assert [i async for i in agen] == [1]
        assert not await AsyncLock("agen:2").locked()

    asyncio.run(main())
    assert seen == [True, True]
    assert inspect.isasyncgenfunction(count)


def test_an_async_generator_waits_without_blocking_its_event_loop():
    """An AsyncLock, not the sync path: other tasks run while the generator waits."""
    ready, done = threading.Event(), threading.Event()
    holder = _hold_in_thread("agen-wait", ready, done)
    threading.Timer(0.3, done.set).start()

    @distributed_lock("agen-wait", timeout=5, blocking_timeout=5)
    async def rows() -> AsyncIterator[int]:
        yield 1

    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        assert [i async for i in rows()] == [1]
        ticker.cancel()
        return ticks

    try:
        assert asyncio.run(main()) >= 10
    finally:
        done.set()
        holder.join(5)


def test_an_async_generator_passes_asend_and_athrow_through():
    @distributed_lock("agen-send", timeout=5)
    async def echo() -> AsyncGenerator[str, str]:
        try:
            got = yield "ready"
            yield f"got {got}"
        except KeyError:
            yield "handled"

    async def main() -> None:
        agen = echo()
        assert await agen.__anext__() == "ready"
        assert await AsyncLock("agen-send").locked()
        assert await agen.asend("x") == "got x"
        assert await agen.athrow(KeyError("k")) == "handled"
        with pytest.raises(StopAsyncIteration):
            await agen.__anext__()
        assert not await AsyncLock("agen-send").locked()

    asyncio.run(main())


def test_an_async_generator_releases_on_aclose_and_on_an_exception():
    @distributed_lock("agen-close", timeout=5)
    async def rows() -> AsyncGenerator[int, None]:
        yield 1
        raise RuntimeError("from the body")

    async def main() -> None:
        agen = rows()
        await agen.__anext__()
        assert await AsyncLock("agen-close").locked()
        await agen.aclose()
        assert not await AsyncLock("agen-close").locked()

        agen = rows()
        await agen.__anext__()
        with pytest.raises(RuntimeError):
            await agen.__anext__()
        assert not await AsyncLock("agen-close").locked()

    asyncio.run(main())


def test_an_abandoned_async_generator_releases_when_collected():
    """asyncio closes a collected async generator in a task of its own: another owner than
    the task that took the lock, so the owner must be fixed at the first anext()."""

    @distributed_lock("agen-gc", timeout=5)
    async def rows() -> AsyncIterator[int]:
        yield 1
        yield 2

    async def main() -> None:
        agen = rows()
        await agen.__anext__()
        assert await AsyncLock("agen-gc").locked()
        del agen
        gc.collect()
        for _ in range(200):
            if not await AsyncLock("agen-gc").locked():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the collected async generator kept its lock")

    asyncio.run(main())


def test_a_busy_async_generator_skips_raises_or_yields_the_fallback(busy):
    busy("agen-busy")

    @distributed_lock("agen-busy", on_busy="skip")
    async def skipped() -> AsyncIterator[int]:
        yield 1

    @distributed_lock("agen-busy", blocking=False)
    async def raised() -> AsyncIterator[int]:
        yield 1

    async def fallback_items() -> AsyncIterator[str]:
        yield "busy"

    @distributed_lock("agen-busy", on_busy=fallback_items)
    async def from_async_generator() -> AsyncIterator[str]:
        yield "ran"

    async def fallback_list() -> list[str]:
        return ["busy", "later"]

    @distributed_lock("agen-busy", on_busy=fallback_list)
    async def from_coroutine() -> AsyncIterator[str]:
        yield "ran"

    async def main() -> None:
        assert [i async for i in skipped()] == []
        with pytest.raises(LockNotAcquiredError):
            await raised().__anext__()
        assert [i async for i in from_async_generator()] == ["busy"]
        assert [i async for i in from_coroutine()] == ["busy", "later"]

    asyncio.run(main())


def test_an_async_generator_left_unfinished_is_released_when_asyncio_run_ends():
    @distributed_lock("agen-run", timeout=5)
    async def rows() -> AsyncIterator[int]:
        yield 1
        yield 2

    kept = []

    async def main() -> None:
        agen = rows()
        kept.append(agen)  # still referenced: asyncio.run's shutdown closes it
        await agen.__anext__()
        assert await AsyncLock("agen-run").locked()

    asyncio.run(main())
    assert not Lock("agen-run").locked()


def test_an_async_generator_releases_when_its_consumer_is_cancelled():
    @distributed_lock("agen-cancel", timeout=5)
    async def rows() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(30)
        yield 2

    async def main() -> None:
        async def consume() -> None:
            async for _ in rows():
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        assert await AsyncLock("agen-cancel").locked()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await AsyncLock("agen-cancel").locked()

    asyncio.run(main())


def test_an_async_on_busy_for_a_generator_fails_at_decoration():
    async def fallback() -> list[str]:
        return []

    with pytest.raises(TypeError, match="asynchronous"):

        @distributed_lock("gen-async-fallback", on_busy=fallback)
        def rows() -> Iterator[int]:
            yield 1


def test_a_template_field_the_argument_lacks_names_the_template_field_and_argument():
    """``{invoice_id.pk}`` called with an int: not a bare ``AttributeError`` from the decorator."""

    @distributed_lock("invoice:{invoice_id.pk}")
    def charge(invoice_id):
        raise AssertionError("must not run")

    with pytest.raises(ValueError) as excinfo:
        charge(7)
    text = str(excinfo.value)
    assert "'invoice:{invoice_id.pk}'" in text
    assert "{invoice_id.pk}" in text and "invoice_id=7 (int)" in text
    assert "has no attribute 'pk'" in text


def test_a_template_key_the_mapping_lacks_names_the_template_field_and_argument():
    @distributed_lock("import:{options[source]}")
    def run(**options):
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=r"\{options\[source\]\}.*no key 'source'"):
        run(other=1)
