"""The attempts of single-flight tasks running in this process.

A ``retry()`` or a same-key ``replace()`` is published from inside the body, through
``apply_async`` of whatever task class publishes it; it finds its attempt here by (task id, key)
and takes over its holds instead of taking the key anew. The ``lock_lost`` receiver finds the
attempt whose lock the watchdog lost, to name the task in the log.

Eager runs (``task_always_eager``, ``apply()``) run in the caller's thread, inside whatever called
them — possibly the body of a run of the same key. Each thread keeps the stack of its eager runs
here, so a delivery that would wait for (or be rescheduled behind) a run further up its own stack
is deferred until that run ended instead of waiting for ever; and the publishes it makes, so a
failing eager publish knows whether its run already took charge of the key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_redislock.singleflight import Flight

__all__ = [
    "Run",
    "add",
    "eager_publish_began_run",
    "eager_publish_ends",
    "eager_publish_starts",
    "eager_run_begins",
    "eager_runner",
    "find",
    "on_lock_lost",
    "pop_eager",
    "push_eager",
    "remove",
]

logger = logging.getLogger("django_redislock.celery")


@dataclass
class Run:
    """One attempt of a task in this worker: its flight (the locks it holds) and its name."""

    task_name: str
    flight: Flight
    #: Eager runs only: deliveries of the same key that would wait for this attempt, or be
    #: rescheduled behind it; they run in this thread as soon as it ended.
    deferred: list[Callable[[], object]] = field(default_factory=list)

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


class _EagerThread(threading.local):
    def __init__(self) -> None:
        #: Eager runs of this thread, outermost first.
        self.stack: list[Run] = []
        #: Task ids published eagerly from this thread -> whether their run began.
        self.publishes: dict[str, bool] = {}


_eager = _EagerThread()


def push_eager(run: Run) -> None:
    _eager.stack.append(run)


def pop_eager(run: Run) -> None:
    if run in _eager.stack:
        _eager.stack.remove(run)


def eager_runner(key: str) -> Run | None:
    """The innermost eager run of ``key`` up this thread's stack (it holds what it holds until
    the caller's frame returns to it)."""
    return next((run for run in reversed(_eager.stack) if run.key == key), None)


def eager_publish_starts(task_id: str) -> None:
    """An eager publish of ``task_id`` from this thread: Celery runs it before it returns."""
    _eager.publishes[task_id] = False


def eager_run_begins(task_id: str) -> None:
    """The run of ``task_id`` begins: from now on the run, not the publish, frees its holds."""
    if task_id in _eager.publishes:
        _eager.publishes[task_id] = True


def eager_publish_began_run(task_id: str) -> bool:
    """Whether the eager publish of ``task_id`` got as far as running it."""
    return _eager.publishes.get(task_id, False)


def eager_publish_ends(task_id: str) -> None:
    _eager.publishes.pop(task_id, None)


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
