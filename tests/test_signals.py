"""Signals carry what metrics and alerts need."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from django.conf import settings

from django_redislock import Lock, force_release
from django_redislock import signals as sig
from django_redislock.runtime import keyspace
from tests.conftest import wait_for


@pytest.fixture
def events():
    received: list[tuple[str, dict]] = []
    receivers = {}
    for name in (
        "lock_acquired",
        "lock_acquire_failed",
        "lock_released",
        "lock_lost",
        "lock_force_released",
    ):

        def receiver(sender, _name=name, **kwargs):
            kwargs.pop("signal", None)
            received.append((_name, kwargs))

        receivers[name] = receiver
        getattr(sig, name).connect(receiver)
    yield received
    for name, receiver in receivers.items():
        getattr(sig, name).disconnect(receiver)


def test_acquire_and_release_signals(events):
    lock = Lock("sig", timeout=5)
    lock.acquire()
    lock.acquire()  # re-entrant: no second lock_acquired
    time.sleep(0.1)
    lock.release()
    lock.release()
    names = [n for n, _ in events]
    assert names == ["lock_acquired", "lock_released"]
    acquired = events[0][1]
    assert acquired["name"] == "sig" and acquired["token"] == lock.fencing_token
    assert acquired["lock"] is lock and acquired["contended"] is False
    assert 0 <= acquired["waited"] < 0.5  # uncontended: no wait to speak of
    assert 0.1 <= events[1][1]["held"] < 5  # from the outer acquisition to the last release


def test_contended_acquire_reports_the_wait(events):
    holder = Lock("sig2", timeout=5)
    holder.acquire()

    def wait():
        lock = Lock("sig2", timeout=5)
        lock.acquire(blocking_timeout=5)
        lock.release()

    t = threading.Thread(target=wait)
    t.start()
    wait_for(
        lambda: redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).llen(
            keyspace().queue("sig2")
        ),
        what="the waiter to queue",
    )
    time.sleep(0.2)  # a measurable wait
    holder.release()
    t.join(5)
    acquired = [kw for n, kw in events if n == "lock_acquired"][1]
    assert acquired["contended"] is True and acquired["waited"] >= 0.15


def test_failed_acquire_signal(events):
    Lock("sig3", timeout=5, owner="someone").acquire()
    assert Lock("sig3").acquire(blocking=False) is False
    assert [n for n, _ in events][-1] == "lock_acquire_failed"


def test_lost_and_force_released_signals(events):
    lock = Lock("sig4", timeout=0.3)
    lock.acquire()
    assert force_release("sig4", token=lock.fencing_token)
    wait_for(lambda: "lock_lost" in [n for n, _ in events], timeout=3, what="lock_lost")
    assert lock.lost
    names = [n for n, _ in events]
    assert "lock_force_released" in names and "lock_lost" in names
    forced = dict(events)["lock_force_released"]
    assert forced["released"] is True and forced["name"] == "sig4"
