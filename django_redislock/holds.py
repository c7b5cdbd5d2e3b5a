"""The holds of this process: who "we" are, what we hold, and what happens when a hold is lost.

One home for the hold lifecycle, used by every face (``Lock``, ``AsyncLock``, semaphores) and by the
watchdog:

- **Owner identity.** A lock is held by an *owner* string. By default it is
  ``<process token>-<thread id>`` (sync) or ``<process token>-a<task number>`` (asyncio), so the
  same thread (or task) nests and any other waits. The process token is random per process and is
  renewed in a forked child, whose holds are not its parent's.
- **Holder metadata** stored with each lock (host, pid, thread or task name, Celery task id) so
  operators can tell who holds it. Task-id providers (registered by the Celery integration) fill
  in the task id without this module knowing Celery.
- **The hold table**: per (target, lock key, owner) the token, hold count and lease this process
  knows, shared by every ``Lock`` object of that name and owner (re-entrancy across objects).
- :func:`mark_lost`: the one place a hold becomes lost (found gone by the watchdog, a renewal or a
  release): flag it, forget it, log a WARNING, send ``lock_lost``.
- :func:`on_fork`: the one fork handler; modules with per-process state (watchdog, wake-up
  listener, statistics) register their reset here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Hold",
    "async_owner",
    "forget",
    "forget_all",
    "get",
    "mark_lost",
    "metadata",
    "new_waiter_id",
    "on_fork",
    "process_token",
    "put",
    "register_task_id_provider",
    "thread_owner",
]

logger = logging.getLogger("django_redislock")

_HOST = socket.gethostname()
_process_token = uuid.uuid4().hex[:12]
_pid = os.getpid()
_waiter_seq = itertools.count()
_task_seq = itertools.count(1)
_task_numbers: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()


def process_token() -> str:
    """Random id of this process (renewed after ``fork``); prefix of owners and waiter ids."""
    return _process_token


#: thread id -> its owner string (built once per thread: every acquire and release asks).
_thread_owners: dict[int, str] = {}


def thread_owner() -> str:
    """The default owner of the calling (process, thread) pair."""
    ident = threading.get_ident()
    owner = _thread_owners.get(ident)
    if owner is None:
        if len(_thread_owners) > 4096:  # threads come and go: keep it bounded
            _thread_owners.clear()
        # A reused thread id gets the same string again: the cache never answers wrong.
        owner = _thread_owners[ident] = f"{_process_token}-{ident}"
    return owner


def async_owner() -> str:
    """The default owner of the calling (process, asyncio task) pair.

    Tasks are numbered in a weak map rather than by ``id()``, which a later task may reuse.
    """
    task = asyncio.current_task()
    if task is None:
        return thread_owner()
    number = _task_numbers.get(task)
    if number is None:
        number = _task_numbers[task] = next(_task_seq)
    return f"{_process_token}-a{number}"


def new_waiter_id() -> str:
    """A waiter id: ``<process token>.<n>``; the process token names its wake-up channel."""
    return f"{_process_token}.{next(_waiter_seq)}"


# -- metadata ------------------------------------------------------------------------------------

#: Callables that return the id of the task this thread runs (``None`` outside a task); the
#: Celery integration registers one from ``AppConfig.ready``.
_task_id_providers: list[Callable[[], str | None]] = []
_meta_cache: dict[tuple[str, str | None, bool], str] = {}


def register_task_id_provider(provider: Callable[[], str | None]) -> None:
    """Let locks taken inside a task record its id (shown by ``list_locks`` and the admin)."""
    if provider not in _task_id_providers:
        _task_id_providers.append(provider)


def task_id_providers() -> tuple[Callable[[], str | None], ...]:
    """The registered task-id providers (for the integrations' own tests)."""
    return tuple(_task_id_providers)


def _current_task_id() -> str | None:
    for provider in _task_id_providers:
        task_id = provider()
        if task_id:
            return task_id
    return None


def _label() -> str:
    # asyncio._get_running_loop() answers None outside a loop; get_running_loop() would raise
    # (and an exception costs a microsecond on every acquisition of a plain thread).
    task = asyncio.current_task() if asyncio._get_running_loop() is not None else None
    if task is not None:
        return f"task:{task.get_name()}"
    return threading.current_thread().name


def metadata(task_id: str | None = None, *, queued: bool = False) -> str:
    """The holder metadata of the caller as compact JSON (cached per thread/task name)."""
    ident = (_label(), task_id or _current_task_id(), queued)
    meta = _meta_cache.get(ident)
    if meta is None:
        if len(_meta_cache) > 1024:
            _meta_cache.clear()
        fields: dict[str, object] = {
            "host": _HOST,
            "pid": _pid,
            "thread": ident[0],
            "task_id": ident[1],
        }
        if queued:
            fields["queued"] = True
        meta = _meta_cache[ident] = json.dumps(fields, separators=(",", ":"))
    return meta


# -- the hold table ------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Hold:
    """What this process knows about one lock it holds (shared by its owner's lock objects).

    ``renew`` is how the watchdog renews it: ``(client, script, keys, args)`` run with a sync
    client even for async locks, so renewal never depends on an event loop being free.
    """

    ident: tuple[str, str, str]  # (target id, lock key, owner)
    name: str
    owner: str
    token: int
    count: int
    lease: float
    auto_renew: bool
    renew: tuple[Any, Any, list[str], list[Any]]
    stats_name: str = ""
    kind: str = "lock"
    sender: Any = None  # the face class (``Lock``, ``AsyncLock`` ...), sender of the signals
    #: ``(replicas, timeout_ms)`` a renewal must be acknowledged by (``REDISLOCK["REPLICAS"]``).
    replicas: tuple[int, int] = (0, 0)
    #: ``(using, stats name)`` a loss is counted under; ``None``: not counted (quiet lock).
    stats_key: tuple[str | None, str] | None = None
    acquired_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    released: bool = False
    lock_ref: Callable[[], Any] = field(default=lambda: None)
    # watchdog bookkeeping
    next_renewal: float = 0.0
    registered: bool = False

    @property
    def client(self) -> Any:
        return self.renew[0]


_table: dict[tuple[str, str, str], Hold] = {}
_mutex = threading.Lock()


def get(ident: tuple[str, str, str]) -> Hold | None:
    return _table.get(ident)


def put(hold: Hold) -> Hold | None:
    """Record a fresh hold; returns the stale one it replaces (its lock expired unnoticed)."""
    with _mutex:
        stale = _table.get(hold.ident)
        _table[hold.ident] = hold
    return stale if stale is not hold else None


def forget(hold: Hold) -> None:
    """Drop a hold from the table (released, lost or detached)."""
    with _mutex:
        if _table.get(hold.ident) is hold:
            del _table[hold.ident]


def all_holds() -> list[Hold]:
    with _mutex:
        return list(_table.values())


#: Called when a hold is dropped other than by a release (lost, or forgotten): the watchdog
#: stops renewing it here.
_drop_hooks: list[Callable[[Hold], None]] = []


def on_drop(hook: Callable[[Hold], None]) -> None:
    if hook not in _drop_hooks:
        _drop_hooks.append(hook)


def forget_all(where: Callable[[Hold], bool] | None = None) -> list[Hold]:
    """Forget every hold of this process (or those ``where`` accepts) without touching Redis;
    returns them.

    For test suites that flush Redis between tests: a hold left over from one test must not be
    renewed (and reported lost) in the middle of the next.
    """
    with _mutex:
        dropped = [hold for hold in _table.values() if where is None or where(hold)]
        for hold in dropped:
            del _table[hold.ident]
    for hold in dropped:
        for hook in _drop_hooks:
            hook(hold)
    return dropped


def mark_lost(hold: Hold) -> bool:
    """The hold's lock is no longer ours (expired or force-released). Returns False if known."""
    with _mutex:
        if hold.lost:
            return False
        hold.lost = True
        if _table.get(hold.ident) is hold:
            del _table[hold.ident]
    for hook in _drop_hooks:
        hook(hold)
    logger.warning(
        "django_redislock: lock %r was lost (expired or force-released) while held by %s; the "
        "protected work may now overlap with another holder.",
        hold.name,
        hold.owner,
    )
    from django_redislock import signals, stats

    if hold.stats_key is not None:
        held = time.monotonic() - hold.acquired_at
        stats.record(*hold.stats_key, "lost", held, name=hold.name, token=hold.token)
    if signals.lock_lost.receivers:
        signals.lock_lost.send_robust(hold.sender, lock=hold.lock_ref(), name=hold.name)
    return True


# -- fork ----------------------------------------------------------------------------------------

_fork_hooks: list[Callable[[], None]] = []


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child (after this module reset its own state)."""
    if hook not in _fork_hooks:
        _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    global _process_token, _pid, _mutex
    _process_token = uuid.uuid4().hex[:12]
    _pid = os.getpid()
    _mutex = threading.Lock()
    _table.clear()
    _meta_cache.clear()
    _thread_owners.clear()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_after_fork_in_child)
