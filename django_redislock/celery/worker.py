"""The worker main process's part: free the key of a task whose pool child cannot; check the pool;
rescue debounced runs whose message was lost.

A body releases its own key (and its task permit) when it ends. It cannot when its pool child
dies (SIGKILL, OOM), is terminated (``revoke(terminate=True)``, hard time limit), or when the
message never reaches a child (revoked or expired before it started): the worker's main process
releases it then, as the task's mode says (:func:`django_redislock.singleflight.abandon`;
``until_expired`` keeps its window whatever happens). A revoked debounced burst is forgotten.

A debounced burst (``lock_mode="debounce"``) keeps its arguments in Redis until its run claims
them, and its message waits in a worker (a countdown): a worker SIGKILLed meanwhile takes the
message with it (the Redis broker gives it back only after its visibility timeout, an hour by
default). So every worker's main process looks, every :data:`RESCUE_INTERVAL` seconds, for runs
of its debounced tasks that were due more than :data:`RESCUE_GRACE` seconds ago and never
claimed, and publishes them again with the same id (:class:`DebounceRescuer`). A rescue that
races the original message costs nothing: the first delivery claims the burst, the other finds
it gone and ends without a state.

At start-up (``worker_init``) a greenlet pool on which concurrent tasks would share one lock
owner is refused (:func:`check_pool`).
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from billiard.exceptions import Terminated
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from django_redislock import singleflight
from django_redislock.celery.headers import HEADER_ATTEMPT, HEADER_KEY, headers_of
from django_redislock.celery.task import SingleFlightTask
from django_redislock.exceptions import LockBackendError

__all__ = [
    "RESCUE_GRACE",
    "RESCUE_INTERVAL",
    "DebounceRescuer",
    "SingleFlightRequest",
    "UnsupportedPoolError",
    "check_pool",
    "on_task_revoked",
    "release_for_request",
    "start_rescuer",
    "stop_rescuer",
]

logger = logging.getLogger("django_redislock.celery")


def release_for_request(
    task: Any, task_id: str | None, request: Any, args: Any = None, kwargs: Any = None
) -> bool:
    """Free what ``task_id`` holds for its mode (:func:`singleflight.abandon`); for code that
    outlives the run (revoke, a dead pool child). Returns whether something was released."""
    if not isinstance(task, SingleFlightTask) or not task_id:
        return False
    headers = headers_of(request) if request is not None else {}
    try:
        key = headers.get(HEADER_KEY) or task.lock_name(args, kwargs)
    except Exception:
        logger.warning(
            "Cannot compute the lock key of %s[%s] to release it.",
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    try:
        released = singleflight.abandon(
            task.flight_rules, key, task_id, attempt=headers.get(HEADER_ATTEMPT) or 0
        )
    except LockBackendError:
        logger.warning(
            "Could not release lock %r of %s[%s]; it expires within its lease.",
            key,
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    if released:
        logger.info("Released lock %r of %s[%s] for the worker.", key, task.name, task_id)
    return released


_CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class SingleFlightRequest(Request):
    """Worker-side request that frees the key when the pool child running it cannot.

    ``on_failure`` runs in the worker's main process; for a child that died (SIGKILL, OOM), was
    terminated by ``revoke(terminate=True)`` or hit the hard time limit, the body's own ``finally``
    never ran, so the key is released here, before Celery requeues or retries the message.
    """

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
        if isinstance(exc, _CHILD_GONE):
            release_for_request(self.task, self.id, self.request_dict, self.args, self.kwargs)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked`` receiver: a revoked, expired or terminated message will not run: free its
    key now (and forget its debounced burst, which no rescue must publish again)."""
    if request is None:
        return
    task_id = getattr(request, "id", None)
    args, kwargs_ = getattr(request, "args", None), getattr(request, "kwargs", None)
    release_for_request(sender, task_id, request, args, kwargs_)
    if (
        isinstance(sender, SingleFlightTask)
        and task_id
        and sender.flight_rules.mode == singleflight.DEBOUNCE
    ):
        try:
            key = headers_of(request).get(HEADER_KEY) or sender.lock_name(args, kwargs_)
            singleflight.cancel_burst(sender.flight_rules, key, task_id)
        except Exception:
            logger.warning(
                "Could not forget the debounced burst of revoked %s[%s]; it runs when rescued.",
                sender.name,
                task_id,
                exc_info=True,
            )


# -- debounced runs lost with a worker ----------------------------------------------------------
#: Seconds between two looks for overdue debounced runs, in each worker's main process.
RESCUE_INTERVAL = 1.0
#: A debounced run counts as lost once it was due longer ago than this, unclaimed; it is then
#: published again (and again every as long, until one delivery claims it). A message that is
#: merely late (every pool slot busy) then has a twin, which ends as a no-op.
RESCUE_GRACE = 5.0


