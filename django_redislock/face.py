"""What every face of every primitive shares: arguments, owners, holds, outcomes.

A *face* is how code holds a primitive: :class:`SyncFace` with blocking calls (``Lock``,
``Semaphore``), :class:`AsyncFace` with ``await`` (``AsyncLock``, ``AsyncSemaphore``). The
primitive itself is a *kind* (:mod:`django_redislock.kinds`) composed into the face; the
protocol is :mod:`django_redislock.flow`, run by :mod:`django_redislock.drivers`.

This module holds what happens around a call, once for both faces: validating arguments,
resolving the owner, building an attempt, recording a hold (the hold table, the watchdog,
statistics and signals), and turning an uncertain outcome into a clean-up by the attempt's id
(:class:`~django_redislock.LockOutcomeUnknown`). The faces add only the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

from django_redislock import drivers, flow, signals, stats
from django_redislock.conf import MIN_LEASE, check_seconds, get_settings
from django_redislock.connection import resolve_alias, shared_cache_aliases
from django_redislock.exceptions import (
    LockBackendError,
    LockError,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
    LockOutcomeUnknown,
)
from django_redislock.holds import Hold
from django_redislock.kinds import DropReply, Inspection
from django_redislock.naming import stats_shape
from django_redislock.runtime import runtime
from django_redislock.transport import NoReply
from django_redislock.validation import check_bool, check_name, check_owner
from django_redislock.watchdog import Resolution

__all__ = ["AsyncFace", "Face", "SyncFace"]

logger = logging.getLogger("django_redislock")


def _report_lost(hold: Hold) -> None:
    """Counts a lost hold and sends ``lock_lost`` (registered with the hold table)."""
    if hold.stats_key is not None:
        held = time.monotonic() - hold.acquired_at
        stats.record(*hold.stats_key, "lost", held, name=hold.name, token=hold.token)
    if signals.lock_lost.receivers:
        signals.lock_lost.send_robust(hold.sender, lock=hold.lock_ref(), name=hold.name)


runtime.holds.on_lost.append(_report_lost)


@dataclass(frozen=True)
class Spec:
    """A face's target and lease under one settings object."""

    target: Any
    lease: float
    settings: Any
    generation: int  # the runtime's: a fork or reset drops the target (a child has its own)


@dataclass(frozen=True)
class Release:
    """A release about to be sent: the call, the hold it drops, the attempt behind it."""

    call: flow.Call
    hold: Hold | None
    owner: str
    attempt: str
    all_holds: bool


