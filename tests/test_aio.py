"""``AsyncLock`` and ``distributed_lock`` on coroutines: what is specific to asyncio.

The ``Lock`` contract tests run against ``AsyncLock`` too (tests/test_lock.py, through
tests/faces.py); these cover task owners, cancellation, a busy event loop, interop with ``Lock``
and the per-loop client. Real Redis, real event loops (``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import time

import pytest
import redis.asyncio

from django_redislock import (
    AsyncLock,
    Lock,
    LockLostError,
    LockNotAcquiredError,
    distributed_lock,
    signals,
)
from django_redislock.runtime import keyspace, runtime
from tests.conftest import async_client_of, hand_off_messages, wait_for


def queue_length(redis_client, name: str) -> int:
    return int(redis_client.llen(keyspace().queue(name)))


def test_two_tasks_are_two_owners_and_one_task_nests():
    async def main() -> None:
        lock = AsyncLock("tasks", timeout=5)
        assert await lock.acquire()
        assert await lock.acquire()  # same task: nests
        assert lock.hold_count == 2

        async def other() -> bool:
            return await AsyncLock("tasks").acquire(blocking=False)

        assert await asyncio.create_task(other()) is False
        await lock.release()
        await lock.release()
        assert await asyncio.create_task(other()) is True

    asyncio.run(main())


def test_an_explicit_owner_is_shared_between_tasks():
    async def main() -> None:
        first = AsyncLock("shared-owner", timeout=5, owner="job-7")
        await first.acquire()

        async def second() -> int:
            lock = AsyncLock("shared-owner", owner="job-7")
            await lock.acquire(blocking=False)
            return lock.hold_count

        assert await asyncio.create_task(second()) == 2

    asyncio.run(main())


def test_two_hundred_tasks_read_modify_write_exactly(redis_client):
    counter = "aio-counter"
    redis_client.set(counter, 0)
    overlaps: list[int] = []
    inside = 0

    async def worker() -> None:
        nonlocal inside
        lock = AsyncLock("rmw", timeout=10)
        for _ in range(50):
            async with lock:
                inside += 1
                if inside > 1:
                    overlaps.append(inside)
                client = await async_client_of(None)
                value = int(await client.get(counter))
                await asyncio.sleep(0)
                await client.set(counter, value + 1)
                inside -= 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(200)))

    asyncio.run(main())
    assert int(redis_client.get(counter)) == 200 * 50
    assert overlaps == []


def test_cancelling_a_waiting_task_leaves_no_queue_entry(redis_client):
    async def main() -> None:
        holder = AsyncLock("cancel-wait", timeout=30)
        await holder.acquire()
        waiter = asyncio.create_task(AsyncLock("cancel-wait").acquire(blocking_timeout=20))
        while queue_length(redis_client, "cancel-wait") == 0:
            await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert queue_length(redis_client, "cancel-wait") == 0
        await holder.release()
        assert not await holder.locked()

    asyncio.run(main())


def test_asyncio_timeout_around_a_wait_leaves_no_queue_entry(redis_client):
    async def main() -> None:
        holder = AsyncLock("timeout-wait", timeout=30)
        await holder.acquire()
        # Another task: this one holds (and would nest).
        waiter = asyncio.create_task(AsyncLock("timeout-wait").acquire())
        if sys.version_info >= (3, 11):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await waiter
        else:  # asyncio.timeout is new in 3.11; wait_for cancels the wait the same way
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, 0.3)
        assert queue_length(redis_client, "timeout-wait") == 0
        await holder.release()

    asyncio.run(main())


def test_a_lock_reserved_for_a_cancelled_waiter_passes_to_the_next(redis_client):
    """The release hands off to the first waiter just as it is cancelled: the next one gets it."""

    async def main() -> None:
        holder = Lock("cancel-race", timeout=30, owner="sync-holder")
        holder.acquire()
        first = asyncio.create_task(AsyncLock("cancel-race").acquire(blocking_timeout=20))
        while queue_length(redis_client, "cancel-race") < 1:
            await asyncio.sleep(0.01)
        second_lock = AsyncLock("cancel-race", owner="second-waiter")
        second = asyncio.create_task(second_lock.acquire(blocking_timeout=20))
        while queue_length(redis_client, "cancel-race") < 2:
            await asyncio.sleep(0.01)
        holder.release()  # blocking: reserved for `first`, which cannot run yet ...
        first.cancel()  # ... and is cancelled before it claims
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 5) is True
        await second_lock.release()

    asyncio.run(main())


@pytest.mark.parametrize("owner", [None, "explicit"], ids=["task-owner", "explicit-owner"])
def test_cancelling_a_task_inside_release_still_releases(redis_client, owner: str | None):
    """The cancellation reaches the task while the release's reply is outstanding (Redis is
    paused by CLIENT PAUSE): it is raised at once, and the release is finished by its attempt
    id in the background as soon as Redis answers."""

    async def main() -> None:
        lock = AsyncLock("cancel-release", timeout=30, owner=owner)
        holding, go = asyncio.Event(), asyncio.Event()

        async def hold_and_release() -> None:
            await lock.acquire()
            holding.set()
            await go.wait()
            await lock.release()  # suspended here when the cancellation arrives

        task = asyncio.create_task(hold_and_release())
        await holding.wait()
        redis_client.execute_command("CLIENT", "PAUSE", 500, "ALL")  # others wait 0.5 s
        go.set()
        await asyncio.sleep(0.1)  # the release is in flight, Redis paused
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(300):  # finished in the background once Redis answers again
            if not await AsyncLock("cancel-release").locked():
                break
            await asyncio.sleep(0.01)
        assert not await AsyncLock("cancel-release").locked()

    asyncio.run(main())


def test_a_cancelled_release_drops_exactly_one_hold_wherever_it_is_cut_off():
    """Releases of a task's own holds run inline (no shield task); a cancellation may cut one
    off before the command is sent, while the reply is outstanding, or after it arrived.
    Whatever the point, exactly one hold is dropped — never two (a nested lock stays held once)
    and never none (a single hold ends free)."""
    from django_redislock import force_release, get_lock_info

    async def settled() -> None:  # a cut-off release is finished by the watchdog thread
        while runtime.watchdog.unsettled():
            await asyncio.sleep(0.001)

    async def cut_off(holds: int, turns: int) -> str:
        ready, go = asyncio.Event(), asyncio.Event()
        started = returned = False

        async def holder() -> None:  # the default owner: this task
            nonlocal started, returned
            lock = AsyncLock("cancel-cut", timeout=30)
            for _ in range(holds):
                await lock.acquire()
            ready.set()
            await go.wait()
            started = True
            await lock.release()  # cut off here, `turns` loop turns in
            returned = True
            await asyncio.sleep(30)  # never reached when cancelled in time

        task = asyncio.create_task(holder())
        await ready.wait()
        go.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await settled()
        if not started:  # cancelled before release() was called: nothing may be dropped
            return "not started"
        return "returned" if returned else "cut off"

    async def main() -> list[str]:
        outcomes = []
        for turns in range(14):
            outcome = await cut_off(2, turns)
            outcomes.append(outcome)
            info = get_lock_info("cancel-cut")
            assert info is not None, turns
            assert info.hold_count == (2 if outcome == "not started" else 1), (turns, outcome)
            force_release("cancel-cut")
            outcome = await cut_off(1, turns)
            outcomes.append(outcome)
            if outcome == "not started":
                force_release("cancel-cut")
            assert get_lock_info("cancel-cut") is None, (turns, outcome)
        return outcomes

    outcomes = asyncio.run(main())
    assert "cut off" in outcomes, outcomes  # the path under test was taken


def test_held_locks_are_renewed_while_the_event_loop_is_blocked():
    async def main() -> None:
        async with AsyncLock("busy-loop", timeout=0.6) as lock:
            time.sleep(2.0)  # CPU-bound work: the loop runs nothing for 3 leases
            assert not lock.lost
            assert await lock.owned()

    asyncio.run(main())


def test_a_sync_holder_hands_over_to_an_async_waiter():
    holder = Lock("interop-1", timeout=30, owner="sync-holder")  # released from another thread
    holder.acquire()
    released = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        released.set()
        holder.release()

    async def main() -> float:
        threading.Thread(target=release_later).start()
        lock = AsyncLock("interop-1", timeout=5)
        assert await lock.acquire(blocking_timeout=10)
        assert released.is_set()
        await lock.release()
        return time.monotonic()

    asyncio.run(main())


def test_an_async_holder_hands_over_to_a_sync_waiter(redis_client):
    result: dict[str, bool] = {}

    def sync_waiter() -> None:
        lock = Lock("interop-2", timeout=5)
        result["acquired"] = lock.acquire(blocking_timeout=10)
        lock.release()

    async def main() -> None:
        lock = AsyncLock("interop-2", timeout=30)
        await lock.acquire()
        thread = threading.Thread(target=sync_waiter)
        thread.start()
        while queue_length(redis_client, "interop-2") == 0:
            await asyncio.sleep(0.01)
        await lock.release()
        await asyncio.to_thread(thread.join, 10)

    asyncio.run(main())
    assert result == {"acquired": True}


def test_a_lost_async_lock_raises_on_exit_and_is_signalled(redis_client):
    events: list[str] = []

    def receiver(sender, name, **kwargs):
        events.append(name)

    signals.lock_lost.connect(receiver)
    try:

        async def main() -> None:
            with pytest.raises(LockLostError):
                async with AsyncLock("aio-lost", timeout=0.6):
                    redis_client.delete(keyspace().lock("aio-lost"))
                    await asyncio.sleep(0.6)  # the watchdog's next renewal finds it gone

        asyncio.run(main())
    finally:
        signals.lock_lost.disconnect(receiver)
    assert events == ["aio-lost"]


def test_restart_and_dropped_connection_during_an_async_wait(redis_client):
    """NOSCRIPT after SCRIPT FLUSH and a killed connection: the wait goes on and succeeds."""

    async def main() -> None:
        holder = AsyncLock("aio-faults", timeout=30, owner="elsewhere")
        await holder.acquire()
        waiter = asyncio.create_task(AsyncLock("aio-faults").acquire(blocking_timeout=10))
        while queue_length(redis_client, "aio-faults") == 0:
            await asyncio.sleep(0.01)
        redis_client.script_flush()
        redis_client.client_kill_filter(_type="normal", skipme=True)
        redis_client.client_kill_filter(_type="pubsub")
        await asyncio.sleep(0.5)
        await holder.release()
        assert await asyncio.wait_for(waiter, 10) is True

    asyncio.run(main())


def test_the_per_loop_client_is_closed_when_the_loop_ends(redis_client):
    def connections() -> int:
        return len(redis_client.client_list(_type="normal"))

    before = connections()

    async def main() -> None:
        async with AsyncLock("per-loop", timeout=5):
            pass

    asyncio.run(main())
    wait_for(lambda: connections() <= before, what="the loop's connections to close")


# -- the decorator on coroutine functions -------------------------------------------------------


def test_distributed_lock_on_a_coroutine_function_uses_the_template():
    seen: list[bool] = []

    @distributed_lock("invoice:{invoice_id}", timeout=5)
    async def charge(invoice_id: int) -> str:
        seen.append(await AsyncLock(f"invoice:{invoice_id}").locked())
        return "charged"

    assert asyncio.run(charge(42)) == "charged"
    assert seen == [True]
    # distributed_lock returns the function's own type; lock_name is set on the wrapper.
    assert charge.lock_name(42) == "invoice:42"  # type: ignore[attr-defined]


def test_distributed_lock_on_a_coroutine_function_skips_without_waiting():
    calls: list[int] = []

    @distributed_lock("aio-skip", on_busy="skip")
    async def job() -> None:
        calls.append(1)

    async def main() -> float:
        holder = AsyncLock("aio-skip", timeout=10)
        await holder.acquire()
        started = time.monotonic()
        # The point: a skipped call returns None (mypy objects that job() never returns a value).
        assert await asyncio.create_task(job()) is None  # type: ignore[func-returns-value]
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.5 and calls == []


def test_distributed_lock_on_a_coroutine_function_awaits_an_async_on_busy():
    async def busy(n: int) -> str:
        return f"busy {n}"

    @distributed_lock("aio-busy-{n}", on_busy=busy)
    async def job(n: int) -> str:
        return "ran"

    async def main() -> str:
        holder = AsyncLock("aio-busy-3", timeout=10)
        await holder.acquire()
        return await asyncio.create_task(job(3))

    assert asyncio.run(main()) == "busy 3"


def test_distributed_lock_on_a_coroutine_function_raises_when_busy():
    @distributed_lock("aio-raise", blocking_timeout=0.2)
    async def job() -> None:
        pass

    async def main() -> None:
        holder = AsyncLock("aio-raise", timeout=10)
        await holder.acquire()
        with pytest.raises(LockNotAcquiredError):
            await asyncio.create_task(job())

    asyncio.run(main())


# -- the per-loop pool: awaits a free connection only when exhausted ----------------------------

# redis-py >= 5.3 deprecates get_connection's command name; older versions require it.
_CHECKOUT_ARGS: tuple[str, ...] = (
    ()
    if inspect.signature(redis.asyncio.ConnectionPool.get_connection)
    .parameters["command_name"]
    .default
    is not inspect.Parameter.empty
    else ("PING",)
)


def test_tasks_beyond_max_connections_wait_for_a_free_connection(redis_client):
    """500 tasks on a pool of 10: every one gets its turn, none fails with "Too
    many connections", and the pool never opens more than its 10 connections."""
    done: list[int] = []

    async def worker(i: int) -> None:
        lock = AsyncLock(f"pool-crowd-{i % 50}", using="small-pool", timeout=10)
        async with lock:
            await asyncio.sleep(0.001)
        done.append(i)

    async def main() -> int:
        client = await async_client_of("small-pool")
        pool = client.connection_pool
        # django-redis shares one sync pool per URL, so the alias's own limit may not be the one
        # the twin copied: pin it for this loop's pool.
        pool.max_connections = 10
        await asyncio.gather(*(worker(i) for i in range(500)))
        return len(pool._available_connections) + len(pool._in_use_connections)

    opened = asyncio.run(main())
    assert sorted(done) == list(range(500))
    assert opened <= 10


