"""Crashes, restarts and hangs: dedicated redis-servers and child processes that get killed."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from django.test import override_settings

from django_redislock import Lock, LockBackendError, list_locks
from django_redislock.runtime import get_client
from tests.conftest import start_holder, wait_for

SOCKET_TIMEOUT = 1.0


def fault_caches(server) -> dict:
    from django.conf import settings

    return {
        **settings.CACHES,
        "fault": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT, "SOCKET_TIMEOUT": SOCKET_TIMEOUT},
        },
    }


@pytest.fixture
def fault_server(redis_factory):
    server = redis_factory().start()
    with override_settings(CACHES=fault_caches(server), REDISLOCK={"CACHE": "fault"}):
        yield server


def test_sigkilled_holder_frees_the_lock_within_its_lease():
    timeout = 1.0
    proc, _ = start_holder("victim", "--timeout", str(timeout))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = time.monotonic()
    assert Lock("victim", timeout=5).acquire(blocking_timeout=timeout + 3)
    assert time.monotonic() - killed_at < timeout + 1


def test_holder_in_another_process_keeps_its_lock_for_three_leases():
    proc, held = start_holder("keeper", "--timeout", "0.5", "--hold", "1.6")
    try:
        time.sleep(1.4)
        infos = list(list_locks(match="keeper"))
        assert [i.fencing_token for i in infos] == [held["token"]]
        assert Lock("keeper").acquire(blocking=False) is False
        assert proc.stdout is not None
        assert '"lost": false' in proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()


def test_tokens_increase_across_processes():
    tokens: list[Any] = []  # the children's (JSON) and ours
    for _ in range(3):
        proc, held = start_holder("multi", "--timeout", "5", "--hold", "0")
        tokens.append(held["token"])
        proc.wait(20)
    lock = Lock("multi", timeout=5)
    lock.acquire()
    tokens.append(lock.fencing_token)
    lock.release()
    assert tokens == sorted(set(tokens))


def test_stopped_redis_raises_backend_error_quickly(fault_server):
    fault_server.stop()
    start = time.monotonic()
    with pytest.raises(LockBackendError) as err:
        Lock("down").acquire()
    assert time.monotonic() - start < 5 * SOCKET_TIMEOUT
    assert err.value.__cause__ is not None


def test_hung_redis_raises_within_the_socket_timeout(fault_server):
    get_client().ping()  # connection established before the hang
    fault_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(LockBackendError):
            Lock("hung").acquire()
        elapsed = time.monotonic() - start
    finally:
        fault_server.resume()
    assert elapsed < 5 * SOCKET_TIMEOUT


def test_hung_redis_raises_within_the_socket_timeout_for_an_async_lock(fault_server):
    """The asyncio connection sends inline (no ``wait_for`` per command, see
    ``connection._lean``): a frozen server must still surface within the socket timeout, on a
    connection that was already open and on a fresh one."""
    import asyncio

    from django_redislock import AsyncLock

    async def main() -> list[float]:
        lock = AsyncLock("hung-async", timeout=5)
        assert await lock.acquire()  # the loop's connection is open before the hang
        await lock.release()
        fault_server.pause()
        elapsed = []
        try:
            for name in ("hung-async", "hung-async-2"):
                start = time.monotonic()
                with pytest.raises(LockBackendError):
                    await AsyncLock(name, timeout=5).acquire()
                elapsed.append(time.monotonic() - start)
        finally:
            fault_server.resume()
        return elapsed

    assert all(e < 5 * SOCKET_TIMEOUT for e in asyncio.run(main()))


def test_protected_code_never_runs_without_the_lock(fault_server):
    from django_redislock import distributed_lock

    ran = []

    @distributed_lock("guarded")
    def job():
        ran.append(1)

    fault_server.stop()
    with pytest.raises(LockBackendError):
        job()
    assert ran == []


def test_restarted_redis_reloads_the_scripts(fault_server):
    lock = Lock("restart", timeout=5, auto_renew=False)
    lock.acquire()
    lock.release()
    fault_server.restart()  # script cache is empty now (NOSCRIPT)
    deadline = time.monotonic() + 5
    while True:  # the pool may need a reconnect attempt first
        try:
            assert lock.acquire()
            break
        except LockBackendError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert lock.owned()
    lock.release()


def test_lock_lost_in_a_restart_is_reported(fault_server):
    lost = threading.Event()
    from django_redislock.signals import lock_lost

    def on_lost(sender, name, **kwargs):
        if name == "wiped":
            lost.set()

    lock_lost.connect(on_lost)
    try:
        lock = Lock("wiped", timeout=0.6)
        lock.acquire()
        fault_server.restart()
        assert lost.wait(5)
        assert lock.lost
    finally:
        lock_lost.disconnect(on_lost)


@pytest.fixture
def on(settings):
    """Point the lock cache at a given server (``on(server)``)."""

    def use(server) -> None:
        settings.CACHES = fault_caches(server)
        settings.REDISLOCK = {"CACHE": "fault"}

    return use


def test_tokens_stay_monotonic_across_a_restart_with_aof(aof_redis, on):
    on(aof_redis)
    lock = Lock("durable", timeout=5, auto_renew=False)
    tokens: list[Any] = []
    for _ in range(3):
        lock.acquire()
        tokens.append(lock.fencing_token)
        lock.release()
    aof_redis.restart()  # a crash: appendfsync always kept every acknowledged write
    wait_for_redis(lock)
    for _ in range(3):
        lock.acquire()
        tokens.append(lock.fencing_token)
        lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_held_lock_survives_a_restart_with_aof(aof_redis, on):
    on(aof_redis)
    lock = Lock("durable-held", timeout=6)
    lock.acquire()
    aof_redis.restart()
    wait_for_redis(lock)
    time.sleep(2.5)  # a renewal after the restart
    assert lock.owned() and not lock.lost
    lock.release()


def test_the_functions_library_survives_a_restart_with_aof(aof_redis, on):
    """The library is saved with the data: the first call after the restart loads nothing."""
    on(aof_redis)
    with Lock("functions-before", timeout=5):
        pass
    aof_redis.restart()
    client = aof_redis.client()
    wait_for(client.ping, what="the restarted server")
    client.config_resetstat()
    with Lock("functions-after", timeout=5):
        pass
    stats = client.info("commandstats")
    if int(client.info("server")["redis_version"].split(".")[0]) < 7:  # the oldest matrix env
        # Redis 6.2 has no Functions (EVALSHA), but it still writes SCRIPT LOAD to its AOF (as
        # to its replicas), so its scripts come back too.
        assert stats["cmdstat_evalsha"]["calls"] == 2 and "cmdstat_script" not in stats, stats
        return
    assert stats["cmdstat_fcall"]["calls"] == 2, sorted(stats)
    assert "cmdstat_function|load" not in stats and "cmdstat_script|load" not in stats


def test_a_restart_without_persistence_is_reported_at_the_next_renewal(volatile_redis, on):
    on(volatile_redis)
    lock = Lock("volatile", timeout=1.5)
    lock.acquire()
    volatile_redis.restart()  # empty
    started = time.monotonic()
    while not lock.lost:
        assert time.monotonic() - started < 1.5 / 3 + 2.0  # one renewal interval (+ retry)
        time.sleep(0.05)


def test_client_pause_longer_than_the_lease(fault_server):
    """CLIENT PAUSE freezes every client (the holder's renewals too) past the lease.

    Renewals block for the pause (bounded by the socket timeout, then retried); once the lease
    ran out on the server, the holder learns it is lost and another owner can take the lock.
    """
    lock = Lock("paused", timeout=1.0)
    lock.acquire()
    admin = fault_server.client()
    admin.execute_command("CLIENT", "PAUSE", 2500, "ALL")
    time.sleep(2.7)
    wait_for_redis(lock)
    started = time.monotonic()
    while not lock.lost:
        assert time.monotonic() - started < 3.0
        time.sleep(0.05)
    other = Lock("paused", owner="other")
    assert other.acquire(blocking=False)
    other.release()


def wait_for_redis(lock: Lock, timeout: float = 5.0) -> None:
    """Until the server answers again (the pool may need a reconnect attempt first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lock.locked()
            return
        except LockBackendError:
            assert time.monotonic() < deadline, "Redis did not come back"
            time.sleep(0.1)
