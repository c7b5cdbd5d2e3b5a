"""Signals the Celery integration sends: the task integrations' shared ones, defined in
:mod:`django_redislock.singleflight` (``task_skipped``, ``task_deduplicated``,
``task_rescheduled``, ``task_throttled``; see there for their arguments). ``sender`` is the task
class.

Receivers of Celery's own signals and of ``lock_lost`` are in :mod:`.receivers`.
"""

from __future__ import annotations

from django_redislock.singleflight import (
    task_deduplicated,
    task_rescheduled,
    task_skipped,
    task_throttled,
)

__all__ = ["task_deduplicated", "task_rescheduled", "task_skipped", "task_throttled"]
