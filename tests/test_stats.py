"""Lock statistics: signal receivers, the background flusher, and reading figures back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_redislock import Lock, LockNotOwnedError, distributed_lock, force_release, stats
from django_redislock.keys import keyspace
from tests.conftest import ROOT, subprocess_env, wait_for


@pytest.fixture(autouse=True)
def _receivers() -> Iterator[None]:
    """Receivers connected (idempotent) and no figures left over from another test."""
    stats.connect_receivers()
    stats.flush()
    yield
    stats.flush()


def figures(name: str, using: str | None = None) -> stats.LockStats:
    stats.flush()
    found = stats.get_stats(name, using=using)
    assert found is not None, f"no statistics for {name!r}"
    return found


def test_acquire_and_release_are_counted_with_hold_time():
    for _ in range(3):
        with Lock("plain"):
            time.sleep(0.05)
    s = figures("plain")
    assert (s.acquired, s.released, s.contended, s.failed, s.lost) == (3, 3, 0, 0, 0)
    assert s.success_rate == 1.0
    assert 0.05 <= s.mean_hold < 1.0
    assert s.hold_max >= s.mean_hold
    assert s.wait_total < 0.5
    assert s.updated_at is not None


def test_contended_acquisition_records_its_wait():
    holder = Lock("shared", auto_renew=False)
    holder.acquire()
    got: list[bool] = []

    def wait() -> None:
        lock = Lock("shared", auto_renew=False)
        got.append(lock.acquire(blocking_timeout=10))
        lock.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    holder.release()
    waiter.join(10)
    assert got == [True]
    s = figures("shared")
    assert (s.acquired, s.contended, s.released) == (2, 1, 2)
    assert 0.2 <= s.wait_max < 5
    assert s.mean_wait == pytest.approx(s.wait_total / 2)


def test_failed_acquisitions_lower_the_success_rate():
    holder = Lock("busy", auto_renew=False)
    holder.acquire()

    def attempts() -> None:
        Lock("busy").acquire(blocking=False)
        Lock("busy").acquire(blocking_timeout=0.1)

    other = threading.Thread(target=attempts)
    other.start()
    other.join(10)
    holder.release()
    s = figures("busy")
    assert (s.acquired, s.failed) == (1, 2)
    assert s.success_rate == pytest.approx(1 / 3)
    assert s.mean_wait is not None and s.mean_wait < 0.5  # failed waits are not in mean_wait


def test_loss_and_force_release_are_counted():
    lock = Lock("victim", auto_renew=False)
    lock.acquire()
    assert force_release("victim")
    with pytest.raises(LockNotOwnedError):
        lock.release()
    s = figures("victim")
    assert (s.acquired, s.force_released, s.lost, s.released) == (1, 1, 1, 0)


def test_decorated_locks_are_aggregated_under_the_key_template():
    @distributed_lock("invoice:{invoice_id}")
    def process(invoice_id: int) -> int:
        return invoice_id

    for i in range(5):
        process(i)
    s = figures("invoice:{invoice_id}")
    assert s.acquired == 5 and s.released == 5
    stats.flush()
    assert stats.get_stats("invoice:1") is None


def test_maxima_only_grow_across_flushes():
    stats.record(None, "m", "released", 0.5)
    stats.flush()
    stats.record(None, "m", "released", 0.2)
    s = figures("m")
    assert s.hold_max == 0.5
    assert s.hold_total == pytest.approx(0.7)
    assert s.released == 2


def test_figures_expire_a_day_after_their_last_update(redis_client):
    with Lock("ttl"):
        pass
    stats.flush()
    space = keyspace()
    ttl = redis_client.ttl(space.stats("ttl"))
    assert stats.STATS_TTL - 60 < ttl <= stats.STATS_TTL
    assert redis_client.ttl(f"{space.namespace}:stats-max:ttl") > 0


def test_figures_follow_the_locks_cache():
    with Lock("elsewhere", using="site2"):
        pass
    stats.flush()
    assert stats.get_stats("elsewhere") is None
    assert figures("elsewhere", using="site2").acquired == 1


def test_iter_stats_lists_every_name():
    for name in ("a", "b", "c"):
        with Lock(name):
            pass
    stats.flush()
    assert sorted(s.name for s in stats.iter_stats()) == ["a", "b", "c"]
    assert set(stats.get_many_stats(["a", "c", "zzz"])) == {"a", "c"}


def test_stats_setting_off_records_nothing():
    with override_settings(REDISLOCK={"STATS": False}):
        with Lock("quiet"):
            pass
        stats.flush()
    assert stats.get_stats("quiet") is None


def test_background_thread_flushes_without_being_asked(monkeypatch):
    monkeypatch.setattr(stats, "FLUSH_INTERVAL", 0.1)
    with Lock("background"):
        pass
    stats._wake.set()  # cut short a wait that started with the old interval
    found = wait_for(lambda: stats.get_stats("background"), timeout=5, what="a flush")
    assert found is not None and found.acquired == 1
    assert stats._flusher is not None and stats._flusher.daemon


def test_figures_are_kept_while_redis_is_unreachable(caplog):
    down = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        }
    }
    stats.record(None, "kept", "acquired", 0.1, contended=True)
    with override_settings(CACHES=down):
        stats.flush()
    assert "could not write lock statistics" in caplog.text
    s = figures("kept")
    assert (s.acquired, s.contended) == (1, 1)


def test_a_process_flushes_its_figures_at_exit():
    code = (
        "import django; django.setup()\n"
        "from django_redislock import Lock, stats\n"
        "stats.connect_receivers()\n"
        "for _ in range(4):\n"
        "    with Lock('from-child'): pass\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=30
    )
    s = stats.get_stats("from-child")
    assert s is not None and (s.acquired, s.released) == (4, 4)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_count_its_parents_figures_again():
    stats.record(None, "forked", "acquired")  # pending in the parent
    pid = os.fork()
    if pid == 0:  # child: must start empty, and record its own events
        status = 0
        try:
            if stats._pending or stats._flusher is not None:
                status = 3
            stats.record(None, "forked", "acquired")
            stats.flush()
        except BaseException:
            status = 4
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert figures("forked").acquired == 2  # one from the parent, one from the child


def test_receivers_connect_once():
    from django_redislock import signals

    before = len(signals.lock_acquired.receivers)
    stats.connect_receivers()
    stats.connect_receivers()
    assert len(signals.lock_acquired.receivers) == before


def test_prometheus_collector_exports_the_same_figures():
    from prometheus_client import CollectorRegistry, generate_latest

    from django_redislock.prometheus import register_collector

    for _ in range(2):
        with Lock("exported"):
            time.sleep(0.05)
    stats.flush()
    registry = CollectorRegistry()
    register_collector(registry)
    assert registry.get_sample_value("redislock_acquisitions_total", {"name": "exported"}) == 2
    assert registry.get_sample_value("redislock_releases_total", {"name": "exported"}) == 2
    assert (
        registry.get_sample_value("redislock_failed_acquisitions_total", {"name": "exported"}) == 0
    )
    assert 0.05 <= registry.get_sample_value("redislock_hold_seconds_max", {"name": "exported"}) < 5
    text = generate_latest(registry).decode()
    assert 'redislock_acquisitions_total{name="exported"} 2.0' in text
