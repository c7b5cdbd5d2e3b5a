"""Single-flight semantics shared by the task integrations: what publish, run start and run end do.

A *flight* is one unit of work identified by a ``flight_id`` (a Celery task id, a Django task
result id): the integrations (:mod:`django_redislock.celery`, :mod:`django_redislock.django_tasks`)
derive a lock *key* from the task's arguments and call this module at three points:

- :func:`reserve` when a message is about to be published, **before** it exists (a worker may start
  it at once). It answers a :class:`Ticket` (what the message carries: the hold it took) or a
  :class:`Duplicate` (publish nothing).
- :func:`begin` when a worker starts the body; it answers a :class:`Flight` or raises :class:`Busy`
  (the framework then skips or reschedules the delivery).
- :func:`end` when the body ended, :func:`hand_over` when the body publishes its own next attempt
  (``retry()``, a same-key ``replace()``), :func:`abandon` when the process that ran it cannot
  (a dead Celery pool child, a revoked message).

What each mode holds (``key``: the task's lock key; ``run slot``: ``key + ":running"``):

===================  =========================  ==========================  =====================
mode                 publish                    run start                   run end
===================  =========================  ==========================  =====================
``until_executed``   take ``key`` (queued)      re-enter ``key``, renewed   release ``key``
``until_executing``  take ``key`` (queued)      release ``key``             --
``while_executing``  --                         take ``key`` (lock, or a    release it
                                                semaphore of ``permits``)
``coalesce``         take ``key`` (queued)      re-enter ``key``; take the  release the run slot
                                                run slot (waiting for the
                                                running one); release
                                                ``key``
``until_expired``    take ``key`` for           check ``key`` is ours (or   --
                     ``lock_timeout``           free: take it)
``debounce``         join the burst's record    when due: take ``key``      release it
                     (:mod:`.debounce`)         (a lock), claim the record
===================  =========================  ==========================  =====================

Owners: publish-time holds belong to the flight id, so the worker re-enters what the publisher
took. Run-time locks (``while_executing``, the coalesce run slot) belong to
``"<flight id>#<attempt>"``: a retry is another attempt of the same flight, which must not re-enter
its predecessor's lock while that one is still releasing it, whereas a second delivery of the same
message (same attempt) does re-enter it and is recognised as already running.

**Flow control** (``lock_rate``, ``task_rate``, ``task_permits``) is checked at run start, once
the mode's run-time step succeeded (so a delivery that is skipped spends no rate and takes no
permit, and a second delivery of a running message is recognised before any limit is asked):
the per-key rate (a :class:`~django_redislock.ratelimit.RateLimiter` named by the lock key),
then the task's rate (one named by the task), then a permit of the task's semaphore
(``"<task name>:permits"``, a :class:`~django_redislock.semaphore.Semaphore` held, renewed and
released like the run's own lock, and freed for a dead worker by :func:`abandon`). A run over a
limit raises :class:`Deferred` (``throttled``): :func:`begin` has already put the holds back as
a queued message holds them (``until_executed``: the re-entry is given back and the publish hold
gets the queued lease again) and says in ``Deferred.ticket`` what the re-published message
carries; the integration publishes it again after ``Deferred.countdown`` (a rate's
``retry_after``; for a full semaphore :data:`PERMIT_BACKOFF`, or ``lock_reschedule_countdown``)
— never running it early, never waiting in a worker slot — and counts it ``throttled``.

**Debounce** (``lock_mode="debounce"``, ``lock_debounce``, ``lock_debounce_max``): publishes of one
key within the quiet period collapse into one run with the arguments of the last one. A publish
(:func:`gather`) writes the arguments into the key's record in one script and learns the burst's
flight id (made by the burst's first publish, which alone sends a message, due after the quiet
period). A delivery (:func:`begin`) reads whether the burst is due: not yet (a publish came
since) raises :class:`Deferred` (``"debounce"``, published again for the rest of the wait); a
record of another id or none raises :class:`Stale` (the burst was run by another message of the
same id); due: the run takes ``key`` as a lock (busy: :class:`Deferred` ``"busy"`` — a debounced
run is never skipped, it carries the last arguments), checks the limits, then claims the record
(atomically: deleted, arguments taken) and runs with the claimed arguments
(``Flight.payload``). A worker that dies before claiming loses nothing: the record stays, and
:func:`rescue_overdue` (run by the workers) publishes its run again once it is overdue.

Publish-time attempts are *quiet*: a key found busy at publish is a deduplication, reported by
the integrations' ``task_deduplicated`` signal, not a failed acquisition in the statistics.
Busy run-time attempts are not failed acquisitions either. The integrations count both with
:func:`count_outcome` — ``deduplicated`` and ``skipped`` in :mod:`django_redislock.stats` — so the
success rate of a task whose duplicates were folded stays at 100 %.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.dispatch import Signal

from django_redislock import client as redis_client
from django_redislock import debounce, stats
from django_redislock.conf import MIN_LEASE, check_seconds, get_settings
from django_redislock.exceptions import (
    LockBackendError,
    LockNotAcquiredError,
    LockNotOwnedError,
)
from django_redislock.lock import Lock
from django_redislock.naming import stats_shape
from django_redislock.operations import force_release, get_lock_info, lock_holders
from django_redislock.ratelimit import RateLimiter, parse_rate
from django_redislock.runtime import runtime
from django_redislock.semaphore import Semaphore, check_permits
from django_redislock.transport import backend_errors
from django_redislock.validation import check_name

__all__ = [
    "COALESCE",
    "DEBOUNCE",
    "LOCK_MODES",
    "MODES",
    "ON_BUSY",
    "ON_DUPLICATE",
    "PERMIT_BACKOFF",
    "UNTIL_EXECUTED",
    "UNTIL_EXECUTING",
    "UNTIL_EXPIRED",
    "WHILE_EXECUTING",
    "Burst",
    "Busy",
    "Deferred",
    "Duplicate",
    "DuplicateTaskError",
    "Flight",
    "FlightRules",
    "Stale",
    "TaskOptionError",
    "Ticket",
    "abandon",
    "begin",
    "cancel_burst",
    "count_outcome",
    "delay_of",
    "drop_burst",
    "end",
    "gather",
    "hand_over",
    "permit_name",
    "rescue_overdue",
    "reserve",
    "run_key",
    "run_owner",
    "stats_row",
    "task_deduplicated",
    "task_rescheduled",
    "task_skipped",
    "task_throttled",
    "unreserve",
]

logger = logging.getLogger("django_redislock.singleflight")

UNTIL_EXECUTED = "until_executed"
UNTIL_EXECUTING = "until_executing"
WHILE_EXECUTING = "while_executing"
COALESCE = "coalesce"
UNTIL_EXPIRED = "until_expired"
DEBOUNCE = "debounce"
#: The single-flight ``lock_mode`` values, the default first.
MODES = (UNTIL_EXECUTED, UNTIL_EXECUTING, WHILE_EXECUTING, COALESCE, UNTIL_EXPIRED)
#: Every ``lock_mode``: the single-flight ones and ``"debounce"`` (a burst of publishes -> one run).
LOCK_MODES = (*MODES, DEBOUNCE)
#: Modes that take the key when a message is published (``while_executing`` does not).
PUBLISH_MODES = (UNTIL_EXECUTED, UNTIL_EXECUTING, COALESCE, UNTIL_EXPIRED)
#: ``lock_on_busy`` values: what a delivery whose key is busy at run time does.
ON_BUSY = ("skip", "reschedule")
#: ``lock_on_duplicate`` values: what a publish whose key is busy returns.
ON_DUPLICATE = ("return", "raise")
#: Suffix of the coalesce run slot's lock name.
RUN_SLOT_SUFFIX = ":running"
#: Suffix of the task-wide semaphore's name (``task_permits``): ``"<task name>:permits"``.
PERMITS_SUFFIX = ":permits"
#: Seconds a run that found every ``task_permits`` permit taken waits in the broker before it is
#: delivered again (unless ``lock_reschedule_countdown`` says otherwise), plus up to a quarter
#: more at random so that the runs throttled together do not all come back at once. A permit
#: frees when a body ends, which nothing announces: short, so a freed permit is not left idle.
PERMIT_BACKOFF = 1.0
#: Seconds an unclaimed debounce record outlives its due time when ``lock_queue_timeout`` is not
#: set (its message may wait that long for a worker; the rescue keeps publishing it meanwhile).
DEBOUNCE_KEEP = 3600.0
#: Seconds ahead a run over a rate may be scheduled (:meth:`RateLimiter.schedule`): runs
#: further behind are re-published after the rate's retry-after and scheduled when they come
#: back. Kept well below the brokers' visibility timeouts (Redis: one hour), beyond which a
#: message waiting for its countdown is delivered twice.
SCHEDULE_HORIZON = 600.0
#: Reasons of a :class:`Deferred` run that count as ``throttled``.
THROTTLE_REASONS = ("lock_rate", "task_rate", "task_permits")


# -- what the integrations report (Django signals, like :mod:`django_redislock.signals`) -----------

#: ``task_skipped(sender=<task class>, task, task_id, key, holder, reason)``: a delivered task did
#: not run its body (``holder``: the task id holding the key, when known; ``reason``: ``"busy"``,
#: ``"queued"`` (coalesce: another follow-up is queued and will do the work) or
#: ``"already-running"``). Sent in the worker, in the thread that got the task.
task_skipped = Signal()
#: ``task_deduplicated(sender=<task class>, task, key, existing_task_id, raised)``: a publish found
#: the key taken and published nothing (beat ticks that overlap a running task land here). Not a
#: failed acquisition: the statistics do not count it as one.
task_deduplicated = Signal()
#: ``task_rescheduled(sender=<task class>, task, task_id, key, holder, reason, countdown)``: a
#: delivery found its key busy and, with ``lock_on_busy="reschedule"``, was published again to
#: run in ``countdown`` seconds (Celery: same task id, not counted as a retry).
task_rescheduled = Signal()
#: ``task_throttled(sender=<task class>, task, task_id, key, reason, countdown)``: a delivery was
#: over a limit (``reason``: ``"lock_rate"``, ``"task_rate"`` or ``"task_permits"``) and was
#: published again to run in ``countdown`` seconds, without running its body (Celery: same task
#: id, not counted as a retry; django.tasks: a new result, see ``TaskSkippedError``).
task_throttled = Signal()


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


def run_key(key: str) -> str:
    """The lock name of the coalesce run slot of ``key``."""
    return key + RUN_SLOT_SUFFIX


def run_owner(flight_id: str, attempt: int) -> str:
    """Owner of the run-time lock of one attempt of a flight."""
    return f"{flight_id}#{attempt}"


class TaskOptionError(ValueError, TypeError):
    """A single-flight task option is invalid (raised when the task is defined).

    Both a ``ValueError`` (a bad option value, as the API promises) and a ``TypeError`` (what
    Python raises for a value of the wrong type), so ``except`` clauses written for either work.
    """


@dataclass(frozen=True)
class FlightRules:
    """The validated single-flight options of one task: mode, leases, permits, limits, reactions.

    Built once, when the task is defined (:meth:`validated`), so a bad option fails there.
    ``timeout``/``queue_timeout`` ``None`` mean ``REDISLOCK["TIMEOUT"]`` / ``timeout``, read at
    use (settings may change in tests).
    """

    mode: str = UNTIL_EXECUTED
    timeout: float | None = None
    queue_timeout: float | None = None
    permits: int = 1
    on_busy: str = "skip"
    on_duplicate: str = "return"
    reschedule_countdown: float | None = None
    using: str | None = None
    #: Statistics name of every lock of the task: its key template, else the task name
    #: (bounded, not one row per key; see :func:`stats_row`).
    stats_name: str | None = None
    #: The task's name: names its task-wide limiter, semaphore and debounce records.
    task: str = ""
    #: ``lock_rate`` (per lock key) and ``task_rate`` (whole task): a rate as
    #: :class:`~django_redislock.ratelimit.RateLimiter` takes it, or ``None``.
    rate: Any = None
    task_rate: Any = None
    #: ``task_permits``: bodies of the task running at once across all keys (``None``: no cap).
    task_permits: int | None = None
    #: ``lock_debounce`` / ``lock_debounce_max``: quiet period and longest wait (seconds).
    debounce: float | None = None
    debounce_max: float | None = None

    @classmethod
    def validated(cls, task: str, **options: Any) -> FlightRules:
        """Rules from task options, or :class:`TaskOptionError` naming ``task`` and the option.

        ``options`` are the keyword arguments of this class; ``None`` values take the defaults
        of ``mode``, ``permits``, ``on_busy`` and ``on_duplicate``.
        """
        values = {name: value for name, value in options.items() if value is not None}
        values.setdefault("task", task)
        rules = cls(**values)

        def fail(message: str) -> TaskOptionError:
            return TaskOptionError(f"{message} (task {task}).")

        if not isinstance(rules.mode, str) or rules.mode not in LOCK_MODES:
            raise fail(f"lock_mode must be one of {_choices(LOCK_MODES)}, not {rules.mode!r}")
        if rules.on_busy not in ON_BUSY:
            raise fail(
                f"lock_on_busy must be one of {_choices(ON_BUSY)}, not {rules.on_busy!r}",
            )
        if rules.on_duplicate not in ON_DUPLICATE:
            raise fail(
                f"lock_on_duplicate must be one of {_choices(ON_DUPLICATE)}, not "
                f"{rules.on_duplicate!r}",
            )
        try:
            check_permits(rules.permits)
        except (TypeError, ValueError) as exc:
            raise fail(f"lock_permits: {exc}") from None
        if rules.permits != 1 and rules.mode != WHILE_EXECUTING:
            raise fail(
                f"lock_permits={rules.permits} needs lock_mode='while_executing' (the other "
                f"modes run at most one body per key), not {rules.mode!r}",
            )
        for option, value in (
            ("lock_timeout", rules.timeout),
            ("lock_queue_timeout", rules.queue_timeout),
            ("lock_reschedule_countdown", rules.reschedule_countdown),
            ("lock_debounce", rules.debounce),
            ("lock_debounce_max", rules.debounce_max),
        ):
            try:
                check_seconds(value, option, minimum=MIN_LEASE, allow_none=True)
            except (TypeError, ValueError) as exc:
                raise fail(str(exc)) from None
        if rules.using is not None and (not isinstance(rules.using, str) or not rules.using):
            raise fail(f"lock_using must be a CACHES alias or None, not {rules.using!r}")
        if rules.task_permits is not None:
            try:
                check_permits(rules.task_permits)
            except (TypeError, ValueError) as exc:
                raise fail(f"task_permits: {exc}") from None
        for option, rate in (("lock_rate", rules.rate), ("task_rate", rules.task_rate)):
            if rate is not None:
                try:
                    parse_rate(rate)
                except (TypeError, ValueError) as exc:
                    raise fail(f"{option}: {exc}") from None
        _check_debounce(rules, fail)
        return rules

    @classmethod
    def of_task(cls, task: str, options: Any, *, stats_name: str | None) -> FlightRules:
        """:meth:`validated` from the options every task face declares (``lock_*``,
        ``task_rate``, ``task_permits``).

        Celery tasks declare them as class attributes, Django tasks as dataclass fields; both
        read them here, so an option added to one face cannot be forgotten by the other.
        """
        return cls.validated(
            task,
            mode=options.lock_mode,
            timeout=options.lock_timeout,
            queue_timeout=options.lock_queue_timeout,
            permits=options.lock_permits,
            on_busy=options.lock_on_busy,
            on_duplicate=options.lock_on_duplicate,
            reschedule_countdown=options.lock_reschedule_countdown,
            using=options.lock_using,
            stats_name=stats_name,
            rate=options.lock_rate,
            task_rate=options.task_rate,
            task_permits=options.task_permits,
            debounce=options.lock_debounce,
            debounce_max=options.lock_debounce_max,
        )

    @property
    def lease(self) -> float:
        """Running lease (renewed while the body runs); ``until_expired``: the window."""
        return float(self.timeout) if self.timeout is not None else get_settings().timeout

    def queue_lease(self, delay: float = 0.0) -> float:
        """Lease of a message waiting in the broker: queue timeout + its countdown/eta."""
        queued = self.queue_timeout
        return (float(queued) if queued is not None else self.lease) + max(0.0, delay)

    def reschedule_delay(self) -> float:
        """Countdown of a rescheduled delivery (default: ``lock_timeout``, within which a dead
        holder's key frees itself; ``debounce``: the quiet period)."""
        countdown = self.reschedule_countdown
        if countdown is not None:
            return float(countdown)
        if self.mode == DEBOUNCE and self.debounce is not None:
            return float(self.debounce)
        return self.lease

    def permit_backoff(self) -> float:
        """Countdown of a run that found every task permit taken (see :data:`PERMIT_BACKOFF`)."""
        base = self.reschedule_countdown
        base = float(base) if base is not None else PERMIT_BACKOFF
        return base * (1.0 + random.random() / 4)

    @property
    def debounce_keep(self) -> float:
        """Seconds an unclaimed debounce record outlives its due time: ``lock_queue_timeout``,
        else :data:`DEBOUNCE_KEEP` (at least the lease)."""
        if self.queue_timeout is not None:
            return float(self.queue_timeout)
        return max(DEBOUNCE_KEEP, self.lease)

    @property
    def limited(self) -> bool:
        """Some flow-control option is set."""
        return bool(self.rate or self.task_rate or self.task_permits)


def _check_debounce(rules: FlightRules, fail: Callable[[str], TaskOptionError]) -> None:
    if rules.mode != DEBOUNCE:
        if rules.debounce is not None or rules.debounce_max is not None:
            raise fail(
                f"lock_debounce and lock_debounce_max need lock_mode='debounce', not {rules.mode!r}"
            )
        return
    if rules.debounce is None:
        raise fail(
            "lock_mode='debounce' needs lock_debounce=<seconds>: the quiet period after the "
            "last publish of a burst before its run starts"
        )
    if rules.debounce_max is not None and rules.debounce_max < rules.debounce:
        raise fail(
            f"lock_debounce_max ({rules.debounce_max}) must not be shorter than lock_debounce "
            f"({rules.debounce}): it bounds how long a burst that keeps going waits"
        )


def stats_row(lock_key: object, task_name: str | None) -> str | None:
    """The statistics row of a task's locks: its ``lock_key`` template (``"report:{id}"``), as
    for ``@distributed_lock``; the task name when the key is a callable or derived from the
    arguments (one row per task, not one per key)."""
    if isinstance(lock_key, str) and lock_key:
        return lock_key
    return task_name


def _choices(values: tuple[str, ...]) -> str:
    return ", ".join(repr(v) for v in values)


# -- what travels with a message ------------------------------------------------------------------


@dataclass(frozen=True)
class Ticket:
    """What a published message carries: its key and the publish-time hold it accounts for.

    ``holds`` is how many holds of the flight id on ``key`` the message accounts for (0: none;
    ``None``: unknown, for integrations that cannot carry it — the run then allows one publish
    hold). ``token`` is the fencing token of that hold; ``attempt`` numbers the flight's attempts
    (retries, replacements, reschedules), which own distinct run-time locks.
    """

    key: str
    token: int | None = None
    holds: int | None = 0
    attempt: int = 0
    #: The message was put off by a rate and spread on its schedule already
    #: (:meth:`~django_redislock.ratelimit.RateLimiter.schedule`): turned away again, it comes
    #: back after the plain retry-after instead of queueing behind the schedule anew.
    scheduled: bool = False


@dataclass(frozen=True)
class Duplicate:
    """A publish found the key held: nothing may be published.

    ``holder`` is the task id recorded with the hold (``None``: a holder that is not a task);
    ``same`` is True when the holder is the very flight being published (published twice under
    one id).
    """

    key: str
    holder: str | None
    same: bool = False


def _publish_lock(rules: FlightRules, key: str, flight_id: str, lease: float) -> Lock:
    # Quiet: a publish-time hold is not an acquisition of the work (the run's is), and a busy
    # publish is a deduplication, reported by task_deduplicated: neither counts in statistics.
    return Lock(
        key,
        quiet=True,
        timeout=lease,
        auto_renew=False,
        using=rules.using,
        owner=flight_id,
        task_id=flight_id,
        queued=True,
        stats_name=rules.stats_name,
    )


def reserve(
    rules: FlightRules, key: str, flight_id: str, *, delay: float = 0.0
) -> Ticket | Duplicate:
    """Take the publish-time hold of a message about to be published (one round trip).

    Nothing to take for ``while_executing`` (nor ``debounce``, whose publishes :func:`gather`).
    The hold is *detached* from this process at once: the worker that runs the message owns it
    from now on, and this process must not renew it. ``delay``: the message's countdown/eta,
    added to the queued lease (``until_expired``: to the window, which starts when the message
    may run).
    """
    check_name(key, "Lock key")
    if rules.mode in (WHILE_EXECUTING, DEBOUNCE):
        return Ticket(key)
    lease = (
        rules.lease + max(0.0, delay) if rules.mode == UNTIL_EXPIRED else rules.queue_lease(delay)
    )
    lock = _publish_lock(rules, key, flight_id, lease)
    for _ in range(3):
        if lock.acquire(blocking=False):
            count, token = lock.detach()  # before publishing: a local worker may start it
            if count > 1:  # this very flight id is already queued or running
                _release_quietly(lock)
                return Duplicate(key, flight_id, same=True)
            return Ticket(key, token, 1)
        holder = _lock_holder(rules, key)
        if holder is not None:
            return Duplicate(key, holder.task_id, same=holder.owner == flight_id)
        # Released between the two calls: try again.
    return Duplicate(key, None)


def count_outcome(rules: FlightRules, key: str, outcome: str) -> None:
    """Count a busy key that worked as intended in the statistics of the task's locks:
    ``"deduplicated"`` (a publish folded into the one queued or running) or ``"skipped"`` (a
    delivery skipped or rescheduled because its key was held). Neither is an attempt, so
    neither lowers the success rate."""
    stats.record(rules.using, rules.stats_name or stats_shape(key), outcome)


def unreserve(rules: FlightRules, ticket: Ticket, flight_id: str) -> None:
    """Give back the hold of a message that was not published after all (publish failed)."""
    if ticket.holds:
        _release_quietly(_publish_lock(rules, ticket.key, flight_id, rules.lease))


@dataclass(frozen=True)
class _Holder:
    owner: str | None
    task_id: str | None


def _lock_holder(rules: FlightRules, name: str) -> _Holder | None:
    """Who holds the *lock* ``name`` (one round trip; ``get_lock_info`` also reads semaphores).

    A value that is not a lock record is a holder that is not a task.
    """
    target = runtime.target(rules.using)
    with backend_errors(f"inspect lock {name!r}"):
        record = redis_client.read_lock(target.client, target.keys.lock(name))
    if record is None:
        return None
    if record.unreadable:
        return _Holder(None, None)
    task_id = record.meta.get("task_id")
    return _Holder(record.owner, task_id if isinstance(task_id, str) else None)


def _release_quietly(lock: Lock | Semaphore, *, all_holds: bool = False) -> bool:
    try:
        if isinstance(lock, Lock):
            lock.release(all_holds=all_holds)
        else:
            lock.release()
    except LockNotOwnedError:
        return False
    return True


# -- run --------------------------------------------------------------------------------------


class Busy(Exception):
    """A delivery must not run its body now: the key is held by another flight.

    ``reason``: ``"busy"`` (held by another holder), ``"queued"`` (coalesce: another follow-up
    is queued already, it will do the work) or ``"already-running"`` (this same message runs
    elsewhere: a redelivery). ``holder``: the holder's task id when known.
    """

    def __init__(self, key: str, holder: str | None, reason: str) -> None:
        super().__init__(key, holder, reason)
        self.key = key
        self.holder = holder
        self.reason = reason


class Deferred(Exception):
    """A delivery must not run its body now but later: publish it again (same flight id) to run
    in ``countdown`` seconds.

    ``reason``: ``"lock_rate"``, ``"task_rate"`` or ``"task_permits"`` (over a limit:
    :attr:`throttled`), ``"debounce"`` (its burst is not due yet: a publish came since) or
    ``"busy"`` (debounce: its key still runs). ``ticket``: what the message published again
    carries — :func:`begin` has already put back the holds a queued message of the mode holds —
    or a :class:`Duplicate` (another message of the key is queued and covers this one: publish
    nothing), or ``None`` when :func:`begin` was told not to keep anything (``requeue=False``).
    """

    def __init__(
        self, key: str, reason: str, countdown: float, ticket: Ticket | Duplicate | None
    ) -> None:
        super().__init__(key, reason, countdown)
        self.key = key
        self.reason = reason
        self.countdown = countdown
        self.ticket = ticket

    @property
    def throttled(self) -> bool:
        """Over a rate or the task's permits (counted ``throttled``, ``task_throttled``)."""
        return self.reason in THROTTLE_REASONS


class Stale(Exception):
    """A debounced delivery whose burst is no longer pending: another message of the same flight
    id claimed it (a rescue and the original both delivered), or it expired. Nothing to do."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _OverLimit(Exception):
    def __init__(self, reason: str, countdown: float) -> None:
        super().__init__(reason, countdown)
        self.reason = reason
        self.countdown = max(0.01, countdown)


@dataclass
class Flight:
    """One attempt of a flight running in this process, and the locks it holds."""

    rules: FlightRules
    key: str
    flight_id: str
    attempt: int
    #: The lock held while the body runs (``None`` in modes that hold nothing then).
    run_lock: Lock | Semaphore | None = None
    #: The holds went to a message published from the body (retry / same-key replace): the end
    #: of this attempt must not release them.
    handed_over: bool = False
    #: The permit of the task's semaphore (``task_permits``) this attempt holds.
    permit: Semaphore | None = None
    #: ``debounce``: the claimed arguments of the burst (JSON text as published), which the body
    #: runs with instead of the message's.
    payload: str | None = None

    @property
    def lost(self) -> bool:
        """The run-time lock (or the task permit) expired or was force-released while the body
        ran."""
        if self.permit is not None and self.permit.lost:
            return True
        return bool(self.run_lock is not None and not self.handed_over and self.run_lock.lost)


def permit_name(rules: FlightRules) -> str:
    """Name of the task-wide semaphore of ``task_permits``."""
    return rules.task + PERMITS_SUFFIX


def _run_options(rules: FlightRules, owner: str, flight_id: str) -> dict[str, Any]:
    """The options of every run-time lock of a flight. A busy run is skipped or rescheduled
    (task_skipped / task_rescheduled), not a failed acquisition: ``report_busy=False``."""
    return {
        "report_busy": False,
        "timeout": rules.lease,
        "auto_renew": True,
        "using": rules.using,
        "owner": owner,
        "task_id": flight_id,
        "stats_name": rules.stats_name,
    }


def _run_lock(rules: FlightRules, name: str, owner: str, flight_id: str) -> Lock | Semaphore:
    options = _run_options(rules, owner, flight_id)
    if rules.permits > 1:
        return Semaphore(name, rules.permits, **options)
    return Lock(name, **options)


def _holder(rules: FlightRules, name: str) -> str | None:
    """Task id holding ``name`` (a lock, or a semaphore's oldest permit with ``permits > 1``)."""
    if rules.permits > 1:
        info = get_lock_info(name, using=rules.using)
        return info.task_id if info is not None else None
    holder = _lock_holder(rules, name)
    return holder.task_id if holder is not None else None


def _expected_holds(ticket: Ticket | None, token: int | None) -> int:
    """How many holds of the flight id a legitimate run finds after re-entering the key."""
    if ticket is None or ticket.holds is None:
        return 2  # unknown: allow the publish hold
    if ticket.holds and token == ticket.token:
        return ticket.holds + 1
    return 1


def _enter_key(rules: FlightRules, flight: Flight, ticket: Ticket | None) -> Lock:
    """Re-enter (or take) ``key`` for the flight id, renewed while this attempt holds it.

    Raises :class:`Busy` when another holder has it, or when the flight id holds it more often
    than the message accounts for (another delivery of this message is running).
    """
    key, flight_id = flight.key, flight.flight_id
    lock = Lock(key, **_run_options(rules, flight_id, flight_id))
    if not lock.acquire(blocking=False):
        holder = _holder(rules, key)
        # Released in between: one more try, else busy.
        if holder is not None or not lock.acquire(blocking=False):
            raise Busy(key, holder, "queued" if rules.mode == COALESCE else "busy")
    if lock.hold_count > _expected_holds(ticket, lock.fencing_token):
        _release_quietly(lock)
        raise Busy(key, flight_id, "already-running")
    # The queued lease (lock_queue_timeout) becomes the running one: a re-entry never shortens
    # a lease by itself (a nested lock must not cut its outer block short), so say it.
    lock.renew()
    return lock


def begin(
    rules: FlightRules,
    key: str,
    flight_id: str,
    ticket: Ticket | None,
    *,
    attempt: int = 0,
    requeue: bool = True,
) -> Flight:
    """Start one attempt of a flight (what the worker does before the body); see the module
    docstring.

    ``ticket``: what the message carries (``None``: unknown). Raises :class:`Busy` when the body
    must not run now, :class:`Deferred` when it must run later (over a limit; debounce: not due,
    or its key runs), :class:`Stale` for a debounced delivery whose burst is gone. A coalesce
    follow-up whose predecessor still runs *waits* here for its run slot (woken by the release),
    unless ``on_busy="reschedule"``. ``requeue``: on :class:`Deferred`, put back what a queued
    message of this flight holds (the integration publishes the same flight id again); False:
    give back everything (it enqueues a new flight instead).
    """
    if rules.mode == DEBOUNCE:
        return _begin_debounced(rules, key, flight_id, ticket, attempt)
    flight = _enter_mode(rules, key, flight_id, ticket, attempt)
    try:
        _take_limits(flight, ticket)
    except _OverLimit as over:
        kept = _scheduled(_put_back(flight, ticket, over.countdown, requeue), over)
        raise Deferred(key, over.reason, over.countdown, kept) from None
    except BaseException:
        end(flight)
        raise
    return flight


def _enter_mode(
    rules: FlightRules, key: str, flight_id: str, ticket: Ticket | None, attempt: int
) -> Flight:
    """The mode's run-time step of :func:`begin` (the table in the module docstring)."""
    flight = Flight(rules, key, flight_id, attempt)
    mode = rules.mode
    if mode == UNTIL_EXECUTED:
        flight.run_lock = _enter_key(rules, flight, ticket)
    elif mode == UNTIL_EXECUTING:
        mine = Lock(key, owner=flight_id, using=rules.using)
        if not _release_quietly(mine, all_holds=True):
            # No publish hold of ours (a delivery that did not come through publish, or ours
            # expired): another holder means another message of the key is queued.
            holder = _lock_holder(rules, key)
            if holder is not None and holder.owner != flight_id:
                raise Busy(key, holder.task_id, "busy")
    elif mode == WHILE_EXECUTING:
        flight.run_lock = _take_run_lock(rules, key, flight_id, attempt)
    elif mode == COALESCE:
        queue = _enter_key(rules, flight, ticket)
        try:
            flight.run_lock = _take_run_slot(rules, key, flight_id, attempt, queue)
        except Busy:
            # Not running now: give the follow-up slot back whole (a reschedule publishes anew).
            _release_quietly(queue, all_holds=True)
            raise
        except BaseException:
            _release_quietly(queue)  # ours; the publish hold expires with its lease
            raise
        # Running: the follow-up slot is free again, so a publish from now on queues the next.
        _release_quietly(queue, all_holds=True)
    else:  # UNTIL_EXPIRED
        holder = _lock_holder(rules, key)
        if holder is None:
            lock = _publish_lock(rules, key, flight_id, rules.lease)
            if lock.acquire(blocking=False):
                lock.detach()  # the window runs out by itself
                return flight
            holder = _lock_holder(rules, key)
        if holder is not None and holder.owner != flight_id:
            raise Busy(key, holder.task_id, "busy")
    return flight


def _scheduled(kept: Any, over: _OverLimit) -> Any:
    """The ticket of a run put off by a rate says so (see :attr:`Ticket.scheduled`)."""
    if isinstance(kept, Ticket) and over.reason in ("lock_rate", "task_rate"):
        return dataclasses.replace(kept, scheduled=True)
    return kept


def _take_limits(flight: Flight, ticket: Ticket | None = None) -> None:
    """The flow-control step of :func:`begin`: per-key rate, task rate, task permit (in that
    order: a key over its own rate spends none of the task's). Raises :class:`_OverLimit`."""
    rules = flight.rules
    for reason, name, rate in (
        ("lock_rate", flight.key, rules.rate),
        ("task_rate", rules.task, rules.task_rate),
    ):
        if rate is None:
            continue
        limiter = RateLimiter(name, rate, using=rules.using)
        decision = limiter.try_acquire()
        if not decision.allowed:
            if ticket is not None and ticket.scheduled:
                # Back from the schedule, and a hair early or late: the plain retry-after.
                raise _OverLimit(reason, decision.retry_after)
            # Spread a backlog out at the rate (each still asks again when it comes back).
            later = limiter.schedule(after=decision.retry_after, max_wait=SCHEDULE_HORIZON)
            raise _OverLimit(reason, later)
    if rules.task_permits is not None:
        owner = run_owner(flight.flight_id, flight.attempt)
        options = {**_run_options(rules, owner, flight.flight_id), "stats_name": None}
        permit = Semaphore(permit_name(rules), rules.task_permits, **options)
        if not permit.acquire(blocking=False):
            raise _OverLimit("task_permits", rules.permit_backoff())
        flight.permit = permit


def _put_back(
    flight: Flight, ticket: Ticket | None, delay: float, requeue: bool
) -> Ticket | Duplicate | None:
    """Undo the mode's run-time step of a flight that will not run now: what its message,
    published again to run in ``delay`` seconds, holds and carries (see :class:`Deferred`)."""
    rules, key, flight_id, attempt = flight.rules, flight.key, flight.flight_id, flight.attempt
    mode = rules.mode
    if not requeue:
        end(flight)
        if mode in PUBLISH_MODES:  # every hold of the flight id, the until_expired window too
            _release_quietly(Lock(key, owner=flight_id, using=rules.using), all_holds=True)
        return None
    if mode == UNTIL_EXECUTED and isinstance(flight.run_lock, Lock):
        # As hand_over, without a new attempt: the key is never dropped in between (no other
        # publish slips in), the run's re-entry is given back and a queued one taken in its
        # place (listings show it queued, with a queued lease). The watchdog must not renew
        # the run's hold any more.
        lock = flight.run_lock
        flight.handed_over = True
        _release_quietly(lock)
        lock.detach()
        queued = _publish_lock(rules, key, flight_id, rules.queue_lease(delay))
        if queued.acquire(blocking=False):
            holds, token = queued.detach()
            return Ticket(key, token, holds, attempt)
        holder = _lock_holder(rules, key)  # lost while it ran, and taken: that one covers us
        return Duplicate(key, holder.task_id if holder is not None else None)
    end(flight)
    if mode in (UNTIL_EXECUTING, COALESCE):
        # Their queued hold was given back at run start: a message queued again takes it anew
        # (another one queued meanwhile covers this one).
        return _with_attempt(reserve(rules, key, flight_id, delay=delay), attempt)
    if mode == UNTIL_EXPIRED:
        # The window, from when the message may run again (a window lost meanwhile is retaken at
        # the next run start, if free).
        with contextlib.suppress(LockNotOwnedError):
            _publish_lock(rules, key, flight_id, rules.lease + delay).renew()
    if mode == DEBOUNCE:
        debounce.postpone(
            rules.using, rules.task, key, flight_id, delay=delay, keep=rules.debounce_keep
        )
    return Ticket(key, None, 0, attempt)


def _with_attempt(outcome: Ticket | Duplicate, attempt: int) -> Ticket | Duplicate:
    if isinstance(outcome, Ticket):
        return Ticket(outcome.key, outcome.token, outcome.holds, attempt)
    return outcome


def _begin_debounced(
    rules: FlightRules, key: str, flight_id: str, ticket: Ticket | None, attempt: int
) -> Flight:
    """:func:`begin` of ``lock_mode="debounce"``: wait for the burst's due time, take ``key``
    (a lock: one run per key at a time), the limits, then claim the burst's arguments.

    A later attempt (``retry()``, a replacement: ``attempt > 0``) of a run that claimed its burst
    runs with its message's arguments, under the key's lock."""
    quiet, most = float(rules.debounce or 0.0), rules.debounce_max
    here = Ticket(key, None, 0, attempt)
    if attempt == 0:
        wait = debounce.peek(rules.using, rules.task, key, flight_id, quiet=quiet, most=most)
        if wait is None:
            raise Stale(key)
        if wait > 0:
            raise Deferred(key, "debounce", wait, here)
    flight = Flight(rules, key, flight_id, attempt)
    try:
        flight.run_lock = _take_run_lock(rules, key, flight_id, attempt)
    except Busy as busy:
        if busy.reason == "already-running":
            raise
        countdown = rules.reschedule_delay()
        if attempt == 0:
            debounce.postpone(
                rules.using, rules.task, key, flight_id, delay=countdown, keep=rules.debounce_keep
            )
        raise Deferred(key, "busy", countdown, here) from None
    try:
        _take_limits(flight, ticket)
        if attempt > 0:
            return flight
        claimed = debounce.claim(rules.using, rules.task, key, flight_id, quiet=quiet, most=most)
    except _OverLimit as over:
        end(flight)
        if attempt == 0:
            debounce.postpone(
                rules.using,
                rules.task,
                key,
                flight_id,
                delay=over.countdown,
                keep=rules.debounce_keep,
            )
        raise Deferred(key, over.reason, over.countdown, _scheduled(here, over)) from None
    except BaseException:
        end(flight)
        raise
    if not isinstance(claimed, str):
        end(flight)
        if claimed is None:
            raise Stale(key)
        raise Deferred(key, "debounce", claimed, here)
    flight.payload = claimed
    return flight


def _take_run_lock(rules: FlightRules, key: str, flight_id: str, attempt: int) -> Lock | Semaphore:
    lock = _run_lock(rules, key, run_owner(flight_id, attempt), flight_id)
    acquired = lock.acquire(blocking=False)
    if not acquired and attempt > 0:
        # A retry/replacement can be delivered before its previous attempt (a holder of this
        # key) has finished releasing: give it up to one lease, then treat the key as busy.
        acquired = lock.acquire(blocking=True, blocking_timeout=rules.lease)
    if not acquired:
        raise Busy(key, _holder(rules, key), "busy")
    if lock.hold_count > 1:  # re-entered: this very attempt runs elsewhere (a redelivery)
        _release_quietly(lock)
        raise Busy(key, flight_id, "already-running")
    return lock


def _take_run_slot(
    rules: FlightRules, key: str, flight_id: str, attempt: int, queue: Lock
) -> Lock | Semaphore:
    """The coalesce run slot: at once, or after the running flight ends (waiting holds the
    follow-up slot, renewed, so publishes meanwhile still return this follow-up)."""
    name = run_key(key)
    lock = _run_lock(rules, name, run_owner(flight_id, attempt), flight_id)
    if not lock.acquire(blocking=False):
        if rules.on_busy == "reschedule":
            raise Busy(key, _holder(rules, name), "running")
        while not lock.acquire(blocking=True, blocking_timeout=rules.lease):
            if queue.lost:  # our follow-up slot expired and was taken: that one runs next
                raise Busy(key, _holder(rules, key), "queued")
    if lock.hold_count > 1:
        _release_quietly(lock)
        raise Busy(key, flight_id, "already-running")
    return lock


def end(flight: Flight) -> bool:
    """Release what the attempt holds when its body ended (unless handed over).

    Returns False when the run-time lock was no longer held (expired or force-released while
    the body ran); a Redis error is logged, and the lease frees the key.
    """
    _release_permit(flight)
    lock = flight.run_lock
    if flight.handed_over or lock is None:
        return True
    try:
        released = _release_quietly(lock, all_holds=not isinstance(lock, Semaphore))
    except LockBackendError:
        logger.warning(
            "Task %s could not release its lock %r when it ended; the lock expires by itself "
            "within %ss.",
            flight.flight_id,
            lock.name,
            flight.rules.lease,
            exc_info=True,
        )
        return True
    if not released:
        logger.error(
            "Task %s ended without holding its lock %r: the lock expired or was force-released "
            "while the task ran, so another run of the same key may have overlapped with it.",
            flight.flight_id,
            lock.name,
        )
    return released


def _release_permit(flight: Flight) -> None:
    """Give back the attempt's task permit (``task_permits``), once."""
    permit, flight.permit = flight.permit, None
    if permit is None:
        return
    try:
        released = _release_quietly(permit)
    except LockBackendError:
        logger.warning(
            "Task %s could not give back its permit of %r; it frees itself within %ss.",
            flight.flight_id,
            permit.name,
            flight.rules.lease,
            exc_info=True,
        )
        return
    if not released:
        logger.error(
            "Task %s ended without holding its permit of %r: it expired or was force-released "
            "while the task ran, so more than task_permits bodies may have run at once.",
            flight.flight_id,
            permit.name,
        )


def hand_over(flight: Flight, *, delay: float = 0.0) -> Ticket:
    """The ticket of the next attempt of this flight, published from inside its body.

    ``until_executed`` hands its holds to the message (never dropped in between, so no other
    publish slips in; the key shows as queued again until a worker starts it). Modes that hold
    nothing between runs (``until_executing``, ``coalesce``) take the key for it when it is free
    — else another message of the key is queued already and this one will be skipped as its
    duplicate. ``while_executing``/``until_expired`` carry no hold.
    """
    rules, key = flight.rules, flight.key
    attempt = flight.attempt + 1
    if rules.mode == UNTIL_EXECUTED and flight.run_lock is not None:
        flight.run_lock.detach()  # the watchdog must not renew (shorten) the queued lease below
        flight.handed_over = True
        queued = _publish_lock(rules, key, flight.flight_id, rules.queue_lease(delay))
        if queued.acquire(blocking=False):
            holds, token = queued.detach()
            if holds == 1:
                logger.warning(
                    "Task %s lost its lock %r while it ran; the lock was free, so the retry (or "
                    "replacement) it publishes takes it anew.",
                    flight.flight_id,
                    key,
                )
            return Ticket(key, token, holds, attempt)
        logger.warning(
            "Task %s passes its lock %r to its retry (or replacement), but lost it while it "
            "ran and another holder has it now: that message will be skipped while the other "
            "holder keeps the lock.",
            flight.flight_id,
            key,
        )
        return Ticket(key, None, 0, attempt)
    if rules.mode in (UNTIL_EXECUTING, COALESCE):
        taken = reserve(rules, key, flight.flight_id, delay=delay)
        if isinstance(taken, Ticket):
            return Ticket(key, taken.token, taken.holds, attempt)
    return Ticket(key, None, 0, attempt)


def abandon(rules: FlightRules, key: str, flight_id: str, *, attempt: int = 0) -> bool:
    """Free what a flight holds when the process that ran it cannot (it died, or the message was
    revoked/expired before it started): its run-time lock, its task permit, its publish-time
    hold. ``until_expired`` keeps its window whatever happens; a debounced burst that was not
    claimed stays pending (its run is published again by the rescue, see :func:`cancel_burst`
    for a revoke). Returns whether something was released."""
    released = False
    owner = run_owner(flight_id, attempt)
    if rules.task_permits is not None:
        released |= _free_permits(permit_name(rules), owner, rules.using)
    if rules.mode == UNTIL_EXPIRED:
        return released
    if rules.mode in PUBLISH_MODES:
        released |= _release_quietly(Lock(key, owner=flight_id, using=rules.using), all_holds=True)
    if rules.mode == COALESCE:
        slot = Lock(run_key(key), owner=owner, using=rules.using)
        released |= _release_quietly(slot, all_holds=True)
    elif rules.mode in (WHILE_EXECUTING, DEBOUNCE):
        if rules.permits > 1:
            released |= _free_permits(key, owner, rules.using)
        else:
            released |= _release_quietly(Lock(key, owner=owner, using=rules.using), all_holds=True)
    return released


def _free_permits(name: str, owner: str, using: str | None) -> bool:
    """Force-release the permits of semaphore ``name`` that ``owner`` holds (taken by another
    process: their tokens are in the holders' records)."""
    released = False
    for info in lock_holders(name, using=using):
        if info.kind == "semaphore" and info.owner == owner:
            released |= force_release(name, token=info.fencing_token, using=using)
    return released


# -- debounce: publish and rescue ------------------------------------------------------------
Burst = debounce.Burst


def gather(
    rules: FlightRules, key: str, candidate: str, payload: str, *, route: str = "{}"
) -> Burst:
    """A publish of a debounced task: join the pending burst of ``key`` with ``payload`` (the
    call's arguments as JSON text), or start one whose run will have the flight id
    ``candidate``. ``Burst.first``: this publish started it and sends its message, to run in
    ``Burst.delay`` seconds; later publishes of the burst send nothing and return its id.
    ``route``: JSON text the rescue needs to send the run where the first publish sent it."""
    check_name(key, "Lock key")
    return debounce.gather(
        rules.using,
        rules.task,
        key,
        candidate,
        payload,
        quiet=float(rules.debounce or 0.0),
        most=rules.debounce_max,
        keep=rules.debounce_keep,
        route=route,
    )


def drop_burst(rules: FlightRules, key: str, flight_id: str) -> bool:
    """The first publish of burst ``flight_id`` could not send its message: forget the burst
    unless another publish joined it meanwhile (then the rescue publishes it)."""
    return debounce.drop(rules.using, rules.task, key, flight_id)


def cancel_burst(rules: FlightRules, key: str, flight_id: str) -> bool:
    """Burst ``flight_id`` was revoked: forget it, so that no rescue publishes it again."""
    return debounce.drop(rules.using, rules.task, key, flight_id, always=True)


def rescue_overdue(rules: FlightRules, *, grace: float, limit: int = 100) -> list[debounce.Rescue]:
    """The task's bursts whose run was due more than ``grace`` seconds ago and never claimed
    (their message was lost with a worker), each taken for this caller to publish again (for
    ``grace`` seconds: one rescuer at a time, and the original message may still come)."""
    found = []
    for key in debounce.overdue(rules.using, rules.task, grace=grace, limit=limit):
        rescued = debounce.rescue(rules.using, rules.task, key, grace=grace)
        if rescued is not None:
            found.append(rescued)
    return found


def delay_of(options: Mapping[str, Any]) -> float:
    """Seconds a message waits before it may run, from its ``countdown``, ``eta`` or
    ``run_after`` (an aware or naive datetime, or its ISO text)."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta") or options.get("run_after")
    if eta:
        if isinstance(eta, str):
            eta = dt.datetime.fromisoformat(eta)
        current = dt.datetime.now(eta.tzinfo) if eta.tzinfo else dt.datetime.now()
        return max(0.0, (eta - current).total_seconds())
    return 0.0
