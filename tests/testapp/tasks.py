"""Celery tasks of the test project, used by ``tests/test_celery.py`` and the Celery fault tests.

Every single-flight task reports what it saw to Redis (db 0, flushed before each test), so tests can
check from the outside what ran where and whether two runs of one key ever overlapped:

- ``events``   list of JSON objects ``{"event": "start"|"end", "key", "task_id", "pid", ...}``
- ``active:<key>`` number of bodies of ``key`` running right now
- ``overlaps`` list of keys whose bodies ran concurrently (must stay empty)
- ``concurrency:<key>`` list of how many bodies of ``key`` ran at each start (its max: the peak)

``MODE_TASKS[mode]`` is one task per ``lock_mode`` (key ``"<mode>:{name}"``, ``lock_timeout=2``)
whose body can sleep, fail, retry and replace itself, for the mode x delivery-path matrix.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import shared_task
from celery.exceptions import Ignore, Reject
from django.conf import settings

from django_redislock import Lock, force_release, get_lock_info, singleflight
from django_redislock.celery import SingleFlightTask
from tests.conftest import wait_for

_client: redis.Redis | None = None


def observer() -> redis.Redis:
    global _client
    if _client is None or _client.connection_pool.pid != os.getpid():
        _client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    return _client


def events(kind: str | None = None) -> list[dict[str, Any]]:
    found = [json.loads(raw) for raw in observer().lrange("events", 0, -1)]
    return [e for e in found if kind is None or e["event"] == kind]


def _emit(event: str, **data: Any) -> None:
    where = {"pid": os.getpid(), "thread": threading.current_thread().name, "at": time.time()}
    observer().rpush("events", json.dumps({"event": event, **where, **data}))


def _holder(key: str) -> dict[str, Any]:
    """Who ``get_lock_info`` says holds ``key`` (from inside the body: no race with its end)."""
    info = get_lock_info(key)
    if info is None:
        return {"holder": None, "holds": 0}
    return {
        "holder": info.task_id,
        "holds": info.hold_count,
        "token": info.fencing_token,
        "holder_pid": info.pid,
        "holder_thread": info.thread,
        "holder_host": info.host,
        "queued": info.queued,
    }


@contextmanager
def observed(task: Any, key: str) -> Iterator[None]:
    """Record start/end of a Celery task's body and any overlap with another body of the key."""
    lost = lambda: getattr(task, "lock_lost", None)  # noqa: E731 - a plain task has none
    with observed_run(key, task.request.id, task.request.retries, lost):
        yield


@contextmanager
def observed_run(
    key: str, task_id: str, retries: int = 0, lock_lost: Any = lambda: None
) -> Iterator[None]:
    """Record start/end of a body (any task framework) and any overlap with another of ``key``."""
    client = observer()
    running = client.incr(f"active:{key}")
    client.rpush(f"concurrency:{key}", running)
    if running > 1:
        client.rpush("overlaps", key)
    _emit("start", key=key, task_id=task_id, retries=retries, **_holder(key))
    try:
        yield
    finally:
        client.decr(f"active:{key}")
        _emit("end", key=key, task_id=task_id, lock_lost=lock_lost(), **_holder(key))


# -- keys only (never consumed) ----------------------------------------------------------------
@shared_task(base=SingleFlightTask, lock_timeout=30)
def unconsumed_keyed(
    x: int = 1, options: dict[str, Any] | None = None, *rest: Any, **extra: Any
) -> None:
    """Default key: task name + hash of the bound arguments."""


@shared_task(bind=True, base=SingleFlightTask, lock_timeout=30)
def unconsumed_bound(self: Any, x: int = 1) -> None:
    """Bound task, default key: ``self`` is not part of it."""


@shared_task(base=SingleFlightTask, lock_key="race:{x}", lock_timeout=30)
def unconsumed_race(x: int) -> None:
    """Target of the concurrent-publish races."""


@shared_task(base=SingleFlightTask, lock_key="backlog:{x}", lock_timeout=1, lock_queue_timeout=300)
def unconsumed_backlog(x: int) -> None:
    """Queued lease longer than the running lease (a queue that may back up)."""


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="backlog-run:{name}",
    lock_timeout=1,
    lock_queue_timeout=300,
)
def backlog_run(self: Any, name: str) -> None:
    """Reports the lease it runs under: the running lease, not the queued one."""
    info = get_lock_info(f"backlog-run:{name}")
    _emit("lease", expires_in=info.expires_in if info else None)


