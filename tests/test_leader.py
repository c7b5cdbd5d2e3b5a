"""``LeaderLease``: one leader per name, leadership proven by a renewal round trip, fail-closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from django_redislock import LockBackendError, LockNotOwnedError, force_release, get_lock_info
from django_redislock.leader import LeaderLease
from tests.conftest import wait_for
from tests.redis_server import RedisServer


@pytest.fixture
def leases() -> Iterator[list[LeaderLease]]:
    made: list[LeaderLease] = []
    yield made
    for lease in made:
        try:
            lease.release()
        except LockBackendError:  # the server may be gone on purpose
            lease.step_down()


def make(leases: list[LeaderLease], name: str = "leader", **kwargs: object) -> LeaderLease:
    lease = LeaderLease(name, **kwargs)  # type: ignore[arg-type]
    leases.append(lease)
    return lease


def test_one_leader_per_name_even_within_one_process(leases: list[LeaderLease]) -> None:
    first, second = make(leases, timeout=5), make(leases, timeout=5)
    assert first.acquire()
    assert not second.acquire()
    assert first.is_leader and not second.is_leader
    info = get_lock_info("leader")
    assert info is not None and info.fencing_token == first.fencing_token


def test_a_proof_resets_the_lease_and_counts_from_when_it_started(
    leases: list[LeaderLease],
) -> None:
    lease = make(leases, timeout=2)
    assert lease.acquire()
    time.sleep(0.3)
    before = time.monotonic()
    lease.prove()
    assert lease.proof_age() < 0.1
    assert lease.remaining() == pytest.approx(2.0 - (time.monotonic() - before), abs=0.1)
    info = get_lock_info("leader")
    assert info is not None and info.expires_in > 1.8


def test_a_release_hands_the_lease_to_a_waiting_standby_at_once(
    leases: list[LeaderLease],
) -> None:
    leader, standby = make(leases, timeout=30), make(leases, timeout=30)
    assert leader.acquire()
    took: list[float] = []

    def wait() -> None:
        if standby.acquire(wait=10):
            took.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: not standby.is_leader and waiter.is_alive(), 2)
    time.sleep(0.2)  # the standby is queued in Redis
    released_at = time.monotonic()
    assert leader.release()
    waiter.join(10)
    assert took and took[0] - released_at < 0.5  # woken by the release: no polling, no lease wait
    assert standby.is_leader and standby.fencing_token > leader.fencing_token  # type: ignore[operator]


def test_a_force_released_lease_is_reported_lost_by_the_watchdog_without_a_proof(
    leases: list[LeaderLease],
) -> None:
    lease = make(leases, timeout=0.6)  # renewed every 0.2 s
    lost = threading.Event()
    lease.on_lost(lost.set)
    assert lease.acquire()
    assert force_release("leader")
    assert lost.wait(2)
    assert lease.lost and not lease.is_leader
    with pytest.raises(LockNotOwnedError):
        lease.prove()
    assert not lease.release()  # nothing left to release


@pytest.fixture
def own_server(redis_factory: type[RedisServer]) -> Iterator[RedisServer]:
    """A Redis of the test's own (stopped and restarted by it) as the locks' cache."""
    server = redis_factory().start()
    caches = {
        **settings.CACHES,
        "own": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        },
    }
    with override_settings(CACHES=caches, REDISLOCK={"CACHE": "own", "STATS": False}):
        yield server


def test_a_lease_that_cannot_be_proven_stops_counting_as_leadership(
    own_server: RedisServer,
) -> None:
    """Redis unreachable: nothing says "lost", but after ``timeout`` without a proof the lease
    may belong to someone else, so this process is no longer the leader (fail-closed)."""
    lease = LeaderLease("leader", timeout=1.0)
    assert lease.acquire()
    own_server.stop()
    with pytest.raises(LockBackendError):
        lease.prove()
    assert not lease.lost  # Redis did not say so...
    wait_for(lambda: not lease.is_leader, 2, what="the proven lease to run out")
    assert lease.remaining() == 0.0  # ... but the lease may have passed on by now
    own_server.start()  # empty: the lease is gone
    with pytest.raises(LockNotOwnedError):
        lease.prove()
    assert lease.lost
    assert not lease.release()


def test_stepping_down_keeps_quiet_and_acquiring_again_re_enters_our_own_lease(
    leases: list[LeaderLease],
) -> None:
    lease = make(leases, timeout=5)
    assert lease.acquire()
    token = lease.fencing_token
    lease.step_down()
    assert not lease.is_leader
    assert get_lock_info("leader") is not None  # left to expire (Redis may be unreachable)
    assert not make(leases, timeout=5).acquire()  # still nobody else's
    assert lease.acquire()
    assert lease.fencing_token == token  # the same tenure: nobody held it in between
    assert lease.release()
    assert get_lock_info("leader") is None


def test_a_standby_waiting_for_the_lease_is_not_counted_as_failing(
    leases: list[LeaderLease],
) -> None:
    """A healthy pair — one leads, one stands by — read "1 acquired, N failed": standing by is
    what a standby is for, so its tries are no failed acquisitions; its takeover is acquired."""
    from django_redislock import stats

    stats.flush()
    leader, standby = make(leases, "stats-lease"), make(leases, "stats-lease")
    assert leader.acquire()
    assert not standby.acquire()  # a try without waiting
    assert not standby.acquire(wait=0.1)  # and one that waits, as a standby beat does
    assert leader.release()
    assert standby.acquire(wait=1)
    stats.flush()
    row = stats.get_stats("stats-lease")
    assert row is not None and (row.acquired, row.failed) == (2, 0), row
    assert row.success_rate == 1.0
