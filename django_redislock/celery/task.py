"""``SingleFlightTask``: Celery's client of :mod:`django_redislock.singleflight`.

The mode semantics (what publish, run start and run end hold) live in the neutral module; this
class maps them onto Celery: ``apply_async`` reserves before publishing and writes the ticket into
the message headers, ``__call__`` begins/ends the flight around the body, a busy delivery ends
``SKIPPED`` or is rescheduled, and ``retry()``/a same-key ``replace()`` (published from inside the
body) take the flight's hand-over. See the package docstring for the protocol end to end; the
worker main process's part (children that die, revoked messages) is in :mod:`.worker`.

Eager runs (``task_always_eager``, ``apply()``) take and release the same locks around the body,
in the caller's thread, so tests in eager mode see the single-flight semantics against real
Redis. Nothing there may wait for a run further up the same thread (it would never end) or be
re-published (an eager re-publish runs at once, finding the key as busy as before), so:

- a busy delivery is skipped: ``apply()`` returns an ``EagerResult`` in state ``SKIPPED`` whose
  ``result``/``info`` is ``{"key", "holder", "reason"}`` (a worker stores the same);
- a delivery that would wait for, or be rescheduled behind, a run of its key up its own thread
  (a coalesce follow-up published from the body, ``lock_on_busy="reschedule"``) runs right after
  that run ended, in the same thread; the call that published it gets its ``AsyncResult``;
- ``lock_on_busy="reschedule"`` behind any other holder is skipped;
- a run over a flow-control limit (``lock_rate``, ``task_rate``, ``task_permits``) is skipped
  (reason ``"lock_rate"`` ...): nothing may wait, and it must not run early;
- ``lock_mode="debounce"`` runs every publish at once (no quiet period), under the key's lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from celery.contrib.django.task import DjangoTask
from celery.exceptions import Ignore, Retry
from celery.result import EagerResult
from celery.utils import uuid as celery_uuid
from kombu.utils.json import dumps as json_dumps
from kombu.utils.json import loads as json_loads

from django_redislock import singleflight
from django_redislock.celery import runs
from django_redislock.celery.exceptions import DuplicateTaskError
from django_redislock.celery.headers import HEADER_KEY, headers_of, ticket_headers, ticket_of
from django_redislock.celery.keys import KeyFunction, key_function
from django_redislock.celery.signals import (
    task_deduplicated,
    task_rescheduled,
    task_skipped,
    task_throttled,
)
from django_redislock.singleflight import (
    Busy,
    Deferred,
    Duplicate,
    FlightRules,
    Stale,
    Ticket,
    delay_of,
    stats_row,
)

__all__ = ["SKIPPED", "SingleFlightTask"]

logger = logging.getLogger("django_redislock.celery")

#: Result state of a delivery that did not run because its key was held by another run.
SKIPPED = "SKIPPED"

_RUN_ATTR = "_redislock_run"
#: Publish options a debounced burst keeps from its first publish, for a rescue of its run.
_ROUTE_OPTIONS = ("queue", "routing_key", "exchange", "priority")


class _Skipped(Ignore):
    """The delivery did not run its body (``meta``: key, holder, reason). An ``Ignore``: a worker
    stores nothing more; an eager ``apply()`` turns it into state ``SKIPPED``."""

    meta: dict[str, Any]


class _Deferred(Ignore):
    """Eager only: the delivery runs once the run of its key up this thread ended."""


class SingleFlightTask(DjangoTask):  # type: ignore[type-arg]
    """A task of which at most one instance per lock key is queued or running (by default).

    Options (class attributes, settable in ``@shared_task(base=SingleFlightTask, ...)``; all
    validated when Celery creates the task class):

    - ``lock_key``: ``str.format`` template over the task's bound arguments (defaults applied), a
      callable taking the task's arguments, or ``None`` for the task name + a stable hash of the
      bound arguments.
    - ``lock_mode``: what the key guards (:data:`~django_redislock.singleflight.MODES`):
      ``"until_executed"`` (default: held from publish until the run ends),
      ``"until_executing"`` (held while queued, released when a worker starts it),
      ``"while_executing"`` (nothing at publish; at most ``lock_permits`` bodies run per key),
      ``"coalesce"`` (at most one running and one queued: a publish while one runs queues one
      follow-up that starts after it) or ``"until_expired"`` (held ``lock_timeout`` after publish,
      whatever the task does).
    - ``lock_permits``: with ``"while_executing"``, how many bodies may run at once per key.
    - ``lock_on_busy``: a delivery whose key is busy when a worker starts it ends ``"skip"``
      (state ``SKIPPED``) or is ``"reschedule"``-d: published again after
      ``lock_reschedule_countdown`` seconds (default ``lock_timeout``), not counted as a retry.
    - ``lock_timeout``: lease in seconds (default: ``REDISLOCK["TIMEOUT"]``), renewed while the body
      runs; ``"until_expired"``: the window.
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

    Flow control (every worker shares the limits; see :mod:`django_redislock.singleflight`):

    - ``lock_rate``: at most this rate of runs per lock key (``"10/m"``, ``"N/s|m|h|d"`` or a
      ``(count, seconds)`` tuple, as :class:`~django_redislock.RateLimiter` takes it);
      ``task_rate``: at most this rate of runs of the task, all keys together.
    - ``task_permits``: at most this many bodies of the task running at once, all keys together
      (with ``lock_permits``, a per-key and a global cap at once). A permit is leased like a
      lock and renewed while the body runs: a SIGKILLed worker's comes back within
      ``lock_timeout``, or at once when only its pool child died.
    - A run over a limit is never executed early and never waits in a worker slot: it is
      published again (same task id, state ``RETRY``, not counted against ``max_retries``) to
      run after the limiter's ``retry_after`` (full permits: about a second, or
      ``lock_reschedule_countdown``), counted ``throttled`` and reported by ``task_throttled``.

    Debounce (``lock_mode="debounce"``):

    - ``lock_debounce``: quiet period in seconds (required in that mode); ``lock_debounce_max``:
      longest wait after the first publish of a burst (optional). Publishes of one key within
      the quiet period collapse into one run with the arguments of the *last* publish (stored
      as JSON: they must be JSON-serialisable), started once no publish came for
      ``lock_debounce`` seconds, at the latest ``lock_debounce_max`` after the first. Every
      publish of a burst returns the ``AsyncResult`` of the run's id. The run holds the key as a
      lock; a due run whose key still runs waits in the broker (``lock_on_busy`` is not used).
      A worker that dies before the run claimed its burst loses nothing: a worker publishes the
      run again once it is overdue (see :mod:`django_redislock.celery.worker`).
    """

    # Celery imports the worker-side request class by this path (the public one, not .worker's).
    Request = "django_redislock.celery:SingleFlightRequest"

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

    _lock_name_of: KeyFunction | None = None
    _flight_rules: FlightRules = FlightRules()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds the task class from the decorated function with type(), so this runs when
        # the task is defined (at @shared_task/@app.task once the app is finalized, else when it
        # finalizes): a bad template or option fails there, not at the first publish.
        super().__init_subclass__(**kwargs)
        name = getattr(cls, "name", None) or cls.__qualname__
        cls._flight_rules = FlightRules.of_task(
            name, cls, stats_name=stats_row(cls.lock_key, getattr(cls, "name", None))
        )
        cls._lock_name_of = key_function(cls, cls.lock_key)

    # -- keys ----------------------------------------------------------------------------------
    def lock_name(self, args: Any = None, kwargs: Any = None) -> str:
        """The lock key of a call with ``args``/``kwargs`` (``TypeError`` if they do not fit)."""
        name_of = type(self)._lock_name_of
        if name_of is None:
            raise TypeError(f"{type(self).__qualname__} has no run() to derive a lock key from")
        return name_of(self, tuple(args or ()), dict(kwargs or {}))

    @property
    def flight_rules(self) -> FlightRules:
        """The task's validated single-flight options."""
        return type(self)._flight_rules

    @property
    def lock_lost(self) -> bool:
        """True when the running attempt lost its lock (expired or force-released) mid-run."""
        run: runs.Run | None = vars(self.request).get(_RUN_ATTR)
        return bool(run is not None and run.flight.lost)

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
        rules = self.flight_rules
        publish = {"producer": producer, "link": link, "link_error": link_error, "shadow": shadow}
        run = runs.find(task_id, key)
        if run is not None and not run.handed_over:
            return self._publish_next_attempt(run, args, kwargs, publish, options)
        if rules.mode == singleflight.DEBOUNCE and not self.app.conf.task_always_eager:
            return self._debounce(key, args, kwargs, task_id, publish, options)
        explicit_id = task_id is not None
        task_id = task_id or celery_uuid()
        outcome = singleflight.reserve(rules, key, task_id, delay=delay_of(options))
        if isinstance(outcome, Duplicate):
            return self._duplicate(
                outcome, own_id=task_id, explicit_id=explicit_id, publish=publish, options=options
            )
        eager = bool(self.app.conf.task_always_eager)
        if eager:
            runs.eager_publish_starts(task_id)
        try:
            return self._publish(outcome, args, kwargs, task_id, publish, options)
        except BaseException:
            # Not published (or unknown): free the key before the error propagates. Unless an
            # eager run began: then the error is the body's, and the run's end freed the key
            # (or kept an until_expired window, which must stay).
            if not (eager and runs.eager_publish_began_run(task_id)):
                singleflight.unreserve(rules, outcome, task_id)
            raise
        finally:
            if eager:
                runs.eager_publish_ends(task_id)

    def _publish(
        self,
        ticket: Ticket,
        args: Any,
        kwargs: Any,
        task_id: str,
        publish: Mapping[str, Any],
        options: dict[str, Any],
    ) -> Any:
        headers = dict(options.pop("headers", None) or {})
        headers.update(ticket_headers(ticket, self.lock_using))
        return super().apply_async(
            args, kwargs, task_id=task_id, headers=headers, **publish, **options
        )

    def _publish_next_attempt(
        self,
        run: runs.Run,
        args: Any,
        kwargs: Any,
        publish: Mapping[str, Any],
        options: dict[str, Any],
    ) -> Any:
        """Publish a retry (or a same-key replacement) of the running attempt ``run``.

        ``until_executed`` hands its holds over (never dropped in between, so no other publish
        slips in, and the next attempt finds exactly the count the headers announce); the other
        modes take what the mode takes for a queued message, if it is free.
        """
        flight = run.flight
        ticket = singleflight.hand_over(flight, delay=delay_of(options))
        try:
            return self._publish(ticket, args, kwargs, flight.flight_id, publish, options)
        except BaseException:
            if flight.handed_over:  # the end of this attempt releases every hold after all
                flight.handed_over = False
            else:
                singleflight.unreserve(self.flight_rules, ticket, flight.flight_id)
            raise

    def _debounce(
        self,
        key: str,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        publish: Mapping[str, Any],
        options: dict[str, Any],
    ) -> Any:
        """A publish of a debounced task: join its key's burst, or start one and send its
        message (due after the quiet period; its own countdown/eta are not used).

        A publish that joins a burst returns the burst's ``AsyncResult``; with
        ``lock_on_duplicate="raise"``, or when it carries callbacks, belongs to a canvas or was
        given another ``task_id``, it raises :class:`DuplicateTaskError` (``.task_id``: the
        burst's) instead, as a duplicate does. Either way its arguments are the burst's last."""
        rules = self.flight_rules
        try:
            payload = json_dumps({"args": list(args or ()), "kwargs": dict(kwargs or {})})
        except TypeError as exc:
            raise TypeError(
                f"{self.name}: the arguments of a debounced task are kept as JSON until its run, "
                f"and these are not JSON-serialisable: {exc}"
            ) from exc
        route = {
            name: value
            for name, value in options.items()
            if name in _ROUTE_OPTIONS and isinstance(value, (str, int)) and value is not True
        }
        candidate = task_id or celery_uuid()
        burst = singleflight.gather(rules, key, candidate, payload, route=json.dumps(route))
        if not burst.first:
            in_canvas = _in_canvas(publish, options)
            must_raise = (
                self.lock_on_duplicate == "raise"
                or in_canvas
                or (task_id is not None and task_id != burst.flight_id)
            )
            singleflight.count_outcome(rules, key, "deduplicated")
            task_deduplicated.send_robust(
                type(self),
                task=self,
                key=key,
                existing_task_id=burst.flight_id,
                raised=must_raise,
            )
            if must_raise:
                raise DuplicateTaskError(burst.flight_id, key)
            return self.AsyncResult(burst.flight_id)
        options.pop("eta", None)
        options["countdown"] = burst.delay
        try:
            return self._publish(Ticket(key), args, kwargs, burst.flight_id, publish, options)
        except BaseException:
            singleflight.drop_burst(rules, key, burst.flight_id)
            raise

    def send_rescued(self, rescued: Any) -> Any:
        """Publish again the run of a debounced burst whose message was lost (a worker died
        before the run claimed it): same id, the burst's latest arguments, where its first
        publish sent it. Called by the workers' rescuer (:mod:`.worker`)."""
        call = json_loads(rescued.payload)
        route = json.loads(rescued.route or "{}")
        headers = ticket_headers(Ticket(rescued.key), self.lock_using)
        return super().apply_async(
            call.get("args") or (),
            call.get("kwargs") or {},
            task_id=rescued.flight_id,
            headers=headers,
            **route,
        )

    def _duplicate(
        self,
        duplicate: Duplicate,
        *,
        own_id: str,
        explicit_id: bool,
        publish: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> Any:
        key, existing = duplicate.key, duplicate.holder
        in_canvas = _in_canvas(publish, options)
        must_raise = (
            self.lock_on_duplicate == "raise"
            or in_canvas
            or existing is None
            or (explicit_id and own_id != existing)
        )
        singleflight.count_outcome(self.flight_rules, key, "deduplicated")
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

    # -- run -----------------------------------------------------------------------------------
    def apply(
        self,
        args: Any = None,
        kwargs: Any = None,
        link: Any = None,
        link_error: Any = None,
        task_id: str | None = None,
        retries: int | None = None,
        throw: bool | None = None,
        logfile: str | None = None,
        loglevel: str | None = None,
        headers: Any = None,
        **options: Any,
    ) -> Any:
        """Run the task here and now (``task_always_eager`` calls this too), with its locks.

        A delivery skipped because its key was busy returns an ``EagerResult`` in state
        ``SKIPPED`` (``.info``: key, holder, reason); one deferred behind a run of its key further
        up this thread returns its ``AsyncResult``: it runs when that run ended.
        """
        result = super().apply(
            args,
            kwargs,
            link=link,
            link_error=link_error,
            task_id=task_id,
            retries=retries,
            throw=throw,
            logfile=logfile,
            loglevel=loglevel,
            headers=headers,
            **options,
        )
        outcome = result.result
        if isinstance(outcome, _Skipped):
            return EagerResult(result.id, outcome.meta, SKIPPED, name=self.name)
        if isinstance(outcome, _Deferred):
            return self.AsyncResult(result.id)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # A plain function call (``sync(1)``), not a delivery: no lock, as documented.
            return super().__call__(*args, **kwargs)
        eager = bool(request.is_eager)
        if eager:
            runs.eager_run_begins(str(request.id))
        run = runs.Run(self.name, self._begin(request, args, kwargs))
        if run.flight.payload is not None:
            # Debounce: the body runs with the burst's last arguments; a retry() from it too.
            claimed = json_loads(run.flight.payload)
            args, kwargs = tuple(claimed.get("args") or ()), dict(claimed.get("kwargs") or {})
            request.args, request.kwargs = list(args), kwargs
        runs.add(run)
        if eager:
            runs.push_eager(run)
        vars(request)[_RUN_ATTR] = run  # per request, so per thread in a threads-pool worker
        try:
            # The tracer already pushed this task and its request; Task.__call__ would push a bare
            # request over it (Celery patches that away only in `celery worker` processes).
            return self.run(*args, **kwargs)
        finally:
            runs.remove(run)
            if eager:
                runs.pop_eager(run)
            vars(request).pop(_RUN_ATTR, None)
            singleflight.end(run.flight)
            # Eager: what would have waited for this run (or been rescheduled behind it) runs now.
            for follow_up in run.deferred:
                follow_up()

    def _begin(self, request: Any, args: Any, kwargs: Any) -> singleflight.Flight:
        headers = headers_of(request)
        key = headers.get(HEADER_KEY) or self.lock_name(args, kwargs)
        ticket = ticket_of(headers, key)
        if request.is_eager and self.flight_rules.mode == singleflight.COALESCE:
            running = runs.eager_runner(key)
            if running is not None:
                # A follow-up published from the body of the run it would wait for: that run
                # cannot end while we wait in its own thread. Run once it ended, as a worker would.
                self._defer_behind(running, self.signature_from_request(request, args, kwargs))
        rules = self.flight_rules
        if request.is_eager and rules.mode == singleflight.DEBOUNCE:
            # Nothing may wait in eager mode: each publish runs at once, under the key's lock.
            rules = dataclasses.replace(
                rules, mode=singleflight.WHILE_EXECUTING, debounce=None, debounce_max=None
            )
        try:
            return singleflight.begin(
                rules,
                key,
                request.id,
                ticket,
                attempt=ticket.attempt,
                requeue=not request.is_eager,
            )
        except Deferred as deferred:
            self._defer(request, args, kwargs, deferred)
        except Stale:
            logger.info(
                "Task %s[%s]: its debounced burst (lock %r) already ran or expired; nothing to do.",
                self.name,
                request.id,
                key,
            )
            raise Ignore() from None
        except Busy as busy:
            if self.lock_on_busy == "reschedule" and busy.reason != "already-running":
                self._reschedule(request, args, kwargs, busy, ticket)
            self._skip(busy.key, busy.holder, busy.reason)

    def _reschedule(
        self, request: Any, args: Any, kwargs: Any, busy: Busy, ticket: Ticket
    ) -> NoReturn:
        """Publish this delivery again after the reschedule countdown (same task id, same
        ``retries``: not counted against ``max_retries``), through the mode's publish step; a
        publish that finds the key queued already is covered by that message: skipped.

        Eager: deferred behind the run of the key up this thread, if there is one; else skipped
        (an eager re-publish would run at once and find the same holder)."""
        rules = self.flight_rules
        behind = runs.eager_runner(busy.key) if request.is_eager else None
        if request.is_eager and behind is None:
            self._skip(busy.key, busy.holder, busy.reason)
        countdown = rules.reschedule_delay()
        outcome = singleflight.reserve(rules, busy.key, request.id, delay=countdown)
        if isinstance(outcome, Duplicate):
            self._skip(busy.key, outcome.holder or busy.holder, busy.reason)
        # Same attempt number: this delivery never held a run-time lock, so the next one has no
        # predecessor to wait for.
        following = Ticket(busy.key, outcome.token, outcome.holds, ticket.attempt)
        sig = self.signature_from_request(request, args, kwargs, countdown=countdown)
        options = dict(sig.options)
        options["headers"] = {
            **dict(options.get("headers") or {}),
            **ticket_headers(following, self.lock_using),
        }
        if behind is not None:
            self._defer_behind(behind, sig.clone(headers=options["headers"]), busy=busy)
        try:
            super().apply_async(sig.args, sig.kwargs, **options)
        except BaseException:
            singleflight.unreserve(rules, outcome, request.id)
            raise
        logger.info(
            "Task %s[%s] rescheduled in %ss: lock %r is held by %s (%s).",
            self.name,
            request.id,
            countdown,
            busy.key,
            f"task {busy.holder}" if busy.holder else "another holder",
            busy.reason,
        )
        singleflight.count_outcome(rules, busy.key, "skipped")
        task_rescheduled.send_robust(
            type(self),
            task=self,
            task_id=request.id,
            key=busy.key,
            holder=busy.holder,
            reason=busy.reason,
            countdown=countdown,
        )
        when: Any = countdown  # celery-types wants numbers.Real, which mypy cannot match a float to
        raise Retry(f"lock {busy.key!r} is busy: rescheduled", when=when, sig=sig)

    def _defer(self, request: Any, args: Any, kwargs: Any, deferred: Deferred) -> NoReturn:
        """Publish this delivery again to run in ``deferred.countdown`` seconds (same task id,
        same ``retries``: not counted against ``max_retries``), carrying the holds
        :func:`singleflight.begin` put back for it. A run over a limit is counted
        ``throttled`` and reported by ``task_throttled``.

        Eager: skipped (reason: the limit; an eager re-publish would run at once)."""
        rules, key = self.flight_rules, deferred.key
        carried = deferred.ticket
        if request.is_eager or carried is None:
            self._skip(key, None, deferred.reason)
        if isinstance(carried, Duplicate):  # another message of the key is queued: it covers us
            self._skip(key, carried.holder, "queued")
        countdown = deferred.countdown
        sig = self.signature_from_request(request, args, kwargs, countdown=countdown)
        options = dict(sig.options)
        options["headers"] = {
            **dict(options.get("headers") or {}),
            **ticket_headers(carried, self.lock_using),
        }
        try:
            super().apply_async(sig.args, sig.kwargs, **options)
        except BaseException:
            singleflight.unreserve(rules, carried, request.id)
            raise
        if deferred.throttled:
            logger.info(
                "Task %s[%s] throttled (%s, lock %r): published again to run in %.3gs.",
                self.name,
                request.id,
                deferred.reason,
                key,
                countdown,
            )
            singleflight.count_outcome(rules, key, "throttled")
            task_throttled.send_robust(
                type(self),
                task=self,
                task_id=request.id,
                key=key,
                reason=deferred.reason,
                countdown=countdown,
            )
        else:
            logger.debug(
                "Task %s[%s] (debounced, lock %r) runs in %.3gs (%s).",
                self.name,
                request.id,
                key,
                countdown,
                deferred.reason,
            )
        when: Any = countdown  # celery-types wants numbers.Real (see _reschedule)
        raise Retry(
            f"lock {key!r}: {deferred.reason}, runs in {countdown:.3g}s", when=when, sig=sig
        )

    def _defer_behind(self, running: runs.Run, sig: Any, busy: Busy | None = None) -> NoReturn:
        """Eager: run ``sig`` in this thread once ``running`` ended; end this delivery now."""
        running.deferred.append(sig.apply)
        logger.info(
            "Task %s[%s] runs after task %s[%s] ends: eager mode, lock %r is held up this thread.",
            self.name,
            self.request.id,
            running.task_name,
            running.task_id,
            running.key,
        )
        if busy is not None:
            task_rescheduled.send_robust(
                type(self),
                task=self,
                task_id=self.request.id,
                key=busy.key,
                holder=busy.holder,
                reason=busy.reason,
                countdown=0.0,
            )
        raise _Deferred(f"runs after task {running.task_id} ends (lock {running.key!r})")

    def _skip(self, key: str, holder: str | None, reason: str) -> NoReturn:
        """End this delivery without running the body: state ``SKIPPED``, log, signal, Ignore."""
        request = self.request
        task_id = request.id
        meta = {"key": key, "holder": holder, "reason": reason}
        if not request.is_eager or self.app.conf.task_store_eager_result:
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
        singleflight.count_outcome(self.flight_rules, key, "skipped")
        task_skipped.send_robust(
            type(self), task=self, task_id=task_id, key=key, holder=holder, reason=reason
        )
        skipped = _Skipped(f"skipped: lock {key!r} is held by {holder or 'another holder'}")
        skipped.meta = meta
        raise skipped


def _in_canvas(publish: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    """The publish carries callbacks or belongs to a chain, group or chord."""
    return bool(
        publish.get("link")
        or publish.get("link_error")
        or options.get("chain")
        or options.get("chord")
        or options.get("group_id")
    )
