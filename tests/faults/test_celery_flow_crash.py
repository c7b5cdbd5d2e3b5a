"""Flow control and debounce when a worker is SIGKILLed (issue 30): a dead worker's task permit
comes back within its lease, and a debounced burst whose worker died before the run still runs.

Crash tests, so ``make test-faults`` runs them; the workers and helpers are those of
``tests/test_celery_flow.py``.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from django_redislock.operations import lock_holders
from django_redislock.singleflight import permit_name
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.test_celery_flow import (  # noqa: F401 - workers is a fixture
    QUEUE,
    SLACK,
    broker,
    debounced_runs,
    publish_debounced,
    starts,
    workers,  # a fixture, used by name (usefixtures)
)
from tests.testapp import tasks
from tests.testapp.celery_app import app


@pytest.mark.usefixtures("workers")
def test_a_sigkilled_workers_task_permit_comes_back_within_its_lease(tmp_path):
    WorkerProcess.log_dir = tmp_path
    victim = WorkerProcess("flow-kill").start()
    name = permit_name(tasks.one_permit.flight_rules)
    lease = tasks.one_permit.flight_rules.lease
    try:
        result = tasks.one_permit.apply_async(("kill", 30), queue=victim.queue)
        wait_for(lambda: starts("one-permit:kill"), 15)
        [permit] = lock_holders(name)
        assert (permit.kind, permit.task_id) == ("semaphore", result.id)
        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGKILL)
        killed = time.time()
        victim.proc.wait(10)
        # At the cap meanwhile: a run of another key is throttled until the permit is back.
        waiting = tasks.one_permit.apply_async(("next",), queue=QUEUE)
        wait_for(
            lambda: all(p.task_id != result.id for p in lock_holders(name)),
            lease + SLACK,
            what="the dead worker's permit to expire",
        )
        assert time.time() - killed <= lease + SLACK
        assert waiting.get(timeout=15) == "next"
        [run] = starts("one-permit:next")
        assert run["at"] >= killed
    finally:
        victim.stop()
        broker().delete("flow-kill")


def test_a_worker_killed_between_the_burst_and_its_run_does_not_lose_the_run(tmp_path):
    WorkerProcess.log_dir = tmp_path
    queue = "flow-debounce-kill"
    broker().delete(queue)
    victim = WorkerProcess(queue).start()
    survivor = WorkerProcess(queue)
    try:
        ids = {publish_debounced("lost", value, queue=queue)[0] for value in (1, 2, 3)}
        [flight_id] = ids
        time.sleep(0.2)  # the victim has the message (it waits for its countdown there)
        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(10)
        assert debounced_runs("lost") == []
        survivor.start()
        # Its rescuer publishes the run again once it is overdue (RESCUE_GRACE after due).
        assert app.AsyncResult(flight_id).get(timeout=30) == 3
        [run] = debounced_runs("lost")
        assert run["task_id"] == flight_id
    finally:
        victim.stop()
        survivor.stop()
        broker().delete(queue)
