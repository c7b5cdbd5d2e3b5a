"""Single-flight tasks for Django's task framework: ``django.tasks`` (Django >= 6) or its backport
``django_tasks`` (with ``django_tasks_db``'s database backend and ``db_worker``).

```python
from django_redislock.django_tasks import single_flight_task

@single_flight_task(lock_key="sync:{account_id}", lock_timeout=60, lock_mode="coalesce")
def sync(account_id: int) -> None: ...

sync.enqueue(42)   # deduplicated like SingleFlightTask.delay
```

The same options, modes and guarantees as :class:`django_redislock.celery.SingleFlightTask`,
from the same neutral module (:mod:`django_redislock.singleflight`); only the plumbing differs:

- **Identity.** The flight id is the task result id. Django tasks choose it inside the backend's
  ``enqueue``, so the key is taken right *after* the row is written: with the database backend
  both happen in one database transaction, so a worker never sees the row before the key is taken,
  and a duplicate's row is rolled back (nothing is published). Other queueing backends (not the
  database one) cannot be made atomic that way: their duplicates are enqueued and then skipped by
  the worker, and a task that finishes before its publisher took the key leaves it held for
  ``lock_queue_timeout`` — prefer the database backend or ``lock_mode="while_executing"`` there.
  Backends that run the task inside ``enqueue`` (``ImmediateBackend``) only get the run-time part.
- **Run.** The worker calls ``task.call``; the result being run is known from the framework's
  ``task_started`` signal (sent just before, in the same thread). A direct ``task.call(...)``
  outside a worker takes no lock, like a direct call of a Celery task.
- **Busy at run time.** There is no ``SKIPPED`` status: the run ends ``FAILED`` with
  :class:`TaskSkippedError` (``.reason``, ``.holder``, ``.rescheduled_as``), and
  ``task_skipped``/``task_rescheduled`` are sent. ``lock_on_busy="reschedule"`` enqueues the same
  call again with ``run_after`` = now + the countdown (through the normal, deduplicated enqueue).
- **Crashes.** ``db_worker`` leaves a killed worker's row ``RUNNING``; the key it held (and its
  task permit) is not renewed any more and frees itself within ``lock_timeout``.
- **Flow control** (``lock_rate``, ``task_rate``, ``task_permits``, as on the Celery face). A
  result id runs once, at its ``run_after``, so a run over a limit cannot be published again
  under its own id: it ends ``FAILED`` with :class:`TaskThrottledError` (a
  :class:`TaskSkippedError`; ``.rescheduled_as``: the result enqueued to run after the limit's
  ``retry_after``) and ``task_throttled`` is sent. Needs a backend that supports ``run_after``.
- **Debounce** (``lock_mode="debounce"``) is refused at definition (:class:`TaskOptionError`):
  every publish of a burst must return the id the run will have, and a run that is not due yet
  must wait under that same id — which a result id that runs once, at a ``run_after`` fixed at
  enqueue, cannot do. Use :class:`django_redislock.celery.SingleFlightTask` for it.
- Enqueue inside ``transaction.on_commit`` (Django's own advice for tasks): a row enqueued in a
  transaction that rolls back leaves its key held until its queued lease ends.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from django.db import router, transaction
from django.utils import timezone
from typing_extensions import ParamSpec

from django_redislock import singleflight
from django_redislock.naming import argument_digest, compile_key
from django_redislock.singleflight import (
    Busy,
    Deferred,
    Duplicate,
    DuplicateTaskError,
    FlightRules,
    TaskOptionError,
    Ticket,
    delay_of,
    task_deduplicated,
    task_rescheduled,
    task_skipped,
    task_throttled,
)

if TYPE_CHECKING:
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskResult,
    )
    from django_tasks.signals import task_finished, task_started
elif importlib.util.find_spec("django.tasks") is not None:  # Django >= 6
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskResult,
    )
    from django.tasks.signals import task_finished, task_started
else:  # the backport
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskResult,
    )
    from django_tasks.signals import task_finished, task_started

__all__ = [
    "DuplicateTaskError",
    "SingleFlightTask",
    "TaskOptionError",
    "TaskSkippedError",
    "TaskThrottledError",
    "single_flight_task",
]

logger = logging.getLogger("django_redislock.django_tasks")

P = ParamSpec("P")
T = TypeVar("T")


class TaskSkippedError(Exception):
    """The body of a task did not run: its key was busy when the worker started it.

    ``reason`` as for ``task_skipped``; ``holder``: the task result id holding the key, when
    known; ``rescheduled_as``: the id of the result enqueued to run later (``lock_on_busy=
    "reschedule"``), or the queued one that covers this call, or ``None`` (skipped).
    """

    def __init__(
        self, key: str, holder: str | None, reason: str, rescheduled_as: str | None = None
    ) -> None:
        self.key, self.holder, self.reason, self.rescheduled_as = (
            key,
            holder,
            reason,
            rescheduled_as,
        )
        what = f"rescheduled as {rescheduled_as}" if rescheduled_as else "skipped"
        super().__init__(
            f"Lock {key!r} is held by {f'task {holder}' if holder else 'another holder'} "
            f"({reason}): {what}."
        )


class TaskThrottledError(TaskSkippedError):
    """The body of a task did not run: it was over a flow-control limit when the worker started
    it (``reason``: ``"lock_rate"``, ``"task_rate"`` or ``"task_permits"``). ``rescheduled_as``:
    the result enqueued to run ``countdown`` seconds later (or the queued one covering this call).
    """

    def __init__(
        self, key: str, reason: str, countdown: float, rescheduled_as: str | None = None
    ) -> None:
        super().__init__(key, None, reason, rescheduled_as)
        self.countdown = countdown
        what = f"rescheduled as {rescheduled_as}" if rescheduled_as else "skipped"
        self.args = (f"Over its {reason} limit (lock {key!r}, {countdown:.3g}s to wait): {what}.",)


# -- which result the worker is running -----------------------------------------------------------
_running = threading.local()


def _on_task_started(sender: Any, *, task_result: Any = None, **kwargs: Any) -> None:
    """``task_started`` receiver: the result the worker is about to ``call`` in this thread."""
    _running.result = task_result


def _on_task_finished(sender: Any, *, task_result: Any = None, **kwargs: Any) -> None:
    if getattr(_running, "result", None) is task_result:
        _running.result = None


def _connect() -> None:
    """Connect the receivers (idempotent), when the first single-flight task is defined."""
    task_started.connect(
        _on_task_started, weak=False, dispatch_uid="django_redislock.django_tasks.started"
    )
    task_finished.connect(
        _on_task_finished, weak=False, dispatch_uid="django_redislock.django_tasks.finished"
    )


def _take_running(task: Task[Any, Any]) -> Any:
    """The result the worker started for ``task`` in this thread (once), or ``None``."""
    result = getattr(_running, "result", None)
    if result is None or result.task.module_path != task.module_path:
        return None
    _running.result = None  # a call nested inside the body is a direct call
    return result


# -- backends -------------------------------------------------------------------------------------
def _runs_inline(backend: BaseTaskBackend) -> bool:
    """Backends that run the task inside ``enqueue`` (nothing is ever queued)."""
    return type(backend).__name__ == "ImmediateBackend"


def _database_of(backend: BaseTaskBackend) -> str | None:
    """The database alias a backend writes its queue to (``django_tasks_db``), else ``None``."""
    if importlib.util.find_spec("django_tasks_db") is None:
        return None
    from django_tasks_db.backend import DatabaseBackend
    from django_tasks_db.models import DBTaskResult

    if not isinstance(backend, DatabaseBackend):
        return None
    return router.db_for_write(DBTaskResult)


def _call_view(func: Callable[..., Any], takes_context: bool) -> Callable[..., Any]:
    """A stand-in for ``func`` whose signature is that of ``enqueue`` (no ``context``)."""
    signature = inspect.signature(func)
    if takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])

    def view(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError

    view.__signature__ = signature  # type: ignore[attr-defined]
    view.__module__ = func.__module__
    view.__qualname__ = view.__name__ = func.__name__
    return view


# -- the task -------------------------------------------------------------------------------------
# ``Task`` is generic in the backport, not at run time in Django 6: subclass the bare class.
@dataclasses.dataclass(frozen=True, kw_only=True)
class SingleFlightTask(Task, Generic[P, T]):  # type: ignore[type-arg]
    """A Django task of which at most one instance per lock key is queued or running (by default).

    Options as :class:`django_redislock.celery.SingleFlightTask` (``lock_key``, ``lock_mode``,
    ``lock_permits``, ``lock_on_busy``, ``lock_reschedule_countdown``, ``lock_timeout``,
    ``lock_queue_timeout``, ``lock_on_duplicate``, ``lock_using``, and the flow control of
    ``lock_rate``, ``task_rate``, ``task_permits``), validated when the task is defined.
    ``lock_mode="debounce"`` is refused (see the module docstring). ``task.using(...)`` keeps
    them.
    """

    lock_key: str | Callable[..., str] | None = None
    lock_mode: str = singleflight.UNTIL_EXECUTED
    lock_permits: int = 1
    lock_on_busy: str = "skip"
    lock_reschedule_countdown: float | None = None
    lock_timeout: float | None = None
    lock_queue_timeout: float | None = None
    lock_on_duplicate: str = "return"
    lock_using: str | None = None
    lock_rate: str | tuple[int, float] | None = None
    task_rate: str | tuple[int, float] | None = None
    task_permits: int | None = None
    lock_debounce: float | None = None
    lock_debounce_max: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        rules = FlightRules.of_task(
            self.module_path,
            self,
            stats_name=singleflight.stats_row(self.lock_key, self.module_path),
        )
        if rules.mode == singleflight.DEBOUNCE:
            raise TaskOptionError(
                "lock_mode='debounce' is not available for Django tasks: a burst's publishes "
                "must all return the id its run will have, and a run that is not due yet must "
                "wait under that id, which a django.tasks result (run once, at the run_after "
                "fixed when it was enqueued) cannot do. Use django_redislock.celery."
                f"SingleFlightTask (task {self.module_path})."
            )
        backend = self.get_backend()
        deferring = (
            "lock_on_busy='reschedule'"
            if rules.on_busy == "reschedule"
            else "lock_rate/task_rate/task_permits"
            if rules.limited
            else None
        )
        if deferring and not (backend.supports_defer or _runs_inline(backend)):
            raise TaskOptionError(
                f"{deferring} needs a backend that supports run_after; "
                f"{type(backend).__name__} does not (task {self.module_path})."
            )
        view = _call_view(self.func, self.takes_context)
        if self.lock_key is None:
            signature = inspect.signature(view)
            prefix = self.module_path

            def name_of(*args: Any, **kwargs: Any) -> str:
                arguments = signature.bind(*args, **kwargs)
                arguments.apply_defaults()
                return f"{prefix}:{argument_digest(arguments.arguments)}"

        else:
            name_of = compile_key(self.lock_key, view)
        object.__setattr__(self, "_rules", rules)
        object.__setattr__(self, "_name_of", name_of)
        _connect()

    @property
    def flight_rules(self) -> FlightRules:
        """The task's validated single-flight options."""
        rules: FlightRules = self.__dict__["_rules"]
        return rules

    def lock_name(self, args: Any = (), kwargs: Any = None) -> str:
        """The lock key of ``enqueue(*args, **kwargs)`` (``TypeError`` if they do not fit)."""
        name_of: Callable[..., str] = self.__dict__["_name_of"]
        return name_of(*tuple(args or ()), **dict(kwargs or {}))

    # -- publish -------------------------------------------------------------------------------
    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[T]:
        """Enqueue unless the key says a duplicate is queued or running (``lock_on_duplicate``)."""
        rules = self.flight_rules
        key = self.lock_name(args, kwargs)
        backend = self.get_backend()
        if rules.mode == singleflight.WHILE_EXECUTING or _runs_inline(backend):
            return super().enqueue(*args, **kwargs)
        delay = delay_of({"run_after": self.run_after})
        database = _database_of(backend)
        outcome: Ticket | Duplicate | None = None
        try:
            if database is None:
                result = super().enqueue(*args, **kwargs)
                outcome = singleflight.reserve(rules, key, str(result.id), delay=delay)
            else:
                # The row stays invisible to workers until the key is ours; a duplicate's row is
                # rolled back, so nothing is published.
                with transaction.atomic(using=database):
                    result = super().enqueue(*args, **kwargs)
                    outcome = singleflight.reserve(rules, key, str(result.id), delay=delay)
                    if isinstance(outcome, Duplicate):
                        transaction.set_rollback(True, using=database)
        except BaseException:
            if isinstance(outcome, Ticket):
                singleflight.unreserve(rules, outcome, str(result.id))
            raise
        if isinstance(outcome, Duplicate):
            return self._duplicate(outcome, published=database is None)
        return result

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[T]:
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, **kwargs)

    def _duplicate(self, duplicate: Duplicate, *, published: bool) -> TaskResult[T]:
        existing = duplicate.holder
        must_raise = self.lock_on_duplicate == "raise" or existing is None
        singleflight.count_outcome(self.flight_rules, duplicate.key, "deduplicated")
        task_deduplicated.send_robust(
            type(self), task=self, key=duplicate.key, existing_task_id=existing, raised=must_raise
        )
        logger.info(
            "%s %s: lock %r is held by %s.",
            self.module_path,
            "enqueued but will be skipped" if published else "not enqueued",
            duplicate.key,
            f"task {existing}" if existing else "a holder that is not a task",
        )
        if must_raise or existing is None:
            raise DuplicateTaskError(existing, duplicate.key)
        try:
            return self.get_result(existing)
        except Exception as exc:  # the backend keeps no results, or not this one
            raise DuplicateTaskError(existing, duplicate.key) from exc

    # -- run -------------------------------------------------------------------------------------
    def call(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the body under the mode's run-time lock in a worker (elsewhere: a plain call)."""
        result = _take_running(self)
        if result is None:
            value: T = super().call(*args, **kwargs)
            return value
        plain = args[1:] if self.takes_context else args
        key = self.lock_name(plain, kwargs)
        try:
            flight = singleflight.begin(self.flight_rules, key, str(result.id), None, requeue=False)
        except Deferred as deferred:
            self._throttled(deferred, plain, kwargs, str(result.id))
        except Busy as busy:
            self._not_run(busy, plain, kwargs, str(result.id))
        try:
            value = super().call(*args, **kwargs)
        finally:
            singleflight.end(flight)
        return value

    def _throttled(self, deferred: Deferred, args: Any, kwargs: Any, result_id: str) -> NoReturn:
        """A run over a limit: enqueue the call again to run after ``deferred.countdown`` (its
        holds were given back, so the enqueue takes the key anew); always raises
        :class:`TaskThrottledError`."""
        later: str | None = None
        rules = self.flight_rules
        if self.get_backend().supports_defer:  # an inline backend (tests) cannot defer
            later = self._enqueue_later(deferred.countdown, args, kwargs)
        singleflight.count_outcome(rules, deferred.key, "throttled")
        task_throttled.send_robust(
            type(self),
            task=self,
            task_id=result_id,
            key=deferred.key,
            reason=deferred.reason,
            countdown=deferred.countdown,
        )
        error = TaskThrottledError(deferred.key, deferred.reason, deferred.countdown, later)
        logger.info("Task %s[%s]: %s", self.module_path, result_id, error)
        raise error

    def _enqueue_later(self, countdown: float, args: Any, kwargs: Any) -> str | None:
        """Enqueue the call again to run in ``countdown`` seconds: the new result id, or the
        id of a queued one that covers it already."""
        when = timezone.now() + dt.timedelta(seconds=countdown)
        try:
            return str(self.using(run_after=when).enqueue(*args, **kwargs).id)
        except DuplicateTaskError as dup:
            return dup.task_id

    def _not_run(self, busy: Busy, args: Any, kwargs: Any, result_id: str) -> NoReturn:
        """Skip, or reschedule, a run whose key is busy; always raises :class:`TaskSkippedError`."""
        later: str | None = None
        singleflight.count_outcome(self.flight_rules, busy.key, "skipped")
        backend = self.get_backend()
        if (
            self.lock_on_busy == "reschedule"
            and busy.reason != "already-running"
            and backend.supports_defer  # an inline backend (tests) has nothing to defer with
        ):
            countdown = self.flight_rules.reschedule_delay()
            later = self._enqueue_later(countdown, args, kwargs)
            task_rescheduled.send_robust(
                type(self),
                task=self,
                task_id=result_id,
                key=busy.key,
                holder=busy.holder,
                reason=busy.reason,
                countdown=countdown,
            )
        else:
            task_skipped.send_robust(
                type(self),
                task=self,
                task_id=result_id,
                key=busy.key,
                holder=busy.holder,
                reason=busy.reason,
            )
        error = TaskSkippedError(busy.key, busy.holder, busy.reason, later)
        logger.warning("Task %s[%s]: %s", self.module_path, result_id, error)
        raise error


def single_flight_task(
    function: Callable[P, T] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **lock_options: Any,
) -> Any:
    """``@task`` for single-flight tasks: Django's task options plus the ``lock_*`` options,
    ``task_rate`` and ``task_permits``."""
    unknown = sorted(
        name
        for name in lock_options
        if not name.startswith("lock_") and name not in ("task_rate", "task_permits")
    )
    if unknown:
        raise TypeError(f"single_flight_task() got unexpected options {unknown}")

    def wrapper(func: Callable[P, T]) -> SingleFlightTask[P, T]:
        return SingleFlightTask(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            **lock_options,
        )

    return wrapper(function) if function is not None else wrapper
