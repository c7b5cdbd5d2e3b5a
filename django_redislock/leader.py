"""Leader leases: one leader across hosts, and leadership *proven* before each action.

A :class:`LeaderLease` is a :class:`~django_redislock.Lock` used as a lease by a long-running
process (a Celery beat, ``manage.py redislock run``): the process that holds it is the leader,
the others stand by in the lock's queue and take over when the lease is released or expires.

Holding a lock is not enough to act safely: the process may have been paused, the lock may have
expired or been force-released, Redis may be unreachable. So a leader *proves* its leadership with
:meth:`LeaderLease.prove` right before every action that must not be done twice: one ``renew()``
round trip, an owner-checked script that both confirms the lease is still ours and resets it to the
full ``timeout``. The lease then cannot pass to another process for ``timeout`` seconds after the
proof started, so an action that starts right after a proof (and ends well within ``timeout``) can
never overlap another leader's.

It is fail-closed: :attr:`LeaderLease.is_leader` is true only while

- this process acquired the lease and did not step down or release it,
- nothing reported it lost (a failed renewal by the watchdog, :meth:`prove` or a release), and
- the last successful proof *started* less than ``timeout`` ago by this process's monotonic clock.

The last rule covers an unreachable Redis: the watchdog keeps retrying a renewal that fails with a
connection error (it only declares a lock lost when Redis says so), but a leader that cannot prove
its lease for ``timeout`` seconds must assume another process has it by now.

:class:`LeaderElection` is the face for services (issue 31): ``with election.lead() as term:``
runs its body while this process leads, proving the lease every ``timeout / 3`` in a thread of
its own; ``term.token`` is the term's fencing token (greater for every new term) and
``term.lost`` an event that is set once leadership may have passed — and that reads as set, by
the monotonic clock, as soon as the last proof is older than ``timeout``, so a leader paused
longer than that (a GC pause, ``SIGSTOP``, a suspended VM) finds it set before it can act.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django_redislock import signals
from django_redislock.conf import check_seconds
from django_redislock.exceptions import LockBackendError, LockNotAcquiredError, LockNotOwnedError
from django_redislock.lock import Lock
from django_redislock.runtime import runtime

__all__ = ["LeaderElection", "LeaderLease", "Term"]

logger = logging.getLogger("django_redislock")

#: ``blocking_timeout`` meaning "wait for ever", whatever ``REDISLOCK["BLOCKING_TIMEOUT"]`` says.
FOREVER = 1e9


class LeaderLease:
    """A lease held by at most one process across hosts; see the module docstring.

    ``LeaderLease(name, *, timeout=None, using=None)``: ``timeout`` is the lease in seconds
    (``None``: ``REDISLOCK["TIMEOUT"]``); the watchdog renews it every ``timeout / 3`` while it is
    held, and a proof resets it too. Every lease object has an owner id of its own, so two leases of
    one name in one process exclude each other like two processes do.
    """

    def __init__(
        self, name: str, *, timeout: float | None = None, using: str | None = None
    ) -> None:
        self.lock = Lock(
            name,
            timeout=timeout,
            using=using,
            owner=f"{runtime.token}-leader-{uuid.uuid4().hex[:8]}",
            auto_renew=True,
            reentrant=True,
            # A standby's tries that find the lease held are standing by, not failures: they
            # are not counted as failed acquisitions (a takeover counts as an acquisition).
            report_busy=False,
        )
        self.name = name
        self.using = using
        self._held = False
        self._valid_until = float("-inf")
        self._proved_at = float("-inf")
        self._lost = threading.Event()
        self._on_lost: list[Callable[[], None]] = []
        # Weakly connected (a bound method): a lease that is garbage collected disconnects itself.
        signals.lock_lost.connect(self._lock_lost)

    def __repr__(self) -> str:
        state = "leader" if self.is_leader else "not leader"
        return f"<LeaderLease {self.name!r} {state}>"

    # -- state -------------------------------------------------------------------------------------
    @property
    def timeout(self) -> float:
        """The lease in seconds."""
        return self.lock.timeout

    @property
    def is_leader(self) -> bool:
        """Held, not reported lost, and proven less than ``timeout`` ago (fail-closed)."""
        return self._held and not self._lost.is_set() and time.monotonic() < self._valid_until

    @property
    def lost(self) -> bool:
        """The lease was found gone (expired or force-released) while this process held it."""
        return self._lost.is_set()

    @property
    def fencing_token(self) -> int | None:
        """Fencing token of the current (or last) tenure: strictly greater for each new leader."""
        return self.lock.fencing_token

    def remaining(self) -> float:
        """Seconds until the lease may pass to someone else, by the last proof (0 when unknown)."""
        return max(0.0, self._valid_until - time.monotonic()) if self._held else 0.0

    def proof_age(self) -> float:
        """Seconds since the last successful proof started (``inf`` when never proven)."""
        return time.monotonic() - self._proved_at

    def valid_until(self) -> float:
        """``time.monotonic()`` value at which the proven lease runs out."""
        return self._valid_until

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the lease is found lost.

        It runs in the thread that noticed (usually the watchdog thread): keep it cheap, e.g.
        ``threading.Event.set``.
        """
        self._on_lost.append(callback)

    # -- transitions -------------------------------------------------------------------------------
    def acquire(self, wait: float = 0.0) -> bool:
        """Become the leader: ``False`` when another process kept the lease for ``wait`` seconds.

        ``wait=0`` tries once. A waiting process sleeps in the lock's queue and is woken by the
        leader's release, or when the leader's lease runs out. A successful acquisition is proven
        at once (one more round trip), so :attr:`is_leader` counts from a known point in time.
        Raises :class:`~django_redislock.LockBackendError` when Redis is unreachable.
        """
        if wait > 0:
            acquired = self.lock.acquire(blocking=True, blocking_timeout=min(wait, FOREVER))
        else:
            acquired = self.lock.acquire(blocking=False)
        if not acquired:
            return False
        self._held = True
        self._lost.clear()
        try:
            self.prove()
        except BaseException:
            self.step_down()
            raise
        return True

    def prove(self) -> None:
        """Prove and extend the lease with one owner-checked renewal round trip.

        Raises :class:`~django_redislock.LockNotOwnedError` (and marks the lease lost) when it is
        no longer ours, :class:`~django_redislock.LockBackendError` when Redis cannot tell; in both
        cases the caller must not act as the leader. On success the lease is valid for
        ``timeout`` seconds from the moment this call started.
        """
        started = time.monotonic()
        try:
            self.lock.renew()
        except LockNotOwnedError:
            self._mark_lost()
            raise
        self._proved_at = started
        self._valid_until = started + self.timeout

    def step_down(self) -> None:
        """Stop being the leader here without a word to Redis (which may be unreachable).

        The watchdog stops renewing the lease, so it expires within ``timeout`` unless it is
        acquired again first (a later :meth:`acquire` re-enters our own still-valid lease).
        """
        self._held = False
        self._valid_until = float("-inf")
        self.lock.detach()

    def release(self) -> bool:
        """Give the lease up so that a standby takes over at once; whether we still held it.

        Raises :class:`~django_redislock.LockBackendError` when Redis is unreachable (the lease
        then expires within ``timeout``).
        """
        self._held = False
        self._valid_until = float("-inf")
        try:
            self.lock.release(all_holds=True)
        except LockNotOwnedError:
            return False
        return True

    # -- loss --------------------------------------------------------------------------------------
    def _lock_lost(self, sender: Any = None, *, lock: Any = None, **kwargs: Any) -> None:
        if lock is self.lock:
            self._mark_lost()

    def _mark_lost(self) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        self._held = False
        self._valid_until = float("-inf")
        for callback in list(self._on_lost):
            try:
                callback()
            except Exception:  # the loss itself matters more than a failing callback
                logger.exception("django_redislock: a lost-lease callback of %r failed", self.name)


