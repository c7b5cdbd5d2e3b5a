"""Per-``PeriodicTask`` "skip while still running", chosen by the schedule entry's headers: a real
``celery beat`` with ``LeaderDatabaseScheduler`` (django-celery-beat) and a real prefork worker
running a plain ``@shared_task`` that knows nothing about locks."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.exceptions import WorkerLostError
from django.conf import settings

from django_redislock import get_lock_info
from django_redislock.celery.periodic import (
    HEADER,
    SingleFlightSpec,
    on_task_failure,
    on_task_revoked,
    spec_from_header,
)
from tests.beat_processes import BeatProcess
from tests.celery_workers import WorkerProcess
from tests.conftest import ROOT, subprocess_env, wait_for

DATABASE = "django_redislock.celery.beat_database:LeaderDatabaseScheduler"
DURATION = 2.5  # each run; the entries are due every second


class BeatAppWorker(WorkerProcess):
    """A worker of ``tests.beatapp`` (its settings and database), not of ``tests.testapp``."""

    def __init__(self, queue: str, env: dict[str, str], log_dir: Path, **kwargs: Any) -> None:
        super().__init__(queue, **kwargs)
        self.env = env
        self.log = log_dir / f"{self.name}.log"

    def argv(self) -> list[str]:
        worker = super().argv()[super().argv().index("worker") :]
        return [sys.executable, "-m", "celery", "-A", "tests.beatapp.celery_app", *worker]

    def start(self) -> BeatAppWorker:
        """Wait for the worker's own "ready." line: a ping would go through the test process's
        ``tests.testapp`` app, whose pooled broker connection other tests may have killed."""
        self.spawn()
        proc = self.proc
        assert proc is not None
        wait_for(lambda: proc.poll() is not None or " ready." in self.output(), 30, 0.05)
        assert proc.poll() is None, self.output()
        return self

    def spawn(self) -> BeatAppWorker:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=ROOT,
                env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.beatapp.settings", **self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self


@pytest.fixture
def recorder() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    yield client
    client.close()


def runs(recorder: redis.Redis, key: str) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(start, end or None) of each run recorded under ``key``, in start order."""
    events = [json.loads(raw) for raw in recorder.lrange(key, 0, -1)]
    ends = {e["id"]: e for e in events if e["event"] == "end"}
    return [(e, ends.get(e["id"])) for e in events if e["event"] == "start"]