class DebounceRescuer:
    """A daemon thread of a worker's main process that publishes again the overdue runs of the
    app's debounced tasks (see the module docstring)."""

    def __init__(self, app: Any, *, interval: float = RESCUE_INTERVAL, grace: float = RESCUE_GRACE):
        self.app = app
        self.interval = interval
        self.grace = grace
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tasks(self) -> list[SingleFlightTask]:
        """The app's debounced tasks."""
        return [
            task
            for task in list(self.app.tasks.values())
            if isinstance(task, SingleFlightTask)
            and task.flight_rules.mode == singleflight.DEBOUNCE
        ]

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="redislock-debounce-rescuer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # keep looking: Redis or the broker may be back next time
                logger.warning("Looking for lost debounced runs failed.", exc_info=True)

    def sweep(self) -> int:
        """Publish every overdue run once; returns how many were published."""
        published = 0
        for task in self.tasks():
            try:
                found = singleflight.rescue_overdue(task.flight_rules, grace=self.grace)
            except LockBackendError:
                logger.warning("Cannot look for lost runs of %s.", task.name, exc_info=True)
                continue
            for rescued in found:
                task.send_rescued(rescued)
                published += 1
                logger.warning(
                    "Debounced run %s[%s] (lock %r) was due and never claimed (its message was "
                    "lost with a worker?): published again.",
                    task.name,
                    rescued.flight_id,
                    rescued.key,
                )
        return published


_rescuers: dict[int, DebounceRescuer] = {}
_rescuers_mutex = threading.Lock()


def start_rescuer(sender: Any = None, **kwargs: Any) -> None:
    """``worker_ready`` receiver: start this worker's rescuer if its app has debounced tasks."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    with _rescuers_mutex:
        if id(app) in _rescuers:
            return
        rescuer = DebounceRescuer(app)
        if not rescuer.tasks():
            return
        _rescuers[id(app)] = rescuer
    rescuer.start()


def stop_rescuer(sender: Any = None, **kwargs: Any) -> None:
    """``worker_shutdown`` receiver: stop the rescuers of this process."""
    with _rescuers_mutex:
        stopping = list(_rescuers.values())
        _rescuers.clear()
    for rescuer in stopping:
        rescuer.stop()


# -- pools -----------------------------------------------------------------------------------------
#: Pools whose tasks run as greenlets in one OS thread.
_GREENLET_POOLS = {"celery.concurrency.gevent": "gevent", "celery.concurrency.eventlet": "eventlet"}


class UnsupportedPoolError(SystemExit):
    """The worker's pool would break mutual exclusion; raised at start-up to stop the worker.

    A ``SystemExit``: Celery logs and swallows ``Exception`` raised by signal receivers, and a
    worker that starts anyway is exactly what must not happen.
    """


def _greenlet_pool(pool_cls: Any) -> str | None:
    """``"gevent"``/``"eventlet"`` when the worker's pool runs tasks as greenlets, else None.

    Decided from the name or class Celery was given, without importing a pool module (a
    ``worker_init`` receiver that monkey-patches may still run after this one).
    """
    if isinstance(pool_cls, str):
        from celery import concurrency

        aliases: dict[str, str] = getattr(concurrency, "ALIASES", {})
        path = aliases.get(pool_cls, pool_cls)
        return _GREENLET_POOLS.get(path.partition(":")[0])
    for klass in getattr(pool_cls, "__mro__", ()):
        found = _GREENLET_POOLS.get(getattr(klass, "__module__", ""))
        if found:
            return found
    return None


def _owner_of_another_greenlet(library: str) -> str:
    """:func:`~django_redislock.lock.default_owner` as seen from a freshly spawned greenlet."""
    from django_redislock.lock import default_owner

    # Imported by name: neither library is a dependency (nor typed).
    greenlets: Any = importlib.import_module(library)
    spawned = greenlets.spawn(default_owner)
    return str(spawned.get() if library == "gevent" else spawned.wait())


def check_pool(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init`` receiver: refuse a greenlet pool whose concurrent tasks share a lock owner.

    Locks taken inside task bodies (``Lock``, ``distributed_lock``) are owned by (process, thread)
    by default. ``celery worker -P gevent``/``-P eventlet`` monkey-patch ``threading``, so each
    greenlet is a thread of its own. Patched without it (``gevent.monkey.patch_all(thread=False)``,
    ``eventlet.monkey_patch(thread=False)``), every task of the worker would be the same owner:
    their locks would nest instead of excluding each other, silently. Measured: four concurrent
    tasks all inside ``with Lock("x")`` at once.
    """
    library = _greenlet_pool(getattr(sender, "pool_cls", None))
    if library is None:
        return
    from django_redislock.lock import default_owner

    if _owner_of_another_greenlet(library) != default_owner():
        return
    message = (
        f"django_redislock: the {library} pool runs every task as a greenlet of one thread, but "
        f"threading is not monkey-patched, so locks taken inside tasks would all have the same "
        f"owner and concurrent tasks would not exclude each other. Start the worker with "
        f"`celery worker -P {library}` (which patches everything before anything is imported) "
        f"or patch threading too; supported pools: prefork, threads, solo, and gevent/eventlet "
        f"with threading patched."
    )
    logger.critical(message)
    raise UnsupportedPoolError(message)
