"""The attempts of single-flight tasks running in this process.

A ``retry()`` or a same-key ``replace()`` is published from inside the body, through
``apply_async`` of whatever task class publishes it; it finds its attempt here by (task id, key)
and takes over its holds instead of taking the key anew. The ``lock_lost`` receiver finds the
attempt whose lock the watchdog lost, to name the task in the log.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from django_redislock.singleflight import Flight

__all__ = ["Run", "add", "find", "on_lock_lost", "remove"]

logger = logging.getLogger("django_redislock.celery")


@dataclass
class Run:
    """One attempt of a task in this worker: its flight (the locks it holds) and its name."""

    task_name: str
    flight: Flight

    @property
    def task_id(self) -> str:
        return self.flight.flight_id

    @property
    def key(self) -> str:
        return self.flight.key

    @property
    def handed_over(self) -> bool:
        """The holds went to a message published from the body (retry / same-key replace)."""
        return self.flight.handed_over


_runs: dict[tuple[str, str], Run] = {}
_runs_lock = threading.Lock()


def add(run: Run) -> None:
    with _runs_lock:
        _runs[(run.task_id, run.key)] = run


def remove(run: Run) -> None:
    with _runs_lock:
        if _runs.get((run.task_id, run.key)) is run:
            del _runs[(run.task_id, run.key)]


def find(task_id: str | None, key: str) -> Run | None:
    """The attempt of ``task_id`` holding ``key`` in this process, if any."""
    return _runs.get((task_id, key)) if task_id is not None else None


def on_lock_lost(sender: Any, *, lock: Any = None, name: str = "", **kwargs: Any) -> None:
    """``lock_lost`` receiver: say which task lost its lock (the watchdog only knows the name)."""
    if lock is None:
        return
    with _runs_lock:
        run = next((r for r in _runs.values() if r.flight.run_lock is lock), None)
    if run is not None:
        logger.error(
            "Task %s[%s] lost its lock %r while running (expired or force-released); another run "
            "may now overlap with it. The task can check self.lock_lost.",
            run.task_name,
            run.task_id,
            run.key,
        )
