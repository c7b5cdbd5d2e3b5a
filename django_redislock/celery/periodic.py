"""Per-schedule-entry single flight: "skip this tick while the previous run is still going".

For periodic tasks whose code you cannot or do not want to change (third-party tasks, tasks
scheduled from the django-celery-beat admin), the *schedule entry* selects single-flight
behaviour through a message header, and no task code changes::

    # django-celery-beat: PeriodicTask.headers (the admin's "Headers" field)
    {"redislock_single_flight": true}
    {"redislock_single_flight": {"key": "reports:nightly", "timeout": 600, "queue_timeout": 3600}}

    # app.conf.beat_schedule
    "nightly": {"task": "reports.build", "schedule": crontab(0, 3),
                "options": {"headers": {"redislock_single_flight": True}}},

How the key is held (the same protocol as :class:`~django_redislock.celery.SingleFlightTask`,
with the schedule entry instead of the task class choosing it):

1. **Publish** — our beat schedulers (:mod:`django_redislock.celery.beat`): the task id is chosen
   first and the key (default ``periodic:<entry name>``) is taken non-blocking for it, with the
   queued lease ``queue_timeout``. Busy (the previous run is queued or running): nothing is sent,
   logged at INFO. The message carries the key, fencing token and leases in the same header.
2. **Run** — worker-side receivers connected by ``AppConfig.ready``: ``task_prerun`` re-enters
   the key for the task id with the running lease ``timeout`` (renewed by the watchdog while the
   body runs), ``task_postrun`` releases it whatever the outcome (a ``retry()`` keeps it for the
   retry). ``task_revoked`` (revoked, expired, terminated) and ``task_failure`` for a pool child
   that died or hit the hard time limit release it from the worker's main process; a worker that
   is SIGKILLed as a whole leaves it to expire within ``timeout``.

Limits: signal receivers cannot stop a task body, so a message that reaches a worker while its key
is held by another run (sent around beat with ``send_task``, a broker redelivery, a queued hold
that expired before a worker picked the message up) runs anyway, and the worker logs an ERROR
naming both. Tasks that need that run-time check too should use ``SingleFlightTask``, which the
header leaves alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import states
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from django_redislock.exceptions import LockBackendError, LockError, LockNotOwnedError
from django_redislock.lock import Lock

__all__ = [
    "HEADER",
    "SingleFlightSpec",
    "connect",
    "on_task_failure",
    "on_task_postrun",
    "on_task_prerun",
    "on_task_revoked",
    "spec_from_header",
    "spec_of_request",
]

logger = logging.getLogger("django_redislock.celery")

#: The message header that selects single flight for a schedule entry.
HEADER = "redislock_single_flight"
_OPTIONS = ("key", "timeout", "queue_timeout", "using")
_PUBLISHED = ("token",)


@dataclass(frozen=True)
class SingleFlightSpec:
    """What the header asks for; ``token`` is set in messages our scheduler published."""

    key: str
    timeout: float | None = None
    queue_timeout: float | None = None
    using: str | None = None
    token: int | None = None

    @property
    def queue_lease(self) -> float | None:
        """Lease of the hold while the message waits in the broker (nobody can renew it)."""
        return self.queue_timeout if self.queue_timeout is not None else self.timeout

    def published(self, token: int | None) -> dict[str, Any]:
        """The header value of a message published holding the key with ``token``."""
        return {
            "key": self.key,
            "timeout": self.timeout,
            "queue_timeout": self.queue_timeout,
            "using": self.using,
            "token": token,
        }

    def lock(self, task_id: str, *, queued: bool) -> Lock:
        """The task id's lock on the key: queued (at publish, not renewed) or running.

        The publish-time one is quiet, as single-flight publishes are: holding the key for a
        queued message is not an acquisition of the work, and a busy key is a deduplication
        (counted by the beat scheduler), not a failure."""
        return Lock(
            self.key,
            timeout=self.queue_lease if queued else self.timeout,
            auto_renew=not queued,
            using=self.using,
            owner=task_id,
            task_id=task_id,
            queued=queued,
            stats_name=self.key,
            quiet=queued,
        )


def _seconds(value: object, option: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{option!r} must be a positive number of seconds, not {value!r}")
    return float(value)


def spec_from_header(value: object, entry_name: str | None) -> SingleFlightSpec | None:
    """Parse the header of schedule entry ``entry_name``; ``None`` when it is absent or false.

    ``ValueError`` (saying which option is wrong) for anything but ``true`` or an object with the
    options ``key``, ``timeout``, ``queue_timeout`` and ``using``.
    """
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"header {HEADER!r} must be true or an object with {', '.join(_OPTIONS)}, not {value!r}"
        )
    unknown = sorted(set(value) - set(_OPTIONS) - set(_PUBLISHED))
    if unknown:
        raise ValueError(
            f"header {HEADER!r} has unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(_OPTIONS)}"
        )
    key = value.get("key") or (f"periodic:{entry_name}" if entry_name else None)
    if not isinstance(key, str) or not key:
        raise ValueError(f"header {HEADER!r}: 'key' must be a non-empty string, not {key!r}")
    using = value.get("using")
    if using is not None and (not isinstance(using, str) or not using):
        raise ValueError(f"header {HEADER!r}: 'using' must be a CACHES alias, not {using!r}")
    token = value.get("token")
    return SingleFlightSpec(
        key=key,
        timeout=_seconds(value.get("timeout"), "timeout"),
        queue_timeout=_seconds(value.get("queue_timeout"), "queue_timeout"),
        using=using,
        token=token if isinstance(token, int) and not isinstance(token, bool) else None,
    )


def _header_value(request: Any, header: str) -> object:
    """A message header from a task ``Context``, a worker ``Request`` or a header mapping."""
    if isinstance(request, Mapping):
        return request.get(header)
    for attr in ("headers", "request_dict"):
        mapping = getattr(request, attr, None)
        if isinstance(mapping, Mapping) and header in mapping:
            return mapping[header]
    return getattr(request, header, None)


def spec_of_request(request: Any) -> SingleFlightSpec | None:
    """The single-flight spec a delivered message carries (``None``: none, or unreadable).

    Our schedulers always write the key into the header; a bare ``true`` sent by another
    scheduler gets the default key from django-celery-beat's ``periodic_task_name`` header.
    """
    value = _header_value(request, HEADER)
    if value is None:
        return None
    name = _header_value(request, "periodic_task_name")
    try:
        return spec_from_header(value, name if isinstance(name, str) else None)
    except ValueError as exc:
        logger.error("Ignoring the single-flight header of a delivered task: %s", exc)
        return None


# -- worker side -----------------------------------------------------------------------------------

#: Locks held by bodies running in this process, by task id.
_running: dict[str, Lock] = {}
_running_mutex = threading.Lock()


def _is_single_flight_task(task: Any) -> bool:
    from django_redislock.celery.task import SingleFlightTask

    return isinstance(task, SingleFlightTask)


def on_task_prerun(
    sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
) -> None:
    """Re-enter the key the publisher took, with the running lease, before the body runs."""
    if task is None or not task_id or _is_single_flight_task(task):
        return
    spec = spec_of_request(task.request)
    if spec is None:
        return
    lock = spec.lock(task_id, queued=False)
    try:
        acquired = lock.acquire(blocking=False)
    except LockBackendError as exc:
        logger.error(
            "Periodic task %s[%s] runs without its single-flight lock %r: %s",
            task.name,
            task_id,
            spec.key,
            exc,
        )
        return
    if not acquired:
        from django_redislock.operations import describe_holder, get_lock_info

        try:
            info = get_lock_info(spec.key, using=spec.using)
        except LockError:
            info = None
        logger.error(
            "Periodic task %s[%s] runs while its single-flight lock %r is held by %s: this "
            "delivery did not come through a redislock beat scheduler (send_task, a redelivery, "
            "or a queued hold that expired), and its run may overlap that one.",
            task.name,
            task_id,
            spec.key,
            describe_holder(info) if info is not None else "another holder",
        )
        return
    if spec.token is not None and lock.hold_count == 1:
        logger.warning(
            "Periodic task %s[%s]: the queued hold of lock %r had expired before a worker started "
            "it (raise queue_timeout above the queue wait); it was free and is taken anew.",
            task.name,
            task_id,
            spec.key,
        )
    with _running_mutex:
        _running[task_id] = lock


def on_task_postrun(
    sender: Any = None, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    """Release the key when the body ends; a retry keeps it (its message re-enters it)."""
    if not task_id:
        return
    with _running_mutex:
        lock = _running.pop(task_id, None)
    if lock is None:
        return
    if state == states.RETRY:
        # The retry carries the header: its run re-enters this hold, which expires within the
        # running lease if the retry never starts.
        lock.detach()
        return
    try:
        lock.release(all_holds=True)
    except LockNotOwnedError:
        logger.error(
            "Periodic task %s finished without its single-flight lock %r (expired or "
            "force-released while it ran): another run may have overlapped it.",
            task_id,
            lock.name,
        )
    except LockBackendError:
        logger.warning(
            "Periodic task %s could not release its single-flight lock %r; it expires within "
            "its lease.",
            task_id,
            lock.name,
            exc_info=True,
        )


def _release_for(task_id: str | None, request: Any, why: str) -> None:
    """Release every hold of ``task_id`` on the key its message names (worker main process)."""
    if not task_id or request is None:
        return
    spec = spec_of_request(request)
    if spec is None:
        return
    lock = spec.lock(task_id, queued=False)
    try:
        lock.release(all_holds=True)
    except LockNotOwnedError:
        return
    except LockBackendError:
        logger.warning(
            "Could not release single-flight lock %r of %s (%s); it expires within its lease.",
            spec.key,
            task_id,
            why,
            exc_info=True,
        )
        return
    logger.info("Released single-flight lock %r of %s (%s).", spec.key, task_id, why)


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """A revoked, expired or terminated message will not (or no longer) run: free its key."""
    if request is None or _is_single_flight_task(sender):
        return
    why = "expired" if kwargs.get("expired") else "revoked"
    _release_for(getattr(request, "id", None), request, why)


def on_task_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    """A pool child that died or hit the hard time limit cannot release: the main process does."""
    if not isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
        return  # an ordinary failure: the body's task_postrun releases
    if _is_single_flight_task(sender):
        return
    _release_for(task_id, getattr(sender, "request", None), type(exception).__name__)


def connect() -> None:
    """Connect the worker-side receivers (idempotent; called from ``AppConfig.ready``)."""
    from celery.signals import task_failure, task_postrun, task_prerun, task_revoked

    for signal, receiver in (
        (task_prerun, on_task_prerun),
        (task_postrun, on_task_postrun),
        (task_revoked, on_task_revoked),
        (task_failure, on_task_failure),
    ):
        signal.connect(
            receiver,
            weak=False,
            dispatch_uid=f"django_redislock.celery.periodic.{receiver.__name__}",
        )
