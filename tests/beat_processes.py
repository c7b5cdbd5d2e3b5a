"""Real ``celery beat`` subprocesses of ``tests.beatapp``: own session each, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, subprocess_env

__all__ = ["BeatProcess"]


class BeatProcess:
    """``celery -A tests.beatapp.celery_app beat -S <scheduler>`` with its log in a file."""

    def __init__(self, workdir: Path, label: str, *, scheduler: str, env: dict[str, str]) -> None:
        self.label = label
        self.scheduler = scheduler
        self.env = env
        self.log = workdir / f"beat-{label}.log"
        self.schedule_file = workdir / f"beat-{label}-schedule"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BeatProcess:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.beatapp.celery_app",
            "beat",
            "--scheduler",
            self.scheduler,
            "--schedule",
            str(self.schedule_file),
            "--pidfile",
            "",
            "--loglevel",
            "INFO",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.beatapp.settings", **self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the leader dies without releasing anything."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM (beat's warm shutdown) and wait for the exit status."""
        assert self.proc is not None
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout)
