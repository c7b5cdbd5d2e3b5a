"""The lock engine shared by every face: where a lock lives, how acquiring proceeds, and what a
result means — written once, without I/O.

``Lock`` (sync) and ``AsyncLock`` (asyncio) are thin *faces* over :class:`LockBase`: the base
validates arguments, builds script arguments, keeps the hold table and the watchdog up to date and
sends the signals; a face only performs the I/O. The multi-step acquisition is a generator
(:meth:`LockBase._acquire_flow`) that *yields* operations (:class:`Call`, :class:`Wait`,
:class:`Sleep`, :class:`Subscribe`) and receives their results; :func:`drive` runs it with blocking
calls, :func:`adrive` with ``await``. So queueing, claiming, deadlines, retries and clean-up on
interruption exist once, whichever face waits. Most acquisitions take a free lock with their first
call, so the drivers make that call themselves (:meth:`LockBase._begin` prepares its arguments,
:func:`run` / :func:`arun` send it, :meth:`LockBase._won` records a success) and create the flow,
with the call's outcome, only when it did not: the uncontended path builds no operation object
and runs no generator.

How a contended acquisition works (the README has the long version): the acquire script queues the
waiter in Redis (FIFO) and returns the holder's remaining lease; the waiter sleeps, holding no
connection, until the release script hands the lock to it (reserved for a short claim window, see
:data:`CLAIM_WINDOW`) and its process's wake-up listener (:mod:`django_redislock.wakeups`) wakes
it; it then claims the lock with the acquire script, which sets the full lease. It also re-checks
when the holder's lease would end, so a lost message costs at most that lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar

from redis import exceptions as redis_errors

from django_redislock import client as redis_client
from django_redislock import connection, holds, scripts, signals, stats, wakeups
from django_redislock.conf import MIN_LEASE, LockSettings, check_seconds, get_settings
from django_redislock.exceptions import (
    LockBackendError,
    LockError,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
)
from django_redislock.holds import Hold
from django_redislock.keys import KeySpace, keyspace
from django_redislock.naming import stats_shape
from django_redislock.watchdog import watchdog

__all__ = [
    "CLAIM_WINDOW",
    "Call",
    "LockBase",
    "Target",
    "adrive",
    "drive",
    "target_for",
]

logger = logging.getLogger("django_redislock")

#: Seconds a handed-off lock stays reserved for the woken waiter until it claims it (the full
#: lease starts at the claim). A waiter that died in the queue therefore costs at most this long
#: — usually nothing: on a single Redis a dead waiter's process no longer listens and is skipped.
CLAIM_WINDOW = 2.0
#: Extra validity of a waiter's queue entry beyond its next planned re-check.
ENTRY_MARGIN = 2.0
#: Longest name accepted: a longer one is almost surely data, not a name (hash it).
MAX_NAME_LENGTH = 4096
#: Seconds a waiter keeps retrying a command that found the connection pool exhausted.
POOL_RETRY_BUDGET = 10.0


def check_name(name: object, what: str = "Lock name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are accepted "
            "(hash long variable parts into the name)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} {name!r} cannot be encoded as UTF-8") from exc
    return name


def check_owner(owner: object) -> str | None:
    if owner is None:
        return None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str or None, not {type(owner).__name__}")
    if not owner or "\n" in owner or len(owner) > MAX_NAME_LENGTH:
        raise ValueError("owner must be a non-empty string without newlines")
    return owner


def check_bool(value: object, what: str, *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, not {value!r}")
    return value


def _flag(value: object, what: str) -> bool:
    """:func:`check_bool` of a required flag, with its usual values let through first."""
    if value is True or value is False:
        return value
    return bool(check_bool(value, what))


# -- where a lock lives ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The Redis server of one ``CACHES`` alias as the engine uses it."""

    alias: str
    settings: LockSettings
    client: Any
    keys: KeySpace
    #: ``<ns>:wake:``; a waiter's process listens on this prefix + its process token.
    channel_prefix: str
    #: "1" when ``PUBLISH`` counts every subscriber (a single Redis, not a Cluster).
    trust_publish: str
    socket_timeout: float | None
    #: Replicas that must acknowledge an acquisition or renewal (``WAIT``), and for how long.
    replicas: int = 0
    replicas_timeout_ms: int = 0
    #: Independent masters (``REDISLOCK["CACHE"]`` as a list): locks need a majority of them
    #: (Redlock, :mod:`django_redislock.redlock`). Empty for a single Redis/Cluster/Sentinel.
    masters: tuple[Any, ...] = ()
    #: What scripts run through: ``client``, or :class:`connection.DirectCommands` in front of it.
    runner: Any = None

    def listener(self) -> Any:
        if self.masters:
            return wakeups.ListenerGroup(
                [
                    wakeups.listener_for(m, self.channel_prefix, self.socket_timeout)
                    for m in self.masters
                ]
            )
        return wakeups.listener_for(self.client, self.channel_prefix, self.socket_timeout)


_targets: dict[str, Target] = {}
_targets_mutex = threading.Lock()