def test_an_exhausted_pool_gives_up_after_its_checkout_timeout():
    """A connection never freed: the waiter gets the pool's own error after its ``timeout``
    (the socket timeout), which locks report as an exhausted pool."""
    from django_redislock import connection as redislock_connection

    async def main() -> tuple[float, BaseException]:
        client = await async_client_of("small-pool")
        pool = client.connection_pool
        pool.timeout = 0.3
        pool.max_connections = 3
        held = [await pool.get_connection(*_CHECKOUT_ARGS) for _ in range(pool.max_connections)]
        started = time.monotonic()
        try:
            await pool.get_connection(*_CHECKOUT_ARGS)
        except Exception as exc:
            error: BaseException = exc
        else:
            raise AssertionError("an exhausted pool handed out a connection")
        waited = time.monotonic() - started
        for c in held:
            await pool.release(c)
        return waited, error

    waited, error = asyncio.run(main())
    assert 0.25 <= waited < 2.0
    assert redislock_connection.is_pool_exhausted(error)


def test_a_task_hands_over_to_a_task_of_its_loop_without_a_message(redis_client):
    """The release resolves the next task's future itself (same loop, same thread: no
    ``call_soon_threadsafe``, no ``PUBLISH``)."""
    holder = AsyncLock("aio-local", timeout=30)
    spy = redis_client.pubsub()

    async def main() -> tuple[list[float], float]:
        await holder.acquire()
        spy.psubscribe(runtime.target().channel_prefix + "*")
        got: list[float] = []

        async def waiter() -> None:
            lock = AsyncLock("aio-local", timeout=30)
            assert await lock.acquire(blocking_timeout=20)
            got.append(time.monotonic())
            await lock.release()

        tasks = [asyncio.ensure_future(waiter()) for _ in range(3)]
        key = keyspace("default").queue("aio-local")
        while redis_client.llen(key) < 3:
            await asyncio.sleep(0.01)
        released = time.monotonic()
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return got, released

    got, released = asyncio.run(main())
    assert len(got) == 3 and got[0] - released < 0.5
    assert hand_off_messages(spy) == []


