"""Flow control and debounce of ``SingleFlightTask`` with real prefork workers on a real broker.

``lock_rate`` / ``task_rate`` (rates shared by every worker), ``task_permits`` (a cap on the task's
bodies running at once, with the per-key ``lock_permits``) and ``lock_mode="debounce"`` (a burst
of publishes -> one run with the last arguments). Two worker processes consume the module's
queue, so every limit is checked across processes; bodies record what they saw in Redis
(``tasks.events()``, counters), so every check is made from the outside. Tasks are in
``tests/testapp/tasks.py``.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redislock import stats
from django_redislock.operations import lock_holders
from django_redislock.singleflight import permit_name
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

pytestmark = pytest.mark.slow

QUEUE = "flow"
#: Scheduling noise between a run's admission (the server's clock) and its body's first line.
TOLERANCE = 0.08
SLACK = 1.0


def broker() -> redis.Redis:
    return redis.Redis.from_url(app.conf.broker_url)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """Two worker processes (prefork, three children each) on the module's queue."""
    app.finalize()
    broker().delete(QUEUE)
    WorkerProcess.log_dir = tmp_path_factory.mktemp("celery-flow")
    started = [WorkerProcess(QUEUE, concurrency=3).spawn() for _ in range(2)]
    try:
        for w in started:
            proc = w.proc
            assert proc is not None
            wait_for(
                lambda w=w, proc=proc: (
                    proc.poll() is not None or app.control.ping(destination=[w.name], timeout=0.3)
                ),
                30,
                what=f"worker {w.name}",
            )
            assert proc.poll() is None, w.output()
        yield started
    finally:
        for w in started:
            w.stop()


def starts(key: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("start") if e["key"] == key]


def peak(counter: str) -> int:
    return max(int(n) for n in tasks.observer().lrange(f"peaks:{counter}", 0, -1))


def throttled(row: str) -> int:
    figures = stats.get_stats(row)
    return figures.throttled if figures is not None else 0


# -- rates ------------------------------------------------------------------------------------
def test_lock_rate_holds_the_rate_of_one_key_across_two_worker_processes(workers):
    count, seconds = tasks.FLOW_LOCK_RATE
    interval = seconds / count
    results = [tasks.per_key_rated.apply_async(("k", i), queue=QUEUE) for i in range(10)]
    other = tasks.per_key_rated.apply_async(("other", 0), queue=QUEUE)
    assert sorted(r.get(timeout=30) for r in results) == list(range(10))
    assert other.get(timeout=10) == 0  # another key has a rate of its own
    runs = sorted(starts("rated:k"), key=lambda e: e["at"])
    at = [e["at"] for e in runs]
    assert len(at) == 10
    # Never early: one run per emission interval (GCRA, burst 1), so at most `count` in any
    # window of `seconds`, whichever worker process ran it.
    assert min(b - a for a, b in itertools.pairwise(at)) >= interval - TOLERANCE
    assert all(at[i + count] - at[i] >= seconds - TOLERANCE for i in range(len(at) - count))
    # Throttled runs were published again, not retried: retries stay 0 with max_retries=0.
    assert {e["retries"] for e in runs} == {0}
    assert len({e["pid"] for e in runs}) > 1


def test_task_rate_holds_the_rate_of_every_key_together(workers):
    rate = 4
    results = [tasks.task_rated.apply_async((f"t{i}",), queue=QUEUE) for i in range(8)]
    assert sorted(r.get(timeout=30) for r in results) == sorted(f"t{i}" for i in range(8))
    at = sorted(e["at"] for e in starts("task-rated"))
    assert len(at) == 8
    assert min(b - a for a, b in itertools.pairwise(at)) >= 1 / rate - TOLERANCE
    assert all(at[i + rate] - at[i] >= 1.0 - TOLERANCE for i in range(len(at) - rate))


def test_throttled_runs_are_counted_in_the_statistics(workers):
    results = [tasks.rated_for_stats.apply_async(("s", i), queue=QUEUE) for i in range(4)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(4))
    # Four at once against one run per 0.2 s: at least three were throttled at first. Workers
    # flush their figures every few seconds.
    wait_for(lambda: throttled("rated-stats:{name}") >= 3, 15, what="the throttled count")
    figures = stats.get_stats("rated-stats:{name}")
    assert figures is not None and figures.failed == 0  # throttling is not a failed attempt