def target_for(using: str | None) -> Target:
    """The :class:`Target` of an alias (``None``: ``REDISLOCK["CACHE"]``), cached per settings."""
    settings = get_settings()
    alias = connection.resolve_alias(using)
    quorum = using is None and not settings.client and len(settings.caches) > 1
    if quorum:
        alias = "redlock:" + ",".join(settings.caches)
    target = _targets.get(alias)
    if target is None or target.settings is not settings:
        masters = tuple(connection.get_client(a) for a in settings.caches) if quorum else ()
        client = masters[0] if quorum else connection.get_client(alias)
        keys = keyspace(settings.caches[0] if quorum else alias)
        target = Target(
            alias=alias,
            settings=settings,
            client=client,
            keys=keys,
            channel_prefix=f"{keys.namespace}:wake:",
            trust_publish="0" if connection.is_cluster(client) else "1",
            socket_timeout=connection.socket_timeout(client),
            replicas=settings.replicas,
            replicas_timeout_ms=_wait_ms(
                settings.replicas_timeout, connection.socket_timeout(client)
            ),
            masters=masters,
            runner=connection.command_runner(client),
        )
        with _targets_mutex:
            _targets[alias] = target
    return target


def _wait_ms(replicas_timeout: float, socket_timeout: float | None) -> int:
    """``WAIT``'s timeout, kept below the socket timeout: a ``WAIT`` that outlasts the socket
    would read as an outage instead of as "not acknowledged"."""
    if socket_timeout is not None:
        replicas_timeout = min(replicas_timeout, max(0.001, socket_timeout * 0.8))
    return max(1, int(replicas_timeout * 1000))


def _forget_targets() -> None:
    with _targets_mutex:
        _targets.clear()
    _specs.clear()  # their targets hold the parent's runners


holds.on_fork(_forget_targets)


# -- operations a flow yields ----------------------------------------------------------------------


class Op:
    """Something a flow needs done; the face's driver does it (``sync`` or ``async_``)."""

    __slots__ = ()

    def sync(self, face: LockBase) -> Any:
        raise NotImplementedError

    async def async_(self, face: LockBase) -> Any:
        raise NotImplementedError


class NotReplicated(LockBackendError):
    """A write was not acknowledged by ``REDISLOCK["REPLICAS"]`` replicas in time; ``reply`` is
    what the script answered (the flow undoes an acquisition it reports)."""

    def __init__(self, action: str, reply: Any, acked: int, needed: int, timeout_ms: int) -> None:
        super().__init__(
            f"Redis did not replicate the write while trying to {action}: {acked} of the "
            f"{needed} replicas REDISLOCK['REPLICAS'] asks for acknowledged it within "
            f"{timeout_ms} ms. A failover now could lose it, so it does not count."
        )
        self.reply = reply


@dataclass(slots=True)
class Call(Op):
    """Run a script (one round trip; with ``REPLICAS``, followed by ``WAIT`` in the same)."""

    script: scripts.Script
    keys: list[str]
    args: list[Any]
    action: str
    #: Clean-up after an interruption: an async driver shields it from a second cancellation.
    shield: bool = False
    #: Replicas to wait for (0: none) and how long, in ms.
    replicas: int = 0
    replicas_timeout_ms: int = 0
    #: Applied to the script's reply before anything else looks at it (a release wakes a waiter
    #: of this process it handed the lock to: :func:`_woken_here`).
    after: Callable[[Any], Any] | None = None
    #: Where it runs, when the builder knew it (``None``: the face's current target).
    target: Target | None = None

    def _checked(self, reply: Any, acked: int) -> Any:
        if acked < self.replicas:
            raise NotReplicated(self.action, reply, acked, self.replicas, self.replicas_timeout_ms)
        return reply

    def sync(self, face: LockBase) -> Any:
        target = self.target or face._spec().target
        if not self.replicas:  # every lock operation's path
            reply = run(target, self.script, self.keys, self.args, self.action)
            return reply if self.after is None else self.after(reply)
        try:
            return self._waited(target)
        except LockBackendError as exc:
            if _transient(exc) != "pool":
                raise
        return _when_pool_frees(lambda: self._waited(target))

    def _waited(self, target: Target) -> Any:
        """The script, then ``WAIT`` for the replicas (``REDISLOCK["REPLICAS"]``)."""
        try:
            reply, acked = scripts.call_and_wait(
                self.script,
                target.client,
                self.keys,
                self.args,
                self.replicas,
                self.replicas_timeout_ms,
            )
        except redis_errors.RedisError as exc:
            raise connection.backend_error(exc, self.action) from exc
        return self._checked(reply if self.after is None else self.after(reply), acked)

    async def async_(self, face: LockBase) -> Any:
        if self.replicas:  # WAIT blocks: in a thread, through the sync client's connection
            return await asyncio.to_thread(self.sync, face)
        reply = await arun(face, self.script, self.keys, self.args, self.action)
        return reply if self.after is None else self.after(reply)


def run(
    target: Target, script: scripts.Script, keys: list[str], args: list[Any], action: str
) -> Any:
    """One script call where ``target`` lives, without ``WAIT``: what every :class:`Call`
    without replicas does, and what :func:`drive` does for an acquisition's first call without
    building one. Redis errors become :class:`LockBackendError` (``action`` says what failed).

    A sync pool that ran out of connections (threads beyond ``max_connections``) frees one
    within moments: it is waited for rather than reported (async pools block by themselves).
    The script did not run then — no connection was had — so sending it again is safe.
    """
    try:
        return script(target.runner, keys, args)
    except redis_errors.RedisError as exc:
        if not connection.is_pool_exhausted(exc):
            raise connection.backend_error(exc, action) from exc
    return _when_pool_frees(lambda: _run_once(target, script, keys, args, action))


def _run_once(
    target: Target, script: scripts.Script, keys: list[str], args: list[Any], action: str
) -> Any:
    try:
        return script(target.runner, keys, args)
    except redis_errors.RedisError as exc:
        raise connection.backend_error(exc, action) from exc


