"""Signals the Celery integration sends (Django signals, like :mod:`django_redislock.signals`).

Receivers of Celery's own signals and of ``lock_lost`` are in :mod:`.receivers`.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["task_deduplicated", "task_rescheduled", "task_skipped"]

#: ``task_skipped(sender=<task class>, task, task_id, key, holder, reason)``: a delivered message
#: did not run its body (``holder``: the task id holding the key, when known; ``reason``:
#: ``"busy"``, ``"queued"`` (coalesce: another follow-up is queued) or ``"already-running"``).
#: Sent in the worker, in the thread that got the message.
task_skipped = Signal()
#: ``task_deduplicated(sender=<task class>, task, key, existing_task_id, raised)``: a publish found
#: the key taken and published nothing (beat ticks that overlap a running task land here).
task_deduplicated = Signal()
#: ``task_rescheduled(sender=<task class>, task, task_id, key, holder, reason, countdown)``: a
#: delivery found its key busy and, with ``lock_on_busy="reschedule"``, was published again to
#: run in ``countdown`` seconds (same task id, not counted as a retry).
task_rescheduled = Signal()