class Face:
    """Everything about a primitive's face except the I/O; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        kind: Any,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
        owner: str | None = None,
        task_id: str | None = None,
        queued: bool = False,
        stats_name: str | None = None,
        on_commit: bool | str = False,
        quiet: bool = False,
        report_busy: bool = True,
    ) -> None:
        self.name = check_name(name)
        self.kind = kind
        self._timeout = check_seconds(timeout, "timeout", minimum=MIN_LEASE, allow_none=True)
        self._blocking = bool(check_bool(blocking, "blocking"))
        self._blocking_timeout = check_seconds(
            blocking_timeout, "blocking_timeout", allow_none=True
        )
        self._auto_renew = check_bool(auto_renew, "auto_renew", allow_none=True)
        if using is not None and (not isinstance(using, str) or not using):
            raise TypeError(
                f"using must be a CACHES alias (a non-empty str) or None, not {using!r}"
            )
        self.using = using
        self._owner = check_owner(owner)
        if task_id is not None and not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str or None, not {type(task_id).__name__}")
        self._task_id = task_id
        self._queued = bool(check_bool(queued, "queued"))
        self.stats_name = stats_name or stats_shape(name)
        #: The statistics row kept in the lock record (see ``runtime.metadata``): only when it
        #: is not the shape of the name, which anyone can compute.
        self._stats_row = None if self.stats_name == stats_shape(name) else self.stats_name
        #: For integrations that report their own events (single-flight publishes): no signals
        #: and no statistics for this object (``quiet``), or none for busy attempts.
        self.quiet = bool(check_bool(quiet, "quiet"))
        self.report_busy = bool(check_bool(report_busy, "report_busy"))
        if not isinstance(on_commit, (bool, str)):
            raise TypeError(f"on_commit must be True, False or a database alias, not {on_commit!r}")
        self.on_commit = on_commit
        # owner -> the holds this object took for that owner, oldest first (kept after release
        # or loss so ``fencing_token`` and ``lost`` still answer).
        self._taken: dict[str, list[Hold]] = {}
        self._spec_cache: Spec | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} using={self.using!r}>"

    # -- resolution ---------------------------------------------------------------------------
    def _spec(self) -> Spec:
        """Target and lease, cached until the settings change (``setting_changed`` replaces
        the settings object) or the runtime forgets its targets (a fork: an object made before
        it must not use the parent's listener in the child)."""
        settings = get_settings()
        spec = self._spec_cache
        if spec is None or spec.settings is not settings or spec.generation != runtime.generation:
            lease = self._timeout if self._timeout is not None else settings.timeout
            generation = runtime.generation
            target = runtime.target(self.using)
            spec = self._spec_cache = Spec(target, lease, settings, generation)
        return spec

    @property
    def timeout(self) -> float:
        """The lease in seconds (``REDISLOCK["TIMEOUT"]`` unless given)."""
        return self._timeout if self._timeout is not None else get_settings().timeout

    @property
    def auto_renew(self) -> bool:
        """Whether the watchdog renews held leases (``REDISLOCK["AUTO_RENEW"]`` unless given)."""
        return self._auto_renew if self._auto_renew is not None else get_settings().auto_renew

    @property
    def reentrant(self) -> bool:
        return bool(self.kind.reentrant)

    def _default_owner(self) -> str:
        return runtime.thread_owner()

    @property
    def owner(self) -> str:
        """The owner id calls use: ``owner=`` if given, else the caller's (process, thread) —
        for asyncio faces, (process, task)."""
        return self._owner or self._default_owner()

    def _ident(self, owner: str) -> tuple[str, str, str]:
        spec = self._spec()
        return self.kind.hold_ident(spec.target, self.name, owner, 0)  # type: ignore[no-any-return]

    def _hold(self, owner: str | None = None) -> Hold | None:
        """The hold a release of ``owner`` would drop: the owner's (a lock: shared by every
        object of the name), or the last permit this object took for it (a semaphore)."""
        owner = owner or self.owner
        if self.kind.per_owner:
            return runtime.holds.get(self._ident(owner))
        live = self._live(owner)
        return live[-1] if live else None

    def _live(self, owner: str) -> list[Hold]:
        return [h for h in self._taken.get(owner, ()) if runtime.holds.get(h.ident) is h]

    def _last(self, owner: str) -> Hold | None:
        taken = self._taken.get(owner)
        return taken[-1] if taken else None

    # -- state --------------------------------------------------------------------------------
    @property
    def hold_count(self) -> int:
        """Re-entrancy depth of this owner, 0 when it holds nothing (a semaphore: the permits
        it holds through this object)."""
        if self.kind.per_owner:
            hold = self._hold()
            return hold.count if hold is not None else 0
        return len(self._live(self.owner))

    @property
    def fencing_token(self) -> int | None:
        """The token of this owner's hold (kept after release, for checks at the resource):
        strictly greater than every token issued before it for the name. ``None`` before the
        first acquisition."""
        hold = self._hold() or self._last(self.owner)
        return hold.token if hold is not None else None

    @property
    def lost(self) -> bool:
        """True once the watchdog, a renewal or a release found the lock no longer held by
        this owner (expired or force-released)."""
        hold = self._last(self.owner)
        return bool(hold and hold.lost)

    # -- acquire ------------------------------------------------------------------------------
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop a waiter sleeps in (``None``: a thread)."""
        return None

    def _attempt(self, blocking: bool | None, blocking_timeout: float | None) -> drivers.Attempt:
        spec = self._spec()
        target = spec.target
        blocking = self._blocking if blocking is None else bool(check_bool(blocking, "blocking"))
        if blocking_timeout is None:
            limit = self._blocking_timeout
        else:
            limit = check_seconds(blocking_timeout, "blocking_timeout")
        if limit is None:
            limit = spec.settings.blocking_timeout
        self.kind.check_target(target)
        started = time.monotonic()
        waits = blocking and limit != 0
        owner = self.owner
        plan = flow.Plan(
            kind=self.kind,
            target=target,
            name=self.name,
            owner=owner,
            known=self._known(owner),
            attempt=runtime.new_attempt_id(),
            meta=runtime.metadata(self._task_id, queued=self._queued, stats=self._stats_row),
            lease=spec.lease,
            blocking=waits,
            started=started,
            deadline=float("inf") if limit is None else started + limit,
            # Queue at the first call only when hand-offs can reach us already (subscribed).
            queue=waits and target.listening(self.name).ready.is_set(),
        )
        return drivers.Attempt(plan=plan, loop=self._loop())

    def _known(self, owner: str) -> str:
        """What this process knows of ``owner``'s holds on this lock, for the acquire script:
        the default owner (this thread or task) has no holds but those in the hold table, so a
        record of it the table does not know is an orphan to replace, never a hold to re-enter.
        An owner given by the caller may be shared with other processes (a Celery flight id)
        or detached on purpose (a leader's lease): its record is the truth ("")."""
        if self._owner is not None:
            return ""
        hold = runtime.holds.get(self._ident(owner)) if self.kind.per_owner else None
        return hold.attempts[0] if hold is not None and hold.attempts else "-"

    def _flow(self, attempt: drivers.Attempt) -> flow.Flow:
        if attempt.plan.target.quorum:
            from django_redislock import redlock

            return redlock.acquire(attempt.plan)
        return flow.acquire(attempt.plan)

    def _pending(self, owner: str) -> list[Resolution]:
        """Clean-ups of this owner's earlier calls on this lock, not yet done: they go first."""
        return runtime.watchdog.pending(self._ident(owner))

    def _finish(self, attempt: drivers.Attempt, outcome: Any) -> bool:
        plan = attempt.plan
        if isinstance(outcome, flow.NotAcquired):
            return self._failed(plan.started)
        spec = self._spec()
        target, owner = spec.target, plan.owner
        ident = self.kind.hold_ident(target, self.name, owner, outcome.token)
        hold = runtime.holds.get(ident)
        now = time.monotonic()
        if hold is None or hold.lost or outcome.count == 1:
            auto_renew = self._auto_renew
            hold = Hold(
                ident=ident,
                name=self.name,
                owner=owner,
                kind=self.kind,
                target=target,
                token=outcome.token,
                count=outcome.count,
                attempts=[plan.attempt],
                lease=spec.lease,
                auto_renew=spec.settings.auto_renew if auto_renew is None else auto_renew,
                sender=type(self),
                stats_key=None if self.quiet else (self.using, self.stats_name),
                acquired_at=now,
                lock_ref=weakref.ref(self),
            )
            stale = runtime.holds.put(hold)
            if stale is not None:
                runtime.watchdog.unregister(stale)  # its lock expired unnoticed before this
            self._took(owner, hold)
            if hold.auto_renew:
                runtime.watchdog.register(hold)
            if not self.quiet:
                waited = now - plan.started
                stats.record(
                    self.using,
                    self.stats_name,
                    "acquired",
                    waited,
                    outcome.contended,
                    self.name,
                    outcome.token,
                )
                if signals.lock_acquired.receivers:
                    signals.lock_acquired.send_robust(
                        type(self),
                        lock=self,
                        name=self.name,
                        token=outcome.token,
                        waited=waited,
                        contended=outcome.contended,
                    )
        else:  # re-entered: the outer hold's token and lease (never shortened) stay
            hold.count = outcome.count
            hold.attempts.append(plan.attempt)
            hold.lease = max(hold.lease, spec.lease)
            self._took(owner, hold)
        return True

    def _took(self, owner: str, hold: Hold) -> None:
        taken = self._taken.setdefault(owner, [])
        if hold in taken:
            taken.remove(hold)
        elif len(taken) > 64:  # long-lived objects: keep the live ones and the last
            taken[:] = [h for h in taken if runtime.holds.get(h.ident) is h]
        taken.append(hold)

    def _failed(self, started: float) -> bool:
        if self.quiet or not self.report_busy:
            return False
        waited = time.monotonic() - started
        stats.record(self.using, self.stats_name, "failed", waited, name=self.name)
        if signals.lock_acquire_failed.receivers:
            signals.lock_acquire_failed.send_robust(
                type(self), lock=self, name=self.name, waited=waited
            )
        return False

    def _abandon(
        self, attempt: drivers.Attempt, exc: BaseException
    ) -> tuple[BaseException | None, Resolution | None]:
        """An acquisition ended with ``exc``: cancel whatever the attempt may have left in Redis
        by its id. Returns the exception to raise instead (``None``: ``exc`` itself), and the
        clean-up to try at once (``None``: none, or Redis is not answering: the watchdog's).

        Nothing needs cleaning up when no call went out, or when the first call failed with a
        known outcome (an error reply, nothing sent). Everything else — no reply, a cancelled
        task, an interrupt, an error after an earlier call queued the attempt — leaves a
        clean-up with the watchdog, which runs it at once and until Redis answers (and this
        owner's next call on the lock runs it first).
        """
        plan = attempt.plan
        unknown = isinstance(exc, NoReply) or not isinstance(exc, Exception)
        if not attempt.sent or (not attempt.replies and not unknown):
            return None, None  # no call went out, or the only one failed knowingly
        if isinstance(exc, LockNotAcquiredError) and attempt.calls == 1:
            return None, None  # re-entry refused: the one call changed nothing
        held = self._hold(plan.owner)
        cleanup = self._leave(plan.owner, plan.attempt, "acquire", plan.void_ms)
        if not isinstance(exc, NoReply):
            return None, cleanup
        ends = None if held is not None else time.time() + plan.lease
        until = time.strftime("%H:%M:%S", time.localtime(ends)) if ends is not None else ""
        return LockOutcomeUnknown(
            f"Could not tell whether {self.kind.name} {self.name!r} was acquired: {exc} The "
            "attempt is cancelled as soon as Redis answers again (in the background, and "
            "before this owner's next call on it); "
            + (
                f"a hold it may have taken ends by {until} at the latest (nobody renews it)."
                if ends is not None
                else "the owner's earlier hold keeps the lock held meanwhile."
            ),
            name=self.name,
            action="acquire",
            attempt=plan.attempt,
            lease_ends_by=ends,
        ), None

    def _leave(self, owner: str, attempt: str, action: str, void_ms: int = 0) -> Resolution:
        """Hand the clean-up of ``attempt`` to the watchdog (which runs it until Redis answers);
        returns it, for the caller to try at once."""
        spec = self._spec()
        resolution = Resolution(
            target=spec.target,
            kind=self.kind,
            name=self.name,
            owner=owner,
            attempt=attempt,
            action=action,
            ident=self._ident(owner),
            void_ms=void_ms,
            sender=type(self),
        )
        runtime.watchdog.settle(resolution)
        return resolution

    # -- release ------------------------------------------------------------------------------
    def _release(self, owner: str, all_holds: bool) -> Release:
        """The release call; unregisters the hold from the watchdog *before* it runs (never
        renew a released lock)."""
        spec = self._spec()
        hold = self._hold(owner)
        if hold is not None and (all_holds or hold.count <= 1 or not self.kind.per_owner):
            runtime.watchdog.unregister(hold)
        attempt = hold.attempts[-1] if hold is not None and hold.attempts and not all_holds else ""
        token = hold.token if hold is not None else self._unknown_token(owner)
        script, keys, args = self.kind.release_call(
            spec.target,
            self.name,
            owner,
            attempt=attempt,
            token=token,
            all_holds=all_holds,
            lease=spec.lease,
            here="" if spec.target.quorum else runtime.token,
        )
        call = flow.Call(script, keys, args, f"release {self.kind.name} {self.name!r}")
        return Release(call, hold, owner, attempt, all_holds)

    def _unknown_token(self, owner: str) -> int | None:
        last = self._last(owner)
        return last.token if last is not None else None

    def _released(self, release: Release, reply: Any) -> None:
        dropped: DropReply = self.kind.read_release(reply)
        hold = release.hold
        self._spec().target.wake_local(dropped.handed_here)
        if dropped.left < 0:
            raise self._not_owned(
                hold,
                f"Cannot release {self.kind.name} {self.name!r}: it is not held by this owner "
                f"({release.owner}). It expired, was force-released, or was never acquired here.",
            )
        if hold is None:
            return
        left = dropped.left if self.kind.per_owner else 0
        self._dropped(hold, release, left)

    def _dropped(self, hold: Hold, release: Release, left: int) -> None:
        """Local bookkeeping of a release (done, or left to a clean-up)."""
        hold.count = left
        if release.all_holds:
            hold.attempts.clear()
        elif release.attempt in hold.attempts:
            hold.attempts.remove(release.attempt)
        if left > 0:
            return
        hold.released = True
        runtime.holds.forget(hold)
        if not self.quiet:
            held = time.monotonic() - hold.acquired_at
            stats.record(
                self.using, self.stats_name, "released", held, False, self.name, hold.token
            )
            if signals.lock_released.receivers:
                signals.lock_released.send_robust(type(self), lock=self, name=self.name, held=held)

    def _release_interrupted(self, release: Release, exc: BaseException) -> BaseException | None:
        """A release ended with ``exc``: return the exception to raise instead (``None``:
        ``exc`` itself). A known failure changed nothing: the hold is renewed again. Anything
        else may have released it: the release is finished by its attempt id in the
        background, and locally it is released now."""
        hold = release.hold
        unknown = isinstance(exc, NoReply) or not isinstance(exc, Exception)
        if not unknown:
            if hold is not None and hold.auto_renew and not hold.registered:
                runtime.watchdog.register(hold)
            return None
        attempts = (
            list(hold.attempts) if hold is not None and release.all_holds else [release.attempt]
        )
        for attempt in attempts:
            if attempt:
                self._leave(release.owner, attempt, "release")
        # A hand-off to a waiter of this process may have gone unannounced: all re-check.
        self._spec().target.waiters.wake_all()
        last = hold is None or release.all_holds or hold.count <= 1 or not self.kind.per_owner
        if hold is not None:
            self._dropped(hold, release, 0 if last else hold.count - 1)
        if not isinstance(exc, NoReply):
            return None
        lease = hold.lease if hold is not None else self._spec().lease
        ends = time.time() + lease if last else None
        return LockOutcomeUnknown(
            f"Could not tell whether {self.kind.name} {self.name!r} was released: {exc} "
            + (
                "The release is finished as soon as Redis answers again."
                if any(attempts)
                else "It was taken elsewhere, so its lease will end it."
            ),
            name=self.name,
            action="release",
            attempt=release.attempt,
            lease_ends_by=ends,
        )

    def _not_owned(self, hold: Hold | None, message: str) -> LockNotOwnedError:
        """The hold (if this process knew one) is lost: record it, and say so."""
        if hold is not None:
            runtime.holds.mark_lost(hold)
        return LockNotOwnedError(message)

    # -- renew --------------------------------------------------------------------------------
    def _renew_call(self, ms: int, mode: str) -> flow.Call:
        spec = self._spec()
        hold = self._hold()
        token = hold.token if hold is not None else 0
        script, keys, args = self.kind.renew_call(
            spec.target, self.name, self.owner, token, ms, mode
        )
        target = spec.target
        return flow.Call(
            script,
            keys,
            args,
            f"renew {self.kind.name} {self.name!r}",
            **target.wait_fields(),
        )

    def _renewed(self, ok: Any) -> None:
        if not int(ok):
            raise self._not_owned(
                self._hold(),
                f"Cannot renew {self.kind.name} {self.name!r}: it is no longer held by this "
                f"owner ({self.owner}).",
            )

    def _renew_unknown(self, exc: NoReply, action: str) -> LockOutcomeUnknown:
        return LockOutcomeUnknown(
            f"Could not tell whether {self.kind.name} {self.name!r} was renewed: {exc} The "
            "watchdog keeps renewing it while it is held.",
            name=self.name,
            action=action,
            attempt="",
            lease_ends_by=None,
        )

    def _extend_ms(self, additional_time: float) -> int:
        seconds = check_seconds(additional_time, "additional_time", minimum=MIN_LEASE)
        assert seconds is not None
        return int(seconds * 1000)

    # -- inspection ---------------------------------------------------------------------------
    def _inspect_call(self) -> flow.Call:
        spec = self._spec()
        script, keys, args = self.kind.inspect_call(spec.target, self.name, self.owner)
        return flow.Call(script, keys, args, f"inspect {self.kind.name} {self.name!r}")

    def _owned_from(self, reply: Any) -> bool:
        found: Inspection = self.kind.read_inspect(reply)
        if not found.readable:
            raise LockError(
                f"Lock {self.name!r} holds a value that is not a lock record "
                f"({found.excerpt!r}): written by something else or corrupted. Inspect it with "
                "`manage.py redislock list` and force-release it if it is stale."
            )
        return found.owned

    def detach(self) -> tuple[int, int | None]:
        """Forget this process's record of the hold, leaving the lock in Redis untouched.

        For hand-overs: a lock taken here on behalf of another process (a Celery task published
        here and run by a worker, with ``owner=`` the task id) must not be renewed by this
        process's watchdog nor kept in its table of holds. Returns ``(hold_count,
        fencing_token)`` as this process knew them (``0`` when it knew of no hold).
        """
        hold = self._hold()
        if hold is None:
            return 0, self.fencing_token
        runtime.watchdog.unregister(hold)
        runtime.holds.forget(hold)
        return hold.count, hold.token

    # -- context manager helpers --------------------------------------------------------------
    def _exit_state(self) -> str:
        """``"lost"``, ``"released"`` (explicitly, inside the block) or ``"held"``."""
        hold = self._last(self.owner)
        if hold is not None and hold.lost:
            return "lost"
        if hold is not None and hold.released and self._hold() is None:
            return "released"
        return "held"

    def _release_on_exit(self, exc: BaseException | None) -> bool:
        """Whether leaving the block must release; a lost lock raises (or logs) here."""
        state = self._exit_state()
        if state == "lost":
            self._lost_on_exit(exc)
            return False
        return state == "held"

    def _release_failed_on_exit(self, exc: BaseException | None, err: LockError) -> None:
        if isinstance(err, LockNotOwnedError):
            self._lost_on_exit(exc, err)
        elif exc is None:  # LockOutcomeUnknown too: the release is finished in the background
            raise err
        else:  # keep the block's own exception
            logger.warning("django_redislock: could not release %r", self.name, exc_info=True)

    def _lost_on_exit(self, exc: BaseException | None, cause: BaseException | None = None) -> None:
        message = lost_message(self.name, self.using)
        if exc is not None:
            logger.warning("django_redislock: %s", message)
            return
        raise LockLostError(message) from cause

    def _not_acquired(self) -> LockNotAcquiredError:
        return LockNotAcquiredError(self.name)


def lost_message(name: str, using: str | None) -> str:
    """The text of ``LockLostError``: what may have happened, the likeliest cause first.

    A lock whose key vanished under its holder was either not renewed in time, force-released,
    or deleted with its database: ``cache.clear()`` (``FLUSHDB``) on a cache that shares the
    locks' database, a ``FLUSHDB``/``FLUSHALL`` by hand, or eviction under ``maxmemory``. When
    the settings show such a shared cache (check ``W005``), the message names it.
    """
    try:
        alias = resolve_alias(using)
        shared = shared_cache_aliases(alias)
    except Exception:  # settings that cannot be read: say what is always true
        alias, shared = "", []
    cause = ""
    if shared:
        what = ["Django's default cache"] if alias in shared else []
        others = [f"CACHES[{a!r}]" for a in shared if a != alias]
        if others:
            what.append(f"the database of {', '.join(others)}")
        cause = (
            f" The locks' cache, CACHES[{alias!r}], is also {' and '.join(what)}: a "
            "cache.clear() there runs FLUSHDB, which deletes every lock. Give locks a database "
            "of their own (check django_redislock.W005)."
        )
    return (
        f"Lock {name!r} was lost while the protected block ran: its key expired unrenewed, was "
        "force-released, or was deleted with its database (cache.clear() or FLUSHDB on the "
        f"lock cache's database, or eviction by a Redis short of memory).{cause} Its work may "
        "have overlapped with another holder."
    )


class SyncFace(Face):
    """The blocking face: calls block the calling thread (each bounded by the socket timeout)."""

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        attempt = self._attempt(blocking, blocking_timeout)
        for resolution in self._pending(attempt.plan.owner):
            resolution.run()
            runtime.watchdog.settled(resolution)
        try:
            return self._finish(attempt, drivers.drive(self._flow(attempt), attempt))
        except BaseException as exc:
            instead, cleanup = self._abandon(attempt, exc)
            if cleanup is not None:
                with contextlib.suppress(Exception):  # not done: the watchdog goes on with it
                    cleanup.run()
                    runtime.watchdog.settled(cleanup)
            if instead is None:
                raise
            raise instead from exc

    def _release_now(self, all_holds: bool, owner: str) -> None:
        for resolution in self._pending(owner):
            resolution.run()
            runtime.watchdog.settled(resolution)
        release = self._release(owner, all_holds)
        try:
            reply = drivers.run_call(self._spec().target, release.call)
        except BaseException as exc:
            instead = self._release_interrupted(release, exc)
            if instead is None:
                raise
            raise instead from exc
        self._released(release, reply)

    def release(self) -> None:
        """Drop this owner's hold; the last one frees the lock (hands it to the next waiter).

        Raises :class:`LockNotOwnedError` (and changes nothing in Redis) when this owner does
        not hold it — never held, already released, expired, or force-released.
        """
        self._release_now(False, self.owner)

    def _call(self, call: flow.Call, action: str) -> Any:
        try:
            return drivers.run_call(self._spec().target, call)
        except NoReply as exc:
            raise self._renew_unknown(exc, action) from exc

    def renew(self) -> None:
        """Reset the lease to ``timeout``; :class:`LockNotOwnedError` if no longer held."""
        self._renewed(self._call(self._renew_call(int(self._spec().lease * 1000), "set"), "renew"))

    def extend(self, additional_time: float) -> None:
        """Add ``additional_time`` seconds to the remaining lease (as redis-py's ``extend``);
        owner-checked like :meth:`renew`, which instead resets the lease to ``timeout``."""
        call = self._renew_call(self._extend_ms(additional_time), "add")
        self._renewed(self._call(call, "extend"))

    def locked(self) -> bool:
        """Held by anyone (one round trip)."""
        return self.kind.read_inspect(self._call(self._inspect_call(), "inspect")).held  # type: ignore[no-any-return]

    def owned(self) -> bool:
        """Held by this owner; :class:`LockError` if the stored value is not a lock record."""
        return self._owned_from(self._call(self._inspect_call(), "inspect"))

    def __enter__(self) -> Any:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._release_on_exit(exc_info[1]):
            try:
                self.release()
            except (LockNotOwnedError, LockBackendError) as err:
                self._release_failed_on_exit(exc_info[1], err)


class AsyncFace(Face):
    """The asyncio face: the same calls, awaited; waiters sleep on futures of their loop."""

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return asyncio.get_running_loop()

    def _default_owner(self) -> str:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        return runtime.task_owner(task)

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait."""
        attempt = self._attempt(blocking, blocking_timeout)
        for resolution in self._pending(attempt.plan.owner):
            await resolution.arun()
            runtime.watchdog.settled(resolution)
        try:
            return self._finish(attempt, await drivers.adrive(self._flow(attempt), attempt))
        except BaseException as exc:
            instead, cleanup = self._abandon(attempt, exc)
            if cleanup is not None:
                with contextlib.suppress(Exception):  # not done: the watchdog goes on with it
                    await cleanup.arun()
                    runtime.watchdog.settled(cleanup)
            if instead is None:
                raise
            raise instead from exc

    async def _release_now(self, all_holds: bool, owner: str) -> None:
        for resolution in self._pending(owner):
            await resolution.arun()
            runtime.watchdog.settled(resolution)
        release = self._release(owner, all_holds)
        try:
            reply = await drivers.arun_call(self._spec().target, release.call)
        except BaseException as exc:
            # A cancelled release is finished by its attempt id in the background.
            instead = self._release_interrupted(release, exc)
            if instead is None:
                raise
            raise instead from exc
        self._released(release, reply)

    async def release(self) -> None:
        """Drop this owner's hold; the last one frees the lock. A task cancelled while
        releasing still releases (finished in the background by the attempt's id)."""
        await self._release_now(False, self.owner)

    async def _call(self, call: flow.Call, action: str) -> Any:
        try:
            return await drivers.arun_call(self._spec().target, call)
        except NoReply as exc:
            raise self._renew_unknown(exc, action) from exc

    async def renew(self) -> None:
        """Reset the lease to ``timeout``; :class:`LockNotOwnedError` if no longer held."""
        call = self._renew_call(int(self._spec().lease * 1000), "set")
        self._renewed(await self._call(call, "renew"))

    async def extend(self, additional_time: float) -> None:
        """Add ``additional_time`` seconds to the remaining lease (owner-checked)."""
        call = self._renew_call(self._extend_ms(additional_time), "add")
        self._renewed(await self._call(call, "extend"))

    async def locked(self) -> bool:
        """Held by anyone (one round trip)."""
        reply = await self._call(self._inspect_call(), "inspect")
        return self.kind.read_inspect(reply).held  # type: ignore[no-any-return]

    async def owned(self) -> bool:
        """Held by this owner (this task, by default)."""
        return self._owned_from(await self._call(self._inspect_call(), "inspect"))

    async def __aenter__(self) -> Any:
        if not await self.acquire():
            raise self._not_acquired()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._release_on_exit(exc_info[1]):
            try:
                await self.release()
            except (LockNotOwnedError, LockBackendError) as err:
                self._release_failed_on_exit(exc_info[1], err)
