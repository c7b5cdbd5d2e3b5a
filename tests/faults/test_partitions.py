"""Partitions: our own TCP proxy blackholes the lock client's traffic mid-hold and mid-wait.

Deadlines are honoured, no thread hangs, the watchdog recovers after the partition heals, and
``lost`` is right: set when the lease ran out during the partition, not when it did not.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_redislock import Lock, LockBackendError, LockLostError, signals
from tests.conftest import wait_for
from tests.proxy import SCRIPT_CALLS

SOCKET_TIMEOUT = 1.0


@pytest.fixture
def proxied(proxied_redis, settings):
    """CACHES["proxied"] reaches the server through the proxy; "direct" does not."""
    options = {"SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT, "SOCKET_TIMEOUT": SOCKET_TIMEOUT}
    settings.CACHES = {
        **settings.CACHES,
        "proxied": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{proxied_redis.url}/0",
            "OPTIONS": options,
        },
        "direct": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{proxied_redis.server.url}/0",
            "OPTIONS": options,
        },
    }
    return proxied_redis


def test_a_partition_shorter_than_the_lease_loses_nothing(proxied):
    lost: list[str] = []
    receiver = lambda sender, name, **kw: lost.append(name)  # noqa: E731
    signals.lock_lost.connect(receiver)
    try:
        with Lock("partitioned", using="proxied", timeout=6) as lock:
            with proxied.proxy.blackholed(3.0):
                time.sleep(3.0)  # the renewal due at 2 s times out inside the partition
            wait_for(lambda: lock.owned(), timeout=5, what="the watchdog to renew again")
            assert not lock.lost
            time.sleep(2.5)  # one more renewal round, after the partition
            assert not lock.lost and lock.owned()
    finally:
        signals.lock_lost.disconnect(receiver)
    assert lost == []


def test_a_partition_longer_than_the_lease_reports_the_loss(proxied):
    with pytest.raises(LockLostError), Lock("outlived", using="proxied", timeout=1.5) as lock:
        with proxied.proxy.blackholed(3.0):
            time.sleep(3.0)  # the lease ends on the server meanwhile
        wait_for(lambda: lock.lost, timeout=5, what="the watchdog to report the loss")
    # The server is fine, and so is the client: someone else takes the lock at once.
    assert Lock("outlived", using="direct").acquire(blocking=False)


def test_a_waiter_inside_a_partition_still_acquires_after_it_heals(proxied):
    holder = Lock("wait-partition", using="direct", timeout=30, owner="holder")
    holder.acquire()
    result: dict[str, object] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            result["acquired"] = Lock("wait-partition", using="proxied", timeout=5).acquire(
                blocking_timeout=10
            )
        except LockBackendError as exc:
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: proxied.direct().llen("redislock:queue:{wait-partition}") == 1)
    with proxied.proxy.blackholed(3.0):
        time.sleep(0.5)
        holder.release()  # handed to the waiter, whose wake-up is stuck in the partition
        time.sleep(2.5)
    thread.join(15)
    assert not thread.is_alive()
    assert result.get("acquired") is True, result
    assert result["took"] < 10  # type: ignore[operator]


def test_a_deadline_inside_a_partition_is_honoured(proxied):
    holder = Lock("deadline-partition", using="direct", timeout=30, owner="holder")
    holder.acquire()
    result: dict[str, object] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            result["acquired"] = Lock("deadline-partition", using="proxied").acquire(
                blocking_timeout=1.5
            )
        except LockBackendError as exc:
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: proxied.direct().llen("redislock:queue:{deadline-partition}") == 1)
    with proxied.proxy.blackholed(3.0):
        thread.join(10)
        assert not thread.is_alive()
    # False at the deadline, or — if the call that gives up its place is the one cut off —
    # LockBackendError one socket timeout later; never a hang, never the lock.
    assert result.get("acquired") is False or isinstance(result.get("error"), LockBackendError)
    assert result["took"] < 1.5 + SOCKET_TIMEOUT + 1.0  # type: ignore[operator]
    holder.release()


# -- a connection lost mid-call: resent once, when that is safe -----------------------------------


def _warm(using: str) -> None:
    """Scripts loaded and a connection open, so the next EVALSHA is the one that runs."""
    warm = Lock("warm", using=using)
    assert warm.acquire(blocking=False)
    warm.release()


def test_an_acquisition_whose_connection_is_lost_is_resent_and_holds_once(proxied):
    _warm("proxied")
    direct = proxied.direct()
    proxied.proxy.lose_next_reply(match=SCRIPT_CALLS)  # it runs; the connection is reset
    lock = Lock("lost-conn", using="proxied", timeout=10)
    assert lock.acquire(blocking=False) is True
    assert proxied.proxy.replies_lost == 1  # the fault happened
    assert lock.hold_count == 1  # the resend found its own hold: nothing nested
    fences = [k for k in direct.keys("redislock:fence*")]
    assert [int(direct.get(k) or 0) for k in fences] == [lock.fencing_token]  # one token taken
    lock.release()
    assert not direct.exists("redislock:lock:{lost-conn}")


def test_a_waiter_whose_queue_call_loses_its_connection_keeps_its_place(proxied):
    holder = Lock("lost-queue", using="direct", timeout=30, owner="holder")
    holder.acquire()
    _warm("proxied")
    proxied.proxy.lose_next_reply(match=SCRIPT_CALLS)
    result: dict[str, object] = {}

    def wait() -> None:
        try:
            lock = Lock("lost-queue", using="proxied", timeout=5)
            result["acquired"] = lock.acquire(blocking_timeout=10)
            result["count"] = lock.hold_count
            lock.release()
        except LockBackendError as exc:
            result["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: proxied.direct().llen("redislock:queue:{lost-queue}") == 1)
    wait_for(lambda: proxied.proxy.replies_lost == 1, what="the lost reply")
    time.sleep(0.3)
    assert thread.is_alive() and "error" not in result, result
    holder.release()
    thread.join(10)
    assert result == {"acquired": True, "count": 1}, result


def test_a_timed_out_acquisition_is_not_resent(proxied):
    from django_redislock import LockOutcomeUnknown

    _warm("proxied")
    proxied.proxy.blackhole(direction="down")  # requests run, replies are held
    started = time.monotonic()
    try:
        with pytest.raises(LockOutcomeUnknown):
            Lock("timed-out", using="proxied").acquire(blocking=False)
        took = time.monotonic() - started
    finally:
        proxied.proxy.drop()
        proxied.proxy.forward()
    # One socket timeout for the call, at most one more for the clean-up; a resend would add
    # a third.
    assert took < 2 * SOCKET_TIMEOUT + 0.8, took


def test_a_rate_decision_whose_connection_is_lost_is_not_resent(proxied):
    from django_redislock import RateLimiter

    limiter = RateLimiter("lost-rate", "1/m", using="proxied")
    _warm("proxied")
    limiter.try_acquire()  # its script loaded
    limiter.reset()
    proxied.proxy.lose_next_reply(match=SCRIPT_CALLS)
    with pytest.raises(LockBackendError):
        limiter.try_acquire()  # counted on the server; a resend would have answered "limited"
    assert proxied.proxy.replies_lost == 1
    decision = limiter.try_acquire()
    assert not decision.allowed and decision.retry_after > 0  # the lost allowance was counted
