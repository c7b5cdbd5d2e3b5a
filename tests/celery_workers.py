"""Real ``celery worker`` subprocesses for the Celery tests, with any pool, stopped by PID.

Each worker consumes a queue of its own, so it never races the in-process worker of
``tests/test_celery.py`` or another module's workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from tests.conftest import ROOT, subprocess_env, wait_for
from tests.testapp.celery_app import app

__all__ = ["WorkerProcess"]


class WorkerProcess:
    """``celery -A tests.testapp.celery_app worker -P <pool>`` in its own session.

    ``preamble``: Python code run before the worker is created (e.g. a partial monkey-patch); the
    worker is then started with ``app.worker_main`` instead of the ``celery`` command, which would
    monkey-patch by itself.
    """

    log_dir: Path = Path(tempfile.gettempdir())

    def __init__(
        self,
        queue: str,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        preamble: str | None = None,
    ) -> None:
        self.queue = queue
        self.pool = pool
        self.concurrency = concurrency
        self.preamble = preamble
        self.name = f"{queue}-{uuid.uuid4().hex[:6]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.log_dir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        worker = [
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "--without-mingle",
            "--without-gossip",
            "-Q",
            self.queue,
            "-n",
            self.name,
            "--loglevel",
            "INFO",
        ]
        if self.preamble is None:
            return [sys.executable, "-m", "celery", "-A", "tests.testapp.celery_app", *worker]
        code = (
            f"{self.preamble}\n"
            "from tests.testapp.celery_app import app\n"
            f"app.worker_main({worker!r})\n"
        )
        return [sys.executable, "-c", code]

    def spawn(self) -> WorkerProcess:
        """Start the process without waiting for it to be ready."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=ROOT,
                env=subprocess_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def start(self) -> WorkerProcess:
        """Start the worker and wait until it answers a ping (or fail with its output)."""
        self.spawn()
        proc = self.proc
        assert proc is not None
        wait_for(
            lambda: (
                proc.poll() is not None or app.control.ping(destination=[self.name], timeout=0.3)
            ),
            30,
            what=f"worker {self.name} to answer a ping",
        )
        assert proc.poll() is None, self.output()
        return self

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        """SIGKILL the worker's whole session (main process and pool children)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
