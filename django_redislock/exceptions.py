"""Exceptions raised by django-redislock.

Every error the package raises is a :class:`LockError`, so ``except LockError`` is enough to handle
"the lock did not work out" without catching unrelated bugs.
"""

from __future__ import annotations

__all__ = [
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotAcquiredError",
    "LockNotOwnedError",
    "LockOutcomeUnknown",
    "RateLimited",
]


class LockError(Exception):
    """Base class of every django-redislock error."""


class LockNotAcquiredError(LockError):
    """The lock could not be acquired in time (or at all, when not blocking)."""

    def __init__(self, name: str, message: str | None = None) -> None:
        self.name = name
        super().__init__(message or f"Could not acquire lock {name!r}: it is held by someone else.")

    def __reduce__(self) -> tuple[type[LockNotAcquiredError], tuple[str, str]]:
        return (type(self), (self.name, str(self)))


class LockNotOwnedError(LockError):
    """A release or renewal was attempted on a lock this owner does not hold (any more)."""


class LockLostError(LockError):
    """The lock was lost while the protected code ran: it expired unrenewed, was force-released,
    or its key was deleted (``cache.clear()`` or ``FLUSHDB`` on the lock cache's database,
    eviction under ``maxmemory``).

    Raised on exit from ``with Lock(...)``: the work inside may have overlapped with another holder,
    so the caller must treat its result as suspect (this is what fencing tokens are for). The
    message names the cache whose ``cache.clear()`` would delete the lock when the settings show
    one (system check ``W005``).
    """


class LockBackendError(LockError):
    """Redis could not be reached or answered with an error.

    Raised within the cache's configured socket timeouts; the original redis-py exception is
    available as ``__cause__``. The protected code never runs without the lock.
    """


class LockOutcomeUnknown(LockBackendError):
    """A call may or may not have acted in Redis: its reply was lost (a timeout or a dropped
    connection after the command was sent), or it was cancelled or interrupted mid-call.

    Nothing is guessed. (An acquisition whose connection was lost was already resent once on a
    fresh connection; this is raised when that failed too, or for a timeout.) The package
    cancels exactly that attempt by its id as soon as Redis answers again (in the background,
    and at the latest before this owner's next call on the same lock goes out): a hold it may
    have taken is dropped and handed on, a queue entry removed, an unfinished release finished.
    Until then, a hold it may have taken ends by ``lease_ends_by`` at the latest (nobody renews
    it).

    ``name``: the lock; ``action``: ``"acquire"``, ``"release"``, ``"renew"`` or ``"extend"``;
    ``attempt``: the id the call carried; ``lease_ends_by``: epoch seconds (``time.time()``) by
    which any hold the call may have taken or kept has expired, or ``None`` when an earlier hold
    of the same owner keeps the lock held anyway (a re-entrant acquisition, a renewal).
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        action: str,
        attempt: str,
        lease_ends_by: float | None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.action = action
        self.attempt = attempt
        self.lease_ends_by = lease_ends_by

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_unknown,
            (str(self), self.name, self.action, self.attempt, self.lease_ends_by),
        )


def _rebuild_unknown(
    message: str, name: str, action: str, attempt: str, lease_ends_by: float | None
) -> LockOutcomeUnknown:
    return LockOutcomeUnknown(
        message, name=name, action=action, attempt=attempt, lease_ends_by=lease_ends_by
    )


class RateLimited(LockError):
    """A rate limiter would not allow the request within the caller's ``timeout``.

    ``retry_after``: seconds from the decision until the request would be allowed (nothing was
    counted against the rate). ``name``: the limiter's name.
    """

    def __init__(self, name: str, retry_after: float, message: str | None = None) -> None:
        self.name = name
        self.retry_after = retry_after
        if message is None:
            message = (
                f"Rate limit {name!r}: the request would be allowed in {retry_after:.3f} s, "
                "later than the timeout allows."
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.name, self.retry_after, str(self)))
