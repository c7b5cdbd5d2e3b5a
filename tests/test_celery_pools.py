"""``SingleFlightTask`` and the lock watchdog under ``celery worker -P gevent|eventlet|threads``.

Real worker subprocesses (``tests/celery_workers.py``), one per pool, four task slots each. Under
gevent and eventlet the worker monkey-patches ``threading``, so the watchdog thread is a greenlet
and each task is a "thread" of its own; prefork is covered by ``tests/test_celery_owner.py`` and
``tests/faults/test_celery_worker_crash.py``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redislock import get_lock_info
from django_redislock.celery import SKIPPED
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

pytestmark = pytest.mark.slow  # real worker subprocesses

GREENLET_POOLS = ("gevent", "eventlet")


@pytest.fixture(scope="module", autouse=True)
def _log_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    app.finalize()
    WorkerProcess.log_dir = tmp_path_factory.mktemp("celery-pools")


@pytest.fixture(scope="module", params=["gevent", "eventlet", "threads"])
def worker(request: pytest.FixtureRequest) -> Iterator[WorkerProcess]:
    queue = f"pool-{request.param}"
    client = redis.Redis.from_url(app.conf.broker_url)
    client.delete(queue)
    client.close()
    w = WorkerProcess(queue, pool=request.param, concurrency=4).start()
    yield w
    w.stop()


def send(worker: WorkerProcess, task: Any, *args: Any) -> Any:
    return task.apply_async(args, queue=worker.queue)


def started(key: str) -> dict[str, Any]:
    return wait_for(lambda: [e for e in tasks.events("start") if e["key"] == key], 20)[0]


def no_overlaps() -> bool:
    return tasks.observer().llen("overlaps") == 0


def test_one_body_per_key_whatever_the_delivery_path(worker):
    running = send(worker, tasks.work, "one", 1.0)
    start = started("work:one")
    assert send(worker, tasks.work, "one", 0.0).id == running.id  # publishes nothing
    bypass = app.send_task("tests.testapp.tasks.work", args=["one", 0.0], queue=worker.queue)
    wait_for(lambda: bypass.state == SKIPPED, 20)
    assert running.get(timeout=20) == "done one"
    assert len(tasks.events("start")) == 1 and no_overlaps()
    # The lock shows the worker process (gevent/eventlet/threads run tasks in it) and the thread
    # (greenlet) of the body.
    assert (start["holder"], start["holder_pid"], start["queued"]) == (
        running.id,
        worker.pid,
        False,
    )
    assert start["holder_thread"] == start["thread"]
    assert start["holder_host"] == socket.gethostname()
    wait_for(lambda: get_lock_info("work:one") is None, 5)


def test_the_lease_is_renewed_while_a_body_runs_longer_than_lock_timeout(worker):
    result = send(worker, tasks.short_lease, "long", 3.5)  # lock_timeout=1: 3.5 leases
    assert result.get(timeout=20) == "done long"
    [start], [end] = tasks.events("start"), tasks.events("end")
    assert end["lock_lost"] is False
    assert (end["holder"], end["token"]) == (result.id, start["token"])  # the same hold throughout
    wait_for(lambda: get_lock_info("short:long") is None, 5)


def test_success_and_failure_release_the_key(worker):
    ok, bad = send(worker, tasks.work, "ok", 0.2), send(worker, tasks.work, "bad", 0.2, True)
    assert ok.get(timeout=20) == "done ok"
    with pytest.raises(ValueError):
        bad.get(timeout=20)
    wait_for(lambda: get_lock_info("work:ok") is None and get_lock_info("work:bad") is None, 5)


def test_concurrent_tasks_taking_a_plain_lock_exclude_each_other(worker):
    """``Lock``'s default owner is (process, thread): each greenlet must count as a thread."""
    results = [send(worker, tasks.guarded, "g", 0.3) for _ in range(4)]
    for result in results:
        result.get(timeout=20)
    starts = tasks.events("start")
    assert len(starts) == 4 and no_overlaps()
    assert len({s["thread"] for s in starts}) > 1  # really run by different threads/greenlets


def test_a_body_that_never_yields_longer_than_the_lease(worker):
    """Threads: the watchdog thread gets the GIL and renews. Greenlets: the watchdog cannot run
    until the body yields, so the lease lapses; the task finds out (``self.lock_lost``, logged at
    ERROR), it is not silent."""
    lost = send(worker, tasks.spinning, "s", 2.0).get(timeout=20)  # lock_timeout=1
    if worker.pool in GREENLET_POOLS:
        assert lost is True
        wait_for(lambda: "lost its lock 'spin:s'" in worker.output(), 5)
    else:
        assert lost is False


@pytest.mark.parametrize(
    ("pool", "patch"),
    [
        ("gevent", "from gevent import monkey; monkey.patch_all(thread=False)"),
        ("eventlet", "import eventlet; eventlet.monkey_patch(thread=False)"),
    ],
)
def test_a_greenlet_pool_without_patched_threading_refuses_to_start(pool, patch):
    """Measured without the check: four such tasks were all inside ``with Lock("x")`` at once."""
    refused = WorkerProcess(f"refuse-{pool}", pool=pool, concurrency=4, preamble=patch).spawn()
    try:
        assert refused.proc is not None
        assert refused.proc.wait(30) != 0
    finally:
        refused.stop()
    output = refused.output()
    assert f"the {pool} pool runs every task as a greenlet" in output, output
    assert "supported pools: prefork, threads, solo" in output
    assert f"{refused.name} ready" not in output


def test_greenlet_pools_are_recognised_by_alias_path_or_class():
    from celery.concurrency.gevent import TaskPool as GeventPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    from django_redislock.celery.worker import _greenlet_pool

    class CustomGeventPool(GeventPool):  # e.g. CELERY_CUSTOM_WORKER_POOL
        pass

    assert _greenlet_pool("gevent") == "gevent" and _greenlet_pool("eventlet") == "eventlet"
    assert _greenlet_pool("celery.concurrency.eventlet:TaskPool") == "eventlet"
    assert _greenlet_pool(GeventPool) == _greenlet_pool(CustomGeventPool) == "gevent"
    for other in ("prefork", "threads", "solo", ThreadPool, None):
        assert _greenlet_pool(other) is None
