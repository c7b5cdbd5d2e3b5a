"""``SingleFlightTask`` when workers die: a real ``celery worker -P prefork`` subprocess whose pool
children (or the whole worker) get SIGKILLed, terminated by ``revoke`` or SIGTERMed.

Each worker consumes its own queue, so it never races the in-process worker of test_celery.py
(see ``tests/celery_workers.py``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import cast

import pytest
import redis

from django_redislock import Lock, LockInfo, get_lock_info
from django_redislock.celery import SKIPPED
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

pytestmark = pytest.mark.slow  # real worker subprocesses

LOCK_TIMEOUT = 2.0  # lock_timeout of tasks.work
SLACK = 0.5  # scheduling noise on a loaded 2-core machine


@pytest.fixture(scope="module", autouse=True)
def _clean_broker(tmp_path_factory: pytest.TempPathFactory) -> None:
    app.finalize()
    redis.Redis.from_url(app.conf.broker_url).flushdb()
    WorkerProcess.log_dir = tmp_path_factory.mktemp("celery-workers")


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    w = WorkerProcess("crash").start()
    yield w
    w.stop()


def started(key: str) -> dict:
    return wait_for(lambda: [e for e in tasks.events("start") if e["key"] == key], 15)[0]


def test_worker_start_up_leaves_other_workers_live_locks_alone(worker):
    # db 0 was flushed before this test: take the "other worker's" lock again, then restart.
    other = Lock(
        "work:live",
        owner="task-of-another-worker",
        task_id="task-of-another-worker",
        timeout=60,
        auto_renew=False,
    )
    assert other.acquire(blocking=False)
    second = WorkerProcess("crash").start()
    try:
        info = get_lock_info("work:live")
        assert info is not None and info.task_id == "task-of-another-worker"
        skipped = app.send_task("tests.testapp.tasks.work", args=["live"], queue="crash")
        wait_for(lambda: skipped.state == SKIPPED, 15)
        assert tasks.events("start") == []
    finally:
        second.stop()
        other.release(all_holds=True)


def test_a_sigkilled_pool_child_frees_the_key_within_one_lock_timeout(worker):
    result = tasks.work.apply_async(("k", 30), queue="crash")
    child = started("work:k")["pid"]
    assert child != worker.proc.pid
    os.kill(child, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: get_lock_info("work:k") is None, LOCK_TIMEOUT + SLACK)
    assert time.monotonic() - killed <= LOCK_TIMEOUT + SLACK
    wait_for(lambda: result.state == "FAILURE", 10)
    again = tasks.work.apply_async(("k", 0), queue="crash")
    assert again.id != result.id and again.get(timeout=15) == "done k"


def test_the_worker_releases_a_dead_childs_key_before_its_lease_ends(worker):
    lease = 20.0  # tasks.slow_lease; renewed every 6.7 s, so the lease alone keeps it >= 13 s
    result = tasks.slow_lease.apply_async(("k", 60), queue="crash")
    os.kill(started("slow:k")["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # billiard notices a dead child at once or, at worst, at its 5 s maintenance tick.
    wait_for(lambda: get_lock_info("slow:k") is None, lease + SLACK)
    assert time.monotonic() - killed < lease / 2
    wait_for(lambda: result.state == "FAILURE", 10)


def test_revoke_with_terminate_releases_the_key(worker):
    result = tasks.slow_lease.apply_async(("t", 60), queue="crash")
    started("slow:t")
    result.revoke(terminate=True)
    revoked = time.monotonic()
    wait_for(lambda: get_lock_info("slow:t") is None, 20)
    assert time.monotonic() - revoked < 2
    wait_for(lambda: result.state == "REVOKED", 10)


def test_a_sigkilled_worker_frees_the_key_within_one_lock_timeout():
    victim = WorkerProcess("crash-kill").start()
    try:
        result = tasks.work.apply_async(("all", 30), queue="crash-kill")
        start = started("work:all")
        # Kill it in steady state: once the watchdog has renewed the running lease (its TTL is
        # then longer than what would be left of the lease set when the body started).
        wait_for(
            lambda: (
                cast(LockInfo, get_lock_info("work:all")).expires_in
                > LOCK_TIMEOUT - (time.time() - start["at"]) + 0.2
            ),
            LOCK_TIMEOUT,
            what="the first renewal",
        )
        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGKILL)  # main process and pool children at once
        killed = time.monotonic()
        victim.proc.wait(10)
        info = get_lock_info("work:all")
        assert info is not None and info.task_id == result.id  # nobody released it...
        wait_for(lambda: get_lock_info("work:all") is None, LOCK_TIMEOUT + SLACK)
        assert time.monotonic() - killed <= LOCK_TIMEOUT + SLACK  # ...its lease did
    finally:
        victim.stop()


def test_a_warm_shutdown_finishes_the_running_task_and_releases_its_key():
    leaving = WorkerProcess("crash-term").start()
    try:
        result = tasks.work.apply_async(("warm", 1.5), queue="crash-term")
        started("work:warm")
        assert leaving.proc is not None
        leaving.proc.send_signal(signal.SIGTERM)
        assert leaving.proc.wait(30) == 0, leaving.output()
        assert result.get(timeout=5) == "done warm"
        assert get_lock_info("work:warm") is None
    finally:
        leaving.stop()
