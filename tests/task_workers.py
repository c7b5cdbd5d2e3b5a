"""Real processes of the Django-tasks backport for ``tests/test_django_tasks.py``: the database
``db_worker`` and an enqueuing client, both on one file-based SQLite database, stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, subprocess_env, wait_for

__all__ = ["DBWorker", "TasksClient", "migrate", "tasks_env"]

SETTINGS = "tests.testapp.tasks_settings"


def tasks_env(database: Path) -> dict[str, str]:
    return subprocess_env(DJANGO_SETTINGS_MODULE=SETTINGS, REDISLOCK_TASKS_DB=str(database))


def migrate(database: Path) -> None:
    """Create the shared database (the backport's tables included)."""
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=ROOT,
        env=tasks_env(database),
        check=True,
        timeout=120,
    )


class DBWorker:
    """``manage.py db_worker`` (``python -m django db_worker``) in its own session."""

    def __init__(self, database: Path, log_dir: Path, queue: str = "default") -> None:
        self.database = database
        self.queue = queue
        self.worker_id = f"w-{uuid.uuid4().hex[:8]}"
        self.log = log_dir / f"{self.worker_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DBWorker:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "db_worker",
                    "--interval",
                    "0.05",
                    "--no-startup-delay",
                    "--no-reload",
                    "--worker-id",
                    self.worker_id,
                    "--queue-name",
                    self.queue,
                ],
                cwd=ROOT,
                env=tasks_env(self.database),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc
        wait_for(
            lambda: proc.poll() is not None or "Starting worker" in self.output(),
            30,
            what=f"db_worker {self.worker_id} to start",
        )
        assert proc.poll() is None, self.output()
        return self

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        """SIGKILL the worker (nothing runs its clean-up)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    stop = kill


class TasksClient:
    """The enqueuing process (``tests/tasks_client.py``): one JSON command, one JSON reply."""

    def __init__(self, database: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.tasks_client"],
            cwd=ROOT,
            env=tasks_env(database),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._readline()) == {"ready": True}

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tasks client exited with {self.proc.wait(10)}")
        return line

    def send(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self._readline())
        return reply

    def enqueue(
        self, task: str, *args: Any, queue: str | None = None, raw: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """Enqueue through the task (``raw``: through its backend, as ``send_task`` would)."""
        return self.send(
            op="enqueue", task=task, args=list(args), kwargs=kwargs, queue=queue, raw=raw
        )

    def result(self, result_id: str) -> dict[str, Any]:
        return self.send(op="result", id=result_id)

    def status(self, result_id: str) -> str:
        return str(self.result(result_id)["status"])

    def count(self, task: str) -> int:
        return int(self.send(op="count", task=task)["count"])

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
