"""Single-flight Django tasks (``django_redislock.django_tasks``) with the backport's REAL
database worker: ``manage.py db_worker`` subprocesses and an enqueuing subprocess on one
file-based SQLite database (``tests/task_workers.py``), the suite's real Redis for the locks.

Tasks are in ``tests/testapp/background.py`` (one per ``lock_mode``, key ``dt-<mode>:{name}``);
bodies record what they saw in Redis, so every check is made from the outside. Two workers run
at once, so run-time exclusion is exercised, not just queue order.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest

if django.VERSION < (5, 2):  # django-tasks-db needs Django >= 5.2 (tox's dj42 envs lack it)
    pytest.skip("the django-tasks database backend needs Django >= 5.2", allow_module_level=True)

from django_redislock import get_lock_info
from django_redislock.django_tasks import (
    SingleFlightTask,
    TaskOptionError,
    TaskSkippedError,
    TaskThrottledError,
    single_flight_task,
)
from django_redislock.singleflight import (
    COALESCE,
    MODES,
    UNTIL_EXECUTED,
    UNTIL_EXECUTING,
    UNTIL_EXPIRED,
    WHILE_EXECUTING,
    run_key,
)
from tests.conftest import wait_for
from tests.task_workers import DBWorker, TasksClient, migrate
from tests.testapp import background, tasks

LEASE = background.LOCK_TIMEOUT
WINDOW = background.EXPIRED_WINDOW
SLACK = 1.0
FINISHED = ("SUCCESSFUL", "FAILED")


# -- without a worker: definitions and keys (the test process's default ImmediateBackend) --------
def test_the_decorator_builds_a_django_task_with_validated_lock_options():
    task = background.mode_coalesce
    assert isinstance(task, SingleFlightTask)
    assert task.flight_rules.mode == COALESCE and task.takes_context
    # The context is not part of the key; positional, keyword and default arguments are one key.
    assert (
        task.lock_name(("a",))
        == task.lock_name((), {"name": "a", "seconds": 0.0})
        == ("dt-coalesce:a")
    )
    # using() keeps the lock options (the worker rebuilds every task with it).
    assert task.using(priority=5).flight_rules == task.flight_rules
    assert background.without_context.lock_name((3,)) == "dt-plain:3"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_mode": "until_done"}, ValueError),
        ({"lock_mode": "coalesce", "lock_permits": 3}, ValueError),
        ({"lock_on_busy": "wait"}, ValueError),
        ({"lock_timeout": float("nan")}, ValueError),
        ({"lock_key": "k:{missing}"}, ValueError),
        ({"timeout": 3}, TypeError),
        ({"task_permits": 0}, ValueError),
        ({"task_permits": 1.5}, TypeError),
        ({"lock_rate": (1, float("nan"))}, ValueError),
        ({"task_rate": "1/week"}, ValueError),
        ({"lock_mode": "while_executing", "lock_debounce": 1.0}, ValueError),
    ],
)
def test_bad_options_fail_when_the_task_is_defined(options, error):
    with pytest.raises(error):
        single_flight_task(background.without_context.func, **options)


def test_flow_control_options_are_accepted_and_debounce_is_refused_naming_celery():
    task = single_flight_task(
        background.without_context.func, task_rate="5/s", task_permits=2, lock_rate=(1, 2.0)
    )
    rules = task.flight_rules
    assert (rules.task_rate, rules.task_permits, rules.rate) == ("5/s", 2, (1, 2.0))
    with pytest.raises(TaskOptionError, match="celery") as caught:
        single_flight_task(background.without_context.func, lock_mode="debounce", lock_debounce=1.0)
    assert "run_after" in str(caught.value)


def test_a_direct_call_outside_a_worker_takes_no_lock():
    assert background.without_context.call(5) == 5
    assert get_lock_info("dt-plain:5") is None


# -- with the real database worker -------------------------------------------------------------
@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("django-tasks") / "tasks.sqlite3"
    migrate(path)
    return path


@pytest.fixture(scope="module")
def client(database: Path) -> Iterator[TasksClient]:
    c = TasksClient(database)
    yield c
    c.close()


@pytest.fixture(scope="module")
def workers(database: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DBWorker]]:
    logs = tmp_path_factory.mktemp("db-workers")
    started = [DBWorker(database, logs).start() for _ in range(2)]
    yield started
    for w in started:
        w.stop()


def enqueue(
    client: TasksClient,
    mode: str,
    name: str,
    *args: Any,
    queue: str | None = None,
    raw: bool = False,
) -> str:
    task = background.MODE_TASKS[mode].func.__name__
    reply = client.enqueue(task, name, *args, queue=queue, raw=raw)
    assert "id" in reply, reply
    return str(reply["id"])


def finished(client: TasksClient, result_id: str, timeout: float = 20) -> dict[str, Any]:
    return wait_for(
        lambda: (r := client.result(result_id))["status"] in FINISHED and r,
        timeout,
        what=f"result {result_id} to finish",
    )


def starts(key: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("start") if e["key"] == key]


def ends(key: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("end") if e["key"] == key]


def held_by(name: str) -> str | None:
    info = get_lock_info(name)
    return info.task_id if info is not None else None


def no_overlaps() -> bool:
    return tasks.observer().llen("overlaps") == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_an_enqueue_takes_what_the_mode_holds_and_deduplicates_without_a_row(client, mode):
    """On a queue no worker consumes: what publish alone does."""
    task = background.MODE_TASKS[mode]
    first = enqueue(client, mode, "queued-only", 0.0, queue="parked")
    second = enqueue(client, mode, "queued-only", 0.0, queue="parked")
    rows = client.count(task.module_path)
    if mode == WHILE_EXECUTING:
        assert (held_by(f"dt-{mode}:queued-only"), rows) == (None, 2)  # the worker decides
        assert second != first
    else:
        info = get_lock_info(f"dt-{mode}:queued-only")
        assert info is not None and (info.task_id, info.queued) == (first, True)
        assert second == first and rows == 1  # the duplicate's row was rolled back


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
@pytest.mark.parametrize("mode", MODES)
def test_a_run_ends_holding_what_the_mode_says(client, workers, mode, fail):
    name = f"end-{int(fail)}"
    key = f"dt-{mode}:{name}"
    result_id = enqueue(client, mode, name, 0.2, fail)
    row = finished(client, result_id)
    assert row["status"] == ("FAILED" if fail else "SUCCESSFUL")
    [start] = starts(key)
    assert start["task_id"] == result_id
    assert start["holder"] == (
        result_id if mode in (UNTIL_EXECUTED, WHILE_EXECUTING, UNTIL_EXPIRED) else None
    )
    if mode == UNTIL_EXPIRED:
        assert held_by(key) == result_id  # the window: deduplicated until it expires
        assert enqueue(client, mode, name) == result_id
        wait_for(lambda: held_by(key) is None, WINDOW + SLACK)
    else:
        wait_for(lambda: held_by(key) is None and held_by(run_key(key)) is None, 5)
    again = enqueue(client, mode, name)
    assert again != result_id and finished(client, again)["status"] == "SUCCESSFUL"


#: What a row written straight through the backend (past ``enqueue``: the ``send_task`` of Django
#: tasks) ends as when a worker picks it up while another body of its key runs.
RAW_ROW_OUTCOME = {
    UNTIL_EXECUTED: "FAILED",  # TaskSkippedError: the key is the runner's
    UNTIL_EXECUTING: "SUCCESSFUL",  # the key was released at start
    WHILE_EXECUTING: "FAILED",
    COALESCE: "SUCCESSFUL",  # becomes the follow-up and waits for the run slot
    UNTIL_EXPIRED: "FAILED",  # one run per window
}


@pytest.mark.slow
@pytest.mark.parametrize("raw", [False, True], ids=["enqueue", "backend-enqueue"])
@pytest.mark.parametrize("mode", MODES)
def test_an_enqueue_while_one_runs(client, workers, mode, raw):
    """The second worker is free, so whatever the second enqueue publishes is picked up at once."""
    name = f"busy-{int(raw)}"
    key = f"dt-{mode}:{name}"
    running = enqueue(client, mode, name, 1.5)
    wait_for(lambda: starts(key), 15)
    second = enqueue(client, mode, name, raw=raw)
    if raw:
        row = finished(client, second)
        assert row["status"] == RAW_ROW_OUTCOME[mode], row
        if row["status"] == "FAILED":
            assert row["exception"] == f"{TaskSkippedError.__module__}.TaskSkippedError"
            assert running in row["traceback"]
            assert [s["task_id"] for s in starts(key)] == [running]
    elif mode in (UNTIL_EXECUTED, UNTIL_EXPIRED):
        assert second == running  # deduplicated
    elif mode == WHILE_EXECUTING:
        # Published; the worker that picks it up finds the key busy: FAILED, TaskSkippedError.
        row = finished(client, second)
        assert row["status"] == "FAILED"
        assert row["exception"] == f"{TaskSkippedError.__module__}.TaskSkippedError"
        assert running in row["traceback"] and "busy" in row["traceback"]
    elif mode == UNTIL_EXECUTING:
        assert second != running  # the first is running, not queued: accepted, runs now
        assert finished(client, second)["status"] == "SUCCESSFUL"
    else:  # coalesce: one follow-up (later enqueues return it)
        assert second != running
        assert enqueue(client, mode, name) == second
    if mode == COALESCE:  # the follow-up starts after the first ends
        assert finished(client, second)["status"] == "SUCCESSFUL"
        first_end = next(e for e in ends(key) if e["task_id"] == running)
        follow_up = next(s for s in starts(key) if s["task_id"] == second)
        assert follow_up["at"] >= first_end["at"]
    assert finished(client, running)["status"] == "SUCCESSFUL"
    if mode != UNTIL_EXECUTING:
        assert no_overlaps()


@pytest.mark.slow
def test_coalesce_runs_once_more_after_a_burst_of_enqueues_during_a_run(client, workers):
    key = "dt-coalesce:burst"
    running = enqueue(client, COALESCE, "burst", 1.0)
    wait_for(lambda: starts(key), 15)
    follow_ups = set()
    for _ in range(4):
        follow_ups.add(enqueue(client, COALESCE, "burst", 0.1))
        last_enqueue = time.time()
    [follow_up] = follow_ups
    assert finished(client, follow_up)["status"] == "SUCCESSFUL"
    assert [s["task_id"] for s in starts(key)] == [running, follow_up]
    assert starts(key)[1]["at"] >= last_enqueue  # the last enqueue of the burst is not lost
    assert no_overlaps()


def rescheduled_as(row: dict[str, Any]) -> str | None:
    """The id a busy run was rescheduled as (from its ``TaskSkippedError``), if it was."""
    if "rescheduled as " not in row["traceback"]:
        return None
    return row["traceback"].rsplit("rescheduled as ", 1)[1].split(".")[0]


@pytest.mark.slow
def test_reschedule_enqueues_the_call_again_until_it_runs_after_the_busy_one(client, workers):
    key = "dt-while_executing:resched"
    running = client.enqueue("rescheduling", "resched", 1.2)["id"]
    wait_for(lambda: starts(key), 15)
    chain = [client.enqueue("rescheduling", "resched", 0.0)["id"]]
    # Each busy run ends FAILED (TaskSkippedError) and enqueues the call again 0.5 s later.
    while (row := finished(client, chain[-1]))["status"] == "FAILED":
        assert "TaskSkippedError" in row["exception"]
        chain.append(rescheduled_as(row))
        assert chain[-1] is not None and len(chain) < 10, chain
    assert len(chain) >= 2  # it was busy at first
    assert [s["task_id"] for s in starts(key)] == [running, chain[-1]]
    assert starts(key)[1]["at"] >= ends(key)[0]["at"]
    assert no_overlaps()


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_sigkilled_worker_never_blocks_a_key_longer_than_one_lock_timeout(
    client, database, tmp_path, mode
):
    # A worker of its own, on a queue the module's workers do not consume.
    victim = DBWorker(database, tmp_path, queue="kill").start()
    try:
        key = f"dt-{mode}:kill"
        published = time.monotonic()
        result_id = enqueue(client, mode, "kill", 30.0, queue="kill")
        wait_for(lambda: starts(key), 15)
        victim.kill()
        killed = time.monotonic()
        if mode == UNTIL_EXECUTING:
            assert held_by(key) is None  # released when the worker started it
        elif mode == UNTIL_EXPIRED:
            wait_for(lambda: held_by(key) is None, WINDOW + SLACK)
            assert time.monotonic() - published <= WINDOW + SLACK
        else:
            running = run_key(key) if mode == COALESCE else key
            assert held_by(running) == result_id  # nobody released it...
            wait_for(lambda: held_by(running) is None, LEASE + SLACK)
            assert time.monotonic() - killed <= LEASE + SLACK  # ...its lease did
        assert client.status(result_id) == "RUNNING"  # db_worker leaves it so
        # The key takes a new enqueue (parked: nobody runs it).
        assert enqueue(client, mode, "kill", 0.0, queue="parked") != result_id
    finally:
        victim.kill()


# -- flow control ---------------------------------------------------------------------------------
def throttled_chain(client: TasksClient, first: str) -> list[str]:
    """The results a call went through: each throttled one ends FAILED with TaskThrottledError
    naming the one enqueued after it; the last one ran."""
    chain = [first]
    while (row := finished(client, chain[-1]))["status"] == "FAILED":
        assert row["exception"] == f"{TaskThrottledError.__module__}.TaskThrottledError", row
        later = rescheduled_as(row)
        assert later is not None and len(chain) < 20, chain
        chain.append(later)
    return chain


@pytest.mark.slow
def test_lock_rate_holds_across_two_workers_by_enqueuing_throttled_runs_again(client, workers):
    key = "dt-rated:r"
    chains = [throttled_chain(client, client.enqueue("rated", "r")["id"]) for _ in range(4)]
    assert sum(len(chain) > 1 for chain in chains) >= 2  # four at once: most were throttled
    at = sorted(s["at"] for s in starts(key))
    assert len(at) == 4  # one body per call, however often it was throttled
    assert min(b - a for a, b in itertools.pairwise(at)) >= 0.5 - 0.08  # 2/s, never early


@pytest.mark.slow
def test_task_permits_run_one_body_of_the_task_at_a_time_across_workers(client, workers):
    first = client.enqueue("capped", "a", 0.8)["id"]
    wait_for(lambda: starts("dt-capped"), 15)
    second = throttled_chain(client, client.enqueue("capped", "b", 0.0)["id"])
    assert len(second) > 1  # the permit was taken: throttled, enqueued again
    assert finished(client, first)["status"] == "SUCCESSFUL"
    assert no_overlaps()
    [end_of_first] = [e for e in ends("dt-capped") if e["task_id"] == first]
    [start_of_second] = [s for s in starts("dt-capped") if s["task_id"] == second[-1]]
    assert start_of_second["at"] >= end_of_first["at"]
