"""Inspection and operator actions: ``list_locks``, ``get_lock_info``, ``force_release``.

The admin pages and the ``redislock`` management command are built on exactly these functions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

from django_redislock import client as redis_client
from django_redislock import connection, scripts, signals
from django_redislock.keys import KeySpace, keyspace
from django_redislock.records import LockRecord

__all__ = ["LockInfo", "force_release", "get_lock_info", "list_locks", "lock_page"]


@dataclass(frozen=True)
class LockInfo:
    """A snapshot of one active lock."""

    name: str
    owner: str
    host: str
    pid: int | None
    thread: str
    task_id: str | None
    fencing_token: int
    hold_count: int
    acquired_at: dt.datetime
    expires_in: float
    #: ``"lock"`` or ``"semaphore"`` (one ``LockInfo`` per held permit).
    kind: str = "lock"
    #: How many holders the name admits at once (1 for a lock).
    permits: int = 1
    #: Held for a published Celery task that no worker has started yet: ``host``/``pid``/``thread``
    #: are the publisher's. Once a worker runs the task they are the worker's.
    queued: bool = False
    #: The stored value is not a record this version can read (written by something else, or
    #: corrupted): the holder fields are empty, and it can still be force-released.
    unreadable: bool = False

    @property
    def held_for(self) -> float:
        """Seconds since acquisition, by this machine's clock."""
        return max(0.0, (dt.datetime.now(dt.timezone.utc) - self.acquired_at).total_seconds())

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields (``acquired_at`` as ISO 8601)."""
        return {
            "name": self.name,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "task_id": self.task_id,
            "fencing_token": self.fencing_token,
            "hold_count": self.hold_count,
            "acquired_at": self.acquired_at.isoformat(),
            "expires_in": self.expires_in,
            "kind": self.kind,
            "permits": self.permits,
            "queued": self.queued,
            "unreadable": self.unreadable,
        }


def _info(keys: KeySpace, record: LockRecord) -> LockInfo:
    meta = record.meta
    pid = meta.get("pid")
    try:
        pid = int(pid) if pid is not None else None
    except (TypeError, ValueError):
        pid = None
    return LockInfo(
        name=keys.name_of(record.key),
        owner=record.owner,
        host=str(meta.get("host") or ""),
        pid=pid,
        thread=str(meta.get("thread") or ""),
        task_id=meta.get("task_id") or None,
        fencing_token=record.token,
        hold_count=record.count,
        acquired_at=dt.datetime.fromtimestamp(record.acquired_at_ms / 1000, tz=dt.timezone.utc),
        # A value without a TTL (pttl -1: only something else writes such values) never expires.
        expires_in=record.pttl_ms / 1000 if record.pttl_ms >= 0 else float("inf"),
        queued=bool(meta.get("queued")),
        unreadable=record.unreadable,
    )


def lock_page(
    *, cursor: int = 0, match: str | None = None, count: int = 500, using: str | None = None
) -> tuple[int, list[LockInfo]]:
    """One SCAN step of active locks: ``(next_cursor, infos)``; ``next_cursor == 0`` when done.

    Two round trips whatever the page size (SCAN, then one pipeline of GET+PTTL). SCAN may
    return a key twice across pages; callers that need uniqueness dedupe by name.
    """
    client = connection.get_client(using)
    keys = keyspace(using)
    with connection.backend_errors("list locks"):
        next_cursor, found = redis_client.scan_keys(
            client, keys.lock_pattern(match), cursor=cursor, count=count
        )
        records = redis_client.read_locks(client, found)
    return next_cursor, [_info(keys, r) for r in records]


def list_locks(*, match: str | None = None, using: str | None = None) -> Iterator[LockInfo]:
    """Every active lock (``SCAN``, never ``KEYS``); ``match`` is a glob on the lock name."""
    seen: set[str] = set()
    cursor = 0
    while True:
        cursor, infos = lock_page(cursor=cursor, match=match, using=using)
        for info in infos:
            if info.name not in seen:
                seen.add(info.name)
                yield info
        if cursor == 0:
            return


def get_lock_info(name: str, *, using: str | None = None) -> LockInfo | None:
    """The active lock called ``name``, or ``None``."""
    client = connection.get_client(using)
    keys = keyspace(using)
    with connection.backend_errors(f"inspect lock {name!r}"):
        record = redis_client.read_lock(client, keys.lock(name))
    return None if record is None else _info(keys, record)


def force_release(name: str, *, token: int | None = None, using: str | None = None) -> bool:
    """Delete a lock whoever holds it, and hand it to the next waiter.

    With ``token``, only a lock whose current fencing token equals it is released, so a lock that
    changed hands since an operator looked at it is left alone. Returns whether a lock was
    released. The former holder finds out at its next renewal (``lost``) or release.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
        raise TypeError(f"token must be an int or None, not {type(token).__name__}")
    from django_redislock.engine import CLAIM_WINDOW, target_for

    target = target_for(using)
    keys = target.keys
    with connection.backend_errors(f"force-release lock {name!r}"):
        reply = scripts.FORCE_RELEASE(
            target.client,
            [keys.lock(name), keys.fence(name), keys.queue(name)],
            [
                "" if token is None else str(token),
                target.channel_prefix,
                target.trust_publish,
                int(CLAIM_WINDOW * 1000),
            ],
        )
    released, current = reply[0], reply[1]
    signals.lock_force_released.send_robust(
        None, name=name, token=int(current) or None, using=using, released=bool(released)
    )
    return bool(released)
