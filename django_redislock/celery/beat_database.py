"""django-celery-beat's ``DatabaseScheduler`` behind a leader lease.

Needs ``pip install django-celery-beat``.

::

    celery -A proj beat --scheduler django_redislock.celery.beat_database:LeaderDatabaseScheduler

Every beat reads the schedule from the shared database, but ``DatabaseScheduler`` writes an
entry's ``last_run_at`` back only every few minutes (``sync_every``) and at shutdown; a standby that
took over from a leader that died in between would find old ``last_run_at`` values and send those
entries again. So at takeover, and whenever the schedule is re-read from the database while
leading, the run times the leaders recorded in Redis win over older database values; unsaved
entries of a tenure that ended are dropped rather than written over the new leader's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from django_redislock.celery.beat import LeaderSchedulerMixin
from django_redislock.exceptions import LockBackendError

__all__ = ["LeaderDatabaseScheduler"]


class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's ``DatabaseScheduler`` that schedules only while holding the lease."""

    def all_as_schedule(self) -> Mapping[str, Any]:
        """The database schedule, with the shared run state applied while leading."""
        entries: Mapping[str, Any] = super().all_as_schedule()
        if self._leading:
            # Redis down: the next send proves the lease first, fails, and stops scheduling.
            with contextlib.suppress(LockBackendError):
                self._apply_shared_state(entries)
        return entries

    def _reload_schedule(self) -> None:
        self._schedule = self.all_as_schedule()
        self._last_timestamp = self.Changes.last_change()
        self._last_full_sync = datetime.now()
        self._initial_read = False

    def _apply_shared_run(self, entry: Any, last_run_at: datetime, total_run_count: int) -> None:
        super()._apply_shared_run(entry, last_run_at, total_run_count)
        entry.model.last_run_at = last_run_at
        entry.model.total_run_count = total_run_count

    def _on_step_down(self) -> None:
        # Runs recorded in Redis already; writing them now could overwrite newer database values
        # of the next leader with this tenure's.
        self._dirty.clear()
