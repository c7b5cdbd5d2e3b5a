"""What this process holds: one :class:`Hold` per (lock, owner), in one :class:`HoldTable`.

A hold is shared by every lock object of its name and owner (re-entrancy across objects) and
remembers the attempt behind each nested acquisition, so a release drops exactly its own hold in
Redis and a resent release drops nothing more. The table is owned by the process runtime
(:mod:`django_redislock.runtime`); the watchdog renews what it holds.

:meth:`HoldTable.mark_lost` is the one place a hold becomes lost (found gone by the watchdog, a
renewal or a release): flag it, forget it, log a WARNING, and tell the ``on_lost`` hooks (the
faces count it and send ``lock_lost``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Hold", "HoldTable"]

logger = logging.getLogger("django_redislock")


@dataclass(eq=False, kw_only=True)
class Hold:
    """What this process knows about one lock (or semaphore permit) it holds."""

    #: (target alias, holder key, owner): the table key. A semaphore permit adds its token.
    ident: tuple[str, str, str]
    name: str
    owner: str
    #: The primitive's kind (:mod:`django_redislock.kinds`): how to renew and release it.
    kind: Any
    #: Where it lives (:class:`django_redislock.targets.Target`).
    target: Any
    token: int
    #: Holds of the owner in Redis, as last reported (re-entrancy depth).
    count: int
    #: The attempt id behind each nested hold this process took, oldest first: a release drops
    #: exactly its own. (An owner shared between processes may have holds of others' attempts.)
    attempts: list[str]
    lease: float
    auto_renew: bool
    #: The face class (``Lock``, ``AsyncLock`` ...), sender of the signals.
    sender: Any = None
    #: ``(using, stats name)`` a loss is counted under; ``None``: not counted (a quiet lock).
    stats_key: tuple[str | None, str] | None = None
    acquired_at: float = field(default_factory=time.monotonic)
    lock_ref: Callable[[], Any] = field(default=lambda: None)
    lost: bool = False
    released: bool = False
    # watchdog bookkeeping
    next_renewal: float = 0.0
    registered: bool = False

    def renewal(self, ms: int, mode: str = "set") -> tuple[Any, list[str], list[Any]]:
        """``(script, keys, args)`` resetting (``"set"``) or extending (``"add"``) the lease."""
        return self.kind.renew_call(self.target, self.name, self.owner, self.token, ms, mode)  # type: ignore[no-any-return]


class HoldTable:
    """The holds of this process; thread-safe."""

    def __init__(self) -> None:
        self._table: dict[tuple[str, str, str], Hold] = {}
        self._mutex = threading.Lock()
        #: Called with a hold dropped other than by a release (lost or forgotten): the watchdog
        #: stops renewing it.
        self.on_drop: list[Callable[[Hold], None]] = []
        #: Called with a hold found lost, after it was dropped: statistics and ``lock_lost``
        #: (registered by the faces, which know them).
        self.on_lost: list[Callable[[Hold], None]] = []

    def get(self, ident: tuple[str, str, str]) -> Hold | None:
        return self._table.get(ident)

    def put(self, hold: Hold) -> Hold | None:
        """Record a fresh hold; returns the stale one it replaces (its lock expired unnoticed)."""
        with self._mutex:
            stale = self._table.get(hold.ident)
            self._table[hold.ident] = hold
        return stale if stale is not hold else None

    def forget(self, hold: Hold) -> None:
        """Drop a hold from the table (released, lost or detached)."""
        with self._mutex:
            if self._table.get(hold.ident) is hold:
                del self._table[hold.ident]

    def all(self) -> list[Hold]:
        with self._mutex:
            return list(self._table.values())

    def forget_all(self, where: Callable[[Hold], bool] | None = None) -> list[Hold]:
        """Forget every hold (or those ``where`` accepts) without touching Redis; returns them.

        For test suites that flush Redis between tests: a hold left over from one test must not
        be renewed (and reported lost) in the middle of the next.
        """
        with self._mutex:
            dropped = [hold for hold in self._table.values() if where is None or where(hold)]
            for hold in dropped:
                del self._table[hold.ident]
        for hold in dropped:
            for hook in self.on_drop:
                hook(hold)
        return dropped

    def mark_lost(self, hold: Hold) -> bool:
        """The hold's lock is no longer ours (expired or force-released). False if known."""
        with self._mutex:
            if hold.lost:
                return False
            hold.lost = True
            if self._table.get(hold.ident) is hold:
                del self._table[hold.ident]
        for hook in self.on_drop:
            hook(hold)
        logger.warning(
            "django_redislock: lock %r was lost while held by %s (expired unrenewed, "
            "force-released, or deleted: cache.clear()/FLUSHDB on its database, eviction); the "
            "protected work may now overlap with another holder.",
            hold.name,
            hold.owner,
        )
        for hook in self.on_lost:
            hook(hold)
        return True

    def clear(self) -> None:
        """Forget everything at once (a forked child: the parent's holds are not its own)."""
        self._mutex = threading.Lock()
        self._table = {}