def _when_pool_frees(again: Callable[[], Any]) -> Any:
    """``again()`` after growing pauses while it finds the pool exhausted (at most
    :data:`POOL_RETRY_BUDGET` seconds)."""
    give_up = time.monotonic() + POOL_RETRY_BUDGET
    pause = 0.001
    while True:
        time.sleep(pause)
        try:
            return again()
        except LockBackendError as exc:
            if _transient(exc) != "pool" or time.monotonic() + pause > give_up:
                raise
        pause = min(pause * 2, 0.05)


async def arun(
    face: LockBase, script: scripts.Script, keys: list[str], args: list[Any], action: str
) -> Any:
    """:func:`run` for the asyncio face (through :meth:`LockBase._arunner`)."""
    try:  # not backend_errors(): a context manager costs a microsecond per call
        return await script.acall(await face._arunner(), keys, args)
    except redis_errors.RedisError as exc:
        raise connection.backend_error(exc, action) from exc


@dataclass
class Wait(Op):
    """Sleep until handed the lock or until ``until`` (monotonic), holding no connection."""

    waiter: wakeups.Waiter
    until: float

    def sync(self, face: LockBase) -> None:
        self.waiter.wait(self.until)

    async def async_(self, face: LockBase) -> None:
        await self.waiter.await_(self.until)


@dataclass
class Sleep(Op):
    seconds: float

    def sync(self, face: LockBase) -> None:
        time.sleep(self.seconds)

    async def async_(self, face: LockBase) -> None:
        await asyncio.sleep(self.seconds)


@dataclass
class Subscribe(Op):
    """Make sure this process listens for hand-offs before it queues (bounded wait)."""

    listener: wakeups.Listener
    timeout: float

    def sync(self, face: LockBase) -> bool:
        return self.listener.ensure(self.timeout)

    async def async_(self, face: LockBase) -> bool:
        return await asyncio.to_thread(self.listener.ensure, self.timeout)


@dataclass
class Read(Op):
    """A read of one lock key through :mod:`django_redislock.client` (sync and async reader)."""

    key: str
    read: Callable[[Any, str], Any]
    aread: Callable[[Any, str], Awaitable[Any]]

    def sync(self, face: LockBase) -> Any:
        with connection.backend_errors(f"inspect lock {face.name!r}"):
            return self.read(face._target().client, self.key)

    async def async_(self, face: LockBase) -> Any:
        with connection.backend_errors(f"inspect lock {face.name!r}"):
            return await self.aread(await face._aclient(), self.key)


Flow = Generator[Op, Any, Any]
#: What an operation came to: ``(reply, None)`` or ``(None, error)``.
Outcome = tuple[Any, BaseException | None]


class QuorumHooks:
    """How locks on independent masters run (filled in by :mod:`django_redislock.redlock`,
    which depends on this module, not the other way round)."""

    acquire_flow: Any = None  # (face, blocking, blocking_timeout) -> Flow
    op: Any = None  # (face, call) -> Op running ``call`` on every master, combined
    renewer: Any = None  # (masters) -> a client-like object the watchdog renews through


quorum = QuorumHooks()


@dataclass(slots=True)
class _Stepper:
    """Advances a flow by one operation's outcome; shared by both drivers."""

    flow: Flow
    op: Any = None  # the operation the flow waits for
    value: Any = None
    done: bool = False

    @classmethod
    def of(cls, flow: Flow) -> _Stepper:
        stepper = cls(flow)
        stepper.step()
        return stepper

    def step(self, reply: Any = None, error: BaseException | None = None) -> None:
        try:
            self.op = self.flow.send(reply) if error is None else self.flow.throw(error)
        except StopIteration as stop:
            self.done, self.value = True, stop.value


def drive(face: LockBase, work: Flow | Attempt) -> Any:
    """Run a flow with blocking I/O — or an acquisition, whose first call it makes itself
    (see :meth:`LockBase._begin`): one that takes the lock with it builds no operation and runs
    no generator."""
    if isinstance(work, Attempt):
        first = _first(face, work) if work.args is not None else None
        flow = face._after_first(work, first)
        if flow is None:
            return True
    else:
        flow = work
    stepper = _Stepper.of(flow)
    while not stepper.done:
        try:
            reply = stepper.op.sync(face)
        except BaseException as exc:
            stepper.step(error=exc)
        else:
            stepper.step(reply)
    return stepper.value


async def adrive(face: LockBase, work: Flow | Attempt) -> Any:
    """Run a flow with ``await``: the same steps as :func:`drive`."""
    if isinstance(work, Attempt):
        flow = face._after_first(work, await _afirst(face, work) if work.args else None)
    else:
        flow = work
    if flow is None:
        return True
    stepper = _Stepper.of(flow)
    while not stepper.done:
        op = stepper.op.async_(face)
        try:
            reply = await (asyncio.shield(op) if getattr(stepper.op, "shield", False) else op)
        except BaseException as exc:
            stepper.step(error=exc)
        else:
            stepper.step(reply)
    return stepper.value


def _first(face: LockBase, attempt: Attempt) -> Any:
    """An acquisition's first call, made by :func:`drive`: its reply, or the error it raised."""
    spec, args = attempt.spec, attempt.args
    assert args is not None
    try:
        return run(spec.target, face._acquire_script, spec.script_keys, args, spec.acquire_action)
    except LockBackendError as exc:
        return exc