# -- permits ----------------------------------------------------------------------------------
def test_task_permits_and_lock_permits_cap_the_task_and_each_key_at_once(workers):
    # Six worker slots; at most 3 bodies of the task at once, at most 2 per tenant.
    results = [tasks.capped.apply_async((tenant, 0.5), queue=QUEUE) for tenant in "ABAB" * 2 + "AC"]
    assert sorted(r.get(timeout=60) for r in results) == sorted("ABAB" * 2 + "AC")
    assert peak("capped") == 3
    assert peak("capped:A") == 2 and peak("capped:B") <= 2
    assert {r.state for r in results} == {"SUCCESS"}
    wait_for(lambda: lock_holders(permit_name(tasks.capped.flight_rules)) == [], 5)


def test_the_worker_frees_the_task_permit_of_a_dead_pool_child_before_its_lease_ends(workers):
    name = permit_name(tasks.long_permit.flight_rules)
    result = tasks.long_permit.apply_async(("dead-child", 60), queue=QUEUE)
    [start] = wait_for(lambda: starts("long-permit:dead-child"), 15)
    [permit] = lock_holders(name)
    assert permit.task_id == result.id
    os.kill(start["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # The lease is 20 s and was renewed; billiard notices a dead child at once or within 5 s.
    wait_for(lambda: lock_holders(name) == [], 15, what="the main process to free the permit")
    assert time.monotonic() - killed < 10
    wait_for(lambda: result.state == "FAILURE", 10)


# -- debounce ---------------------------------------------------------------------------------
def publish_debounced(name: str, value: int, queue: str = QUEUE) -> tuple[str, float]:
    result = tasks.debounced.apply_async((name, value), queue=queue)
    return result.id, time.time()


def debounced_runs(name: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("debounced") if e["key"] == f"debounce:{name}"]


def test_a_burst_of_publishes_runs_once_with_the_last_arguments_after_the_quiet_period(workers):
    quiet = tasks.DEBOUNCE_QUIET
    published = []
    for value in range(1, 6):
        published.append(publish_debounced("burst", value))
        time.sleep(0.1)
    ids = {flight_id for flight_id, _ in published}
    assert len(ids) == 1  # every publish returns the id the run will have
    [flight_id] = ids
    assert app.AsyncResult(flight_id).get(timeout=15) == 5
    [run] = debounced_runs("burst")
    assert (run["task_id"], run["value"]) == (flight_id, 5)
    last = published[-1][1]
    assert last + quiet - TOLERANCE <= run["at"] <= last + quiet + SLACK
    time.sleep(quiet + 0.3)
    assert len(debounced_runs("burst")) == 1  # nothing else ran
    # The burst is over: the next publish starts another.
    again, _ = publish_debounced("burst", 6)
    assert again != flight_id and app.AsyncResult(again).get(timeout=15) == 6


def test_a_burst_that_keeps_going_runs_at_the_latest_lock_debounce_max_after_its_first_publish(
    workers,
):
    most = tasks.DEBOUNCE_MAX
    published = []
    deadline = time.time() + most + 1.5
    value = 0
    while time.time() < deadline:  # never quiet for lock_debounce
        value += 1
        published.append((*publish_debounced("steady", value), value))
        time.sleep(0.25)
    first_id, first_at, _ = published[0]
    mine = [(at, v) for flight_id, at, v in published if flight_id == first_id]
    later = [flight_id for flight_id, _, _ in published[len(mine) :]]
    assert later and first_id not in later  # publishes after the run started a new burst
    assert [flight_id for flight_id, _, _ in published[: len(mine)]] == [first_id] * len(mine)
    # It ran with the arguments of the last publish that joined it.
    assert app.AsyncResult(first_id).get(timeout=15) == mine[-1][1]
    run = next(e for e in debounced_runs("steady") if e["task_id"] == first_id)
    assert first_at + most - TOLERANCE <= run["at"] <= first_at + most + SLACK
    assert app.AsyncResult(later[-1]).get(timeout=15) == published[-1][2]
