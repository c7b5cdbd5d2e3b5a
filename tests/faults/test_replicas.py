"""``REDISLOCK["REPLICAS"]``: an acquisition counts only once replicas acknowledged it."""

from __future__ import annotations

import time

import pytest

from django_redislock import Lock, LockBackendError
from tests.conftest import wait_for

#: Generous for a loaded CI machine (a healthy replica acknowledges in milliseconds).
REPLICAS_TIMEOUT = 1.0


@pytest.fixture
def primary_and_replica(redis_factory, settings):
    primary = redis_factory().start()
    replica = redis_factory().start()
    primary.client().config_set("repl-diskless-sync-delay", 0)  # sync now, not in 5 s
    replica.client().replicaof("127.0.0.1", primary.port)
    wait_for(
        lambda: primary.client().execute_command("WAIT", 1, 100) == 1,
        what="the replica to be in sync and acknowledging",
    )
    settings.CACHES = {
        **settings.CACHES,
        "replicated": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{primary.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        },
    }
    settings.REDISLOCK = {
        "CACHE": "replicated",
        "REPLICAS": 1,
        "REPLICAS_TIMEOUT": REPLICAS_TIMEOUT,
    }
    return primary, replica


def test_an_acknowledged_acquisition_and_renewal_count(primary_and_replica):
    _, replica = primary_and_replica
    lock = Lock("replicated", timeout=5)
    assert lock.acquire()
    wait_for(lambda: replica.client().exists("redislock:lock:{replicated}"), what="replication")
    lock.renew()
    lock.extend(1)
    lock.release()


def test_an_unacknowledged_acquisition_is_undone(primary_and_replica):
    primary, replica = primary_and_replica
    replica.pause()  # the replica stops acknowledging (a partition, a stalled replica)
    try:
        lock = Lock("unreplicated", timeout=5)
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="replicas"):
            lock.acquire()
        # bounded by REPLICAS_TIMEOUT (the acquire's WAIT, then the give-back's), not a hang
        assert time.monotonic() - started < 2 * REPLICAS_TIMEOUT + 1.0
        assert not primary.client().exists("redislock:lock:{unreplicated}")
        assert lock.hold_count == 0
    finally:
        replica.resume()


def test_without_any_replica_every_acquisition_fails_clearly(redis_factory, settings):
    alone = redis_factory().start()
    settings.CACHES = {
        **settings.CACHES,
        "alone": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{alone.url}/0"},
    }
    settings.REDISLOCK = {"CACHE": "alone", "REPLICAS": 1, "REPLICAS_TIMEOUT": 0.2}
    with pytest.raises(LockBackendError, match="0 of the 1 replicas"):
        Lock("alone").acquire()
    assert not alone.client().keys("redislock:lock:*")


def test_a_hand_off_is_acknowledged_like_any_acquisition(primary_and_replica):
    """With the replica gone, a waiter that is handed the lock must not return holding it
    unacknowledged: it claims it with a call of its own, which WAIT then refuses, and the lock
    goes on (issue 27, A2.8)."""
    import threading

    primary, replica = primary_and_replica
    holder = Lock("handed", timeout=10, owner="holder")
    assert holder.acquire()
    results: list[object] = []

    def wait() -> None:
        try:
            results.append(Lock("handed", timeout=10).acquire(blocking_timeout=5))
        except LockBackendError as exc:
            results.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: primary.client().llen("redislock:queue:{handed}") == 1)
    replica.pause()
    try:
        holder.release()  # hands the lock to the waiter (reserved: it must claim it)
        waiter.join(10)
    finally:
        replica.resume()
    assert len(results) == 1 and isinstance(results[0], LockBackendError), results
    assert "replicas" in str(results[0])
    assert not primary.client().exists("redislock:lock:{handed}")  # undone, not kept


def test_a_rate_limiter_allowance_counts_once_the_replica_has_it(primary_and_replica):
    """Issue 30: an allowance a failover could forget is not one — the request does not pass."""
    from django_redislock import RateLimiter

    _, replica = primary_and_replica
    limiter = RateLimiter("replicated-rate", "2/m", burst=2)
    assert limiter.try_acquire()
    wait_for(
        lambda: replica.client().exists("redislock:rate:{replicated-rate}"), what="replication"
    )
    replica.pause()
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="replicas"):
            limiter.try_acquire()
        assert time.monotonic() - started < REPLICAS_TIMEOUT + 2
    finally:
        replica.resume()
    # The unacknowledged allowance stayed counted (the strict side): the limit is spent.
    refused = limiter.try_acquire()
    assert not refused and refused.retry_after > 0
    assert limiter.reserve(max_wait=60) is not None  # booking is acknowledged too


def test_a_refusal_is_a_refusal_while_the_replica_stalls(primary_and_replica):
    """A refused decision writes nothing: a stalled replica (WAIT gives up on the connection's
    earlier writes) must not turn it into an error — ``acquire`` raises ``RateLimited``."""
    from django_redislock import RateLimited, RateLimiter

    _, replica = primary_and_replica
    limiter = RateLimiter("stalled-refusal", "1/m")
    assert limiter.try_acquire()
    replica.pause()
    try:
        refused = limiter.try_acquire()
        assert not refused and refused.retry_after > 0
        with pytest.raises(RateLimited):
            limiter.acquire(timeout=0.5)
        assert limiter.reserve(max_wait=0.5) is None
    finally:
        replica.resume()


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "evalsha"])
def test_a_promoted_replica_answers_the_first_call_without_loading_a_script(
    redis_factory, settings, functions
):
    """Functions are replicated with the data; the script cache is not (NOSCRIPT, SCRIPT LOAD
    and a second call on the new primary's first call of each script)."""
    primary = redis_factory().start()
    replica = redis_factory().start()
    primary.client().config_set("repl-diskless-sync-delay", 0)
    replica.client().replicaof("127.0.0.1", primary.port)
    wait_for(lambda: primary.client().execute_command("WAIT", 1, 100) == 1, what="the replica")

    def use(server) -> None:
        settings.CACHES = {
            **settings.CACHES,
            "promoted": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url},
        }
        settings.REDISLOCK = {"CACHE": "promoted", "FUNCTIONS": functions}

    use(primary)
    with Lock("before-failover", timeout=5):
        pass
    assert primary.client().execute_command("WAIT", 1, 1000) == 1
    primary.kill()
    replica.client().replicaof("no", "one")
    replica.client().config_resetstat()
    use(replica)
    with Lock("after-failover", timeout=5):
        pass
    calls = {
        k[len("cmdstat_") :]: v["calls"] for k, v in replica.client().info("commandstats").items()
    }
    if functions:
        assert calls.get("fcall") == 2, calls  # acquire, release: nothing else
        assert "function|load" not in calls and "script|load" not in calls, calls
    else:
        assert calls.get("script|load") == 2, calls  # after a NOSCRIPT, for each script
        assert calls.get("evalsha") == 4, calls