async def _afirst(face: LockBase, attempt: Attempt) -> Any:
    """:func:`_first` for :func:`adrive`."""
    spec, args = attempt.spec, attempt.args or []
    try:
        return await arun(face, face._acquire_script, spec.script_keys, args, spec.acquire_action)
    except LockBackendError as exc:
        return exc


def _transient(exc: LockBackendError) -> str | None:
    """``"pool"``, ``"connection"`` or ``None`` (a real outage or an error reply)."""
    cause = exc.__cause__
    if connection.is_pool_exhausted(cause):
        return "pool"
    if isinstance(cause, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        return "connection"
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- the shared face -------------------------------------------------------------------------------


@dataclass
class _Spec:
    """A lock's resolved keys and arguments under one settings object (the hot path builds none)."""

    target: Target
    lock_key: str  # the key holding the lock (a semaphore's permit set)
    script_keys: list[str]  # the KEYS of acquire/release/cancel
    lease: float
    lease_ms: int
    claim_ms: int
    ident: tuple[str, str]  # (alias, lock key); + owner = the hold table key
    #: The ARGV every script that may hand off ends with: channel prefix, trust, claim ms.
    wake_args: tuple[str, str, int]
    #: What a failed acquire / release was doing, for error messages (built once, not per call).
    acquire_action: str
    release_action: str


#: Specs of the names used lately, shared by their lock objects: code that builds
#: ``Lock(f"order:{pk}")`` per call would otherwise format the same keys every time. Bounded
#: (emptied when full); an entry is valid while its target's settings object is the current one.
_specs: dict[tuple[Any, ...], _Spec] = {}
SPEC_CACHE_SIZE = 4096


@dataclass(slots=True)
class Attempt:
    """An acquisition between its set-up and its first call (see :meth:`LockBase._begin`)."""

    spec: _Spec
    owner: str
    meta: str
    started: float
    deadline: float  # monotonic; inf: wait for ever
    listener: Any  # None: a non-blocking attempt (never queues)
    #: Whether attempts pass the waiter id (queue when busy): once hand-offs can reach us.
    queued: bool
    waiter_id: str  # "" until needed
    #: ``listener.connections`` when the first call was sent (see :meth:`LockBase._waiter`).
    generation: int
    #: The first acquire call's ARGV, sent by the driver itself without a :class:`Call`
    #: (``None``: the flow sends every call, as with ``REPLICAS``, whose ``WAIT`` a Call runs).
    args: list[Any] | None
    #: Registered only when the first call finds the lock busy (most acquisitions never wait).
    waiter: wakeups.Waiter | None = None


class LockBase:
    """Everything about a lock except I/O; see the module docstring."""

    kind: ClassVar[str] = "lock"
    # The defaults of the constructor's options (``__init__`` stores only the others).
    _timeout: float | None = None
    _blocking: bool = True
    _blocking_timeout: float | None = None
    _auto_renew: bool | None = None
    reentrant: bool = True
    using: str | None = None
    _owner: str | None = None
    _task_id: str | None = None
    _queued: bool = False
    quiet: bool = False
    report_busy: bool = True
    on_commit: bool | str = False
    _spec_cache: _Spec | None = None

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
        on_commit: bool | str = False,
        quiet: bool = False,
        report_busy: bool = True,
    ) -> None:
        # Every argument is validated here; the common values pass an identity test first,
        # and an argument left at its default is not stored: the class attributes below answer
        # (a lock object per call is the usual pattern, so construction is on the hot path).
        if type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH or not name.isascii():
            check_name(name)
        self.name = name
        if timeout is not None:
            self._timeout = check_seconds(timeout, "timeout", minimum=MIN_LEASE, allow_none=True)
        if blocking is not True:
            self._blocking = blocking if blocking is False else _flag(blocking, "blocking")
        if blocking_timeout is not None:
            self._blocking_timeout = check_seconds(
                blocking_timeout, "blocking_timeout", allow_none=True
            )
        if auto_renew is not None:
            self._auto_renew = _flag(auto_renew, "auto_renew")
        if reentrant is not True:
            self.reentrant = _flag(reentrant, "reentrant")
        if using is not None:
            if not isinstance(using, str) or not using:
                raise TypeError(
                    f"using must be a CACHES alias (a non-empty str) or None, not {using!r}"
                )
            self.using = using
        if owner is not None:
            self._owner = check_owner(owner)
        if task_id is not None:
            if not isinstance(task_id, str):
                raise TypeError(f"task_id must be a str or None, not {type(task_id).__name__}")
            self._task_id = task_id
        if queued is not False:
            self._queued = _flag(queued, "queued")
        self.stats_name = stats_name or stats_shape(name)
        #: For integrations that report their own events (single-flight publishes): no signals
        #: and no statistics for this object (``quiet``), or none for busy attempts.
        if quiet is not False:
            self.quiet = _flag(quiet, "quiet")
        if report_busy is not True:
            self.report_busy = _flag(report_busy, "report_busy")
        if on_commit is not False:
            if not isinstance(on_commit, (bool, str)):
                raise TypeError(
                    f"on_commit must be True, False or a database alias, not {on_commit!r}"
                )
            self.on_commit = on_commit
        # owner -> the last Hold this object took for that owner (kept after release or loss so
        # ``fencing_token`` and ``lost`` still answer).
        self._last: dict[str, Hold] = {}

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} using={connection.resolve_alias(self.using)!r}>"
        )

    # -- resolution ---------------------------------------------------------------------------
    #: The owner when none is given: the calling (process, thread); ``AsyncLock``: its task.
    #: A static method, not a method calling it: one Python call less on every acquire and
    #: release.
    _default_owner: Callable[[], str] = staticmethod(holds.thread_owner)

    def _target(self) -> Target:
        return self._spec().target

    async def _aclient(self) -> Any:
        raise NotImplementedError

    async def _arunner(self) -> Any:
        """What this face's scripts run through (the asyncio client, or a direct runner)."""
        raise NotImplementedError

    def _spec(self) -> _Spec:
        """Keys and arguments, cached until the settings change (``setting_changed`` replaces
        the settings object)."""
        settings = get_settings()
        spec = self._spec_cache
        if spec is not None and spec.target.settings is settings:
            return spec
        ident = (type(self), self.name, self.using, self._timeout)
        spec = _specs.get(ident)
        if spec is None or spec.target.settings is not settings:
            target = target_for(self.using)
            keys = target.keys
            lease = self._timeout if self._timeout is not None else settings.timeout
            script_keys = self._script_keys(keys)
            lock_key = script_keys[0]
            # Independent masters cannot hand a majority over: 0 = wake every waiter instead.
            claim_ms = 0 if target.masters else max(1, int(min(CLAIM_WINDOW, lease) * 1000))
            spec = _Spec(
                target=target,
                lock_key=lock_key,
                script_keys=script_keys,
                lease=lease,
                lease_ms=max(1, int(lease * 1000)),
                claim_ms=claim_ms,
                ident=(target.alias, lock_key),
                wake_args=(target.channel_prefix, target.trust_publish, claim_ms),
                acquire_action=f"acquire {self.kind} {self.name!r}",
                release_action=f"release {self.kind} {self.name!r}",
            )
            if len(_specs) >= SPEC_CACHE_SIZE:
                _specs.clear()
            _specs[ident] = spec
        self._spec_cache = spec
        return spec

    def _script_keys(self, keys: KeySpace) -> list[str]:
        return [keys.lock(self.name), keys.fence(self.name), keys.queue(self.name)]

    def _hold_ident(self, spec: _Spec, owner: str, token: int) -> tuple[str, str, str]:
        """The hold table key: one hold per (lock, owner), however often it nests."""
        return (*spec.ident, owner)

    def _renew_args(
        self, spec: _Spec, owner: str, token: int | None, ms: int, mode: str
    ) -> tuple[scripts.Script, list[str], list[Any]]:
        return scripts.RENEW, [spec.lock_key], [owner, ms, mode]

    @property
    def timeout(self) -> float:
        return self._timeout if self._timeout is not None else get_settings().timeout

    @property
    def auto_renew(self) -> bool:
        return self._auto_renew if self._auto_renew is not None else get_settings().auto_renew

    @property
    def owner(self) -> str:
        return self._owner or self._default_owner()

    def _hold(self) -> Hold | None:
        spec = self._spec()
        return holds.get((*spec.ident, self.owner))

    def _locked_op(self) -> Op:
        return Read(self._spec().lock_key, redis_client.lock_exists, redis_client.alock_exists)

    def _owned_op(self) -> Op:
        return Read(self._spec().lock_key, redis_client.read_lock, redis_client.aread_lock)

    def _locked_from(self, reply: Any) -> bool:
        return bool(reply)

    # -- state --------------------------------------------------------------------------------
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

    # -- acquire ------------------------------------------------------------------------------
    def _wait_limit(self, blocking_timeout: float | None) -> float | None:
        limit = (
            self._blocking_timeout
            if blocking_timeout is None
            else check_seconds(blocking_timeout, "blocking_timeout")
        )
        return get_settings().blocking_timeout if limit is None else limit

    #: The acquire script of this kind, and what its 7th argument is (``_limit_arg``).
    _acquire_script: ClassVar[scripts.Script] = scripts.ACQUIRE

    def _limit_arg(self) -> Any:
        """Locks: "1" refuses re-entry (``reentrant=False``); semaphores pass their permits."""
        return "0" if self.reentrant else "1"

    def _acquire_args(
        self, spec: _Spec, owner: str, meta: str, waiter: str, entry: str, entry_ms: int
    ) -> list[Any]:
        """The acquire script's ARGV (``waiter``: queue when busy; ``entry``: our queue entry)."""
        args = [owner, spec.lease_ms, meta, waiter, entry_ms, entry, self._limit_arg()]
        args += spec.wake_args
        return args

    def _acquire_call(
        self, spec: _Spec, owner: str, meta: str, waiter: str, entry: str, entry_ms: int
    ) -> Call:
        args = self._acquire_args(spec, owner, meta, waiter, entry, entry_ms)
        call = Call(self._acquire_script, spec.script_keys, args, spec.acquire_action)
        return self._replicated(call, spec)

    def _cancel_call(self, spec: _Spec, owner: str, waiter: str, entry: str, take: bool) -> Call:
        return Call(
            scripts.CANCEL,
            spec.script_keys,
            [
                entry,
                waiter,
                owner,
                spec.lease_ms,
                "1" if take else "0",
                *spec.wake_args,
            ],
            f"stop waiting for lock {self.name!r}",
        )

    def _io(self, call: Call) -> Op:
        """The operation that runs ``call`` where this lock lives (every master for Redlock)."""
        if (call.target or self._spec().target).masters:
            return quorum.op(self, call)  # type: ignore[no-any-return]
        return call

    def _begin(self, blocking: bool | None, blocking_timeout: float | None) -> Attempt | None:
        """Everything up to the first acquire call, which the driver (:func:`drive`,
        :func:`adrive`) then makes itself: most acquisitions end with that call, and the
        generator flow is only needed when they do not. ``None`` for independent masters
        (Redlock), whose flow differs."""
        spec = self._spec()
        target = spec.target
        if target.masters:
            return None
        if blocking is None:
            blocking = self._blocking
        elif blocking is not True and blocking is not False:
            blocking = check_bool(blocking, "blocking")
        limit = self._wait_limit(blocking_timeout)
        meta = holds.metadata(self._task_id, queued=self._queued)
        owner = self._owner or self._default_owner()
        started = time.monotonic()
        deadline = float("inf") if limit is None else started + limit
        listener: Any = None
        queued = False
        waiter_id = ""
        generation = 0
        if blocking and limit != 0:
            listener = target.listener()
            # Queue at the first attempt only when hand-offs can reach us already (subscribed);
            # the waiter itself is registered if the lock is busy (_waiter).
            queued = listener.ready.is_set()
            if queued:
                waiter_id = holds.new_waiter_id()
                generation = listener.connections
        args = None
        if not target.replicas:
            entry_ms = _entry_ms(deadline - started, spec.lease)
            args = self._acquire_args(spec, owner, meta, waiter_id, "", entry_ms)
        return Attempt(
            spec, owner, meta, started, deadline, listener, queued, waiter_id, generation, args
        )

    def _waiter(self, attempt: Attempt) -> wakeups.Waiter:
        """Register the waiter of an attempt whose first call found the lock busy.

        That call may have queued it already, so a hand-off can come before this registration:
        :func:`wakeups.register` takes such a message. A renewed subscription since the call
        (its messages meanwhile are lost, and the reconnect's wake-up of every waiter missed
        this one) makes it re-check at once; a listener that stopped meanwhile (it stops when
        no waiter is registered) is started again through the flow's ``Subscribe``.
        """
        waiter = wakeups.Waiter(attempt.waiter_id or holds.new_waiter_id(), loop=self._loop())
        attempt.waiter, attempt.waiter_id = waiter, waiter.id
        wakeups.register(waiter)  # before reading `ready`: see Listener._run
        listener = attempt.listener
        if attempt.queued:
            if not listener.ready.is_set():
                attempt.queued = False
            elif listener.connections != attempt.generation:
                waiter.recheck_at = 0.0
        return waiter

    def _attempt_call(self, attempt: Attempt, entry: str) -> Call:
        """The next acquire call of ``attempt`` (``entry``: its queue entry, "" for none)."""
        spec, waiter = attempt.spec, attempt.waiter
        entry_ms = _entry_ms(attempt.deadline - time.monotonic(), spec.lease)
        if waiter is not None:
            # Reset before the call, never after: a hand-off message arriving while the call is
            # in flight must not be forgotten.
            waiter.handed = False
            waiter.token = None
            waiter.recheck_at = float("inf")
        waiter_id = attempt.waiter_id if attempt.queued else ""
        return self._acquire_call(spec, attempt.owner, attempt.meta, waiter_id, entry, entry_ms)

    def _after_first(self, attempt: Attempt, first: Any) -> Flow | None:
        """Where an acquisition stands after its first call, which the driver made: ``first``
        is its reply, the :class:`LockBackendError` it raised, or ``None`` when the driver made
        none (with ``REPLICAS`` the flow makes every call). ``None``: it took the lock, now
        recorded; otherwise the flow that goes on from there."""
        if first is None:
            return self._acquire_flow(None, None, attempt)
        if isinstance(first, LockBackendError):
            return self._acquire_flow(None, None, attempt, (None, first))
        if self._won(attempt, first):
            return None
        return self._acquire_flow(None, None, attempt, (first, None))

    def _won(self, attempt: Attempt, reply: Any) -> bool:
        """Whether the first call's ``reply`` took the lock, which is then recorded (the
        driver returns at once; otherwise it runs :meth:`_acquire_flow` from that reply)."""
        if type(reply) is int:  # a free lock taken: the bare token (see _taken)
            return self._acquired(attempt.spec, attempt.owner, reply, 1, attempt.started, False)
        if reply[0] != 1:
            return False
        return self._acquired(
            attempt.spec, attempt.owner, int(reply[1]), int(reply[2]), attempt.started, False
        )

    def _acquire_flow(
        self,
        blocking: bool | None,
        blocking_timeout: float | None,
        attempt: Attempt | None = None,
        first: Outcome | None = None,
    ) -> Flow:
        """Take the lock; ``False`` when not acquired in time. One deadline covers every wait.

        A face that made the first call of ``attempt`` itself passes its outcome as ``first``
        (``(reply, None)`` or ``(None, error)``); the flow goes on from there.
        """
        if attempt is None:
            attempt = self._begin(blocking, blocking_timeout)
            if attempt is None:
                return (yield from quorum.acquire_flow(self, blocking, blocking_timeout))
        spec, owner = attempt.spec, attempt.owner
        waiter, listener = attempt.waiter, attempt.listener
        started, deadline = attempt.started, attempt.deadline
        entry = ""
        contended = False
        reconnected = False
        try:
            while True:
                try:
                    if first is not None:
                        (reply, error), first = first, None
                        if error is not None:
                            raise error
                    else:
                        reply = yield self._attempt_call(attempt, entry)
                except NotReplicated as exc:
                    if int(_taken(exc.reply)[0]) != 1:
                        reply = exc.reply  # only a queue entry went unacknowledged
                    else:
                        entry = ""
                        yield self._release_call(False, owner)[0]  # undo it, then say so
                        raise
                except LockBackendError as exc:
                    kind = _transient(exc)
                    if kind == "connection" and (entry or attempt.queued) and not reconnected:
                        # The connection dropped (killed, restarted pool): Redis may well be up.
                        # Our queue entry is still valid; reconnect once and keep waiting.
                        reconnected = True
                        continue
                    raise
                reconnected = False
                state, value, extra = _taken(reply)
                if state == 1:
                    entry = ""
                    return self._acquired(spec, owner, int(value), int(extra), started, contended)
                if state == 2:
                    raise LockNotAcquiredError(
                        self.name,
                        f"Lock {self.name!r} is already held by this owner and reentrant=False: "
                        "acquiring it again would deadlock.",
                    )
                contended = True
                if listener is None:
                    return self._failed(started)
                entry = _text(extra)  # "" when not queued; set first: clean-up needs it
                if waiter is None:
                    waiter = self._waiter(attempt)
                if not attempt.queued:
                    if not (yield Subscribe(listener, _subscribe_timeout(spec.target))):
                        logger.warning(
                            "django_redislock: cannot subscribe for wake-ups of %r; waiting "
                            "with re-checks at the holder's lease end only.",
                            self.name,
                        )
                    attempt.queued = True
                    continue
                # PTTL -1: a value without expiry (not ours): re-check once per span.
                span = min(deadline - time.monotonic(), spec.lease)
                holder_left = int(value) / 1000 if int(value) >= 0 else span
                planned = time.monotonic() + max(0.001, min(holder_left, span))
                waiter.recheck_at = min(waiter.recheck_at, planned)
                if time.monotonic() < deadline:
                    yield Wait(waiter, deadline)
                if waiter.handed and waiter.token is not None:
                    # Handed over outright (single Redis): held, with its full lease, already.
                    entry = ""
                    return self._acquired(spec, owner, waiter.token, 1, started, True)
                if not waiter.handed and time.monotonic() >= deadline:
                    cancel = self._cancel_call(spec, owner, waiter.id, entry, take=True)
                    entry = ""
                    try:
                        result = yield self._replicated(cancel, spec)
                    except NotReplicated as exc:
                        if int(exc.reply[0]) == 1:
                            yield self._release_call(False, owner)[0]
                        raise
                    if int(result[0]) == 1:
                        return self._acquired(
                            spec, owner, int(result[1]), int(result[2]), started, True
                        )
                    return self._failed(started)
        except BaseException:
            if entry and attempt.waiter_id:
                # Interrupted while queued (even before the waiter was registered): leave the
                # queue, pass on a lock reserved for us.
                cleanup = self._cancel_call(spec, owner, attempt.waiter_id, entry, take=False)
                cleanup.shield = True
                try:
                    yield cleanup
                except Exception:  # the interruption matters more; the entry expires anyway
                    logger.warning(
                        "django_redislock: could not clean up the wait for %r",
                        self.name,
                        exc_info=True,
                    )
            raise
        finally:
            if attempt.waiter is not None:
                wakeups.unregister(attempt.waiter)

    @staticmethod
    def _replicated(call: Call, spec: _Spec) -> Call:
        """``call`` followed by ``WAIT`` for ``REDISLOCK["REPLICAS"]`` replicas, when set."""
        target = call.target = spec.target
        call.replicas = target.replicas
        call.replicas_timeout_ms = target.replicas_timeout_ms
        return call

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop a waiter sleeps in (``None``: a thread)."""
        return None

    def _acquired(
        self, spec: _Spec, owner: str, token: int, count: int, started: float, contended: bool
    ) -> bool:
        ident = self._hold_ident(spec, owner, token)
        hold = holds.get(ident)
        if hold is None or hold.lost or count == 1:
            target = spec.target
            script, keys, args = self._renew_args(spec, owner, token, spec.lease_ms, "set")
            renewer = quorum.renewer(target.masters) if target.masters else target.client
            auto_renew = self._auto_renew
            now = time.monotonic()
            hold = Hold(
                ident,
                self.name,
                owner,
                token,
                count,
                spec.lease,
                target.settings.auto_renew if auto_renew is None else auto_renew,
                (renewer, script, keys, args),
                self.stats_name,
                self.kind,
                type(self),
                (target.replicas, target.replicas_timeout_ms),
                None if self.quiet else (self.using, self.stats_name),
                now,  # acquired_at
            )
            hold.lock_ref = weakref.ref(self)
            stale = holds.put(hold)
            if stale is not None:
                watchdog.unregister(stale)  # its lock expired unnoticed before this acquisition
            self._last[owner] = hold
            if hold.auto_renew:
                watchdog.register(hold)
            if not self.quiet:
                waited = now - started
                stats.record(
                    self.using, self.stats_name, "acquired", waited, contended, self.name, token
                )
                if signals.lock_acquired.receivers:
                    signals.lock_acquired.send_robust(
                        type(self),
                        lock=self,
                        name=self.name,
                        token=token,
                        waited=waited,
                        contended=contended,
                    )
        else:
            hold.count = count
            if spec.lease > hold.lease:
                hold.lease = spec.lease
                script, keys, args = self._renew_args(spec, owner, token, spec.lease_ms, "set")
                hold.renew = (hold.renew[0], script, keys, args)
            self._last[owner] = hold
        return True

    def _failed(self, started: float) -> bool:
        if self.quiet or not self.report_busy:
            return False
        stats.record(
            self.using, self.stats_name, "failed", time.monotonic() - started, name=self.name
        )
        if signals.lock_acquire_failed.receivers:
            signals.lock_acquire_failed.send_robust(
                type(self), lock=self, name=self.name, waited=time.monotonic() - started
            )
        return False

    # -- release / renew ----------------------------------------------------------------------
    def _release_call(self, all_holds: bool, owner: str) -> tuple[Call, Hold | None]:
        """The release script call; unregisters the hold from the watchdog *before* it runs
        (never renew a released lock). ``owner`` is resolved by the caller (an async release
        runs shielded, in another task)."""
        spec = self._spec()
        hold = holds.get((*spec.ident, owner))
        if hold is not None and (all_holds or hold.count <= 1):
            watchdog.unregister(hold)
        here = "" if spec.target.masters else holds.process_token()
        call = Call(
            scripts.RELEASE,
            spec.script_keys,
            [owner, "1" if all_holds else "0", *spec.wake_args, here],
            spec.release_action,
            after=_woken_here,
            target=spec.target,
        )
        return call, hold

    def _not_owned(self, hold: Hold | None, message: str) -> LockNotOwnedError:
        """The hold (if this process knew one) is lost: record it, and say so."""
        if hold is not None:
            holds.mark_lost(hold)
            self._last[hold.owner] = hold
        return LockNotOwnedError(message)

    def _released(self, hold: Hold | None, left: int, owner: str) -> None:
        if left < 0:
            raise self._not_owned(
                hold,
                f"Cannot release lock {self.name!r}: it is not held by this owner ({owner}). "
                "It expired, was force-released, or was never acquired here.",
            )
        if hold is None:
            return
        hold.count = left
        if left == 0:
            hold.released = True
            holds.forget(hold)
            if not self.quiet:
                held = time.monotonic() - hold.acquired_at
                stats.record(
                    self.using, self.stats_name, "released", held, False, self.name, hold.token
                )
                if signals.lock_released.receivers:
                    signals.lock_released.send_robust(
                        type(self), lock=self, name=self.name, held=held
                    )

    def _renew_call(self, ms: int, mode: str) -> Call:
        spec = self._spec()
        hold = self._hold()
        token = hold.token if hold is not None else None
        script, keys, args = self._renew_args(spec, self.owner, token, ms, mode)
        return self._replicated(Call(script, keys, args, f"renew lock {self.name!r}"), spec)

    def _renewed(self, ok: int) -> None:
        if not ok:
            raise self._not_owned(
                self._hold(),
                f"Cannot renew lock {self.name!r}: it is no longer held by this owner "
                f"({self.owner}).",
            )

    def _extend_ms(self, additional_time: float) -> int:
        seconds = check_seconds(additional_time, "additional_time", minimum=MIN_LEASE)
        assert seconds is not None
        return int(seconds * 1000)

    def _detach(self) -> tuple[int, int | None]:
        hold = self._hold()
        if hold is None:
            return 0, self.fencing_token
        watchdog.unregister(hold)
        holds.forget(hold)
        return hold.count, hold.token

    def _owned_from(self, record: Any) -> bool:
        if record is None:
            return False
        if record.unreadable:
            raise LockError(
                f"Lock {self.name!r} holds a value that is not a lock record "
                f"({record.raw_excerpt!r}): written by something else or corrupted. Inspect it "
                "with `manage.py redislock list` and force-release it if it is stale."
            )
        return bool(record.owner == self.owner)

    # -- context manager helpers ----------------------------------------------------------------
    def _exit_state(self) -> str:
        """``"lost"``, ``"released"`` (explicitly, inside the block) or ``"held"``."""
        hold = self._last.get(self.owner)
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
        return state == "held"  # "released": explicitly, inside the block — nothing was lost

    def _release_failed_on_exit(self, exc: BaseException | None, err: LockError) -> None:
        if isinstance(err, LockNotOwnedError):
            self._lost_on_exit(exc, err)
        elif exc is None:
            raise err
        else:  # keep the block's own exception
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

    def _not_acquired(self) -> LockNotAcquiredError:
        return LockNotAcquiredError(self.name)


def _taken(reply: Any) -> Any:
    """An acquire's reply as ``[state, value, extra]``: ``acquire.lua`` answers its commonest
    case, a free lock taken, with the bare fencing token (see ``take`` in ``lua/_library.lua``),
    which means ``[1, token, 1]``. :meth:`LockBase._won`, on every acquisition's path, reads the
    token without this."""
    return [1, reply, 1] if type(reply) is int else reply


def _entry_ms(left: float, lease: float) -> int:
    """How long a queue entry stays valid: until the next planned re-check — the deadline
    (``left`` seconds away) or the holder's longest lease, whichever is first — plus a margin."""
    return int((max(min(left, lease), 0.0) + ENTRY_MARGIN) * 1000)


def _woken_here(reply: Any) -> Any:
    """A release's reply: ``[0, waiter, token]`` when the lock went to a waiter of this process
    (``release.lua`` published nothing for it) — woken here, then 0 like any release."""
    if isinstance(reply, list):
        token = int(reply[2])
        wakeups.hand_over(_text(reply[1]), token if token >= 0 else None)
        return 0
    return reply


def _subscribe_timeout(target: Target) -> float:
    return (target.socket_timeout or wakeups.DEFAULT_REPLY_TIMEOUT) + 1.0
