"""Lock statistics: signal receivers, the background flusher, and reading figures back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from django.test import override_settings

from django_redislock import (
    Lock,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
    distributed_lock,
    force_release,
    stats,
)
from django_redislock.runtime import keyspace
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
    assert s.mean_hold is not None and 0.05 <= s.mean_hold < 1.0
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


def test_a_force_release_is_counted_once_on_the_row_of_the_holders_name_shape():
    """``Lock("report:7")`` counts on the row ``report:{n}``: so does its force release (it was
    counted on a row of its own, ``report:7``)."""
    lock = Lock("report:7", auto_renew=False)
    lock.acquire()
    assert force_release("report:7")
    with pytest.raises(LockNotOwnedError):
        lock.release()
    s = figures("report:{n}")
    assert (s.acquired, s.force_released, s.lost) == (1, 1, 1)
    stats.flush()
    assert stats.get_stats("report:7") is None


def test_a_force_release_is_counted_on_the_key_template_row_of_a_decorated_function():
    @distributed_lock("invoice:{invoice_id}", timeout=5)
    def process(invoice_id: int) -> None:
        assert force_release(f"invoice:{invoice_id}")  # an operator, while it runs

    with pytest.raises(LockLostError):
        process(42)
    s = figures("invoice:{invoice_id}")
    assert (s.acquired, s.force_released, s.lost) == (1, 1, 1)
    stats.flush()
    assert stats.get_stats("invoice:42") is None and stats.get_stats("invoice:{n}") is None


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
            if stats._pending or stats._events or stats._flusher is not None:
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
    hold_max = registry.get_sample_value("redislock_hold_seconds_max", {"name": "exported"})
    assert hold_max is not None and 0.05 <= hold_max < 5
    text = generate_latest(registry).decode()
    assert 'redislock_acquisitions_total{name="exported"} 2.0' in text


# -- histograms, the per-minute series, skips ----------------------------------------------------


def bucket(seconds: float) -> int:
    """Index of the bucket a value falls in, by the documented rule (``le``, inclusive)."""
    return next(
        (i for i, bound in enumerate(stats.BUCKETS) if seconds <= bound), len(stats.BUCKETS)
    )


def counts(*indexes: int) -> tuple[int, ...]:
    found = [0] * (len(stats.BUCKETS) + 1)
    for index in indexes:
        found[index] += 1
    return tuple(found)


def test_buckets_are_increasing_upper_bounds_in_seconds():
    assert sorted(set(stats.BUCKETS)) == list(stats.BUCKETS)
    assert (stats.BUCKETS[0], stats.BUCKETS[-1]) == (0.001, 1800.0)


def test_waits_and_holds_are_counted_in_their_buckets_exactly():
    waits = [0.0004, 0.001, 0.003, 0.003, 0.7, 42.0, 4000.0]
    holds = [0.02, 0.5, 0.51, 12.0]
    for seconds in waits:
        stats.record(None, "histo:{n}", "acquired", seconds)
    for seconds in holds:
        stats.record(None, "histo:{n}", "released", seconds)
    s = figures("histo:{n}")
    # 0.0004 and 0.001 in "<= 1 ms", 0.003 twice in "<= 5 ms", 0.7 in "<= 1 s", 42 in "<= 60 s",
    # 4000 above the last bound (+Inf).
    assert s.wait_buckets == counts(0, 0, 1, 1, 6, 10, 13)
    assert s.wait_buckets == counts(*map(bucket, waits))
    assert s.hold_buckets == counts(3, 5, 6, 9)
    assert (s.wait_count, s.hold_count) == (s.acquired, s.released) == (7, 4)
    assert s.wait_total == pytest.approx(sum(waits))


def test_histograms_are_kept_per_key_template():
    stats.record(None, "a:{n}", "acquired", 0.002)
    stats.record(None, "b:{n}", "acquired", 20.0)
    stats.flush()
    found = stats.get_many_stats(["a:{n}", "b:{n}"])
    assert found["a:{n}"].wait_buckets == counts(1)
    assert found["b:{n}"].wait_buckets == counts(9)


def test_histograms_add_up_across_flushes_and_processes(redis_client):
    stats.record(None, "summed", "released", 0.2)
    stats.flush()
    code = (
        "import django; django.setup()\n"
        "from django_redislock import stats\n"
        "stats.record(None, 'summed', 'released', 0.3)\n"
        "stats.record(None, 'summed', 'released', 90.0)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=30
    )
    s = figures("summed")
    assert s.hold_buckets == counts(5, 5, 11)
    fields = {k.decode() for k in redis_client.hkeys(keyspace().stats("summed"))}
    assert {"hold_le_0.5", "hold_le_300"} <= fields  # one field per non-empty bucket, by bound
    assert not any(f.startswith("wait_le_") for f in fields)


def test_a_real_lock_fills_both_histograms():
    for _ in range(2):
        with Lock("real-histo"):
            time.sleep(0.12)
    s = figures("real-histo")
    assert s.wait_count == 2 and s.hold_count == 2
    assert s.hold_buckets[bucket(0.5)] == 2  # 0.1 s < each hold <= 0.5 s


def test_acquisitions_and_failures_per_minute_for_the_last_hour(redis_client):
    for _ in range(3):
        stats.record(None, "series", "acquired", 0.01)
    stats.record(None, "series", "failed", 0.5)
    minute = int(time.time() // 60)
    stats.flush()
    s = stats.get_stats("series", series=True)
    assert s is not None and len(s.per_minute) == stats.SERIES_MINUTES
    starts = [m.start.timestamp() for m in s.per_minute]
    assert starts == sorted(starts) and starts[1] - starts[0] == 60
    busy = [m for m in s.per_minute if m.acquired or m.failed]
    assert [(m.acquired, m.failed) for m in busy] == [(3, 1)]
    assert abs(busy[0].start.timestamp() // 60 - minute) <= 1
    unread = stats.get_stats("series")
    assert unread is not None and unread.per_minute == ()  # read only when asked for
    key = keyspace().stats_minutes("series", minute // 60)
    assert 0 < redis_client.ttl(key) <= stats.SERIES_TTL  # bounded: each hour's hash expires


def test_minutes_older_than_the_window_are_not_shown():
    from django_redislock.client import StatsUpdate, write_stats
    from django_redislock.runtime import get_client

    old = int(time.time() // 60) - stats.SERIES_MINUTES - 1
    space = keyspace()
    update = StatsUpdate(
        space.stats("window"),
        space.stats_max("window"),
        {"acquired": 5},
        {},
        {},
        series={space.stats_minutes("window", old // 60): {f"a:{old}": 5}},
    )
    write_stats(get_client(), [update], now=time.time(), ttl=60)
    s = stats.get_stats("window", series=True)
    assert s is not None and sum(m.acquired for m in s.per_minute) == 0


def test_a_skip_on_busy_is_skipped_not_failed():
    @distributed_lock("report:{n}", on_busy="skip")
    def report(n: int) -> str:
        return "ran"

    with Lock("report:1", owner="elsewhere", stats_name="holder"):
        assert report(1) is None
    assert report(1) == "ran"
    s = figures("report:{n}")
    assert (s.acquired, s.failed, s.skipped) == (1, 0, 1)
    assert s.success_rate == 1.0


def test_an_on_busy_callable_that_returns_is_skipped_one_that_raises_failed():
    @distributed_lock("fallback", on_busy=lambda: "cached")
    def fallback() -> str:
        return "fresh"

    @distributed_lock("strict", on_busy=lambda: (_ for _ in ()).throw(RuntimeError("busy")))
    def strict() -> str:
        return "fresh"

    with (
        Lock("fallback", owner="elsewhere", stats_name="holder"),
        Lock("strict", owner="elsewhere", stats_name="holder"),
    ):
        assert fallback() == "cached"
        with pytest.raises(RuntimeError):
            strict()
    assert (figures("fallback").skipped, figures("fallback").failed) == (1, 0)
    assert (figures("strict").skipped, figures("strict").failed) == (0, 1)


def test_a_busy_lock_with_on_busy_raise_is_still_a_failure():
    @distributed_lock("exclusive", blocking=False)
    def exclusive() -> None:
        pass

    with (
        Lock("exclusive", owner="elsewhere", stats_name="holder"),
        pytest.raises(LockNotAcquiredError),
    ):
        exclusive()
    s = figures("exclusive")
    assert (s.failed, s.skipped, s.success_rate) == (1, 0, 0.0)


def test_single_flight_skips_and_deduplications_are_counted_apart():
    from django_redislock.singleflight import (
        UNTIL_EXECUTED,
        Busy,
        FlightRules,
        Ticket,
        begin,
        count_outcome,
        end,
        reserve,
    )

    rules = FlightRules.validated("tests.flight", mode=UNTIL_EXECUTED, stats_name="flight")
    flight = begin(rules, "k", "a", cast(Ticket, reserve(rules, "k", "a")))
    with pytest.raises(Busy):
        begin(rules, "k", "c", Ticket("k"))
    count_outcome(rules, "k", "skipped")  # what the integrations do with Busy ...
    count_outcome(rules, "k", "deduplicated")  # ... and with a Duplicate
    end(flight)
    s = figures("flight")
    assert (s.acquired, s.failed, s.skipped, s.deduplicated) == (1, 0, 1, 1)
    assert s.success_rate == 1.0


def test_record_reads_the_stats_setting_once_and_again_after_a_change(monkeypatch):
    from django_redislock import conf

    stats.record(None, "cached", "skipped")  # the setting is read (at the latest) here
    looked_up = []
    real = conf.get_settings

    def counting() -> conf.LockSettings:
        looked_up.append(1)
        return real()

    counting.cache_clear = real.cache_clear  # type: ignore[attr-defined]
    monkeypatch.setattr(conf, "get_settings", counting)
    for _ in range(100):
        stats.record(None, "cached", "skipped")
    assert looked_up == []  # not per call: record() is on the hot path
    with override_settings(REDISLOCK={"STATS": False}):
        stats.record(None, "cached", "skipped")  # read again after the change: now off
    assert looked_up == [1]
    assert figures("cached").skipped == 101


def test_events_recorded_while_figures_are_flushed_are_all_counted(monkeypatch):
    """``record`` appends without a lock while ``flush`` folds the list: none may be lost, also
    when the list is folded by the recording threads themselves (a tiny ``MAX_EVENTS``)."""
    monkeypatch.setattr(stats, "MAX_EVENTS", 50)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    threads, per_thread = 8, 3000
    done = threading.Event()

    def record() -> None:
        for _ in range(per_thread):
            stats.record(None, "racing", "acquired", 0.001)
            stats.record(None, "racing", "released", 0.002)

    def flush() -> None:
        while not done.is_set():
            stats.flush()

    try:
        flusher = threading.Thread(target=flush)
        flusher.start()
        workers = [threading.Thread(target=record) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        flusher.join()
    finally:
        sys.setswitchinterval(interval)
    stats.flush()
    s = figures("racing")
    assert (s.acquired, s.released) == (threads * per_thread, threads * per_thread)


def test_a_flush_returns_only_after_a_write_in_flight_in_another_thread(monkeypatch):
    """``flush()`` then reading figures must see every event recorded before it, also when the
    background flusher had already taken them and was still writing them to Redis."""
    stats.record(None, "inflight", "acquired", 0.001)
    writing, go_on = threading.Event(), threading.Event()
    real_write = stats._write

    def slow_write(alias: Any, tallies: Any) -> None:
        writing.set()
        go_on.wait(10)
        real_write(alias, tallies)

    monkeypatch.setattr(stats, "_write", slow_write)
    first = threading.Thread(target=stats.flush)  # stands for the background flusher
    first.start()
    assert writing.wait(10)
    second_done = threading.Event()

    def flush_and_say() -> None:
        stats.flush()
        second_done.set()

    second = threading.Thread(target=flush_and_say)
    second.start()
    assert not second_done.wait(0.5), "flush() returned while another flush was still writing"
    go_on.set()
    first.join(10)
    second.join(10)
    assert second_done.is_set()
    assert figures("inflight").acquired == 1
