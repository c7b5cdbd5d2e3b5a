"""Signals sent by django-redislock, for metrics, alerts and audit.

Receivers run synchronously in the thread that caused the event (``lock_lost`` usually in the
watchdog thread), so keep them cheap; an exception in a receiver is logged, never raised into the
locking code (they are sent with ``send_robust``).

- ``lock_acquired(sender=Lock, lock, name, token, waited, contended)``: ``waited`` is seconds spent
  in ``acquire``; ``contended`` is True when the lock was busy at the first attempt.
- ``lock_acquire_failed(sender=Lock, lock, name, waited)``: not acquired in time (or busy when not
  blocking).
- ``lock_released(sender=Lock, lock, name, held)``: the last hold was released; ``held`` in seconds.
- ``lock_lost(sender=Lock, lock, name)``: a renewal, renew() or release() found that the lock is no
  longer held by its owner (expired or force-released). ``lock`` may be ``None`` when the ``Lock``
  object was already garbage-collected.
- ``lock_force_released(sender=None, name, token, using, released)``: ``force_release`` ran.
- ``rate_limit_reset(sender=None, name, using, reset)``: ``reset_rate_limit`` ran (an operator
  or code forgot a rate limiter's history); ``reset``: whether there was a history.
- ``lock_outcome_resolved(sender=Lock, name, attempt, action, outcome)``: a call whose outcome
  was unknown (:class:`~django_redislock.LockOutcomeUnknown`) was settled by the package:
  ``outcome`` is ``"undone"`` (the attempt had taken a hold or a queue place; it is gone now) or
  ``"absent"`` (it had left nothing). Usually sent from the watchdog thread.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = [
    "lock_acquire_failed",
    "lock_acquired",
    "lock_force_released",
    "lock_lost",
    "lock_outcome_resolved",
    "lock_released",
    "rate_limit_reset",
]

lock_acquired = Signal()
lock_acquire_failed = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_force_released = Signal()
lock_outcome_resolved = Signal()
rate_limit_reset = Signal()
