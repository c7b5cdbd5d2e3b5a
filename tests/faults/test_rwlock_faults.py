"""Read-write locks under faults: the history checker (``tests/history.py``: no reader with a
writer, no two writers, tokens increasing, unknown outcomes resolved, nothing left in Redis)
while the fault proxy loses replies and holds traffic and a reader process is SIGKILLed; and
readers and writers in processes that are SIGKILLed or SIGSTOPped."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from django_redislock import LockBackendError, LockError, ReadWriteLock
from tests.conftest import start_holder, wait_for
from tests.history import HistoryRecorder, check_history, load_history, read_leftovers
from tests.test_rwlock import _sync, started

SOCKET_TIMEOUT = 1.0
NAMES = ("doc-a", "doc-b")


@pytest.fixture
def proxied(proxied_redis, settings):
    options = {"SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT, "SOCKET_TIMEOUT": SOCKET_TIMEOUT}
    settings.CACHES = {
        **settings.CACHES,
        "proxied": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{proxied_redis.url}/0",
            "OPTIONS": options,
        },
    }
    settings.REDISLOCK = {"CACHE": "proxied", "STATS": False}
    return proxied_redis


def worker(rec: HistoryRecorder, seed: int, until: float, writers: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        name = rng.choice(NAMES)
        mode = "write" if rng.random() < writers else "read"
        rw = ReadWriteLock(name, timeout=4)
        side = rw.write_lock() if mode == "write" else rw.read_lock()
        call = rec.call("acquire", side, via="blocking", mode=mode)
        try:
            ok = side.acquire(blocking_timeout=3)
        except LockBackendError as exc:
            call.failed(exc)
            time.sleep(0.05)
            continue
        if not ok:
            call.done("not-acquired")
            continue
        call.acquired(side)
        time.sleep(rng.uniform(0.001, 0.01))
        release = rec.call("release", side, via="blocking", mode=mode, lost=side.lost)
        try:
            side.release()
        except LockError as exc:
            release.failed(exc) if isinstance(exc, LockBackendError) else release.done("lost")
        else:
            release.done("released")


def test_readers_and_writers_under_lost_replies_and_a_killed_reader(proxied, tmp_path: Path):
    history = tmp_path / "rw.jsonl"
    rec = HistoryRecorder(history, client="test")
    rec.connect_signals()
    proxy = proxied.proxy
    # Another process reads doc-a and is SIGKILLed while holding it.
    holder, _ = start_holder(
        "doc-a", "--side", "read", "--timeout", "2", REDISLOCK_TEST_REDIS_URL=proxied.url
    )
    try:
        until = time.monotonic() + 8.0
        threads = [
            threading.Thread(target=worker, args=(rec, seed, until, 0.3 if seed < 2 else 0.1))
            for seed in range(6)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)
        os.kill(holder.pid, signal.SIGKILL)
        rec.killed(holder.pid)
        proxy.lose_replies(0.05, seed=31, reset=True)
        time.sleep(2.0)
        proxy.lose_replies(0.05, seed=32, reset=False)
        time.sleep(2.0)
        proxy.forward()
        proxy.blackhole(0.6)  # replies held past nothing, requests late: timeouts
        time.sleep(1.5)
        proxy.forward()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        holder.wait(10)
        if holder.stdout:
            holder.stdout.close()
    time.sleep(4.5)  # the killed reader's lease (2 s) and the clean-ups of unknown outcomes
    rec.write("exit", clean=True)
    rec.close()
    report = check_history(
        load_history(history),
        leftovers=read_leftovers([proxied.direct()]),
        checked_at=time.monotonic(),
    )
    print(f"\n{report.summary('read-write lock, lost replies + a killed reader')}")
    if report.violations:
        print(report.details(10))
    modes = {e.get("mode") for e in load_history(history) if e.get("ev") == "call"}
    assert modes == {"read", "write"}
    assert report.holds > 200, report
    assert proxy.replies_lost > 0  # the faults happened
    assert report.ok, report.details()


# -- processes: a reader or a writer that dies or stops -------------------------------------------


@pytest.mark.slow
def test_a_killed_reader_frees_only_its_own_part_within_its_lease() -> None:
    mine = ReadWriteLock("killed-reader", timeout=2).read_lock()
    assert mine.acquire()  # renewed by this process's watchdog
    proc, _ = start_holder("killed-reader", "--side", "read", "--timeout", "2")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        mine.release()
        killed = time.monotonic()
        writer = ReadWriteLock("killed-reader").write_lock()
        assert writer.acquire(blocking_timeout=10)
        assert time.monotonic() - killed < 2 + 1.0  # its lease, not more
        writer.release()
    finally:
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.slow
def test_a_live_reader_is_not_freed_with_a_dead_one() -> None:
    mine = ReadWriteLock("two-readers", timeout=2).read_lock()
    assert mine.acquire()
    proc, _ = start_holder("two-readers", "--side", "read", "--timeout", "2")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        writer = started(_sync, "two-readers", "write", blocking_timeout=4)
        writer.join(10)
        assert writer.result is False  # two leases long: mine is renewed
        assert mine.owned()
        mine.release()
        writer = started(_sync, "two-readers", "write", blocking_timeout=5)
        wait_for(lambda: writer.result is True, what="the writer")
        writer.finish()
    finally:
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.slow
def test_a_stopped_writer_loses_the_lock_to_readers_within_its_lease() -> None:
    proc, info = start_holder("stopped-writer", "--side", "write", "--timeout", "2")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        reader = ReadWriteLock("stopped-writer").read_lock()
        assert reader.acquire(blocking_timeout=10)
        assert time.monotonic() - stopped < 2 + 1.0
        assert reader.fencing_token is not None and reader.fencing_token > int(info["token"])  # type: ignore[call-overload]
        reader.release()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
