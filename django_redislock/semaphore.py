"""Semaphores: at most ``permits`` holders of a name at once.

A semaphore is not a counter — counters leak when a holder crashes. Each held permit is its own
lease (a fencing token in a sorted set, scored by its expiry, with a record like a lock's),
renewed by the watchdog like a lock, so a crashed holder frees its permit within ``timeout``.
Waiters queue FIFO and are woken by a release exactly like lock waiters; every acquisition gets
its own fencing token. One Lua round trip per acquire and per release.

``Semaphore`` and ``AsyncSemaphore`` are the blocking and asyncio faces composed with the
semaphore kind (:class:`~django_redislock.kinds.SemaphoreKind`): not locks (``isinstance(sem,
Lock)`` is false), and not re-entrant: each ``acquire`` takes one more permit, and ``release``
gives back the one this owner took last through the object.

Changing ``permits`` for a name while holders exist: the limit is the acquirer's. A larger value
admits more holders at once; a smaller one lets current holders keep their permits and makes new
acquirers wait until fewer than the new limit remain. The last limit used is what listings show.
"""

from __future__ import annotations

from typing import Any

from django_redislock.face import AsyncFace, Face, SyncFace
from django_redislock.kinds import SemaphoreKind

__all__ = ["MAX_PERMITS", "AsyncSemaphore", "Semaphore", "check_permits"]

#: Largest ``permits`` accepted (each acquisition scans the holders' expiries).
MAX_PERMITS = 100_000


def check_permits(permits: object) -> int:
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits must be between 1 and {MAX_PERMITS}, not {permits}")
    return permits


def _options(name: str, permits: int, options: dict[str, Any]) -> dict[str, Any]:
    """The face's arguments: every option of a lock but ``reentrant`` and ``on_commit``."""
    for unsupported in ("reentrant", "on_commit"):
        if unsupported in options:
            raise TypeError(f"Semaphore() got an unexpected keyword argument {unsupported!r}")
    return {"kind": SemaphoreKind(permits=check_permits(permits)), **options}


class Semaphore(SyncFace):
    """At most ``permits`` holders at once, across processes.

    ``Semaphore(name, permits, *, timeout=None, blocking=True, blocking_timeout=None,
    auto_renew=None, using=None, owner=None)``: ``acquire``/``release``/``renew``/``extend``,
    ``locked()`` (any permit held), ``owned()`` (this owner holds one), context manager, and
    ``fencing_token`` per acquisition — as ``Lock``.
    """

    def __init__(self, name: str, permits: int, **options: Any) -> None:
        super().__init__(name, **_options(name, permits, options))

    @property
    def permits(self) -> int:
        return self.kind.permits  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return _repr(self)

    def __enter__(self) -> Semaphore:
        super().__enter__()
        return self


class AsyncSemaphore(AsyncFace):
    """``Semaphore`` for asyncio code (the owner is the asyncio task); see ``AsyncLock``."""

    def __init__(self, name: str, permits: int, **options: Any) -> None:
        super().__init__(name, **_options(name, permits, options))

    @property
    def permits(self) -> int:
        return self.kind.permits  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return _repr(self)

    async def __aenter__(self) -> AsyncSemaphore:
        await super().__aenter__()
        return self


def _repr(face: Face) -> str:
    return f"<{type(face).__name__} {face.name!r} permits={face.kind.permits}>"