# -- elections -------------------------------------------------------------------------------------


class _Lost(threading.Event):
    """``Term.lost``: set when leadership is known lost, and *reads* as set once the lease's
    last proof is older than its timeout (fail-closed, whatever the thread that would set it
    is doing: after a pause, the first look already says so)."""

    def __init__(self, lease: LeaderLease) -> None:
        super().__init__()
        self._lease = lease
        self._ended = False

    def is_set(self) -> bool:
        if super().is_set():
            return True
        return not self._ended and time.monotonic() >= self._lease.valid_until()

    isSet = is_set

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            left = self._lease.valid_until() - now
            if deadline is not None:
                left = min(left, deadline - now)
                if left <= 0:
                    return False
            super().wait(max(0.001, left))
        return True


@dataclass
class Term:
    """One term of leadership: what the body of :meth:`LeaderElection.lead` gets."""

    #: Fencing token of the term: greater than every earlier term's.
    token: int
    #: Set when leadership is lost (see :class:`LeaderElection`); check it before each action.
    lost: threading.Event
    #: ``time.monotonic()`` when the term began.
    started: float = field(default_factory=time.monotonic)


class LeaderElection:
    """One leader across processes and hosts: ``with election.lead() as term: ...``.

    ``LeaderElection(name, *, timeout=None, using=None)``: ``timeout`` is the lease (default
    ``REDISLOCK["TIMEOUT"]``), proven every ``timeout / 3`` while leading. A process waiting in
    :meth:`lead` stands by in the lease's queue and is woken when the leader steps down or its
    lease runs out. ``on_elected(fn)`` / ``on_lost(fn)`` register callbacks (``fn(term)``),
    called in the thread that noticed; :meth:`is_leader` is fail-closed like
    :attr:`LeaderLease.is_leader`.
    """

    def __init__(
        self, name: str, *, timeout: float | None = None, using: str | None = None
    ) -> None:
        self.name = name
        self.lease = LeaderLease(name, timeout=timeout, using=using)
        self._on_elected: list[Callable[[Term], None]] = []
        self._on_lost: list[Callable[[Term], None]] = []
        self._term: Term | None = None
        self._stop = threading.Event()
        self.lease.on_lost(self._lease_lost)

    def __repr__(self) -> str:
        return f"<LeaderElection {self.name!r} {'leader' if self.is_leader() else 'not leader'}>"

    def is_leader(self) -> bool:
        """Leading, with a lease proven less than ``timeout`` ago."""
        return self._term is not None and self.lease.is_leader

    @property
    def term(self) -> Term | None:
        """The current term (``None`` when not leading)."""
        return self._term

    # -- step by step: for loops that prove the lease themselves (the beat, redislock run) ------
    def elect(self, wait: float = 0.0) -> Term | None:
        """Become the leader within ``wait`` seconds (0: one try); the new :class:`Term`, else
        ``None``. Nothing proves the lease afterwards but :meth:`prove` (and the watchdog's
        renewals): :meth:`lead` is this plus a thread that proves it. Raises
        :class:`~django_redislock.LockBackendError` when Redis is unreachable."""
        if self._term is not None:
            if self.lease.is_leader:
                return self._term
            self.abandon()  # a term that can no longer be shown ends before a new one
        if not self.lease.acquire(wait):
            return None
        term = Term(token=self.lease.fencing_token or 0, lost=_Lost(self.lease))
        self._term = term
        self._notify(self._on_elected, term)
        return term

    def prove(self) -> None:
        """Prove the lease now (one owner-checked renewal); see :meth:`LeaderLease.prove`. A
        lease found gone ends the term as lost (``on_lost`` runs) and raises
        :class:`~django_redislock.LockNotOwnedError`."""
        self.lease.prove()

    def resign(self) -> bool:
        """End the term by choice and release the lease, so that a standby takes over at once;
        whether the lease was still ours. When Redis cannot be reached the lease is left to
        expire (within ``timeout``) and :class:`~django_redislock.LockBackendError` is raised."""
        term, self._term = self._term, None
        lost = term is not None and term.lost.is_set()
        if term is not None:
            term.lost._ended = True  # type: ignore[attr-defined]
        if lost:
            self.lease.step_down()
            return False
        try:
            return self.lease.release()
        except LockBackendError:
            self.lease.step_down()
            raise

    def abandon(self) -> None:
        """End the term because leadership can no longer be shown (the lease is lost, or could
        not be proven for ``timeout``): ``on_lost`` runs if it has not, and nothing is sent to
        Redis (it may be unreachable); the lease expires by itself."""
        term, self._term = self._term, None
        if term is not None:
            self._lose(term)
            term.lost._ended = True  # type: ignore[attr-defined]
        self.lease.step_down()

    def on_elected(self, callback: Callable[[Term], None]) -> Callable[[Term], None]:
        """Call ``callback(term)`` when this process becomes the leader (usable as decorator)."""
        self._on_elected.append(callback)
        return callback

    def on_lost(self, callback: Callable[[Term], None]) -> Callable[[Term], None]:
        """Call ``callback(term)`` when leadership is found lost (not when the body ends)."""
        self._on_lost.append(callback)
        return callback

    @contextlib.contextmanager
    def lead(self, blocking: bool = True, blocking_timeout: float | None = None) -> Iterator[Term]:
        """Lead for the body of the ``with``: wait to be elected (``blocking``, at most
        ``blocking_timeout`` seconds; ``None``: for ever), else :class:`LockNotAcquiredError`.
        Leaving the body steps down (a standby takes over at once)."""
        wait = check_seconds(blocking_timeout, "blocking_timeout", allow_none=True)
        if not blocking:
            wait = 0.0
        elif wait is None:
            wait = FOREVER
        if self._term is not None:
            raise RuntimeError(f"{self!r} is already leading: terms do not nest")
        term = self.elect(wait)
        if term is None:
            raise LockNotAcquiredError(
                self.name, f"Another process leads {self.name!r}: not elected in time."
            )
        self._stop.clear()
        keeper = threading.Thread(
            target=self._keep, args=(term,), name=f"redislock-leader-{self.name}", daemon=True
        )
        keeper.start()
        try:
            yield term
        finally:
            self._stop.set()
            keeper.join(self.lease.timeout)
            with contextlib.suppress(LockBackendError):  # the lease expires by itself
                self.resign()

    def _keep(self, term: Term) -> None:
        """Prove the lease every ``timeout / 3`` until the term ends or is lost."""
        interval = self.lease.timeout / 3
        while not self._stop.wait(interval):
            try:
                self.lease.prove()
            except LockNotOwnedError:
                return  # marked lost: _lease_lost has run
            except LockBackendError:
                interval = min(interval, 0.5)  # Redis unreachable: try again soon
                if not self.lease.is_leader:  # the proof is too old: assume someone else leads
                    self._lose(term)
                    return
                continue
            interval = self.lease.timeout / 3

    def _lease_lost(self) -> None:
        term = self._term
        if term is not None:
            self._lose(term)

    def _lose(self, term: Term) -> None:
        if threading.Event.is_set(term.lost):
            return
        term.lost.set()
        self._notify(self._on_lost, term)

    def _notify(self, callbacks: list[Callable[[Term], None]], term: Term) -> None:
        for callback in list(callbacks):
            try:
                callback(term)
            except Exception:
                logger.exception("django_redislock: a callback of %r failed", self)
