"""One Celery beat across the fleet: beat schedulers that schedule only while they hold a lease.

Run ``celery beat`` on several hosts with the same scheduler class; one of them (the *leader*)
sends the periodic tasks, the others stand by and take over within one lease after it stops::

    celery -A proj beat --scheduler django_redislock.celery.beat:LeaderScheduler
    celery -A proj beat --scheduler django_redislock.celery.beat_database:LeaderDatabaseScheduler

``LeaderScheduler`` is Celery's default ``PersistentScheduler`` (a local shelve file) with a
leader lease; ``LeaderDatabaseScheduler`` is django-celery-beat's ``DatabaseScheduler`` with one
(needs ``pip install django-celery-beat``). :class:`LeaderSchedulerMixin` adds the lease to any
other scheduler class. Settings (``app.conf``, or ``CELERY_REDISLOCK_BEAT_*`` in Django settings
with the usual ``CELERY`` namespace; a subclass may set the class attributes instead):

- ``redislock_beat_lock``: lease name (default ``celery-beat:<app main name>``);
- ``redislock_beat_timeout``: lease seconds (default ``REDISLOCK["TIMEOUT"]``): a standby takes
  over at most this long after the leader died;
- ``redislock_beat_using``: ``CACHES`` alias (default ``REDISLOCK["CACHE"]``).

**Never two senders** (fail-closed; the README has the argument and its assumptions):

- The beats stand in one :class:`~django_redislock.LeaderElection` (``leader_election``:
  ``on_elected`` / ``on_lost`` callbacks follow its terms), which they drive step by step from
  the beat loop (``elect``, ``prove``, ``resign``, ``abandon``) instead of ``lead()``'s thread.
- The leader *proves* its lease (:meth:`~django_redislock.leader.LeaderLease.prove`: one
  owner-checked renewal round trip, which also resets the lease to ``timeout``) right before
  each due task it sends. A proof that fails — lease expired or force-released, Redis
  unreachable, or no successful proof for ``timeout`` seconds — stops scheduling at once, logs an
  ERROR, and the beat stands by again. A beat that cannot reach Redis never schedules.
- After a proof, the lease cannot pass to another beat for ``timeout`` seconds, so a send that
  completes within that time cannot overlap another leader's sends. A send that took longer (a
  paused process, a publish stuck retrying) is logged at ERROR.
- Schedule state is shared: each send records the entry's new ``last_run_at`` and run count in
  Redis (``<ns>:beat:{<lease>}``) before it is published, and a beat that becomes the leader loads
  them first. So a standby does not resend a slot the previous leader already sent (a crontab due
  at 04:00 is sent once, even if the leader died at 04:00:10) — each slot is sent at most once.

**Single flight per entry**: an entry whose options carry the ``redislock_single_flight`` header
is not sent while its previous run is queued or running (:mod:`django_redislock.celery.periodic`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery.beat import PersistentScheduler
from celery.utils import uuid as celery_uuid

from django_redislock import client as redis_client
from django_redislock.celery import periodic
from django_redislock.conf import get_settings
from django_redislock.exceptions import LockBackendError, LockError, LockNotOwnedError
from django_redislock.leader import LeaderElection, LeaderLease
from django_redislock.runtime import get_client, keyspace
from django_redislock.transport import backend_errors

if TYPE_CHECKING:
    from celery.beat import Scheduler as _SchedulerBase
else:
    _SchedulerBase = object

# LeaderDatabaseScheduler lives in beat_database (django-celery-beat is optional).
__all__ = ["LeaderScheduler", "LeaderSchedulerMixin"]

logger = logging.getLogger("django_redislock.beat")

#: Seconds between attempts while Redis is unreachable (capped by the scheduler's max interval).
RETRY_DELAY = 1.0
#: While Redis stays unreachable, the "not scheduling" warning is repeated this often.
OUTAGE_LOG_EVERY = 60.0


def _summary(exc: LockBackendError, using: str | None) -> str:
    from django_redislock.operations import backend_problem

    return backend_problem(exc, using=using).summary()


class LeaderSchedulerMixin(_SchedulerBase):
    """Schedule only while holding the leader lease; put it before the scheduler class.

    ``class MyScheduler(LeaderSchedulerMixin, SomeScheduler)``. Subclasses with their own storage
    of ``last_run_at`` (a database) override :meth:`_reload_schedule` and
    :meth:`_apply_shared_run`.
    """

    #: Lease name; ``None``: ``app.conf.redislock_beat_lock``, else ``celery-beat:<app.main>``.
    leader_lock: str | None = None
    #: Lease seconds; ``None``: ``app.conf.redislock_beat_timeout``, else ``REDISLOCK["TIMEOUT"]``.
    leader_timeout: float | None = None
    #: ``CACHES`` alias; ``None``: ``app.conf.redislock_beat_using``, else ``REDISLOCK["CACHE"]``.
    leader_using: str | None = None

    _election: LeaderElection | None = None
    #: This beat believes it is the leader (state changes are logged once).
    _leading: bool = False
    _standing_by: bool = False
    _led_before: bool = False
    _outage_logged_at: float = float("-inf")
    #: The entry as advanced by the last ``reserve()`` (what a send records as shared state).
    _reserved: Any = None
    #: Name of the entry whose send was just proven (``apply_entry`` → ``apply_async``).
    _cleared: str | None = None

    # -- configuration -----------------------------------------------------------------------------
    @property
    def leader_election(self) -> LeaderElection:
        """The election this beat stands in (created on first use, when Django settings are
        loaded): register ``on_elected`` / ``on_lost`` callbacks on it to follow the terms."""
        if self._election is None:
            conf = self.app.conf
            name = self.leader_lock or conf.get("redislock_beat_lock")
            if not name:
                main = getattr(self.app, "main", None)
                name = f"celery-beat:{main}" if main else "celery-beat"
            timeout = self.leader_timeout or conf.get("redislock_beat_timeout")
            using = self.leader_using or conf.get("redislock_beat_using")
            self._election = LeaderElection(
                str(name),
                timeout=float(timeout) if timeout is not None else None,
                using=using,
            )
        return self._election

    @property
    def leader_lease(self) -> LeaderLease:
        """The election's lease (what is proven, renewed and released)."""
        return self.leader_election.lease

    @property
    def info(self) -> str:
        lease = self.leader_lease
        line = (
            f"    . leader lease -> {lease.name!r} ({lease.timeout:g} s; standbys take over "
            "within it)"
        )
        base = super().info
        return f"{base}\n{line}" if base else line

    def _proof_interval(self) -> float:
        return self.leader_lease.timeout / 3

    def _standby_wait(self) -> float:
        # Woken at once by a release, or when the leader's lease runs out; returning within
        # max_interval keeps beat's remote-control ping answering on a standby.
        return max(0.05, min(float(self.max_interval or 1.0), self.leader_lease.timeout))

    def _retry_delay(self) -> float:
        return min(RETRY_DELAY, float(self.max_interval or RETRY_DELAY))

    # -- the loop ----------------------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Stand by until this beat holds the lease, then run Celery's tick while it does."""
        lease = self.leader_lease
        if not lease.is_leader:
            if self._leading:
                self._stop_leading(
                    "the leader lease was lost (expired or force-released)"
                    if lease.lost
                    else f"the lease could not be proven for {lease.timeout:g} s"
                )
            return self._stand_by(lease)
        if lease.proof_age() >= self._proof_interval() and not self._prove("keep the lease"):
            return self._retry_delay()
        interval = float(super().tick(*args, **kwargs))
        return max(0.0, min(interval, self._proof_interval() - lease.proof_age()))

    def _stand_by(self, lease: LeaderLease) -> float:
        try:
            acquired = self.leader_election.elect(self._standby_wait()) is not None
        except LockNotOwnedError:  # lost again right after it was acquired
            return 0.0
        except LockBackendError as exc:
            self._redis_unreachable(exc)
            return self._retry_delay()
        if not acquired:
            if not self._standing_by:
                self._standing_by = True
                logger.info(
                    "beat: standing by: leader lease %r is held by %s; this beat takes over "
                    "within %g s if that leader stops.",
                    lease.name,
                    self._holder(),
                    lease.timeout,
                )
            return 0.0
        try:
            self._take_over()
        except LockBackendError as exc:
            self.leader_election.abandon()
            self._redis_unreachable(exc)
            return self._retry_delay()
        self._leading = True
        self._outage_logged_at = float("-inf")
        if self._standing_by or self._led_before:
            logger.warning(
                "beat: took over as the leader (lease %r, fencing token %s): scheduling from "
                "the shared schedule state.",
                lease.name,
                lease.fencing_token,
            )
        else:
            logger.info(
                "beat: leader (lease %r, fencing token %s): scheduling.",
                lease.name,
                lease.fencing_token,
            )
        self._standing_by = False
        self._led_before = True
        return 0.0

    def _holder(self) -> str:
        from django_redislock.operations import describe_holder, get_lock_info

        try:
            info = get_lock_info(self.leader_lease.name, using=self.leader_lease.using)
        except LockError:
            return "another beat"
        return describe_holder(info) if info is not None else "another beat"

    def _prove(self, action: str) -> bool:
        lease = self.leader_lease
        try:
            self.leader_election.prove()
        except LockNotOwnedError:
            self._stop_leading(f"the leader lease was lost (found when trying to {action})")
            return False
        except LockBackendError as exc:
            self._stop_leading(_summary(exc, lease.using))
            return False
        return True

    def _stop_leading(self, reason: str) -> None:
        lease = self.leader_lease
        self.leader_election.abandon()
        if self._leading:
            logger.error(
                "beat: stopped scheduling: %s. This beat is no longer the leader of %r; it "
                "sends nothing until it holds and proves the lease again.",
                reason.rstrip("."),
                lease.name,
            )
        self._leading = False
        self._standing_by = False
        self._outage_logged_at = time.monotonic()
        self._on_step_down()

    def _redis_unreachable(self, exc: LockBackendError) -> None:
        now = time.monotonic()
        if now - self._outage_logged_at < OUTAGE_LOG_EVERY:
            return
        self._outage_logged_at = now
        logger.error(
            "beat: not scheduling: cannot take or prove the leader lease %r: %s Retrying every "
            "%g s.",
            self.leader_lease.name,
            _summary(exc, self.leader_lease.using),
            self._retry_delay(),
        )

    # -- sending -----------------------------------------------------------------------------------
    def reserve(self, entry: Any) -> Any:
        new_entry = super().reserve(entry)
        self._reserved = new_entry
        return new_entry

    def apply_entry(self, entry: Any, producer: Any = None) -> Any:
        """Prove the lease and record the run before Celery sends (and logs) the due task."""
        if not self._clear_to_send(entry):
            return None
        try:
            return super().apply_entry(entry, producer)
        finally:
            self._cleared = None

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send ``entry`` if this beat proved its lease for it (also when called directly)."""
        if advance:
            entry = self.reserve(entry)
        if self._cleared != entry.name and not self._clear_to_send(entry):
            return None
        self._cleared = None
        deadline = self.leader_lease.valid_until()
        try:
            return self._publish(entry, producer, **kwargs)
        finally:
            overdue = time.monotonic() - deadline
            if overdue >= 0:
                logger.error(
                    "beat: sending %r ended %.1f s after the proven leader lease ran out: if "
                    "another beat took over meanwhile, this tick may have been sent by both. "
                    "Keep the lease (redislock_beat_timeout) well above the time a publish can "
                    "take.",
                    entry.name,
                    overdue,
                )

    def _clear_to_send(self, entry: Any) -> bool:
        """Prove the lease, then record the run as shared state; False: do not send."""
        reserved = self._reserved if getattr(self._reserved, "name", None) == entry.name else entry
        self._reserved = None
        if not self.leader_lease.is_leader or not self._prove(f"send {entry.name!r}"):
            logger.error(
                "beat: due task %r (%s) not sent: this beat is not the leader.",
                entry.name,
                entry.task,
            )
            return False
        try:
            self._record_run(reserved)
        except LockBackendError as exc:
            self._stop_leading(_summary(exc, self.leader_lease.using))
            logger.error("beat: due task %r (%s) not sent.", entry.name, entry.task)
            return False
        self._cleared = entry.name
        return True

    def _publish(self, entry: Any, producer: Any, **kwargs: Any) -> Any:
        options: Mapping[str, Any] = entry.options or {}
        try:
            spec = periodic.spec_from_header(
                (options.get("headers") or {}).get(periodic.HEADER), entry.name
            )
        except ValueError as exc:
            logger.error("beat: due task %r not sent: %s", entry.name, exc)
            return None
        task = self.app.tasks.get(entry.task)
        from django_redislock.celery.task import SingleFlightTask

        if spec is None or isinstance(task, SingleFlightTask):
            # A SingleFlightTask holds its own key at publish and checks it at run time.
            return super().apply_async(entry, producer, advance=False, **kwargs)
        return self._publish_single_flight(entry, producer, spec, **kwargs)

    def _publish_single_flight(
        self, entry: Any, producer: Any, spec: periodic.SingleFlightSpec, **kwargs: Any
    ) -> Any:
        original = entry.options or {}
        task_id = original.get("task_id") or celery_uuid()
        lock = spec.lock(task_id, queued=True)
        try:
            acquired = lock.acquire(blocking=False)
        except LockBackendError as exc:
            logger.error(
                "beat: due task %r not sent: cannot take its single-flight lock %r: %s",
                entry.name,
                spec.key,
                _summary(exc, spec.using),
            )
            return None
        if not acquired:
            from django_redislock import stats
            from django_redislock.operations import describe_holder, get_lock_info

            stats.record(spec.using, spec.key, "deduplicated")

            try:
                info = get_lock_info(spec.key, using=spec.using)
            except LockError:
                info = None
            logger.info(
                "beat: %r not sent: its previous run is still queued or running (lock %r held "
                "by %s).",
                entry.name,
                spec.key,
                describe_holder(info) if info is not None else "another holder",
            )
            return None
        _, token = lock.detach()  # before publishing: a worker may start it at once
        headers = dict(original.get("headers") or {})
        headers[periodic.HEADER] = spec.published(token)
        entry.options = {**original, "task_id": task_id, "headers": headers}
        try:
            return super().apply_async(entry, producer, advance=False, **kwargs)
        except BaseException:
            # Not published (or unknown): free the key before the error propagates.
            with contextlib.suppress(LockError):
                lock.release(all_holds=True)
            raise
        finally:
            entry.options = original

    # -- shared schedule state ---------------------------------------------------------------------
    def _state_key(self) -> tuple[Any, str]:
        lease = self.leader_lease
        alias = lease.using or get_settings().cache
        return get_client(alias), keyspace(alias).beat_state(lease.name)

    def _record_run(self, entry: Any) -> None:
        """Write the entry's new last run to Redis before it is sent (``LockBackendError``)."""
        last_run_at = entry.last_run_at
        record = json.dumps(
            {
                "last_run_at": last_run_at.isoformat() if last_run_at is not None else None,
                "total_run_count": int(entry.total_run_count or 0),
                "token": self.leader_lease.fencing_token,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        )
        client, key = self._state_key()
        with backend_errors(f"record the run of beat entry {entry.name!r}"):
            redis_client.write_beat_state(client, key, entry.name, record)

    def _shared_state(self) -> dict[str, tuple[datetime, int]]:
        """Last run of every entry the leaders recorded: name -> (last_run_at, run count)."""
        client, key = self._state_key()
        with backend_errors("read the shared beat schedule state"):
            raw = redis_client.read_beat_state(client, key)
        state: dict[str, tuple[datetime, int]] = {}
        for name, text in raw.items():
            try:
                record = json.loads(text)
                state[name] = (
                    datetime.fromisoformat(record["last_run_at"]),
                    int(record["total_run_count"]),
                )
            except (TypeError, ValueError, KeyError):
                logger.warning("beat: ignoring unreadable shared state of entry %r", name)
        return state

    def _take_over(self) -> None:
        """Load the schedule as the previous leader left it, before the first send."""
        self._reload_schedule()
        self._apply_shared_state(self.schedule)
        self._heap = None  # Celery's tick rebuilds it from the updated entries

    def _apply_shared_state(self, entries: Mapping[str, Any]) -> None:
        state = self._shared_state()
        for name, entry in entries.items():
            found = state.get(name)
            if found is not None:
                self._apply_shared_run(entry, *found)

    def _apply_shared_run(self, entry: Any, last_run_at: datetime, total_run_count: int) -> None:
        """Make ``entry`` look as the leader that last sent it left it."""
        entry.last_run_at = last_run_at
        entry.total_run_count = total_run_count

    def _reload_schedule(self) -> None:
        """Hook: re-read schedule storage shared with other beats (a database) at takeover."""

    def _on_step_down(self) -> None:
        """Hook: forget unsaved state of the tenure that just ended."""

    # -- shutdown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Sync and close the schedule, then hand the lease to a standby at once."""
        try:
            super().close()
        finally:
            self._resign()

    def _resign(self) -> None:
        election = self._election
        if election is None or not self._leading:
            return
        lease = election.lease
        self._leading = False
        try:
            released = election.resign()
        except LockError as exc:
            logger.warning(
                "beat: could not release the leader lease %r (%s); a standby takes over when it "
                "expires.",
                lease.name,
                exc,
            )
            return
        if released:
            logger.info("beat: released the leader lease %r; a standby takes over now.", lease.name)


class LeaderScheduler(LeaderSchedulerMixin, PersistentScheduler):
    """Celery's default scheduler (local shelve file) behind a leader lease."""
