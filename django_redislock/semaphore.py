"""Semaphores: at most ``permits`` holders of a name at once, on the lock engine.

A semaphore is not a counter — counters leak when a holder crashes. Each held permit is its own
lease (a fencing token in a sorted set, scored by its expiry, with a record like a lock's), renewed
by the watchdog like a lock, so a crashed holder frees its permit within ``timeout``. Waiters queue
FIFO and are woken by a release exactly like lock waiters (same wake-up listener, claim window,
dead-waiter skipping); every acquisition gets its own fencing token. One Lua round trip per
acquire and per release.

``Semaphore`` is the blocking face, ``AsyncSemaphore`` the asyncio one: the same faces as
``Lock``/``AsyncLock`` with the semaphore's keys and scripts mixed in (:class:`SemaphoreMixin`).

Changing ``permits`` for a name while holders exist: the limit is the acquirer's. A larger value
admits more holders at once; a smaller one lets current holders keep their permits and makes new
acquirers wait until fewer than the new limit remain. The last limit used is what listings show.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_redislock import holds, scripts
from django_redislock.aio import AsyncLock
from django_redislock.engine import Call, LockBase, Op, _Spec, check_bool
from django_redislock.holds import Hold
from django_redislock.keys import KeySpace
from django_redislock.lock import Lock

__all__ = ["MAX_PERMITS", "AsyncSemaphore", "Semaphore", "SemaphoreMixin"]

#: Largest ``permits`` accepted (each acquisition scans the holders' expiries).
MAX_PERMITS = 100_000


def check_permits(permits: object) -> int:
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits must be between 1 and {MAX_PERMITS}, not {permits}")
    return permits


class SemaphoreMixin(LockBase):
    """The semaphore's keys, scripts and bookkeeping, on top of a lock face."""

    kind = "semaphore"

    def __init__(
        self,
        name: str,
        permits: int,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
        owner: str | None = None,
        task_id: str | None = None,
        queued: bool = False,
        stats_name: str | None = None,
        quiet: bool = False,
        report_busy: bool = True,
    ) -> None:
        self.permits = check_permits(permits)
        check_bool(blocking, "blocking")
        super().__init__(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
            owner=owner,
            task_id=task_id,
            queued=queued,
            stats_name=stats_name,
            quiet=quiet,
            report_busy=report_busy,
        )
        # owner -> tokens of the permits this object took for it, oldest first.
        self._tokens: dict[str, list[int]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} permits={self.permits}>"

    # -- keys and scripts -------------------------------------------------------------------
    def _script_keys(self, keys: KeySpace) -> list[str]:
        name = self.name
        return [
            keys.semaphore(name),
            keys.semaphore_records(name),
            keys.fence(name),
            keys.semaphore_queue(name),
        ]

    def _hold_ident(self, spec: _Spec, owner: str, token: int) -> tuple[str, str, str]:
        """One hold per permit: an owner may hold several permits of one semaphore."""
        return (*spec.ident, f"{owner}#{token}")

    def _renew_args(
        self, spec: _Spec, owner: str, token: int | None, ms: int, mode: str
    ) -> tuple[scripts.Script, list[str], list[Any]]:
        return scripts.SEM_RENEW, spec.script_keys[:2], [owner, token or 0, ms, mode]

    _acquire_script = scripts.SEM_ACQUIRE

    def _limit_arg(self) -> Any:
        return self.permits

    def _acquire_call(
        self, spec: _Spec, owner: str, meta: str, waiter: str, entry: str, entry_ms: int
    ) -> Call:
        if spec.target.masters:
            raise ImproperlyConfigured(
                "Semaphores need one Redis (single, Sentinel or Cluster): REDISLOCK['CACHE'] "
                "lists independent masters (Redlock). Pass using=<one alias>."
            )
        return super()._acquire_call(spec, owner, meta, waiter, entry, entry_ms)

    def _cancel_call(self, spec: _Spec, owner: str, waiter: str, entry: str, take: bool) -> Call:
        meta = holds.metadata(self._task_id, queued=self._queued)
        return Call(
            scripts.SEM_CANCEL,
            spec.script_keys,
            [
                entry,
                waiter,
                owner,
                spec.lease_ms,
                "1" if take else "0",
                *spec.wake_args,
                meta,
            ],
            f"stop waiting for semaphore {self.name!r}",
        )

    # -- bookkeeping --------------------------------------------------------------------------
    def _live_holds(self, owner: str) -> list[Hold]:
        spec = self._spec()
        found = []
        for token in self._tokens.get(owner, []):
            hold = holds.get(self._hold_ident(spec, owner, token))
            if hold is not None:
                found.append(hold)
        return found

    def _hold(self) -> Hold | None:
        """The permit this owner took last through this object (released first)."""
        live = self._live_holds(self.owner)
        return live[-1] if live else None

    @property
    def hold_count(self) -> int:
        """Permits this owner holds through this object."""
        return len(self._live_holds(self.owner))

    def _acquired(
        self, spec: _Spec, owner: str, token: int, count: int, started: float, contended: bool
    ) -> bool:
        tokens = self._tokens.setdefault(owner, [])
        live = {h.token for h in self._live_holds(owner)}
        tokens[:] = [t for t in tokens if t in live] + [token]
        return super()._acquired(spec, owner, token, 1, started, contended)

    def _release_call(self, all_holds: bool, owner: str) -> tuple[Call, Hold | None]:
        from django_redislock.watchdog import watchdog

        spec = self._spec()
        live = self._live_holds(owner)
        hold = live[-1] if live else None
        token = hold.token if hold is not None else (self._tokens.get(owner) or [0])[-1]
        if hold is not None:
            watchdog.unregister(hold)
        call = Call(
            scripts.SEM_RELEASE,
            spec.script_keys,
            [owner, token, *spec.wake_args],
            f"release semaphore {self.name!r}",
        )
        return call, hold

    def _released(self, hold: Hold | None, left: int, owner: str) -> None:
        if hold is not None and left >= 0:
            tokens = self._tokens.get(owner, [])
            if hold.token in tokens:
                tokens.remove(hold.token)
        super()._released(hold, left, owner)

    # -- inspection -----------------------------------------------------------------------------
    def _locked_op(self) -> Op:
        return self._inspect_call()

    def _owned_op(self) -> Op:
        return self._inspect_call()

    def _inspect_call(self) -> Call:
        spec = self._spec()
        return Call(
            scripts.SEM_INSPECT,
            spec.script_keys[:2],
            [self.owner],
            f"inspect semaphore {self.name!r}",
        )

    def _locked_from(self, reply: Any) -> bool:
        """Held by anyone: at least one live permit."""
        return int(reply[0]) > 0

    def _owned_from(self, reply: Any) -> bool:
        return int(reply[1]) > 0

    def _exit_state(self) -> str:
        hold = self._last.get(self.owner)
        if hold is not None and hold.lost:
            return "lost"
        if hold is not None and hold.released:
            return "released"
        return "held"


class Semaphore(SemaphoreMixin, Lock):
    """At most ``permits`` holders at once, across processes. See ``API.md`` ("Semaphores").

    ``Semaphore(name, permits, *, timeout=None, blocking=True, blocking_timeout=None,
    auto_renew=None, using=None, owner=None)``: ``acquire``/``release``/``renew``/``extend``,
    ``locked()`` (any permit held), ``owned()`` (this owner holds one), context manager, and
    ``fencing_token`` per acquisition — as ``Lock``. Each ``acquire`` takes one more permit
    (not re-entrant); ``release`` gives back the one this owner took last.
    """

    def __enter__(self) -> Semaphore:
        super().__enter__()
        return self


class AsyncSemaphore(SemaphoreMixin, AsyncLock):
    """``Semaphore`` for asyncio code (the owner is the asyncio task); see ``AsyncLock``."""

    async def __aenter__(self) -> AsyncSemaphore:
        await super().__aenter__()
        return self
