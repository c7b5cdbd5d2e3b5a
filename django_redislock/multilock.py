"""``MultiLock``: several locks taken as one, all or none, without deadlock.

Two ``MultiLock`` objects that share names, given in any order, must never each hold part of
what the other needs. They cannot: every ``MultiLock`` takes its locks one by one in one global
order (the names sorted), so whoever holds the first name they share goes on and the other
waits for it, holding nothing the first one needs. Whatever cannot be taken by the deadline (or
at once, without blocking) is given back: nothing is ever left half-taken.

Each name is an ordinary :class:`~django_redislock.Lock` (same keys, same queue, same fencing
tokens, same watchdog), so a ``MultiLock`` and plain ``Lock`` users of one name exclude each
other, and it works wherever ``Lock`` does: one Redis, Sentinel, a Cluster (names in different
slots: each lock is one script on its own node), Redlock. Decision: the ordered protocol is used
everywhere, also when the names share a slot — one script for all names would save round trips
(one per name) but needs a queue that spans names; measured, not yet worth it (see the docs).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

from django_redislock.conf import check_seconds, get_settings
from django_redislock.exceptions import LockError, LockNotAcquiredError
from django_redislock.lock import Lock
from django_redislock.validation import check_bool, check_name

__all__ = ["MultiLock"]

#: Most names one MultiLock takes (each is a round trip).
MAX_NAMES = 1000


class MultiLock:
    """All of ``names`` or none, with the ``Lock`` interface.

    ``MultiLock(*names, timeout=None, blocking=True, blocking_timeout=None, using=None,
    auto_renew=None, owner=None)``. Duplicated names count once. ``fencing_tokens`` maps each
    name to its token (check each resource against its own); ``fencing_token`` is the largest.
    ``locked()``: any of the names is held by anyone; ``owned()``: this owner holds all of them.
    """

    def __init__(
        self,
        *names: str,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        using: str | None = None,
        auto_renew: bool | None = None,
        owner: str | None = None,
    ) -> None:
        if not names:
            raise ValueError("MultiLock() needs at least one lock name")
        if len(names) > MAX_NAMES:
            raise ValueError(f"MultiLock() takes at most {MAX_NAMES} names, not {len(names)}")
        self.names: tuple[str, ...] = tuple(sorted({check_name(name) for name in names}))
        self._blocking = bool(check_bool(blocking, "blocking"))
        self._blocking_timeout = check_seconds(
            blocking_timeout, "blocking_timeout", allow_none=True
        )
        self.using = using
        self._locks = [
            Lock(
                name,
                timeout=timeout,
                blocking=blocking,
                blocking_timeout=blocking_timeout,
                using=using,
                auto_renew=auto_renew,
                owner=owner,
            )
            for name in self.names
        ]

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r} using={self.using!r}>"

    def __iter__(self) -> Iterator[Lock]:
        """The locks, in the order they are taken."""
        return iter(self._locks)

    # -- acquire / release ------------------------------------------------------------------------
    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take every lock, in order, within one deadline; ``False`` (holding none of them) when
        not all could be taken in time."""
        waits = self._blocking if blocking is None else bool(check_bool(blocking, "blocking"))
        limit = (
            self._blocking_timeout
            if blocking_timeout is None
            else check_seconds(blocking_timeout, "blocking_timeout")
        )
        if limit is None:
            limit = get_settings().blocking_timeout
        deadline = math.inf if limit is None else time.monotonic() + limit
        taken: list[Lock] = []
        try:
            for lock in self._locks:
                left = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
                if not lock.acquire(blocking=waits, blocking_timeout=left):
                    self._give_back(taken)
                    return False
                taken.append(lock)
        except BaseException:
            self._give_back(taken)
            raise
        return True

    @staticmethod
    def _give_back(taken: list[Lock]) -> None:
        for lock in reversed(taken):
            # Expired meanwhile, or Redis gone: its lease ends it.
            with contextlib.suppress(LockError):
                lock.release()

    def release(self) -> None:
        """Release every lock (one hold each); the first error is raised once all were tried."""
        first: LockError | None = None
        for lock in reversed(self._locks):
            try:
                lock.release()
            except LockError as exc:
                first = first or exc
        if first is not None:
            raise first

    def renew(self) -> None:
        for lock in self._locks:
            lock.renew()

    def extend(self, additional_time: float) -> None:
        for lock in self._locks:
            lock.extend(additional_time)

    # -- state --------------------------------------------------------------------------------
    def locked(self) -> bool:
        return any(lock.locked() for lock in self._locks)

    def owned(self) -> bool:
        return all(lock.owned() for lock in self._locks)

    @property
    def hold_count(self) -> int:
        """How many times this owner holds the whole set (0: not all of it)."""
        return min(lock.hold_count for lock in self._locks)

    @property
    def fencing_tokens(self) -> dict[str, int | None]:
        return {lock.name: lock.fencing_token for lock in self._locks}

    @property
    def fencing_token(self) -> int | None:
        tokens = [t for t in self.fencing_tokens.values() if t is not None]
        return max(tokens) if tokens else None

    @property
    def lost(self) -> bool:
        return any(lock.lost for lock in self._locks)

    @property
    def timeout(self) -> float:
        return self._locks[0].timeout

    # -- context manager ------------------------------------------------------------------------
    def __enter__(self) -> MultiLock:
        if not self.acquire():
            raise LockNotAcquiredError(
                ", ".join(self.names),
                f"Could not acquire all of {list(self.names)!r} in time (none is held).",
            )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Each lock leaves as a ``Lock`` block would (a lost one raises ``LockLostError``),
        the others still released; the first error is raised."""
        first: BaseException | None = None
        for lock in reversed(self._locks):
            try:
                lock.__exit__(*exc_info)
            except LockError as exc:
                first = first or exc
        if first is not None:
            raise first
