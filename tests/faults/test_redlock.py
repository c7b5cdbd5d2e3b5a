"""Redlock: ``REDISLOCK["CACHE"]`` lists independent masters; a lock needs a majority."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redislock import AsyncLock, Lock, LockBackendError, Semaphore
from tests.conftest import wait_for


@pytest.fixture
def masters(redis_factory, settings):
    servers = [redis_factory().start() for _ in range(3)]
    settings.CACHES = {
        **settings.CACHES,
        **{
            f"m{i}": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"{server.url}/0",
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 1},
            }
            for i, server in enumerate(servers)
        },
    }
    settings.REDISLOCK = {"CACHE": ["m0", "m1", "m2"]}
    return servers


def held_on(servers, name: str) -> int:
    return sum(bool(s.client().exists(f"redislock:lock:{{{name}}}")) for s in servers)


def test_a_lock_is_taken_and_released_on_every_master(masters):
    lock = Lock("quorum", timeout=5)
    assert lock.acquire()
    assert held_on(masters, "quorum") == 3
    assert lock.fencing_token is not None and lock.fencing_token > 0
    assert not _other_thread_acquires("quorum")
    lock.release()
    assert held_on(masters, "quorum") == 0


def _other_thread_acquires(name: str, **options: object) -> bool:
    out: list[bool] = []

    def attempt() -> None:
        lock = Lock(name, **options)  # type: ignore[arg-type]
        out.append(lock.acquire(blocking=False))
        if out[-1]:
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(10)
    return out[0]


def test_one_master_down_still_gives_a_majority(masters):
    masters[2].kill()
    lock = Lock("one-down", timeout=5)
    assert lock.acquire(blocking_timeout=2)
    assert not _other_thread_acquires("one-down")
    lock.release()


def test_two_masters_down_is_a_clear_error_not_a_lock(masters):
    masters[1].kill()
    masters[2].kill()
    with pytest.raises(LockBackendError, match="majority"):
        Lock("two-down", timeout=5).acquire(blocking_timeout=1)


def test_a_failed_quorum_gives_back_what_it_took_before_raising(masters, settings):
    """Two masters configured, one killed: the attempt takes the live one, cannot make a
    majority, and gives it back before raising, so the live master does not lock every other
    owner out for a lease (issue 27, A2.9)."""
    settings.REDISLOCK = {"CACHE": ["m0", "m1"]}
    masters[1].kill()
    with pytest.raises(LockBackendError, match="majority"):
        Lock("half-quorum", timeout=30).acquire(blocking=False)
    assert not masters[0].client().exists("redislock:lock:{half-quorum}")
    masters[1].restart()
    result: list[bool] = []
    other = threading.Thread(target=lambda: result.append(Lock("half-quorum").acquire(False)))
    other.start()
    other.join(10)
    assert result == [True]


def test_a_minority_is_given_back(masters):
    """Another owner holds two masters: our attempt takes one, fails, and gives it back."""
    for server in masters[:2]:
        server.client().set(
            "redislock:lock:{split}",
            '{"o":"other","n":1,"t":1,"at":1,"m":{}}',
            px=30_000,
        )
    assert Lock("split", timeout=5).acquire(blocking=False) is False
    assert not masters[2].client().exists("redislock:lock:{split}")


def test_waiters_are_woken_by_the_release(masters):
    holder = Lock("quorum-wait", timeout=30)
    holder.acquire()
    acquired: list[float] = []

    def wait() -> None:
        lock = Lock("quorum-wait", timeout=5)
        assert lock.acquire(blocking_timeout=20)
        acquired.append(time.monotonic())
        lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: all(s.client().llen("redislock:queue:{quorum-wait}") for s in masters))
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert acquired and acquired[0] - released < 0.5  # woken, not after the 30 s lease


def test_the_watchdog_renews_on_every_master(masters):
    with Lock("quorum-renew", timeout=0.6) as lock:
        time.sleep(2.0)
        assert not lock.lost
        assert held_on(masters, "quorum-renew") == 3


def test_losing_the_majority_is_noticed(masters):
    with pytest.raises(Exception, match="lost"), Lock("quorum-lost", timeout=0.6) as lock:
        for server in masters[:2]:
            server.client().delete("redislock:lock:{quorum-lost}")
        wait_for(lambda: lock.lost, timeout=3, what="the watchdog to notice")


def test_async_lock_on_independent_masters(masters):
    async def main() -> None:
        async with AsyncLock("quorum-aio", timeout=5) as lock:
            assert await lock.owned()
            assert held_on(masters, "quorum-aio") == 3
        assert held_on(masters, "quorum-aio") == 0

    asyncio.run(main())


def test_semaphores_refuse_independent_masters(masters):
    with pytest.raises(Exception, match="Semaphores need one Redis"):
        Semaphore("quorum-sem", 2).acquire()
