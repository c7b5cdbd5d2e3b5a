"""``SingleFlightTask``: the key is taken at publish and re-entered by the worker that runs it.

See the package docstring for the protocol end to end; the worker main process's part (children
that die, revoked messages) is in :mod:`.worker`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from celery.contrib.django.task import DjangoTask
from celery.exceptions import Ignore
from celery.utils import uuid as celery_uuid

from django_redislock.celery import runs
from django_redislock.celery.exceptions import DuplicateTaskError
from django_redislock.celery.headers import (
    HEADER_HOLDS,
    HEADER_KEY,
    HEADER_TOKEN,
    HEADER_USING,
    headers_of,
)
from django_redislock.celery.keys import KeyFunction, key_function
from django_redislock.celery.signals import task_deduplicated, task_skipped
from django_redislock.exceptions import LockBackendError, LockNotOwnedError
from django_redislock.lock import Lock
from django_redislock.operations import get_lock_info

__all__ = ["SKIPPED", "SingleFlightTask"]

logger = logging.getLogger("django_redislock.celery")

#: Result state of a delivery that did not run because its key was held by another run.
SKIPPED = "SKIPPED"

_DUPLICATE_CHOICES = ("return", "raise")
_RUN_ATTR = "_redislock_run"


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

    # Celery imports the worker-side request class by this path (the public one, not .worker's).
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
        cls._lock_name_of = key_function(cls, cls.lock_key)

    # -- keys and leases -----------------------------------------------------------------------
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

    def _lock(
        self, key: str, task_id: str, timeout: float, *, auto_renew: bool, queued: bool = False
    ) -> Lock:
        """The task id's lock on ``key``. ``queued``: taken for a message that is about to wait in
        the broker, so ``list_locks`` shows this process as its publisher, labelled queued; the
        worker that runs it re-enters without ``queued`` and shows itself instead."""
        return Lock(
            key,
            timeout=timeout,
            auto_renew=auto_renew,
            using=self.lock_using,
            owner=task_id,
            task_id=task_id,
            queued=queued,
            stats_name=self.name,
        )

    @property
    def lock_lost(self) -> bool:
        """True when the running attempt lost its lock (expired or force-released) mid-run."""
        run: runs.Run | None = vars(self.request).get(_RUN_ATTR)
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
        run = runs.find(task_id, key)
        if run is not None and not run.handed_over:
            return self._hand_over(run, args, kwargs, producer, link, link_error, shadow, options)
        explicit_id = task_id is not None
        task_id = task_id or celery_uuid()
        lock = self._lock(key, task_id, self._queue_lease(options), auto_renew=False, queued=True)
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
        run: runs.Run,
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

        The hand-over re-enters the lock (one more hold, ``queued``, with the queued lease)
        instead of only renewing it: until a worker starts the next attempt, ``list_locks`` shows
        the message as queued, published by this process, like any other queued task.
        """
        run.lock.detach()  # the watchdog must not renew (shorten) the queued lease set below
        headers = dict(options.pop("headers", None) or {})
        headers.update(
            {
                HEADER_KEY: run.key,
                HEADER_TOKEN: None,
                HEADER_HOLDS: 0,
                HEADER_USING: self.lock_using,
            }
        )
        queued = self._lock(
            run.key, run.task_id, self._queue_lease(options), auto_renew=False, queued=True
        )
        if queued.acquire(blocking=False):
            holds, held_token = queued.detach()
            headers.update({HEADER_TOKEN: held_token, HEADER_HOLDS: holds})
            if holds == 1:  # a fresh hold, not a re-entry: ours had expired or been released
                logger.warning(
                    "Task %s[%s] lost lock %r while it ran; it was free, so the message it "
                    "publishes takes it anew.",
                    self.name,
                    run.task_id,
                    run.key,
                )
        else:
            logger.warning(
                "Task %s[%s] hands over lock %r, but it was lost and is held by another "
                "holder now: the message it publishes will be skipped while that holds it.",
                self.name,
                run.task_id,
                run.key,
            )
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

    def _start_run(self, request: Any, args: Any, kwargs: Any) -> runs.Run:
        headers = headers_of(request)
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
        run = runs.Run(self.name, task_id, key, lock)
        runs.add(run)
        vars(request)[_RUN_ATTR] = run  # per request, so per thread in a threads-pool worker
        return run

    def _skip(self, key: str, holder: str | None, reason: str) -> NoReturn:
        """End this delivery without running the body: state ``SKIPPED``, log, signal, Ignore."""
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

    def _end_run(self, run: runs.Run) -> None:
        runs.remove(run)
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