@shared_task(base=SingleFlightTask, lock_key="race:{x}", lock_timeout=30, lock_on_duplicate="raise")
def unconsumed_race_raise(x: int) -> None:
    """Same key as unconsumed_race, duplicates raise."""


@shared_task(
    base=SingleFlightTask, lock_key=lambda account, **kw: f"acct:{account['id']}", lock_timeout=30
)
def unconsumed_callable_key(account: dict[str, Any], full: bool = False) -> None:
    """Key from a callable."""


# -- run on a worker -----------------------------------------------------------------------------
@shared_task(bind=True, base=SingleFlightTask, lock_key="work:{name}", lock_timeout=2)
def work(self: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    with observed(self, f"work:{name}"):
        time.sleep(seconds)
        if fail:
            raise ValueError(f"work {name} failed on purpose")
    return f"done {name}"


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="work:{name}",
    lock_timeout=2,
    lock_on_duplicate="raise",
)
def work_raise(self: Any, name: str, seconds: float = 0.0) -> str:
    with observed(self, f"work:{name}"):
        time.sleep(seconds)
    return f"done {name}"


@shared_task(bind=True, base=SingleFlightTask, lock_key="short:{name}", lock_timeout=1)
def short_lease(self: Any, name: str, seconds: float = 0.0) -> str:
    """Like ``work`` with a 1 s lease, renewed every 1/3 s while it runs."""
    with observed(self, f"short:{name}"):
        time.sleep(seconds)
    return f"done {name}"


@shared_task(bind=True, base=SingleFlightTask, lock_key="slow:{name}", lock_timeout=20)
def slow_lease(self: Any, name: str, seconds: float = 0.0) -> str:
    """Like ``work`` with a long lease: shows who frees the key before the lease would."""
    with observed(self, f"slow:{name}"):
        time.sleep(seconds)
    return f"done {name}"


@shared_task(
    bind=True, base=SingleFlightTask, lock_key="retry:{name}", lock_timeout=2, max_retries=5
)
def retrying(
    self: Any, name: str, failures: int, countdown: float = 0.0, seconds: float = 0.0
) -> int:
    with observed(self, f"retry:{name}"):
        time.sleep(seconds)
    if self.request.retries < failures:
        raise self.retry(countdown=countdown)
    return self.request.retries


@shared_task(bind=True, base=SingleFlightTask, lock_key="exit:{name}", lock_timeout=2)
def ignoring(self: Any, name: str) -> None:
    with observed(self, f"exit:{name}"):
        pass
    raise Ignore()


@shared_task(bind=True, base=SingleFlightTask, lock_key="exit:{name}", lock_timeout=2)
def rejecting(self: Any, name: str) -> None:
    with observed(self, f"exit:{name}"):
        pass
    raise Reject("rejected on purpose", requeue=False)


@shared_task(bind=True, base=SingleFlightTask, lock_key="work:{name}", lock_timeout=2)
def replacing(self: Any, name: str, same_key: bool, countdown: float = 0.0) -> None:
    with observed(self, f"work:{name}"):
        pass
    if same_key:
        # On the queue this delivery came from, so the same worker gets the replacement.
        queue = (self.request.delivery_info or {}).get("routing_key") or "celery"
        return self.replace(work.si(name, 0.3).set(countdown=countdown, queue=queue))
    return self.replace(plain.si(name))


@shared_task(bind=True, base=SingleFlightTask, lock_key="lose:{name}", lock_timeout=1)
def lose_lock(self: Any, name: str) -> bool:
    with observed(self, f"lose:{name}"):
        force_release(f"lose:{name}")
        # The watchdog finds out at its next renewal (every timeout / 3).
        return bool(wait_for(lambda: self.lock_lost, 5, what="the watchdog to notice"))


@shared_task(bind=True, base=SingleFlightTask, lock_key="beat:tick", lock_timeout=1)
def beat_tick(self: Any) -> None:
    with observed(self, "beat:tick"):
        time.sleep(2.5)


