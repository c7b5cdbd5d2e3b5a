"""Read-write locks: any number of readers, or one writer.

``ReadWriteLock(name)`` is a name and two sides: :meth:`~ReadWriteLock.read_lock` and
:meth:`~ReadWriteLock.write_lock` return objects with the ``Lock`` interface, built from the
blocking face and the read-write kind (:class:`~django_redislock.kinds.ReadWriteKind`), so they
wait, hand over, renew, fence and clean up lost replies exactly as a ``Lock`` does.

- Every reader has its own lease (a member of a sorted set scored by its end), so a crashed
  reader frees its part within ``timeout`` and does not keep the others' going.
- A queued writer blocks new readers, and writers go in queue order: a steady stream of readers
  cannot starve a writer.
- Re-entrant per owner on each side. A writer may take the read lock (a downgrade: take read,
  then release write). A reader asking for the write lock gets :class:`LockNotAcquiredError`
  (a ``LockError``) at once: two readers upgrading would wait for each other for ever.
- Waiters are woken by the release that lets them go (the writer's, or the last reader's),
  never by polling; fencing tokens come from the name's one counter, so a writer's token is
  above every reader's before it.
- Sync and asyncio objects of one name interoperate (same keys, same scripts).
"""

from __future__ import annotations

from typing import Any

from django_redislock.face import AsyncFace, Face, SyncFace
from django_redislock.kinds import ReadWriteKind
from django_redislock.runtime import runtime
from django_redislock.validation import check_name

__all__ = ["AsyncReadWriteLock", "ReadWriteLock"]

#: What ``read_lock()`` / ``write_lock()`` accept; ``timeout`` there overrides the lock's.
_SIDE_OPTIONS = frozenset(
    {"timeout", "blocking", "blocking_timeout", "auto_renew", "owner", "stats_name"}
)


class _Sides:
    """The name, the lease and the two kinds; the faces differ only in the class they build."""

    _face: type[Face]

    def __init__(self, name: str, *, timeout: float | None = None, using: str | None = None):
        self.name = check_name(name)
        self.timeout = timeout
        self.using = using
        self._default: dict[bool, Face] = {}
        # Validates timeout and using now, not at first use.
        self._side(False, {})

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} using={self.using!r}>"

    def _side(self, writes: bool, options: dict[str, Any]) -> Any:
        unknown = set(options) - _SIDE_OPTIONS
        if unknown:
            raise TypeError(
                f"{'write' if writes else 'read'}_lock() got an unexpected keyword argument "
                f"{sorted(unknown)[0]!r} (accepted: {', '.join(sorted(_SIDE_OPTIONS))})"
            )
        if not options and writes in self._default:
            return self._default[writes]
        face = self._face(
            self.name,
            kind=ReadWriteKind(writes=writes),
            using=self.using,
            **{"timeout": self.timeout, **options},
        )
        if not options:
            self._default[writes] = face
        return face


class _Side(Face):
    """What a side adds to a face: what this process knows of the owner's hold on the *other*
    side too. A default owner (a thread, a task) whose id a finished thread left behind may
    find a hold of that thread: it is not this caller's, so it must neither refuse an upgrade
    nor let a reader past a writer."""

    def _known(self, owner: str) -> str:
        mine = super()._known(owner)
        if self._owner is not None:
            return mine  # an owner given by the caller: the records are the truth
        target = self._spec().target
        other = ReadWriteKind(writes=not self.kind.writes)
        hold = runtime.holds.get(other.hold_ident(target, self.name, owner, 0))
        return f"{mine},{hold.attempts[0] if hold is not None and hold.attempts else '-'}"


class _ReadWriteSide(_Side, SyncFace):
    def __enter__(self) -> _ReadWriteSide:
        super().__enter__()
        return self


class _AsyncReadWriteSide(_Side, AsyncFace):
    async def __aenter__(self) -> _AsyncReadWriteSide:
        await super().__aenter__()
        return self


class ReadWriteLock(_Sides):
    """Any number of readers or one writer, across processes.

    ``ReadWriteLock(name, *, timeout=None, using=None)``; ``read_lock(**options)`` and
    ``write_lock(**options)`` return objects with the ``Lock`` interface (``acquire``,
    ``release``, ``renew``, ``extend``, ``locked``, ``owned``, context manager,
    ``fencing_token``, ``hold_count``, ``lost``). Options: ``timeout``, ``blocking``,
    ``blocking_timeout``, ``auto_renew``, ``owner``, ``stats_name``. Without options the same
    object is returned each time.
    """

    _face = _ReadWriteSide

    def read_lock(self, **options: Any) -> _ReadWriteSide:
        return self._side(False, options)  # type: ignore[no-any-return]

    def write_lock(self, **options: Any) -> _ReadWriteSide:
        return self._side(True, options)  # type: ignore[no-any-return]


class AsyncReadWriteLock(_Sides):
    """``ReadWriteLock`` for asyncio code (the owner is the asyncio task): the sides' methods
    are awaitable and they are ``async with`` context managers."""

    _face = _AsyncReadWriteSide

    def read_lock(self, **options: Any) -> _AsyncReadWriteSide:
        return self._side(False, options)  # type: ignore[no-any-return]

    def write_lock(self, **options: Any) -> _AsyncReadWriteSide:
        return self._side(True, options)  # type: ignore[no-any-return]
