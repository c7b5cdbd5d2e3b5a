"""``SingleFlightTask`` modes: each ``lock_mode`` on each delivery path, with a real prefork worker.

The matrix (``MODE_TASKS`` in ``tests/testapp/tasks.py``, one task per mode, ``lock_timeout=2``):
success, failure, ``retry()``, revoke, worker SIGKILL, same-key ``replace()``, ``send_task`` and a
second publisher process (what a second beat does: ``apply_async`` of the same key while one
runs). Each
row says what the mode promises on that path; the bodies record what they saw in Redis
(``tasks.events()``, ``overlaps``), so every check is made from the outside.

Option validation and the cost of a publish are checked without a worker (fast tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import _state as celery_state
from celery import shared_task

from django_redislock import get_lock_info, singleflight, stats
from django_redislock.celery import SKIPPED, DuplicateTaskError, SingleFlightTask
from django_redislock.operations import lock_holders
from django_redislock.singleflight import (
    COALESCE,
    MODES,
    UNTIL_EXECUTED,
    UNTIL_EXECUTING,
    UNTIL_EXPIRED,
    WHILE_EXECUTING,
    run_key,
)
from tests.celery_workers import WorkerProcess
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

QUEUE = "modes"
LEASE = tasks.MODE_LOCK_TIMEOUT
WINDOW = tasks.EXPIRED_WINDOW
SLACK = 1.0  # scheduling noise on a loaded 2-core machine

#: Modes that hold the key while a message waits in the broker.
QUEUED_HOLD = (UNTIL_EXECUTED, UNTIL_EXECUTING, COALESCE, UNTIL_EXPIRED)


def broker() -> redis.Redis:
    return redis.Redis.from_url(app.conf.broker_url)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    app.finalize()
    broker().delete(QUEUE)
    WorkerProcess.log_dir = tmp_path_factory.mktemp("celery-modes")
    w = WorkerProcess(QUEUE, concurrency=3).start()
    yield w
    w.stop()


def publish(mode: str, name: str, *args: Any, **options: Any) -> Any:
    return tasks.MODE_TASKS[mode].apply_async((name, *args), queue=QUEUE, **options)


def starts(key: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("start") if e["key"] == key]


def ends(key: str) -> list[dict[str, Any]]:
    return [e for e in tasks.events("end") if e["key"] == key]


def wait_starts(key: str, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (found := starts(key))[count - 1 :] and found,
        timeout,
        what=f"{count} start(s) of {key}",
    )


def held_by(name: str) -> str | None:
    info = get_lock_info(name)
    return info.task_id if info is not None else None


def key_free(mode: str, key: str) -> bool:
    """Neither the key nor (coalesce) its run slot is held."""
    return held_by(key) is None and (mode != COALESCE or held_by(run_key(key)) is None)


def no_overlaps() -> bool:
    return tasks.observer().llen("overlaps") == 0


def assert_released_after_the_run(mode: str, key: str, result: Any) -> None:
    """What the mode leaves once the task is over: nothing, or (until_expired) the window."""
    if mode == UNTIL_EXPIRED:
        # The window: a publish now is deduplicated; once it expires, one goes through.
        assert held_by(key) == result.id
        assert publish(mode, key.partition(":")[2]).id == result.id
        wait_for(lambda: held_by(key) is None, WINDOW + SLACK, what="the window to expire")
    else:
        wait_for(lambda: key_free(mode, key), 5, what=f"{key} to be free")


# -- options --------------------------------------------------------------------------------------
@pytest.fixture
def restore_finalizers() -> Iterator[None]:
    # Private to Celery: not in celery-types' stubs.
    before = set(celery_state._on_app_finalizers)  # type: ignore[attr-defined]
    yield
    celery_state._on_app_finalizers.intersection_update(before)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"lock_mode": "until_done"}, ValueError, "lock_mode"),
        ({"lock_mode": None, "lock_on_busy": "wait"}, ValueError, "lock_on_busy"),
        ({"lock_mode": "while_executing", "lock_permits": 0}, ValueError, "lock_permits"),
        ({"lock_mode": "while_executing", "lock_permits": 2.5}, TypeError, "lock_permits"),
        ({"lock_mode": "while_executing", "lock_permits": True}, TypeError, "lock_permits"),
        ({"lock_mode": "coalesce", "lock_permits": 2}, ValueError, "while_executing"),
        ({"lock_timeout": float("nan")}, ValueError, "lock_timeout"),
        ({"lock_timeout": float("inf")}, ValueError, "lock_timeout"),
        ({"lock_timeout": True}, TypeError, "lock_timeout"),
        ({"lock_queue_timeout": 1e12}, ValueError, "lock_queue_timeout"),
        ({"lock_reschedule_countdown": -1}, ValueError, "lock_reschedule_countdown"),
        ({"lock_reschedule_countdown": "5"}, TypeError, "lock_reschedule_countdown"),
        # Flow control: hostile values are refused where the task is defined.
        ({"task_permits": 0}, ValueError, "task_permits"),
        ({"task_permits": -3}, ValueError, "task_permits"),
        ({"task_permits": 2.5}, TypeError, "task_permits"),
        ({"task_permits": True}, TypeError, "task_permits"),
        ({"task_permits": "3"}, TypeError, "task_permits"),
        ({"lock_rate": "ten/s"}, ValueError, "lock_rate"),
        ({"lock_rate": "0/s"}, ValueError, "lock_rate"),
        ({"lock_rate": "-5/m"}, ValueError, "lock_rate"),
        ({"lock_rate": (1, float("nan"))}, ValueError, "lock_rate"),
        ({"lock_rate": (1, float("inf"))}, ValueError, "lock_rate"),
        ({"lock_rate": (1, -1.0)}, ValueError, "lock_rate"),
        ({"lock_rate": 10}, TypeError, "lock_rate"),
        ({"task_rate": "5/x"}, ValueError, "task_rate"),
        ({"task_rate": True}, TypeError, "task_rate"),
        ({"task_rate": (float("nan"), 1.0)}, TypeError, "task_rate"),
        # Debounce: the quiet period is required, and only there.
        ({"lock_mode": "debounce"}, ValueError, "lock_debounce"),
        ({"lock_mode": "debounce", "lock_debounce": float("nan")}, ValueError, "lock_debounce"),
        ({"lock_mode": "debounce", "lock_debounce": float("inf")}, ValueError, "lock_debounce"),
        ({"lock_mode": "debounce", "lock_debounce": -1}, ValueError, "lock_debounce"),
        ({"lock_mode": "debounce", "lock_debounce": "1"}, TypeError, "lock_debounce"),
        (
            {"lock_mode": "debounce", "lock_debounce": 2, "lock_debounce_max": 1},
            ValueError,
            "lock_debounce_max",
        ),
        (
            {"lock_mode": "debounce", "lock_debounce": 1, "lock_debounce_max": float("nan")},
            ValueError,
            "lock_debounce_max",
        ),
        ({"lock_debounce": 1.0}, ValueError, "need lock_mode='debounce'"),
        ({"lock_mode": "debounce", "lock_debounce": 1, "lock_permits": 2}, ValueError, "while"),
    ],
)
def test_bad_mode_options_fail_when_the_task_is_defined_naming_it(
    restore_finalizers, options, error, match
):
    app.finalize()

    def task_body(x: int) -> None: ...

    with pytest.raises(error, match=match) as caught:
        shared_task(base=SingleFlightTask, name="tests.bad_mode_options", **options)(task_body)
    assert "tests.bad_mode_options" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # as API.md promises, whatever the cause
    assert "tests.bad_mode_options" not in app.tasks


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_is_accepted_with_its_defaults(mode):
    rules = tasks.MODE_TASKS[mode].flight_rules
    assert (rules.mode, rules.permits, rules.on_busy) == (mode, 1, "skip")
    assert rules.lease == (WINDOW if mode == UNTIL_EXPIRED else LEASE)


# -- publish --------------------------------------------------------------------------------------
@pytest.fixture
def empty_unconsumed_queue() -> Iterator[None]:
    broker().delete("unconsumed")
    yield
    broker().delete("unconsumed")


def lock_scripts_run(client: redis.Redis) -> int:
    """Scripts run by the server so far (every lock operation is one script)."""
    stats_ = client.info("commandstats")
    return sum(
        stats_.get(f"cmdstat_{cmd}", {}).get("calls", 0) for cmd in ("evalsha", "eval", "fcall")
    )


@pytest.mark.parametrize("mode", MODES)
def test_what_a_publish_costs_and_holds_per_mode(mode, redis_client, empty_unconsumed_queue):
    task = tasks.UNCONSUMED_MODE_TASKS[mode]
    key = task.lock_name((1,))
    task.delay(0)  # scripts loaded, connections open
    broker().delete("unconsumed")
    before = lock_scripts_run(redis_client)
    first = task.delay(1)
    cost = lock_scripts_run(redis_client) - before
    if mode == WHILE_EXECUTING:
        # Nothing at publish: every call publishes; the worker decides.
        assert (cost, held_by(key)) == (0, None)
        assert task.delay(1).id != first.id
        assert broker().llen("unconsumed") == 2
    else:
        assert (cost, held_by(key)) == (1, first.id)  # one round trip, the key is the task's
        current = get_lock_info(key)
        assert current is not None and current.queued is True
        assert task.delay(1).id == first.id  # deduplicated
        assert broker().llen("unconsumed") == 1


def test_a_debounced_burst_costs_one_script_a_publish_and_sends_one_message(
    redis_client, empty_unconsumed_queue
):
    task = tasks.unconsumed_debounced
    task.delay(0)  # scripts loaded, connections open
    broker().delete("unconsumed")
    before = lock_scripts_run(redis_client)
    ids = {task.delay(1, value=v).id for v in range(4)}
    assert lock_scripts_run(redis_client) - before == 4  # one round trip each
    assert len(ids) == 1 and broker().llen("unconsumed") == 1  # one burst, one message
    assert task.delay(2).id not in ids  # another key, another burst
    # A publish that names another id, or carries a callback, cannot join silently.
    with pytest.raises(DuplicateTaskError) as caught:
        task.apply_async((1,), task_id="mine")
    assert caught.value.task_id in ids
    with pytest.raises(DuplicateTaskError):
        task.apply_async((1,), link=tasks.plain.s())
    with pytest.raises(TypeError, match="JSON"):
        task.delay(3, value=object())


def test_a_deduplicated_publish_is_not_a_failed_acquisition(empty_unconsumed_queue):
    stats.flush()
    task = tasks.UNCONSUMED_MODE_TASKS[UNTIL_EXECUTED]
    first = task.delay(2)
    assert [task.delay(2).id for _ in range(3)] == [first.id] * 3
    stats.flush()
    figures = stats.get_stats(task.lock_key)  # a task's row is its key template
    # Publish-time holds are quiet (the run counts the acquisition); a deduplication is never a
    # failed acquisition (task_deduplicated reports it).
    assert figures is None or (figures.failed, figures.acquired) == (0, 0), figures


# -- the matrix: success and failure ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
@pytest.mark.parametrize("mode", MODES)
def test_the_end_of_a_run_releases_what_the_mode_holds(worker, mode, fail):
    name = f"end-{int(fail)}"
    key = f"{mode}:{name}"
    result = publish(mode, name, 0.2, fail)
    [start] = wait_starts(key)
    # While it runs: the key holder per mode.
    if mode in (UNTIL_EXECUTED, WHILE_EXECUTING, UNTIL_EXPIRED):
        assert start["holder"] == result.id
    elif mode == UNTIL_EXECUTING:
        assert start["holder"] is None  # released when the worker started it
    else:  # coalesce: the follow-up slot is free, the run slot is the task's
        assert start["holder"] is None
    if fail:
        with pytest.raises(ValueError):
            result.get(timeout=10)
    else:
        assert result.get(timeout=10) == f"done {name}"
    assert_released_after_the_run(mode, key, result)
    again = publish(mode, name)
    assert again.id != result.id and again.get(timeout=10) == f"done {name}"


# -- retry ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_retry_runs_every_attempt_one_at_a_time(worker, mode):
    key = f"{mode}:retry"
    result = publish(mode, "retry", 0.1, False, 1, 1.5)  # one retry, 1.5 s later
    wait_for(lambda: result.state == "RETRY", 10, what="the retry to be published")
    if mode in QUEUED_HOLD:
        # Between attempts the retry is queued and holds the key: publishes return it.
        assert held_by(key) == result.id
        assert publish(mode, "retry").id == result.id
    else:
        assert held_by(key) is None
    assert result.get(timeout=15) == "done retry"
    assert [s["retries"] for s in starts(key)] == [0, 1]
    assert no_overlaps()
    assert_released_after_the_run(mode, key, result)


# -- revoke -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_revoking_a_queued_task_frees_its_key_unless_the_mode_keeps_a_window(worker, mode):
    key = f"{mode}:revoke"
    result = publish(mode, "revoke", countdown=1.0)
    assert held_by(key) == (result.id if mode in QUEUED_HOLD else None)
    result.revoke()
    wait_for(lambda: result.state == "REVOKED", 10, what="the worker to discard it")
    if mode == UNTIL_EXPIRED:
        assert held_by(key) == result.id  # held for lock_timeout after publish, whatever happens
    else:
        wait_for(lambda: key_free(mode, key), 5, what="the key to be released")
    assert starts(key) == []


# -- worker SIGKILL ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_sigkilled_worker_never_blocks_a_key_longer_than_one_lock_timeout(mode, tmp_path):
    WorkerProcess.log_dir = tmp_path
    victim = WorkerProcess(f"modes-kill-{mode}").start()
    try:
        key = f"{mode}:kill"
        published = time.monotonic()
        result = tasks.MODE_TASKS[mode].apply_async(("kill", 30), queue=victim.queue)
        wait_starts(key)
        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGKILL)  # main process and pool children at once
        killed = time.monotonic()
        victim.proc.wait(10)
        if mode == UNTIL_EXECUTING:
            assert held_by(key) is None  # released when the worker started it
        elif mode == UNTIL_EXPIRED:
            # The window started at publish; nobody renews it.
            wait_for(lambda: held_by(key) is None, WINDOW + SLACK)
            assert time.monotonic() - published <= WINDOW + SLACK
        else:
            running = run_key(key) if mode == COALESCE else key
            assert held_by(running) == result.id  # nobody released it...
            wait_for(lambda: key_free(mode, key), LEASE + SLACK)
            assert time.monotonic() - killed <= LEASE + SLACK  # ...its lease did
        # And the key takes a new publish.
        assert tasks.MODE_TASKS[mode].apply_async(("kill", 0), queue="unconsumed").id != result.id
    finally:
        victim.stop()
        broker().delete("unconsumed")


# -- replace ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_same_key_replacement_runs_after_the_replaced_body(worker, mode):
    key = f"{mode}:swap"
    result = publish(mode, "swap", 0.1, False, 0, 0.0, True)
    assert result.get(timeout=15) == "done swap"
    first, second = wait_starts(key, 2)
    assert first["task_id"] == second["task_id"] == result.id
    assert ends(key)[0]["at"] <= second["at"]
    assert no_overlaps()
    if mode != UNTIL_EXPIRED:
        wait_for(lambda: key_free(mode, key), 5, what="the key to be released")


# -- send_task while one runs -----------------------------------------------------------------
#: What a ``send_task`` delivery (no publish-time hold) does while another body of its key runs.
SEND_TASK_OUTCOME = {
    UNTIL_EXECUTED: SKIPPED,  # the key is the runner's
    UNTIL_EXECUTING: "SUCCESS",  # the key was released at start: allowed to run
    WHILE_EXECUTING: SKIPPED,  # at most one body
    COALESCE: "SUCCESS",  # queued as the follow-up, runs after the running one
    UNTIL_EXPIRED: SKIPPED,  # one run per window
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_send_task_delivery_while_one_runs(worker, mode):
    key = f"{mode}:st"
    running = publish(mode, "st", 1.5)
    wait_starts(key)
    other = app.send_task(tasks.MODE_TASKS[mode].name, args=["st", 0.0], queue=QUEUE)
    expected = SEND_TASK_OUTCOME[mode]
    wait_for(lambda: other.state == expected, 15, what=f"the send_task delivery to be {expected}")
    assert running.get(timeout=10) == "done st"
    if expected == SKIPPED:
        assert other.info["key"] == key
        assert [s["task_id"] for s in starts(key)] == [running.id]
    else:
        assert {s["task_id"] for s in starts(key)} == {running.id, other.id}
    if mode == COALESCE:
        [first_end] = [e for e in ends(key) if e["task_id"] == running.id]
        [follow_up] = [s for s in starts(key) if s["task_id"] == other.id]
        assert follow_up["at"] >= first_end["at"]
    if mode != UNTIL_EXECUTING:
        assert no_overlaps()


# -- a second publisher (a second beat) while one runs ----------------------------------------
class SecondPublisher:
    """Another process that publishes the task when told to, as a second beat would (it imports
    everything first, so its publish is not delayed by start-up)."""

    def __init__(self, mode: str, name: str) -> None:
        self.go = f"go:{uuid.uuid4().hex}"
        code = (
            "import django; django.setup(); from tests.testapp.celery_app import app; "
            "from tests.testapp import tasks; app.finalize(); "
            f"task = tasks.MODE_TASKS[{mode!r}]; task.lock_name(({name!r},)); "
            "print('ready', flush=True); "
            f"tasks.observer().blpop({self.go!r}, 60); "
            f"print(task.apply_async(({name!r},), queue={QUEUE!r}).id, flush=True)"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def publish(self) -> Any:
        tasks.observer().rpush(self.go, "go")
        out = self.proc.communicate(timeout=60)[0].strip()
        assert self.proc.returncode == 0, out
        return app.AsyncResult(out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_second_publisher_process_while_one_runs(worker, mode):
    key = f"{mode}:beat"
    other = SecondPublisher(mode, "beat")
    try:
        running = publish(mode, "beat", 1.5)
        wait_starts(key)
        second = other.publish()
    finally:
        other.stop()
    if mode in (UNTIL_EXECUTED, UNTIL_EXPIRED):
        assert second.id == running.id  # deduplicated
        assert running.get(timeout=10) == "done beat"
        assert len(starts(key)) == 1
    elif mode == WHILE_EXECUTING:
        assert second.id != running.id  # published; the worker skips it while the first runs
        wait_for(lambda: second.state == SKIPPED, 10)
        assert second.info["holder"] == running.id
        assert running.get(timeout=10) == "done beat"
    elif mode == UNTIL_EXECUTING:
        assert second.id != running.id  # the first is running, not queued: accepted
        assert second.get(timeout=10) == "done beat"
    else:  # coalesce: one follow-up, which later publishes return; it starts after the first
        assert second.id != running.id
        assert publish(mode, "beat").id == second.id
        assert second.get(timeout=15) == "done beat"
        first_end = next(e for e in ends(key) if e["task_id"] == running.id)
        follow_up = next(s for s in starts(key) if s["task_id"] == second.id)
        assert follow_up["at"] >= first_end["at"]
    if mode != UNTIL_EXECUTING:
        assert no_overlaps()


# -- coalesce: the last publish made while one runs is never dropped ---------------------------
@pytest.mark.slow
def test_coalesce_runs_once_more_after_every_burst_of_publishes_during_a_run(worker):
    key = "coalesce:burst"
    running = publish(COALESCE, "burst", 1.0)
    wait_starts(key)
    published_at = []
    ids = set()
    for _ in range(5):
        ids.add(publish(COALESCE, "burst", 0.2).id)
        published_at.append(time.time())
    assert len(ids) == 1 and running.id not in ids  # one follow-up for the whole burst
    [follow_up] = ids
    assert app.AsyncResult(follow_up).get(timeout=15) == "done burst"
    first, second = wait_starts(key, 2)
    assert (first["task_id"], second["task_id"]) == (running.id, follow_up)
    # The stale-data race: the run that follows starts after the LAST publish of the burst.
    assert second["at"] >= published_at[-1]
    assert no_overlaps()
    wait_for(lambda: key_free(COALESCE, key), 5)


# -- while_executing: permits and reschedule ---------------------------------------------------
@pytest.mark.slow
def test_while_executing_runs_at_most_lock_permits_bodies_per_key(worker):
    key = f"{WHILE_EXECUTING}:permits"
    results = [tasks.two_permits.apply_async(("permits", 1.5), queue=QUEUE) for _ in range(3)]
    wait_for(lambda: sum(r.state in ("SUCCESS", SKIPPED) for r in results) == 3, 20)
    assert sorted(r.state for r in results) == [SKIPPED, "SUCCESS", "SUCCESS"]
    assert max(int(n) for n in tasks.observer().lrange(f"concurrency:{key}", 0, -1)) == 2
    wait_for(lambda: held_by(key) is None, 5)


@pytest.mark.slow
def test_the_worker_frees_the_permit_of_a_dead_pool_child_before_its_lease_ends(worker):
    key = f"{WHILE_EXECUTING}:dead-child"
    result = tasks.two_permits.apply_async(("dead-child", 60), queue=QUEUE)
    [start] = wait_starts(key)
    [permit] = lock_holders(key)
    assert (permit.kind, permit.permits, permit.task_id) == ("semaphore", 2, result.id)
    os.kill(start["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # The lease is 20 s and was renewed; billiard notices a dead child at once or within 5 s.
    wait_for(lambda: lock_holders(key) == [], 15, what="the main process to free the permit")
    assert time.monotonic() - killed < 10
    wait_for(lambda: result.state == "FAILURE", 10)


@pytest.mark.slow
def test_reschedule_publishes_a_busy_delivery_again_without_counting_a_retry(worker):
    key = f"{WHILE_EXECUTING}:resched"
    running = tasks.rescheduling.apply_async(("resched", 1.2), queue=QUEUE)
    wait_starts(key)
    later = tasks.rescheduling.apply_async(("resched", 0.0), queue=QUEUE)
    wait_for(lambda: later.state == "RETRY", 10, what="the busy delivery to be rescheduled")
    assert later.get(timeout=15) == "done resched"
    first, second = wait_starts(key, 2)
    assert first["task_id"] == running.id
    assert second["task_id"] == later.id and second["retries"] == 0  # not a retry
    assert second["at"] >= ends(key)[0]["at"]
    assert running.get(timeout=5) == "done resched"
    assert no_overlaps()


def test_the_singleflight_module_imports_no_task_framework():
    """The mode semantics are shared by every integration: they import neither Celery nor a
    Django tasks package."""
    import ast

    with open(singleflight.__file__) as source:
        tree = ast.parse(source.read())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported and not {m for m in imported if m.startswith(("celery", "django_tasks"))}
    assert not {m for m in imported if m.startswith("django.tasks")}
