"""Single-flight Celery tasks: one queued-or-running instance per lock key.

```python
from celery import shared_task
from django_redislock.celery import SingleFlightTask

@shared_task(base=SingleFlightTask, lock_key="sync:{account_id}", lock_timeout=60)
def sync(account_id, full=False): ...
```

How the key is held, end to end (the README has the long version):

1. **Publish** (``apply_async``/``delay``, beat, ``delay_on_commit``): the task id is generated
   first, then the key is taken with ``owner=<task id>`` and a lease of ``lock_timeout`` plus any
   ``countdown``/``eta``. One round trip. Busy key: nothing is published; the caller gets the
   in-flight task's ``AsyncResult`` (or :class:`DuplicateTaskError`). The message carries the key,
   the fencing token and the hold count in its headers.
2. **Run**: the worker re-enters the same lock (same owner = task id) with ``auto_renew``, so the
   watchdog keeps it while the body runs. A delivery that did not come through step 1
   (``send_task``, another beat, a broker redelivery of a message that is still running) finds the
   key held by someone else, or held *more often than its headers say*, and ends as ``SKIPPED``
   without running the body.
3. **End**: every exit releases all holds of the task id in one round trip — except ``retry()`` and
   a ``replace()`` by the same key, which hand the holds over to the message they publish (same task
   id), so the key stays taken until the final attempt ends.
4. **Crashes**: the worker's main process releases the key when a pool child dies or is terminated
   (``WorkerLostError``, ``revoke(terminate=True)``, hard time limit) and when it discards a revoked
   or expired message; a SIGKILLed worker's key expires within one ``lock_timeout``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from billiard.exceptions import Terminated
from celery import Task
from celery.contrib.django.task import DjangoTask
from celery.exceptions import Ignore, TimeLimitExceeded, WorkerLostError
from celery.signals import task_revoked
from celery.utils import uuid as celery_uuid
from celery.worker.request import Request
from django.dispatch import Signal

from django_redislock import signals as lock_signals
from django_redislock.exceptions import (
    LockBackendError,
    LockNotAcquiredError,
    LockNotOwnedError,
)
from django_redislock.lock import Lock, register_task_id_provider
from django_redislock.naming import argument_digest, compile_key
from django_redislock.operations import get_lock_info

__all__ = [
    "SKIPPED",
    "DuplicateTaskError",
    "SingleFlightRequest",
    "SingleFlightTask",
    "argument_digest",
    "task_deduplicated",
    "task_skipped",
]

logger = logging.getLogger("django_redislock.celery")

#: Result state of a delivery that did not run because its key was held by another run.
SKIPPED = "SKIPPED"

#: ``task_skipped(sender=<task class>, task, task_id, key, holder, reason)``: a delivered message
#: did not run its body (``holder``: the task id holding the key, when known; ``reason``:
#: ``"busy"`` or ``"already-running"``). Sent in the worker, in the thread that got the message.
task_skipped = Signal()
#: ``task_deduplicated(sender=<task class>, task, key, existing_task_id, raised)``: a publish found
#: the key taken and published nothing (beat ticks that overlap a running task land here).
task_deduplicated = Signal()

# Message headers (they travel with retries: Celery copies custom headers into the retry).
HEADER_KEY = "redislock_key"
HEADER_TOKEN = "redislock_token"
HEADER_HOLDS = "redislock_holds"
HEADER_USING = "redislock_using"

_DUPLICATE_CHOICES = ("return", "raise")
_RUN_ATTR = "_redislock_run"


class DuplicateTaskError(LockNotAcquiredError):
    """A task with the same lock key is already queued or running; nothing was published.

    ``task_id`` is the id of the queued/running task (``None`` when the key is held by code that is
    not a task, e.g. ``distributed_lock`` on the same name); ``name`` is the lock key.
    """

    def __init__(self, task_id: str | None, name: str = "", message: str | None = None) -> None:
        self.task_id = task_id
        if message is None:
            holder = f"task {task_id}" if task_id else "a holder that is not a task"
            message = (
                f"Lock {name!r} is held by {holder}: a task with the same key is already "
                "queued or running, so nothing was published."
            )
        super().__init__(name, message)
        self.message = message
        # Celery's JSON result backend rebuilds exceptions as ``cls(*args)``.
        self.args = (task_id, name, message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


# -- keys ------------------------------------------------------------------------------------------
def _call_view(run: Callable[..., Any], bound: bool) -> Callable[..., Any]:
    """A stand-in for ``run`` whose signature is the task's call signature (no ``self``)."""
    signature = inspect.signature(run)
    if bound:
        params = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=params)

    def view(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError

    view.__signature__ = signature  # type: ignore[attr-defined]
    view.__module__ = getattr(run, "__module__", None) or __name__
    view.__qualname__ = getattr(run, "__qualname__", getattr(run, "__name__", "run"))
    view.__name__ = getattr(run, "__name__", "run")
    return view


def _run_function(cls: type) -> tuple[Callable[..., Any], bool] | None:
    """The task body and whether it takes ``self`` (bind=True / class-based), or None (abstract)."""
    for klass in cls.__mro__:
        if "run" in klass.__dict__:
            if klass is Task or klass is DjangoTask:
                return None
            attr = klass.__dict__["run"]
            if isinstance(attr, staticmethod):
                return attr.__func__, False
            if isinstance(attr, classmethod):
                return attr.__func__, True
            return attr, True
    return None


KeyFunction = Callable[[Any, tuple[Any, ...], dict[str, Any]], str]


def _key_function(cls: type, key: Any) -> KeyFunction | None:
    """``(task, args, kwargs) -> lock key`` for the task class, or None for an abstract class.

    Templates are validated here (unknown parameter: ``ValueError``), i.e. when Celery creates the
    task class.
    """
    found = _run_function(cls)
    if found is None:
        return None
    run, bound = found
    view = _call_view(run, bound)
    if key is not None:
        name_of = compile_key(key, view)
        return lambda task, args, kwargs: name_of(*args, **kwargs)
    signature = inspect.signature(view)

    def default_key(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        return f"{task.name}:{argument_digest(arguments.arguments)}"

    return default_key


@dataclass
class _Run:
    """One attempt of a task in this worker: the lock it holds and how it ends."""

    task_name: str
    task_id: str
    key: str
    lock: Lock
    handed_over: bool = False


# Attempts running in this process, by (task id, key): a retry() or replace() published from
# inside the body finds its attempt here, whatever task class publishes it.
_runs: dict[tuple[str, str], _Run] = {}
_runs_lock = threading.Lock()


def _on_lock_lost(sender: Any, *, lock: Any = None, name: str = "", **kwargs: Any) -> None:
    if lock is None:
        return
    run = next((r for r in list(_runs.values()) if r.lock is lock), None)
    if run is not None:
        logger.error(
            "Task %s[%s] lost its lock %r while running (expired or force-released); another run "
            "may now overlap with it. The task can check self.lock_lost.",
            run.task_name,
            run.task_id,
            run.key,
        )


lock_signals.lock_lost.connect(
    _on_lock_lost, weak=False, dispatch_uid="django_redislock.celery.lock_lost"
)


def _celery_task_id() -> str | None:
    """The id of the Celery task this thread runs (for the holder metadata of any lock)."""
    from celery import current_task

    request = getattr(current_task, "request", None) if current_task else None
    return getattr(request, "id", None)


register_task_id_provider(_celery_task_id)


def _delay_seconds(options: Mapping[str, Any]) -> float:
    """How long the message waits before a worker may run it (countdown or eta)."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta:
        if isinstance(eta, str):
            eta = dt.datetime.fromisoformat(eta)
        now = dt.datetime.now(eta.tzinfo) if eta.tzinfo else dt.datetime.now()
        return max(0.0, (eta - now).total_seconds())
    return 0.0


_HEADERS = (HEADER_KEY, HEADER_TOKEN, HEADER_HOLDS, HEADER_USING)


def _headers_of(request: Any) -> Mapping[str, Any]:
    """Our message headers from a raw header dict or a task ``Context``."""
    if isinstance(request, Mapping):
        return request
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping) and HEADER_KEY in headers:
        return headers
    # Protocol 2 also sets custom headers as attributes of the request.
    return {name: getattr(request, name, None) for name in _HEADERS}


# -- the task class --------------------------------------------------------------------------------
class SingleFlightTask(DjangoTask):  # type: ignore[type-arg]
    """A task of which at most one instance per lock key is queued or running.

    Options (class attributes, settable in ``@shared_task(base=SingleFlightTask, ...)``):

    - ``lock_key``: ``str.format`` template over the task's bound arguments (defaults applied), a
      callable taking the task's arguments, or ``None`` for the task name + a stable hash of the
      bound arguments.
    - ``lock_timeout``: lease in seconds (default: ``REDISLOCK["TIMEOUT"]``), renewed while the body
      runs; a queued message's lease is ``lock_timeout`` plus its countdown/eta.
    - ``lock_queue_timeout``: lease in seconds of a *queued* message (plus its countdown/eta);
      ``None`` (default) = ``lock_timeout``. Nobody can renew a message sitting in the broker, so
      raise it above your worst queue wait if the queue backs up: once a queued lease runs out, a
      second publish goes through (the worker still never runs the two at once: one is
      ``SKIPPED``). The price is that a message lost by the broker keeps its key for that long.
    - ``lock_on_duplicate``: ``"return"`` (the in-flight task's ``AsyncResult``) or ``"raise"``
      (:class:`DuplicateTaskError`). A duplicate that carries callbacks (``link``/``link_error``),
      belongs to a chain, group or chord, or was given its own ``task_id`` always raises: returning
      another task's result would silently drop its callbacks or leave its id pending for ever.
    - ``lock_using``: ``CACHES`` alias holding the locks (default: ``REDISLOCK["CACHE"]``).
    """

    Request = "django_redislock.celery:SingleFlightRequest"

    lock_key: str | Callable[..., str] | None = None
    lock_timeout: float | None = None
    lock_queue_timeout: float | None = None
    lock_on_duplicate: str = "return"
    lock_using: str | None = None

    _lock_name_of: KeyFunction | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds the task class from the decorated function with type(), so this runs when
        # the task is defined (at @shared_task/@app.task once the app is finalized, else when it
        # finalizes): a bad template or option fails there, not at the first publish.
        super().__init_subclass__(**kwargs)
        if cls.lock_on_duplicate not in _DUPLICATE_CHOICES:
            raise ValueError(
                f"lock_on_duplicate must be 'return' or 'raise', not "
                f"{cls.lock_on_duplicate!r} (task {cls.__qualname__})."
            )
        for option in ("lock_timeout", "lock_queue_timeout"):
            timeout = getattr(cls, option)
            if timeout is not None and (
                isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
            ):
                raise ValueError(
                    f"{option} must be a positive number of seconds or None, not "
                    f"{timeout!r} (task {cls.__qualname__})."
                )
        cls._lock_name_of = _key_function(cls, cls.lock_key)

    # -- keys ----------------------------------------------------------------------------------
    def lock_name(self, args: Any = None, kwargs: Any = None) -> str:
        """The lock key of a call with ``args``/``kwargs`` (``TypeError`` if they do not fit)."""
        name_of = type(self)._lock_name_of
        if name_of is None:
            raise TypeError(f"{type(self).__qualname__} has no run() to derive a lock key from")
        return name_of(self, tuple(args or ()), dict(kwargs or {}))

    def _lease(self) -> float:
        if self.lock_timeout is not None:
            return float(self.lock_timeout)
        from django_redislock.conf import get_settings

        return get_settings().timeout

    def _queue_lease(self, options: Mapping[str, Any]) -> float:
        """Lease of a message waiting in the broker: queue timeout + its countdown/eta."""
        queued = self.lock_queue_timeout
        return (float(queued) if queued is not None else self._lease()) + _delay_seconds(options)

    def _lock(self, key: str, task_id: str, timeout: float, *, auto_renew: bool) -> Lock:
        lock = Lock(
            key,
            timeout=timeout,
            auto_renew=auto_renew,
            using=self.lock_using,
            owner=task_id,
            task_id=task_id,
            stats_name=self.name,
        )
        return lock

    @property
    def lock_lost(self) -> bool:
        """True when the running attempt lost its lock (expired or force-released) mid-run."""
        run: _Run | None = vars(self.request).get(_RUN_ATTR)
        return bool(run is not None and not run.handed_over and run.lock.lost)

    # -- publish -------------------------------------------------------------------------------
    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> Any:
        key = self.lock_name(args, kwargs)
        run = _runs.get((task_id, key)) if task_id is not None else None
        if run is not None and not run.handed_over:
            return self._hand_over(run, args, kwargs, producer, link, link_error, shadow, options)
        explicit_id = task_id is not None
        task_id = task_id or celery_uuid()
        lock = self._lock(key, task_id, self._queue_lease(options), auto_renew=False)
        for _ in range(3):
            if lock.acquire(blocking=False):
                count, token = lock.detach()  # before publishing: a local worker may start it
                if count > 1:  # this very task id is already queued or running
                    self._release_quietly(lock)
                    return self._duplicate(
                        key,
                        task_id,
                        explicit_id=False,
                        link=link,
                        link_error=link_error,
                        options=options,
                    )
                headers = dict(options.pop("headers", None) or {})
                headers.update(
                    {
                        HEADER_KEY: key,
                        HEADER_TOKEN: token,
                        HEADER_HOLDS: 1,
                        HEADER_USING: self.lock_using,
                    }
                )
                try:
                    return super().apply_async(
                        args,
                        kwargs,
                        task_id=task_id,
                        producer=producer,
                        link=link,
                        link_error=link_error,
                        shadow=shadow,
                        headers=headers,
                        **options,
                    )
                except BaseException:
                    # Not published (or unknown): free the key before the error propagates.
                    self._release_quietly(lock)
                    raise
            info = get_lock_info(key, using=self.lock_using)
            if info is not None:
                return self._duplicate(
                    key,
                    info.task_id,
                    explicit_id=explicit_id,
                    link=link,
                    link_error=link_error,
                    options=options,
                    own_id=task_id,
                )
            # Released between the two calls: try again.
        raise DuplicateTaskError(
            None, key, f"Lock {key!r} kept changing hands; nothing was published. Try again."
        )

    def _duplicate(
        self,
        key: str,
        existing: str | None,
        *,
        explicit_id: bool,
        link: Any,
        link_error: Any,
        options: Mapping[str, Any],
        own_id: str | None = None,
    ) -> Any:
        in_canvas = bool(
            link
            or link_error
            or options.get("chain")
            or options.get("chord")
            or options.get("group_id")
        )
        must_raise = (
            self.lock_on_duplicate == "raise"
            or in_canvas
            or existing is None
            or (explicit_id and own_id != existing)
        )
        task_deduplicated.send_robust(
            type(self), task=self, key=key, existing_task_id=existing, raised=must_raise
        )
        logger.info(
            "%s not published: lock %r is held by %s.",
            self.name,
            key,
            f"task {existing}" if existing else "a holder that is not a task",
        )
        if must_raise or existing is None:
            raise DuplicateTaskError(existing, key)
        return self.AsyncResult(existing)

    def _hand_over(
        self,
        run: _Run,
        args: Any,
        kwargs: Any,
        producer: Any,
        link: Any,
        link_error: Any,
        shadow: Any,
        options: dict[str, Any],
    ) -> Any:
        """Publish a retry (or a same-key replacement) that inherits this attempt's holds.

        The holds are never dropped in between, so no other publish can slip in, and the next
        attempt finds exactly the count the headers announce, whenever this attempt finishes.
        """
        count, token = run.lock.detach()  # the watchdog must not shorten the lease set below
        headers = dict(options.pop("headers", None) or {})
        headers.update(
            {
                HEADER_KEY: run.key,
                HEADER_TOKEN: None,
                HEADER_HOLDS: 0,
                HEADER_USING: self.lock_using,
            }
        )
        if count:
            queued = self._lock(run.key, run.task_id, self._queue_lease(options), auto_renew=False)
            try:
                queued.renew()
            except LockNotOwnedError:
                logger.warning(
                    "Task %s[%s] hands over lock %r, but it was already lost.",
                    self.name,
                    run.task_id,
                    run.key,
                )
            else:
                headers.update({HEADER_TOKEN: token, HEADER_HOLDS: count})
        result = super().apply_async(
            args,
            kwargs,
            task_id=run.task_id,
            producer=producer,
            link=link,
            link_error=link_error,
            shadow=shadow,
            headers=headers,
            **options,
        )
        run.handed_over = True
        return result

    @staticmethod
    def _release_quietly(lock: Lock, *, all_holds: bool = False) -> bool:
        try:
            lock.release(all_holds=all_holds)
        except LockNotOwnedError:
            return False
        return True

    # -- run -----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # A plain function call (``sync(1)``), not a delivery: no lock, as documented.
            return super().__call__(*args, **kwargs)
        run = self._start_run(request, args, kwargs)
        try:
            # The tracer already pushed this task and its request; Task.__call__ would push a bare
            # request over it (Celery patches that away only in `celery worker` processes).
            return self.run(*args, **kwargs)
        finally:
            self._end_run(run)

    def _start_run(self, request: Any, args: Any, kwargs: Any) -> _Run:
        headers = _headers_of(request)
        key = headers.get(HEADER_KEY) or self.lock_name(args, kwargs)
        task_id = request.id
        lock = self._lock(key, task_id, self._lease(), auto_renew=True)
        if not lock.acquire(blocking=False):
            info = get_lock_info(key, using=self.lock_using)
            # Released in between: one more try, else skip.
            if info is not None or not lock.acquire(blocking=False):
                self._skip(key, info.task_id if info else None, "busy")
        count, token = lock.hold_count, lock.fencing_token
        announced = headers.get(HEADER_HOLDS) or 0
        expected = announced + 1 if token == headers.get(HEADER_TOKEN) and announced else 1
        if count > expected:
            # Our own task id holds it more often than this message's headers say: another
            # delivery of this same message is running (broker redelivery, duplicate send_task).
            self._release_quietly(lock)
            self._skip(key, task_id, "already-running")
        run = _Run(self.name, task_id, key, lock)
        with _runs_lock:
            _runs[(task_id, key)] = run
        vars(request)[_RUN_ATTR] = run  # per request, so per thread in a threads-pool worker
        return run

    def _skip(self, key: str, holder: str | None, reason: str) -> None:
        task_id = self.request.id
        meta = {"key": key, "holder": holder, "reason": reason}
        try:
            self.update_state(task_id=task_id, state=SKIPPED, meta=meta)
        except Exception:  # a disabled/failing result backend must not hide the skip itself
            logger.warning(
                "Could not store the SKIPPED state of %s[%s]", self.name, task_id, exc_info=True
            )
        logger.warning(
            "Task %s[%s] skipped: lock %r is held by %s (%s).",
            self.name,
            task_id,
            key,
            f"task {holder}" if holder else "another holder",
            reason,
        )
        task_skipped.send_robust(
            type(self), task=self, task_id=task_id, key=key, holder=holder, reason=reason
        )
        raise Ignore(f"skipped: lock {key!r} is held by {holder or 'another holder'}")

    def _end_run(self, run: _Run) -> None:
        with _runs_lock:
            if _runs.get((run.task_id, run.key)) is run:
                del _runs[(run.task_id, run.key)]
        vars(self.request).pop(_RUN_ATTR, None)
        if run.handed_over:
            return
        try:
            released = self._release_quietly(run.lock, all_holds=True)
        except LockBackendError:
            logger.warning(
                "Task %s[%s] could not release lock %r; it expires within %ss.",
                self.name,
                run.task_id,
                run.key,
                self._lease(),
                exc_info=True,
            )
            return
        if not released:
            logger.error(
                "Task %s[%s] finished without its lock %r (expired or force-released "
                "while it ran).",
                self.name,
                run.task_id,
                run.key,
            )


# -- worker main process -----------------------------------------------------------------------
def release_for_request(
    task: Any, task_id: str | None, request: Any, args: Any = None, kwargs: Any = None
) -> bool:
    """Release every hold of ``task_id`` on its key; for code that outlives the run (revoke,
    a dead pool child). Returns whether something was released."""
    if not isinstance(task, SingleFlightTask) or not task_id:
        return False
    headers = _headers_of(request) if request is not None else {}
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
    lock = Lock(key, owner=task_id, using=headers.get(HEADER_USING) or task.lock_using)
    try:
        lock.release(all_holds=True)
    except LockNotOwnedError:
        return False
    except LockBackendError:
        logger.warning(
            "Could not release lock %r of %s[%s]; it expires within its lease.",
            key,
            task.name,
            task_id,
            exc_info=True,
        )
        return False
    logger.info("Released lock %r of %s[%s] for the worker.", key, task.name, task_id)
    return True


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


def _on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """A revoked, expired or terminated message will not run: free its key now."""
    if request is None:
        return
    release_for_request(
        sender,
        getattr(request, "id", None),
        request,
        getattr(request, "args", None),
        getattr(request, "kwargs", None),
    )


task_revoked.connect(
    _on_task_revoked, weak=False, dispatch_uid="django_redislock.celery.task_revoked"
)
