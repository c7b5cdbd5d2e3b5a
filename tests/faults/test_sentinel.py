"""Sentinel (1 primary, 1 replica, 3 sentinels): failover while a lock is held and waited for.

Through django-redis's Sentinel support (a ``CACHES`` entry) and through ``REDISLOCK["CLIENT"]``
(``Sentinel(...).master_for(...)``).
"""

from __future__ import annotations

import threading
import time

import pytest

from django_redislock import Lock, LockBackendError
from django_redislock.runtime import keyspace
from tests import topology_clients
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_django_redis_pools():
    """django-redis caches pools per LOCATION process-wide: each test's sentinels are new."""
    from django_redis.pool import ConnectionFactory

    ConnectionFactory._pools.clear()
    yield
    ConnectionFactory._pools.clear()


@pytest.fixture(params=["django-redis", "client"])
def sentinel_locks(request, redis_sentinel, settings):
    if request.param == "django-redis":
        settings.CACHES = {**settings.CACHES, "sentinel": redis_sentinel.caches_entry()}
        settings.REDISLOCK = {"CACHE": "sentinel"}
    else:
        topology_clients.current = redis_sentinel.master_client()
        settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    yield redis_sentinel
    topology_clients.current = None


def queue_length(sentinel, name: str) -> int:
    return int(sentinel.master_client().llen(keyspace().queue(name)))


def test_failover_while_held_and_waited_for(sentinel_locks):
    sentinel = sentinel_locks
    holder = Lock("sentinel-lock", timeout=6)
    assert holder.acquire()
    first_token = holder.fencing_token
    wait_for(
        lambda: sentinel.replica.client().exists(keyspace().lock("sentinel-lock")),
        what="the lock to reach the replica",
    )
    result: dict[str, object] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            lock = Lock("sentinel-lock", timeout=6)
            result["acquired"] = lock.acquire(blocking_timeout=30)
            result["token"] = lock.fencing_token
        except LockBackendError as exc:
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: queue_length(sentinel, "sentinel-lock") == 1, what="the waiter")
    sentinel.kill_primary()
    sentinel.wait_failover()
    # The lock was replicated before the kill, so it survives on the new primary: the holder
    # keeps it (its next renewal reconnects and reloads the scripts after NOSCRIPT) ...
    wait_for(lambda: holder.owned(), timeout=15, what="the holder to reach the new primary")
    assert not holder.lost
    assert "acquired" not in result
    holder.release()  # ... and hands it to the waiter, whose wake-up listener reconnected
    thread.join(30)
    assert result.get("acquired") is True, result
    # Tokens stay monotonic: the fence counter was replicated with the lock.
    assert result["token"] > first_token  # type: ignore[operator]


def test_a_lock_that_did_not_reach_the_replica_is_reported_lost(sentinel_locks):
    """Asynchronous replication: a lock taken just before the primary dies may be lost with it.
    The holder learns it at its next renewal (that is what REPLICAS prevents, see below)."""
    sentinel = sentinel_locks
    sentinel.replica.pause()  # the replica misses the acquisition
    holder = Lock("unreplicated", timeout=3)
    assert holder.acquire()
    sentinel.kill_primary()
    sentinel.replica.resume()
    sentinel.wait_failover()
    wait_for(lambda: holder.lost, timeout=20, what="the holder to learn of the loss")


def test_with_replicas_1_a_failover_right_after_acquisition_never_makes_two_holders(
    redis_sentinel, settings
):
    settings.CACHES = {**settings.CACHES, "sentinel": redis_sentinel.caches_entry()}
    settings.REDISLOCK = {"CACHE": "sentinel", "REPLICAS": 1, "REPLICAS_TIMEOUT": 2.0}
    holder = Lock("replicated", timeout=10)
    assert holder.acquire()  # acknowledged by the replica before acquire() returned
    redis_sentinel.kill_primary()
    redis_sentinel.wait_failover()
    intruder = Lock("replicated", owner="intruder")
    deadline = time.monotonic() + 15
    errors: list[str] = []
    while time.monotonic() < deadline:
        try:
            assert intruder.acquire(blocking=False) is False  # the new primary has it
            break
        except LockBackendError as exc:  # still reconnecting
            errors.append(str(exc)[:200])
            time.sleep(0.2)
    else:
        pytest.fail(f"the new primary never answered: {errors[-3:]}")
    assert holder.owned()
