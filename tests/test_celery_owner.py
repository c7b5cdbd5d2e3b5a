"""Who ``list_locks``/``get_lock_info`` say holds a Celery task's key, with a real prefork worker.

Queued: the publisher (host, pid, thread), ``queued=True``. Running: the pool child that runs the
body, ``queued=False``. A retry or a same-key ``replace()`` waiting in the broker is queued again,
published by the child that ran the previous attempt. (A queued task without a worker is in
``tests/test_celery.py``.)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redislock import LockInfo, get_lock_info, list_locks
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

pytestmark = pytest.mark.slow  # a real prefork worker subprocess

QUEUE = "owner"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    app.finalize()
    client = redis.Redis.from_url(app.conf.broker_url)
    client.delete(QUEUE)
    client.close()
    WorkerProcess.log_dir = tmp_path_factory.mktemp("celery-owner")
    w = WorkerProcess(QUEUE, pool="prefork", concurrency=2).start()
    yield w
    w.stop()


def starts(key: str, count: int = 1) -> list[dict[str, Any]]:
    found = wait_for(
        lambda: (s := [e for e in tasks.events("start") if e["key"] == key])[count - 1 :] and s,
        20,
        what=f"{count} start(s) of {key}",
    )
    return found[:count]


def queued_info(key: str) -> LockInfo:
    return wait_for(
        lambda: (i := get_lock_info(key)) is not None and i.queued and i,
        20,
        what=f"{key} to be queued",
    )


def test_a_running_task_shows_the_pool_child_that_runs_it(worker):
    result = tasks.work.apply_async(("child", 2.0), queue=QUEUE)
    [start] = starts("work:child")
    child = start["pid"]
    assert child not in (worker.pid, os.getpid())  # a pool child, not the main process
    # Seen from inside the body...
    assert (start["holder"], start["holder_pid"], start["queued"]) == (result.id, child, False)
    assert start["holder_thread"] == start["thread"]
    assert start["holder_host"] == socket.gethostname()
    # ... and from outside, while it runs.
    [listed] = list_locks(match="work:child")
    assert (listed.task_id, listed.pid, listed.thread) == (result.id, child, start["thread"])
    assert listed.queued is False
    assert result.get(timeout=15) == "done child"


def test_a_retry_is_queued_by_the_child_that_published_it_until_a_child_runs_it(worker):
    result = tasks.retrying.apply_async(("owner", 1, 1.5), queue=QUEUE)  # one retry, countdown 1.5
    [first] = starts("retry:owner")
    between = queued_info("retry:owner")
    assert (between.task_id, between.pid, between.thread) == (
        result.id,
        first["pid"],
        first["thread"],
    )
    assert between.expires_in > 2.0  # the queued lease: lock_timeout 2 + countdown 1.5
    second = starts("retry:owner", 2)[1]
    assert second["retries"] == 1
    assert (second["holder"], second["holder_pid"], second["queued"]) == (
        result.id,
        second["pid"],
        False,
    )
    assert result.get(timeout=15) == 1
    wait_for(lambda: get_lock_info("retry:owner") is None, 5)


def test_a_same_key_replacement_is_queued_then_shown_running(worker):
    result = tasks.replacing.apply_async(("swap", True, 1.5), queue=QUEUE)
    [replaced] = starts("work:swap")
    between = queued_info("work:swap")
    assert (between.task_id, between.pid) == (result.id, replaced["pid"])
    replacement = starts("work:swap", 2)[1]
    assert (replacement["holder"], replacement["holder_pid"], replacement["queued"]) == (
        result.id,
        replacement["pid"],
        False,
    )
    wait_for(lambda: get_lock_info("work:swap") is None, 10)
    assert tasks.observer().llen("overlaps") == 0
