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
    """The lock was lost (expired or force-released) while the protected code ran.

    Raised on exit from ``with Lock(...)``: the work inside may have overlapped with another holder,
    so the caller must treat its result as suspect (this is what fencing tokens are for).
    """


class LockBackendError(LockError):
    """Redis could not be reached or answered with an error.

    Raised within the cache's configured socket timeouts; the original redis-py exception is
    available as ``__cause__``. The protected code never runs without the lock.
    """
