"""Looking at and resetting the package's locks from a test, with or without pytest.

A test of code that takes locks wants to say "this is locked now, by that task" and to start
from a clean slate, without knowing the key layout. These functions read what ``list_locks`` and
the admin read (:mod:`django_redislock.operations`), encode names exactly as ``Lock`` does
(:mod:`django_redislock.keys`), and delete only keys of the package's own namespace: never
``FLUSHDB``, so a test pointed at a shared Redis database loses nothing else.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

from django_redislock import client as redis_client
from django_redislock import connection
from django_redislock.conf import get_settings
from django_redislock.holds import Hold
from django_redislock.operations import (
    LockInfo,
    describe_holder,
    get_lock_info,
    list_locks,
    lock_holders,
)
from django_redislock.runtime import get_client, keyspace, runtime
from django_redislock.transport import backend_errors
from django_redislock.validation import check_name

__all__ = [
    "assert_locked",
    "assert_not_locked",
    "flush_locks",
    "held_by",
    "lock_aliases",
]

#: Held locks named in a failed assertion's message at most (the rest are counted).
SHOWN_IN_MESSAGES = 20


class _HasOwner(Protocol):
    @property
    def owner(self) -> str: ...


def lock_aliases(using: str | None = None) -> list[str]:
    """The aliases whose namespaces hold the locks: ``[using]``, else every master of
    ``REDISLOCK["CACHE"]`` (one alias, or several for Redlock), else ``REDISLOCK["CLIENT"]``'s."""
    if using:
        return [using]
    settings = get_settings()
    if settings.client:
        return [connection.resolve_alias(None)]
    return list(settings.caches)


def flush_locks(using: str | None = None) -> int:
    """Delete every key of the package's namespace (locks, fencing counters, wait queues,
    semaphores, statistics) of ``using`` (default: every lock alias); returns how many.

    Keys are found with ``SCAN`` on the escaped namespace pattern, so keys of the cache itself,
    of another site's prefix or of anything else in the database survive. This process also
    forgets its holds of that namespace, so the watchdog does not report them lost in the next
    test. Fencing counters go too: tokens start again from 1.
    """
    deleted = 0
    for alias in lock_aliases(using):
        client = get_client(alias)
        space = keyspace(alias)
        cursor = 0
        with backend_errors(f"flush the lock namespace {space.namespace!r}"):
            while True:
                cursor, keys = redis_client.scan_keys(
                    client, space.namespace_pattern, cursor=cursor, count=1000
                )
                deleted += redis_client.delete_keys(client, keys)
                if cursor == 0:
                    break
        runtime.holds.forget_all(_in_namespace(space.namespace))
    return deleted


def _in_namespace(namespace: str) -> Callable[[Hold], bool]:
    prefix = namespace + ":"
    return lambda hold: hold.ident[1].startswith(prefix)


def held_by(name: str, using: str | None = None) -> LockInfo | None:
    """Who holds ``name`` now (owner, host, pid, Celery task id, fencing token...) or ``None``.

    For a semaphore, its oldest permit; the name is encoded exactly as :class:`~django_redislock.
    Lock` encodes it, braces and all.
    """
    return get_lock_info(check_name(name), using=using)


def assert_locked(
    name: str, using: str | None = None, *, by: str | _HasOwner | None = None
) -> LockInfo:
    """Fail unless ``name`` is held now (by ``by``, when given); returns the holder.

    ``by`` is an owner id or a Celery task id (``result.id``), or a lock object (``Lock``,
    ``AsyncLock``, ``Semaphore``) whose owner must hold it. The message of a failure lists what
    *is* held, which usually shows the mistake at once (a different key, a task id).
    """
    check_name(name)
    holders = lock_holders(name, using=using)
    if not holders:
        raise AssertionError(f"Lock {name!r} is not held. {_held_now(using)}")
    if by is None:
        return holders[0]
    wanted = by if isinstance(by, str) else by.owner
    for info in holders:
        if wanted in (info.owner, info.task_id):
            return info
    found = "; ".join(_describe(info) for info in holders)
    raise AssertionError(f"Lock {name!r} is held, but not by {wanted!r}: held by {found}.")


def assert_not_locked(name: str, using: str | None = None) -> None:
    """Fail if ``name`` is held now; the message says by whom (and for how long still)."""
    check_name(name)
    holders = lock_holders(name, using=using)
    if holders:
        found = "; ".join(_describe(info) for info in holders)
        raise AssertionError(f"Lock {name!r} is held by {found}.")


def _describe(info: LockInfo) -> str:
    lease = f"expires in {info.expires_in:.1f} s" if info.expires else "never expires"
    return f"{describe_holder(info)} (owner {info.owner!r}, {lease})"


def _held_now(using: str | None) -> str:
    """The locks held now, for a failure message."""
    infos = list_locks(using=using)
    shown = list(itertools.islice(infos, SHOWN_IN_MESSAGES + 1))
    if not shown:
        return "No lock is held at all."
    lines = [f"  {info.name!r}: {_describe(info)}" for info in shown[:SHOWN_IN_MESSAGES]]
    if len(shown) > SHOWN_IN_MESSAGES:
        rest = sum(1 for _ in infos) + 1
        lines.append(f"  ... and {rest} more")
    return "Held now:\n" + "\n".join(lines)
