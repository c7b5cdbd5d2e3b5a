"""``LeaderLease``: one leader per name, leadership proven by a renewal round trip, fail-closed."""

from __future__ import annotations

import itertools
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


# -- LeaderElection (issue 31: one implementation of leadership, for services) ---------------------

ELECTION_HOLDER = """
import os, sys, time
import django
django.setup()
from django_redislock import LeaderElection
election = LeaderElection("paused-leader", timeout=1.0)
with election.lead() as term:
    print(f"leading {term.token}", flush=True)
    while True:
        # What a careful leader does before every action: look at term.lost.
        if term.lost.is_set():
            print("lost before acting", flush=True)
            break
        print(f"act {time.monotonic()!r}", flush=True)
        time.sleep(0.05)
"""


def test_one_leader_at_a_time_and_each_term_has_a_greater_token() -> None:
    from django_redislock import LeaderElection, LockNotAcquiredError

    first, second = LeaderElection("elected", timeout=2), LeaderElection("elected", timeout=2)
    elected: list[int] = []
    first.on_elected(lambda term: elected.append(term.token))
    with first.lead() as term:
        assert first.is_leader() and not second.is_leader()
        with pytest.raises(LockNotAcquiredError), second.lead(blocking=False):
            pass
        with pytest.raises(LockNotAcquiredError), second.lead(blocking_timeout=0.2):
            pass
        assert not term.lost.is_set()
        token = term.token
    assert not first.is_leader()
    assert elected == [token]
    with second.lead(blocking_timeout=1) as later:
        assert later.token > token
        assert not later.lost.is_set()


def test_a_standby_takes_over_when_the_leader_steps_down() -> None:
    from django_redislock import LeaderElection

    leader, standby = LeaderElection("handover", timeout=5), LeaderElection("handover", timeout=5)
    took_over = threading.Event()
    times: dict[str, float] = {}

    def stand_by() -> None:
        with standby.lead(blocking_timeout=10):
            times["elected"] = time.monotonic()
            took_over.set()

    with leader.lead():
        thread = threading.Thread(target=stand_by)
        thread.start()
        time.sleep(0.3)
        assert not took_over.is_set()
        times["stepped_down"] = time.monotonic()
    assert took_over.wait(5)
    thread.join(5)
    assert times["elected"] - times["stepped_down"] < 1.0  # woken by the release, not the lease


def test_a_force_released_term_is_lost_and_on_lost_is_called() -> None:
    from django_redislock import LeaderElection

    election = LeaderElection("revoked", timeout=1.5)
    lost_terms: list[int] = []
    election.on_lost(lambda term: lost_terms.append(term.token))
    with election.lead() as term:
        assert force_release("revoked")
        assert term.lost.wait(3)  # the next proof (every 0.5 s) finds it gone
        assert not election.is_leader()
    assert lost_terms == [term.token]


def test_term_lost_reads_as_set_once_the_last_proof_is_older_than_the_lease() -> None:
    from django_redislock import LeaderElection

    election = LeaderElection("unproven", timeout=1.0)
    with election.lead() as term:
        election._stop.set()  # the keeper stops proving (as if this process were paused)
        election.lease.lock.detach()  # nor does the watchdog renew
        assert not term.lost.is_set()
        assert term.lost.wait(2.0)  # by the clock alone, without anyone calling set()
        assert not election.is_leader()


def test_a_paused_leader_sees_term_lost_before_it_can_act_and_a_new_term_begins() -> None:
    """SIGSTOP a leading process past its lease: another process is elected with a greater
    token, and when the paused one resumes, its very first look at ``term.lost`` says lost."""
    import signal
    import subprocess
    import sys

    from django_redislock import LeaderElection
    from tests.conftest import ROOT, subprocess_env

    proc = subprocess.Popen(
        [sys.executable, "-c", ELECTION_HOLDER],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[0] == "leading"
        assert proc.stdout.readline().startswith("act ")
        os_kill = __import__("os").kill
        os_kill(proc.pid, signal.SIGSTOP)
        successor = LeaderElection("paused-leader", timeout=1.0)
        with successor.lead(blocking_timeout=5) as term:
            assert term.token > int(first[1])
            resumed = time.monotonic()
            os_kill(proc.pid, signal.SIGCONT)
            out, _ = proc.communicate(timeout=20)
        lines = out.split()
        # Resumed, it acts at most once more — an action it had already decided on when it
        # was stopped (what fencing tokens are for) — and then finds the term lost.
        assert out.rstrip().endswith("lost before acting"), out
        after = [float(t) for word, t in itertools.pairwise(lines) if word == "act"]
        assert len([t for t in after if t >= resumed]) <= 1, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert lines.count("lost") == 1