def test_wait_for_around_acquire_then_release_from_the_caller():
    """``await asyncio.wait_for(lock.acquire(), 5)`` then ``await lock.release()``: on Python
    3.10/3.11 the acquire runs in a task of its own; the lock object adopts the hold for its
    caller, so the release works and nothing stays renewed (issue 27, A2.7)."""

    async def main() -> None:
        lock = AsyncLock("wait-for", timeout=30)
        assert await asyncio.wait_for(lock.acquire(), 5)
        assert lock.hold_count == 1
        assert await lock.owned()
        async with lock:  # nests in the adopted hold
            assert lock.hold_count == 2
        await lock.release()
        assert not await lock.locked()
        assert lock.hold_count == 0
        assert len(runtime.watchdog) == 0
        other = AsyncLock("wait-for-2", timeout=30)
        assert await asyncio.create_task(other.acquire())  # a task of its own, done
        await other.release()
        assert not await other.locked()

    asyncio.run(main())


def test_two_tasks_sharing_one_lock_object_are_still_two_owners():
    """Adoption takes only the hold of a *finished* task: two live tasks on one object exclude
    each other."""

    async def main() -> list[str]:
        lock = AsyncLock("shared-object", timeout=30)
        order: list[str] = []

        async def worker(label: str) -> None:
            async with lock:
                order.append(f"{label} in")
                await asyncio.sleep(0.05)
                order.append(f"{label} out")

        await asyncio.gather(worker("a"), worker("b"))
        return order

    order = asyncio.run(main())
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
