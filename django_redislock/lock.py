"""The ``Lock`` primitive.

Design in brief (the README has the long version):

- A lock is one Redis string holding a JSON record (owner, hold count, fencing token, metadata)
  with a lease (``PX``). Acquire, release, renew and force-release are single Lua scripts, so each
  is atomic and costs one round trip.
- Re-entrancy is per owner: by default ``<process token>-<thread id>``, so the same thread nests
  and other threads or processes wait. Callers that need another identity (a Celery task that is
  published by one process and run by another) pass ``owner=``.
- Waiters queue in Redis (FIFO). A release hands the lock straight to the oldest live waiter and
  pushes its fencing token to that waiter's mailbox, which the waiter is blocked on (``BLPOP``):
  no polling, no thundering herd, no barging. A waiter also wakes when the holder's lease would
  run out, so a lost message costs at most the holder's lease.
- Holds of this process are tracked in :mod:`django_redislock.watchdog`, which renews them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from django_redislock import client as redis_client
from django_redislock import connection, scripts, signals
from django_redislock.conf import LockSettings, get_settings
from django_redislock.exceptions import (
    LockBackendError,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
)
from django_redislock.keys import keyspace
from django_redislock.watchdog import Hold, watchdog

__all__ = ["Lock", "default_owner", "register_task_id_provider"]

logger = logging.getLogger("django_redislock")

#: Extra validity of a waiter's queue entry beyond its next planned wake-up.
_ENTRY_MARGIN = 2.0
#: How much earlier than the socket timeout a blocking pop must return.
_SOCKET_MARGIN = 0.25

_HOST = socket.gethostname()
_process_token = uuid.uuid4().hex[:12]
_pid = os.getpid()

# (client id, key, owner) -> Hold, for every lock this process holds.
_holds: dict[tuple[int, str, str], Hold] = {}
_holds_lock = threading.Lock()
_waiter_seq = itertools.count()
# (thread name, task id) -> metadata JSON; rebuilt only when a thread or task is new.
_meta_cache: dict[tuple[str, str | None, bool], str] = {}


def _meta(task_id: str | None, queued: bool = False) -> str:
    ident = (threading.current_thread().name, task_id, queued)
    meta = _meta_cache.get(ident)
    if meta is None:
        if len(_meta_cache) > 1024:
            _meta_cache.clear()
        fields: dict[str, object] = {
            "host": _HOST,
            "pid": _pid,
            "thread": ident[0],
            "task_id": task_id,
        }
        if queued:
            fields["queued"] = True
        meta = _meta_cache[ident] = json.dumps(
            fields,
            separators=(",", ":"),
        )
    return meta


def _after_fork() -> None:
    global _process_token, _pid, _holds_lock
    _process_token = uuid.uuid4().hex[:12]
    _pid = os.getpid()
    _holds.clear()
    _meta_cache.clear()
    _holds_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def default_owner() -> str:
    """The owner id of the calling (process, thread) pair."""
    return f"{_process_token}-{threading.get_ident()}"


#: Callables that return the id of the task this thread is running (``None`` outside a task);
#: the Celery integration registers one from ``AppConfig.ready``, so this module knows nothing
#: of Celery.
_task_id_providers: list[Callable[[], str | None]] = []


def register_task_id_provider(provider: Callable[[], str | None]) -> None:
    """Let locks taken inside a task record its id (shown by ``list_locks`` and the admin)."""
    if provider not in _task_id_providers:
        _task_id_providers.append(provider)


def _current_task_id() -> str | None:
    for provider in _task_id_providers:
        task_id = provider()
        if task_id:
            return task_id
    return None


def _on_lost(hold: Hold) -> None:
    with _holds_lock:
        if _holds.get((id(hold.client), hold.key, hold.owner)) is hold:
            del _holds[(id(hold.client), hold.key, hold.owner)]
    signals.lock_lost.send_robust(Lock, lock=hold.lock_ref(), name=hold.name)


watchdog.on_lost = _on_lost


@dataclass(frozen=True)
class _Target:
    """Where a ``Lock`` lives: its client and keys under the settings they were built from."""

    settings: LockSettings
    client: Any
    lock_key: str
    script_keys: list[str]  # lock, fence, queue: the KEYS of acquire/release
    wake_prefix: str
    lease_ms: int


def _check_seconds(value: object, what: str, *, allow_none: bool = True) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{what} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return float(value)


class Lock:
    """A distributed, re-entrant, fenced lock on Redis. See ``API.md`` for the contract."""

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = True,
        using: str | None = None,
        owner: str | None = None,
        task_id: str | None = None,
        queued: bool = False,
        stats_name: str | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Lock name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("Lock name must not be empty")
        if owner is not None and (not isinstance(owner, str) or not owner or "\n" in owner):
            raise ValueError("owner must be a non-empty string without newlines")
        timeout = _check_seconds(timeout, "timeout")
        if timeout == 0:
            raise ValueError("timeout must be positive")
        self.name = name
        self.stats_name = stats_name or name
        self._timeout = timeout
        self._blocking = blocking
        self._blocking_timeout = _check_seconds(blocking_timeout, "blocking_timeout")
        self._auto_renew = auto_renew
        self.reentrant = reentrant
        self.using = using
        self._owner = owner
        self._task_id = task_id
        self._queued = queued
        # owner -> the last Hold this object took for that owner (kept after release/loss so
        # ``fencing_token`` and ``lost`` still answer).
        self._last: dict[str, Hold] = {}
        self._target: _Target | None = None

    def _resolve(self) -> _Target:
        """Client and keys of this lock, cached until the settings change (``setting_changed``
        replaces the settings object): the hot path builds no strings."""
        settings = get_settings()
        target = self._target
        if target is None or target.settings is not settings:
            keys = keyspace(self.using)
            target = self._target = _Target(
                settings=settings,
                client=connection.get_client(self.using),
                lock_key=keys.lock(self.name),
                script_keys=[keys.lock(self.name), keys.fence(self.name), keys.queue(self.name)],
                wake_prefix=keys.wake_prefix(self.name),
                lease_ms=int(self.timeout * 1000),
            )
        return target

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} using={self.using or get_settings().cache!r}>"

    # -- settings resolved lazily, so a Lock can be built at import time -------------------------
    @property
    def timeout(self) -> float:
        return self._timeout if self._timeout is not None else get_settings().timeout

    @property
    def auto_renew(self) -> bool:
        return self._auto_renew if self._auto_renew is not None else get_settings().auto_renew

    @property
    def owner(self) -> str:
        return self._owner or default_owner()

    def _hold(self) -> Hold | None:
        target = self._resolve()
        return _holds.get((id(target.client), target.lock_key, self.owner))

    # -- state ---------------------------------------------------------------------------------
    @property
    def hold_count(self) -> int:
        hold = self._hold()
        return hold.count if hold is not None else 0

    @property
    def fencing_token(self) -> int | None:
        hold = self._hold() or self._last.get(self.owner)
        return hold.token if hold is not None else None

    @property
    def lost(self) -> bool:
        hold = self._last.get(self.owner)
        return bool(hold and hold.lost)

    def locked(self) -> bool:
        target = self._resolve()
        with connection.backend_errors(f"inspect lock {self.name!r}"):
            return redis_client.lock_exists(target.client, target.lock_key)

    def owned(self) -> bool:
        target = self._resolve()
        with connection.backend_errors(f"inspect lock {self.name!r}"):
            record = redis_client.read_lock(target.client, target.lock_key)
        return record is not None and record.owner == self.owner

    # -- acquire -------------------------------------------------------------------------------
    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        blocking = self._blocking if blocking is None else blocking
        limit = _check_seconds(blocking_timeout, "blocking_timeout")
        if limit is None:
            limit = self._blocking_timeout
        if limit is None:
            limit = get_settings().blocking_timeout
        started = time.monotonic()
        deadline = None if limit is None else started + limit
        owner = self.owner
        target = self._resolve()
        client, lock_key = target.client, target.lock_key
        if not self.reentrant:
            hold = _holds.get((id(client), lock_key, owner))
            if hold is not None and not hold.lost:
                raise LockNotAcquiredError(
                    self.name,
                    f"Lock {self.name!r} is already held by this owner and "
                    "reentrant=False: acquiring it again would deadlock.",
                )
        meta = _meta(self._task_id or _current_task_id(), self._queued)
        waiter = f"{_process_token}.{next(_waiter_seq)}" if blocking and limit != 0 else ""
        key_list = [*target.script_keys, target.wake_prefix + (waiter or "-")]
        entry = ""
        contended = False
        sock_timeout = connection.socket_timeout(client)
        try:
            while True:
                entry_lease = self._wait_span(deadline, self.timeout) + _ENTRY_MARGIN
                with connection.backend_errors(f"acquire lock {self.name!r}"):
                    state, value, extra = scripts.ACQUIRE(
                        client,
                        key_list,
                        [
                            owner,
                            target.lease_ms,
                            meta,
                            waiter,
                            int(entry_lease * 1000),
                            entry,
                            int(time.time() * 1000),
                        ],
                    )
                if state == 1:
                    return self._acquired(
                        client, lock_key, owner, int(value), int(extra), started, contended
                    )
                contended = True
                if not waiter:
                    return self._failed(started)
                entry = extra.decode() if isinstance(extra, bytes) else extra
                holder_left = max(int(value), 0) / 1000
                wait = min(self._wait_span(deadline, holder_left), entry_lease - _ENTRY_MARGIN)
                if sock_timeout is not None:
                    wait = min(wait, sock_timeout - _SOCKET_MARGIN)
                if wait >= 0.001:
                    with connection.backend_errors(f"wait for lock {self.name!r}"):
                        handed = redis_client.blocking_pop(client, key_list[3], wait)
                    if handed is not None:
                        entry = ""
                        return self._acquired(
                            client, lock_key, owner, int(handed), 1, started, True
                        )
                if deadline is not None and time.monotonic() >= deadline:
                    token = self._cancel(target, key_list[3], entry)
                    entry = ""
                    if token:
                        return self._acquired(client, lock_key, owner, token, 1, started, True)
                    return self._failed(started)
        except BaseException:
            if entry:
                self._abandon_wait(target, key_list[3], entry, owner)
            raise

    @staticmethod
    def _wait_span(deadline: float | None, cap: float) -> float:
        if deadline is None:
            return cap
        return max(0.0, min(cap, deadline - time.monotonic()))

    def _cancel(self, target: _Target, wake_key: str, entry: str) -> int:
        with connection.backend_errors(f"stop waiting for lock {self.name!r}"):
            return int(scripts.CANCEL(target.client, [target.script_keys[2], wake_key], [entry]))

    def _abandon_wait(self, target: _Target, wake_key: str, entry: str, owner: str) -> None:
        """Interrupted while queued: leave the queue; pass on a lock handed to us meanwhile."""
        try:
            if self._cancel(target, wake_key, entry):
                scripts.RELEASE(target.client, target.script_keys, [owner, "1", target.wake_prefix])
        except Exception:  # the original interruption matters more; the lease bounds the damage
            logger.warning(
                "django_redislock: could not clean up the wait for %r", self.name, exc_info=True
            )

    def _acquired(
        self,
        client: Any,
        lock_key: str,
        owner: str,
        token: int,
        count: int,
        started: float,
        contended: bool,
    ) -> bool:
        ident = (id(client), lock_key, owner)
        stale = None
        with _holds_lock:
            hold = _holds.get(ident)
            if hold is None or hold.lost or count == 1:
                stale = hold  # a hold whose lock expired unnoticed before this fresh acquisition
                hold = Hold(
                    client=client,
                    name=self.name,
                    key=lock_key,
                    owner=owner,
                    lease=self.timeout,
                    token=token,
                    count=count,
                    auto_renew=self.auto_renew,
                )
                hold.set_lock(self)
                _holds[ident] = hold
                fresh = True
            else:
                hold.count = count
                hold.lease = max(hold.lease, self.timeout)
                fresh = False
        self._last[owner] = hold
        if stale is not None:
            watchdog.unregister(stale)
        if fresh and hold.auto_renew:
            watchdog.register(hold)
        if fresh:
            signals.lock_acquired.send_robust(
                Lock,
                lock=self,
                name=self.name,
                token=token,
                waited=time.monotonic() - started,
                contended=contended,
            )
        return True

    def _failed(self, started: float) -> bool:
        signals.lock_acquire_failed.send_robust(
            Lock, lock=self, name=self.name, waited=time.monotonic() - started
        )
        return False

    # -- release / renew -----------------------------------------------------------------------
    def release(self, *, all_holds: bool = False) -> None:
        """Drop one hold (every hold with ``all_holds``); the last one frees the lock.

        Raises :class:`LockNotOwnedError` (and changes nothing in Redis) when this owner does not
        hold the lock — never held, already released, expired, or force-released.
        """
        owner = self.owner
        target = self._resolve()
        ident = (id(target.client), target.lock_key, owner)
        hold = _holds.get(ident)
        if hold is not None and (all_holds or hold.count <= 1):
            watchdog.unregister(hold)  # before the script: never renew a released lock
        with connection.backend_errors(f"release lock {self.name!r}"):
            left = int(
                scripts.RELEASE(
                    target.client,
                    target.script_keys,
                    [owner, "1" if all_holds else "0", target.wake_prefix],
                )
            )
        if left < 0:
            if hold is not None:
                self._mark_lost(hold)
            raise LockNotOwnedError(
                f"Cannot release lock {self.name!r}: it is not held by this owner ({owner}). It "
                "expired, was force-released, or was never acquired here."
            )
        if hold is None:
            return
        with _holds_lock:
            hold.count = left
            if left == 0 and _holds.get(ident) is hold:
                del _holds[ident]
        if left == 0:
            signals.lock_released.send_robust(
                Lock, lock=self, name=self.name, held=time.monotonic() - hold.acquired_at
            )

    def detach(self) -> tuple[int, int | None]:
        """Forget this process's record of the hold, leaving the lock in Redis untouched.

        For hand-overs: a lock taken here on behalf of another process (a Celery task published
        here and run by a worker, with ``owner=`` the task id) must not be renewed by this
        process's watchdog nor kept in its table of holds. Returns ``(hold_count, fencing_token)``
        as this process knew them (``0`` when it knew of no hold).
        """
        hold = self._hold()
        if hold is None:
            return 0, self.fencing_token
        watchdog.unregister(hold)
        ident = (id(hold.client), hold.key, hold.owner)
        with _holds_lock:
            if _holds.get(ident) is hold:
                del _holds[ident]
        return hold.count, hold.token

    def renew(self) -> None:
        """Reset the lease to ``timeout``; :class:`LockNotOwnedError` if no longer held."""
        owner = self.owner
        target = self._resolve()
        with connection.backend_errors(f"renew lock {self.name!r}"):
            ok = int(scripts.RENEW(target.client, [target.lock_key], [owner, target.lease_ms]))
        hold = self._hold()
        if not ok:
            if hold is not None:
                self._mark_lost(hold)
            raise LockNotOwnedError(
                f"Cannot renew lock {self.name!r}: it is no longer held by this owner ({owner})."
            )

    def _mark_lost(self, hold: Hold) -> None:
        watchdog.unregister(hold)
        first = not hold.lost
        hold.lost = True
        self._last[hold.owner] = hold
        if first:
            logger.warning(
                "django_redislock: lock %r was lost while held by %s.", self.name, hold.owner
            )
            _on_lost(hold)

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockNotAcquiredError(self.name)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._last.get(self.owner)
        if hold is not None and hold.lost:
            self._lost_on_exit(exc)
            return
        try:
            self.release()
        except LockNotOwnedError as err:
            self._lost_on_exit(exc, err)
        except LockBackendError:
            if exc is None:
                raise
            logger.warning("django_redislock: could not release %r", self.name, exc_info=True)

    def _lost_on_exit(self, exc: BaseException | None, cause: BaseException | None = None) -> None:
        message = (
            f"Lock {self.name!r} was lost (expired or force-released) while the protected "
            "block ran; its work may have overlapped with another holder."
        )
        if exc is not None:
            # Keep the block's own exception: it says more about what went wrong.
            logger.warning("django_redislock: %s", message)
            return
        raise LockLostError(message) from cause
