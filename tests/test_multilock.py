"""``MultiLock``: all the names or none, no deadlock between overlapping sets, on a real Redis."""

from __future__ import annotations

import math
import os
import random
import signal
import threading
import time
from typing import Any

import pytest

from django_redislock import (
    Lock,
    LockLostError,
    LockNotAcquiredError,
    MultiLock,
    force_release,
)
from tests.conftest import start_holder, wait_for


def held_elsewhere(name: str, release: threading.Event, timeout: float = 30) -> threading.Thread:
    taken = threading.Event()

    def run() -> None:
        lock = Lock(name, timeout=timeout)
        lock.acquire()
        taken.set()
        release.wait(60)
        lock.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert taken.wait(10)
    return thread


def test_all_or_none_without_blocking() -> None:
    release = threading.Event()
    thread = held_elsewhere("b", release)
    multi = MultiLock("c", "a", "b")
    assert multi.acquire(blocking=False) is False
    assert not Lock("a").locked() and not Lock("c").locked()  # given back
    assert multi.hold_count == 0
    release.set()
    thread.join(10)
    assert multi.acquire(blocking=False) is True
    assert multi.owned() and multi.hold_count == 1
    assert set(multi.fencing_tokens) == {"a", "b", "c"}
    assert all(isinstance(t, int) for t in multi.fencing_tokens.values())
    assert multi.fencing_token == max(multi.fencing_tokens.values())  # type: ignore[type-var]
    multi.release()
    assert not multi.locked()


def test_one_deadline_covers_every_name() -> None:
    release = threading.Event()
    thread = held_elsewhere("late", release)
    began = time.monotonic()
    assert MultiLock("early", "late").acquire(blocking_timeout=1.0) is False
    took = time.monotonic() - began
    assert 0.9 < took < 2.5
    assert not Lock("early").locked()
    release.set()
    thread.join(10)


def test_a_release_elsewhere_lets_the_whole_set_in() -> None:
    release = threading.Event()
    thread = held_elsewhere("m2", release)
    out: dict[str, Any] = {}

    def take() -> None:
        multi = MultiLock("m1", "m2", "m3")
        out["ok"] = multi.acquire(blocking_timeout=10)
        out["at"] = time.monotonic()
        multi.release()

    taker = threading.Thread(target=take)
    taker.start()
    time.sleep(0.3)
    assert "ok" not in out
    released = time.monotonic()
    release.set()
    taker.join(15)
    thread.join(10)
    assert out["ok"] is True and out["at"] - released < 1.0


def test_overlapping_sets_in_any_order_never_deadlock() -> None:
    names = ["d1", "d2", "d3", "d4"]
    inside = {name: 0 for name in names}
    mutex = threading.Lock()
    errors: list[str] = []
    done = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            chosen = rng.sample(names, rng.randint(2, 4))
            with MultiLock(*chosen, timeout=10, blocking_timeout=20) as multi:
                with mutex:
                    for name in multi.names:
                        inside[name] += 1
                        if inside[name] != 1:
                            errors.append(f"{name} held twice")
                time.sleep(0.001)
                with mutex:
                    for name in multi.names:
                        inside[name] -= 1
            with mutex:
                done[0] += 1

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == [] and done[0] == 100
    assert time.monotonic() - began < 60


def test_reentrant_per_owner_and_duplicates_count_once() -> None:
    multi = MultiLock("r1", "r2", "r1")
    assert multi.names == ("r1", "r2")
    with multi:
        with multi:
            assert multi.hold_count == 2
        assert multi.owned()
    assert not multi.locked()


def test_a_lost_name_raises_on_exit_and_the_others_are_released() -> None:
    with pytest.raises(LockLostError), MultiLock("l1", "l2", timeout=30):
        force_release("l1")
    assert not Lock("l2").locked()


def test_the_context_manager_raises_when_not_acquired() -> None:
    release = threading.Event()
    thread = held_elsewhere("cm2", release)
    with (
        pytest.raises(LockNotAcquiredError, match="none is held"),
        MultiLock("cm1", "cm2", blocking=False),
    ):
        pass
    assert not Lock("cm1").locked()
    release.set()
    thread.join(10)


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, ValueError),
        ((5,), {}, TypeError),
        (("",), {}, ValueError),
        (("a",), {"blocking_timeout": math.nan}, ValueError),
        (("a",), {"blocking_timeout": -1}, ValueError),
        (("a",), {"timeout": math.inf}, ValueError),
        (("a",), {"timeout": "1"}, TypeError),
        (("a",), {"blocking": "yes"}, TypeError),
        (("a",), {"using": 3}, TypeError),
        (tuple(f"n{i}" for i in range(1001)), {}, ValueError),
    ],
)
def test_hostile_arguments_are_refused_at_construction(args: Any, kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        MultiLock(*args, **kwargs)


@pytest.mark.slow
def test_a_killed_holder_of_one_name_delays_the_set_by_its_lease_only() -> None:
    proc, _ = start_holder("k2", "--timeout", "2")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        multi = MultiLock("k1", "k2", "k3")
        assert multi.acquire(blocking_timeout=10)
        assert time.monotonic() - killed < 2 + 1.0
        multi.release()
    finally:
        if proc.stdout:
            proc.stdout.close()


def test_a_stopped_process_never_leaves_a_set_half_taken() -> None:
    """The give-back: a set that cannot be completed leaves nothing held for others to trip on."""
    release = threading.Event()
    thread = held_elsewhere("h3", release)
    results = []
    for _ in range(5):
        results.append(MultiLock("h1", "h2", "h3").acquire(blocking_timeout=0.2))
        assert not Lock("h1").locked() and not Lock("h2").locked()
    assert results == [False] * 5
    release.set()
    thread.join(10)
    wait_for(lambda: not Lock("h3").locked())