@shared_task(bind=True, base=SingleFlightTask, lock_key="spin:{name}", lock_timeout=1)
def spinning(self: Any, name: str, seconds: float) -> bool:
    """Pure-Python work that never yields (no I/O, no sleep) for ``seconds``; returns lock_lost.

    Under prefork/threads the watchdog thread still gets the GIL; under gevent/eventlet it is a
    greenlet that cannot run until the body yields.
    """
    with observed(self, f"spin:{name}"):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
        # Yield once (I/O), so a greenlet watchdog gets the chance to find out.
        wait_for(lambda: self.lock_lost or time.monotonic() > deadline + 1.0, 5)
        return bool(self.lock_lost)


@shared_task(bind=True)
def guarded(self: Any, name: str, seconds: float) -> None:
    """An ordinary task whose body takes a plain ``Lock`` (default owner: process + thread, or
    greenlet under gevent/eventlet): concurrent bodies must exclude each other, not nest."""
    with Lock(f"guarded:{name}", timeout=5), observed(self, f"guarded:{name}"):
        time.sleep(seconds)


@shared_task
def plain(value: Any = None) -> Any:
    """An ordinary task: callback target, replacement and benchmark baseline."""
    _emit("plain", value=value)
    return value


# -- one task per lock_mode ----------------------------------------------------------------------
MODE_LOCK_TIMEOUT = 2.0
#: The until_expired window: long enough to look at it after a short run on a loaded machine.
EXPIRED_WINDOW = 4.0


def _mode_task(
    mode: str, suffix: str = "", lock_timeout: float = MODE_LOCK_TIMEOUT, **options: Any
) -> Any:
    """The matrix task of ``mode``: ``body(name, seconds, fail, retries, countdown, replace)``."""

    def body(
        self: Any,
        name: str,
        seconds: float = 0.0,
        fail: bool = False,
        retries: int = 0,
        countdown: float = 0.0,
        replace: bool = False,
    ) -> str:
        key = f"{mode}:{name}"
        with observed(self, key):
            time.sleep(seconds)
            if fail:
                raise ValueError(f"{key} failed on purpose")
        if self.request.retries < retries:
            raise self.retry(countdown=countdown)
        if replace:
            # On the queue this delivery came from, so the same worker gets the replacement.
            queue = (self.request.delivery_info or {}).get("routing_key") or "celery"
            return self.replace(self.si(name, 0.3).set(queue=queue))
        return f"done {name}"

    body.__name__ = body.__qualname__ = f"mode_{mode}{suffix}"
    body.__module__ = __name__
    return shared_task(
        bind=True,
        base=SingleFlightTask,
        name=f"{__name__}.mode_{mode}{suffix}",
        lock_key=f"{mode}:{{name}}",
        lock_mode=mode,
        lock_timeout=lock_timeout,
        max_retries=3,
        **options,
    )(body)


MODE_TASKS = {
    mode: _mode_task(mode, lock_timeout=EXPIRED_WINDOW if mode == "until_expired" else 2.0)
    for mode in singleflight.MODES
}
#: At most two bodies per key at once (a long lease: shows who frees a dead child's permit).
two_permits = _mode_task(
    singleflight.WHILE_EXECUTING, "_two_permits", lock_timeout=20.0, lock_permits=2
)
#: A busy delivery is published again 0.5 s later instead of skipped.
rescheduling = _mode_task(
    singleflight.WHILE_EXECUTING,
    "_rescheduling",
    lock_on_busy="reschedule",
    lock_reschedule_countdown=0.5,
)


def _unconsumed_mode_task(mode: str) -> Any:
    def unconsumed(x: int) -> None:
        """Never consumed: what a publish of the mode costs and holds."""

    unconsumed.__name__ = unconsumed.__qualname__ = f"unconsumed_mode_{mode}"
    return shared_task(
        base=SingleFlightTask,
        name=f"{__name__}.unconsumed_mode_{mode}",
        lock_key=f"cost-{mode}:{{x}}",
        lock_mode=mode,
        lock_timeout=30,
    )(unconsumed)


UNCONSUMED_MODE_TASKS = {mode: _unconsumed_mode_task(mode) for mode in singleflight.MODES}