def overlapping(found: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> int:
    """How many runs started before the previous one ended."""
    return sum(
        1
        for (_, end), (start, _) in itertools.pairwise(found)
        if end is None or start["at"] < end["at"]
    )


@pytest.mark.slow
def test_a_periodic_task_whose_headers_ask_for_it_never_overlaps_its_previous_run(
    tmp_path: Path, recorder: redis.Redis
) -> None:
    tag = uuid.uuid4().hex[:8]
    queue, guarded, plain = f"periodic-{tag}", f"runs:guarded:{tag}", f"runs:plain:{tag}"
    env = {
        "REDISLOCK_TEST_DJANGO_CELERY_BEAT": "1",
        "REDISLOCK_TEST_DB": str(tmp_path / "beat.sqlite3"),
        "REDISLOCK_TEST_SENDS_KEY": f"sends:{tag}",
    }
    entries = [
        {
            "name": "guarded",
            "task": "tests.beatapp.tasks.report",
            "every": 1,
            "args": [guarded, DURATION],
            "queue": queue,
            "headers": {HEADER: {"timeout": 10}},
        },
        {  # the control: same task, same schedule, no header
            "name": "plain",
            "task": "tests.beatapp.tasks.report",
            "every": 1,
            "args": [plain, DURATION],
            "queue": queue,
        },
    ]
    subprocess.run(
        [sys.executable, "-m", "tests.beatapp.periodic_tasks", json.dumps(entries)],
        cwd=ROOT,
        env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.beatapp.settings", **env),
        check=True,
        timeout=60,
    )
    worker = BeatAppWorker(queue, env, tmp_path, concurrency=4)
    beat = BeatProcess(tmp_path, "db", scheduler=DATABASE, env=env)
    try:  # stopped by PID below even if it never got ready
        worker.start()
        beat.start()
        first, _ = wait_for(lambda: next(iter(runs(recorder, guarded)), None), 30, 0.02)
        # While it runs, the worker holds the entry's key for the task id (re-entered, not queued).
        info = get_lock_info("periodic:guarded")
        assert info is not None and info.task_id == first["id"] and not info.queued, info
        wait_for(
            lambda: sum(1 for _, end in runs(recorder, guarded) if end) >= 2,
            30,
            0.05,
            what="two complete runs of the guarded entry",
        )
        assert beat.terminate() == 0
        wait_for(lambda: all(end for _, end in runs(recorder, guarded)), 10, 0.05)
        wait_for(lambda: get_lock_info("periodic:guarded") is None, 5, 0.02, what="the release")
    finally:
        beat.kill()
        worker.stop()
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)

    guarded_runs = runs(recorder, guarded)
    assert overlapping(guarded_runs) == 0, guarded_runs
    assert overlapping(runs(recorder, plain)) >= 1  # without the header, runs pile up
    output = beat.output()
    assert "'guarded' not sent: its previous run is still queued or running" in output, output
    assert "'plain' not sent" not in output
    sent = [json.loads(raw) for raw in recorder.lrange(f"sends:{tag}", 0, -1)]
    flagged = [s["single_flight"] for s in sent if s["single_flight"]]
    assert flagged and all(f["key"] == "periodic:guarded" and f["token"] for f in flagged)
    assert len(flagged) == len(guarded_runs)  # every tick that was sent ran; the rest were skipped


def test_the_header_is_true_or_an_object_of_known_options() -> None:
    assert spec_from_header(True, "nightly") == SingleFlightSpec(key="periodic:nightly")
    assert spec_from_header(None, "nightly") is None
    assert spec_from_header(False, "nightly") is None
    spec = spec_from_header({"key": "k", "timeout": 60, "queue_timeout": 3600}, "nightly")
    assert spec == SingleFlightSpec(key="k", timeout=60.0, queue_timeout=3600.0)
    assert spec is not None and spec.queue_lease == 3600.0
    with pytest.raises(ValueError, match="unknown option"):
        spec_from_header({"timeuot": 60}, "nightly")
    with pytest.raises(ValueError, match="'timeout' must be a positive number"):
        spec_from_header({"timeout": "60"}, "nightly")
    with pytest.raises(ValueError, match="must be true or an object"):
        spec_from_header("yes", "nightly")


def _queued_hold(task_id: str) -> dict[str, Any]:
    """Take the key as the scheduler does at publish; the headers its message would carry."""
    spec = SingleFlightSpec(key="periodic:nightly", timeout=30)
    lock = spec.lock(task_id, queued=True)
    assert lock.acquire(blocking=False)
    _, token = lock.detach()
    return {HEADER: spec.published(token), "periodic_task_name": "nightly"}


def test_a_revoked_or_expired_message_frees_its_key_in_the_worker_main_process() -> None:
    headers = _queued_hold("task-1")
    info = get_lock_info("periodic:nightly")
    assert info is not None and info.task_id == "task-1" and info.queued
    # What Celery hands to task_revoked receivers: the worker Request of the message.
    on_task_revoked(sender=None, request=SimpleNamespace(id="task-1", request_dict=headers))
    assert get_lock_info("periodic:nightly") is None


def test_a_pool_child_that_died_has_its_key_freed_by_the_main_process() -> None:
    headers = _queued_hold("task-2")
    task = SimpleNamespace(request=SimpleNamespace(headers=headers))
    on_task_failure(sender=task, task_id="task-2", exception=ValueError("the body failed"))
    assert get_lock_info("periodic:nightly") is not None  # the body's own postrun releases that
    on_task_failure(sender=task, task_id="task-2", exception=WorkerLostError("SIGKILL"))
    assert get_lock_info("periodic:nightly") is None