@shared_task(bind=True)
def plain_lock_holder(self: Any, name: str) -> dict[str, Any]:
    """A plain task (no single flight) that takes a ``Lock`` in its body: the holder metadata
    must name this task's id without the lock being told it (the Celery task-id provider)."""
    with Lock(name, timeout=10):
        info = get_lock_info(name)
        assert info is not None
        return {"task_id": info.task_id, "request_id": self.request.id}


# -- flow control and debounce (tests/test_celery_flow.py) -------------------------------------
#: lock_rate: at most 5 runs a second per key (GCRA, burst 1: one every 0.2 s).
FLOW_LOCK_RATE = (5, 1.0)
#: task_rate: at most 4 runs a second of the task, every key together.
FLOW_TASK_RATE = "4/s"


@contextmanager
def counted(counter: str) -> Iterator[None]:
    """Count the bodies running at once under ``counter``; its peaks go to ``peaks:<counter>``."""
    client = observer()
    client.rpush(f"peaks:{counter}", client.incr(f"running:{counter}"))
    try:
        yield
    finally:
        client.decr(f"running:{counter}")


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="rated:{name}",
    lock_mode="while_executing",
    lock_permits=50,  # the rate is what limits, not the key
    lock_rate=FLOW_LOCK_RATE,
    lock_timeout=5,
    max_retries=0,
)
def per_key_rated(self: Any, name: str, n: int = 0) -> int:
    with observed(self, f"rated:{name}"):
        pass
    return n


@shared_task(
    base=SingleFlightTask,
    lock_key="rated-stats:{name}",
    lock_mode="while_executing",
    lock_permits=50,
    lock_rate=FLOW_LOCK_RATE,
    lock_timeout=5,
)
def rated_for_stats(name: str, n: int = 0) -> int:
    """``per_key_rated`` with a statistics row of its own (``"rated-stats:{name}"``)."""
    return n


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="task-rated:{name}",
    lock_mode="while_executing",
    task_rate=FLOW_TASK_RATE,
    lock_timeout=5,
    max_retries=0,
)
def task_rated(self: Any, name: str) -> str:
    with observed(self, "task-rated"), observed(self, f"task-rated:{name}"):
        pass
    return name


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="capped:{tenant}",
    lock_mode="while_executing",
    lock_permits=2,  # per tenant
    task_permits=3,  # all tenants together
    lock_on_busy="reschedule",
    lock_reschedule_countdown=0.3,
    lock_timeout=5,
    max_retries=0,
)
def capped(self: Any, tenant: str, seconds: float = 0.5) -> str:
    with counted("capped"), counted(f"capped:{tenant}"):
        _emit("start", key="capped", task_id=self.request.id, tenant=tenant)
        time.sleep(seconds)
    return tenant


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="one-permit:{name}",
    task_permits=1,
    lock_timeout=2,
)
def one_permit(self: Any, name: str, seconds: float = 0.0) -> str:
    """until_executed + a single task permit (2 s lease): what a dead worker leaves behind."""
    with observed(self, f"one-permit:{name}"):
        time.sleep(seconds)
    return name


#: The debounce quiet period and longest wait of ``debounced``.
DEBOUNCE_QUIET = 0.6
DEBOUNCE_MAX = 2.0


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="debounce:{name}",
    lock_mode="debounce",
    lock_debounce=DEBOUNCE_QUIET,
    lock_debounce_max=DEBOUNCE_MAX,
    lock_timeout=5,
)
def debounced(self: Any, name: str, value: int, seconds: float = 0.0) -> int:
    with observed(self, f"debounce:{name}"):
        _emit("debounced", key=f"debounce:{name}", task_id=self.request.id, value=value)
        time.sleep(seconds)
    return value


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="long-permit:{name}",
    lock_mode="while_executing",
    task_permits=1,
    lock_timeout=20,
)
def long_permit(self: Any, name: str, seconds: float = 0.0) -> str:
    """A single task permit with a long lease: shows who frees a dead pool child's permit."""
    with observed(self, f"long-permit:{name}"):
        time.sleep(seconds)
    return name


@shared_task(
    base=SingleFlightTask,
    lock_key="cost-debounce:{x}",
    lock_mode="debounce",
    lock_debounce=30,
    lock_timeout=30,
)
def unconsumed_debounced(x: int, value: int = 0) -> None:
    """Never consumed: what a debounced publish costs and sends."""
