"""Waking waiters: one subscribed connection per process (and Redis server) for all of them.

A blocked ``acquire`` holds no Redis connection while it waits. It registers a :class:`Waiter`
here and sleeps on it; the Lua ``hand_off`` publishes ``h <waiter id>`` on the channel of the
waiter's process (``<namespace>:wake:<process token>``), and this process's :class:`Listener`
thread — one ``SUBSCRIBE``d connection per Redis client, however many threads or asyncio tasks wait
— wakes the waiter, which then claims the lock. So a thousand waiting threads need one
connection, not a thousand (a pool of 10 serves them), and there is no polling. A hand-off between
processes waits on the listener's read, so it reads straight from the socket into the hiredis
reader where the connection allows (:func:`connection.pubsub_reader`), else via ``get_message``.

Channels are not keys, so scripts that publish touch nothing outside their lock's hash slot.
On a single Redis, ``PUBLISH`` returns how many subscribers heard it: a waiter whose process died
(its connection closed) is skipped at once instead of being handed the lock. Messages are not
queued for a disconnected subscriber; when the listener reconnects it makes every local waiter
re-check, and each waiter also re-checks on its own when the holder's lease would end. A
periodic ``PING`` finds a connection that went silent (a partition) within
:data:`HEALTH_INTERVAL` plus the socket timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django_redislock import connection, holds

__all__ = [
    "HEALTH_INTERVAL",
    "Listener",
    "ListenerGroup",
    "Waiter",
    "hand_over",
    "listener_for",
]

logger = logging.getLogger("django_redislock")

#: Seconds of silence after which the listener pings its connection.
HEALTH_INTERVAL = 1.0
#: Seconds to wait for a PONG (or a SUBSCRIBE confirmation) when the client sets no timeout.
DEFAULT_REPLY_TIMEOUT = 2.0
#: Seconds the listener stays subscribed after the last waiter of this process is gone.
IDLE_EXIT = 30.0


class Waiter:
    """One blocked acquisition: woken by a hand-off, a re-check hint, or its own timer.

    Sync waiters sleep on a *gate*, a ``threading.Lock`` held closed that a wake-up releases (a
    binary semaphore: cheaper on both sides than a ``threading.Event``, whose ``wait`` builds
    a ``Condition`` waiter each time); async waiters on a future of their loop, resolved from
    the listener thread through ``call_soon_threadsafe`` or by a loop timer at the deadline
    (no ``asyncio.wait_for``, which wraps every wait in a task of its own).
    """

    __slots__ = ("_future", "_gate", "_loop", "_thread", "handed", "id", "recheck_at", "token")

    def __init__(self, waiter_id: str, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.id = waiter_id
        self.handed = False
        #: The fencing token of a lock handed over outright (single Redis), else ``None``.
        self.token: int | None = None
        self.recheck_at = float("inf")
        self._loop = loop
        self._thread = threading.get_ident()  # the loop's thread, for an asyncio waiter
        # Created when the waiter first sleeps: most acquisitions never wait. notify() sets the
        # fields before it looks for a gate or event, and wait() creates it before it looks at
        # the fields, so a message arriving in between is never missed.
        self._gate: threading.Lock | None = None
        self._future: asyncio.Future[None] | None = None

    def _set(self) -> None:
        gate = self._gate
        if gate is not None:
            # Open it; already open (a second message before the waiter woke) is fine.
            with contextlib.suppress(RuntimeError):
                gate.release()
        elif self._loop is not None and self._future is not None:
            # A closed loop raises RuntimeError: nobody waits there any more.
            with contextlib.suppress(RuntimeError):
                if threading.get_ident() == self._thread:  # a task of its own loop hands over
                    _resolve(self._future)
                else:
                    self._loop.call_soon_threadsafe(_resolve, self._future)

    def notify(
        self, *, handed: bool = False, token: int | None = None, recheck_in: float | None = None
    ) -> None:
        """Called from the listener thread, or by a release of this process that handed the lock
        over (fields first, then the wake-up: no lost update)."""
        if handed:
            self.token = token
            self.handed = True
        elif recheck_in is not None:
            at = time.monotonic() + recheck_in
            if at >= self.recheck_at:
                return  # it re-checks earlier anyway: no need to wake it
            self.recheck_at = at
        self._set()

    def _timeout(self, until: float) -> float:
        return max(0.0, min(until, self.recheck_at) - time.monotonic())

    def wait(self, until: float) -> None:
        """Sleep until handed the lock, or ``min(until, recheck_at)`` (monotonic seconds)."""
        gate = self._gate
        if gate is None:
            gate = threading.Lock()
            gate.acquire()
            self._gate = gate
        while not self.handed:
            timeout = self._timeout(until)
            if timeout <= 0 or not gate.acquire(timeout=min(timeout, threading.TIMEOUT_MAX)):
                return

    async def await_(self, until: float) -> None:
        """:meth:`wait` for an asyncio task (of the loop given at creation)."""
        loop = self._loop or asyncio.get_running_loop()
        while True:
            # Publish the future first, then look at the fields (see __init__).
            future = self._future = loop.create_future()
            timeout = self._timeout(until)
            if self.handed or timeout <= 0:
                return
            timer = loop.call_later(timeout, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_waiters: dict[str, Waiter] = {}
_waiters_mutex = threading.Lock()

#: Messages for waiter ids not registered (yet): waiter id -> (monotonic time, kind, value).
#: An acquisition registers its waiter only when its first call finds the lock busy, and that
#: call has queued it already, so a hand-off can arrive before the registration; ``register``
#: takes it from here. Messages for waiters that are gone (a late re-check hint) age out.
_early: dict[str, tuple[float, str, int | None]] = {}
#: Seconds an unclaimed early message is kept, and the most kept (oldest dropped first).
EARLY_TTL = 30.0
EARLY_MAX = 4096


def register(waiter: Waiter) -> None:
    """Make ``waiter`` reachable by wake-ups, including one that came before this call.

    Lock-free under the GIL, in the order that cannot lose a message: this stores the waiter,
    then looks for an early message; :func:`_deliver` stores an early message, then looks for the
    waiter again. Whichever side pops the message delivers it, so it is delivered exactly once.
    """
    _waiters[waiter.id] = waiter
    if _early:
        early = _early.pop(waiter.id, None)
        if early is not None:
            _notify(waiter, early[1], early[2])


def unregister(waiter: Waiter) -> None:
    _waiters.pop(waiter.id, None)


def _notify(waiter: Waiter, kind: str, value: int | None) -> None:
    if kind == "h":
        waiter.notify(handed=True, token=value)
    elif value is not None:
        waiter.notify(recheck_in=value / 1000)


def _deliver(waiter_id: str, kind: str, value: int | None) -> None:
    """Wake ``waiter_id`` ("h": handed the lock, ``value`` its token or ``None``; "r": re-check in
    ``value`` ms), or keep the message for its registration (see :func:`register`)."""
    waiter = _waiters.get(waiter_id)
    if waiter is None:
        now = time.monotonic()
        _prune_early(now)
        _early[waiter_id] = (now, kind, value)
        waiter = _waiters.get(waiter_id)
        if waiter is None or _early.pop(waiter_id, None) is None:
            return  # kept for its registration, or taken by it meanwhile
    _notify(waiter, kind, value)


def _prune_early(now: float) -> None:
    """Drop early messages that are too old, or too many, oldest first (dicts keep insertion
    order, which is time order here): usually one look at the oldest."""
    while _early:
        try:
            oldest = next(iter(_early))
            at = _early[oldest][0]
        except (StopIteration, KeyError, RuntimeError):  # another thread changed it meanwhile
            return
        if now - at <= EARLY_TTL and len(_early) < EARLY_MAX:
            return
        _early.pop(oldest, None)


def hand_over(waiter_id: str, token: int | None) -> None:
    """A release of this process handed the lock to one of its own waiters (``release.lua``
    sends no message for it): wake that waiter here, or keep the wake-up for its registration
    (:func:`register`). One that is gone meanwhile has left the queue or finds the lock
    reserved for it in its clean-up (as with a message it missed)."""
    _deliver(waiter_id, "h", token)


def _dispatch(data: bytes | str) -> None:
    text = data.decode() if isinstance(data, bytes) else data
    parts = text.split(" ")
    kind, waiter_id, number = parts[0], parts[1] if len(parts) > 1 else "", parts[2:3]
    value = int(number[0]) if number and number[0].lstrip("-").isdigit() else None
    if kind not in ("h", "r") or not waiter_id or (value is None and (kind == "r" or number)):
        # Not a message of ours: the waiter still re-checks on its own timer.
        logger.warning("django_redislock: ignored a malformed wake-up message %r", text[:100])
        return
    _deliver(waiter_id, kind, value)


def _wake_all() -> None:
    """After a reconnect: messages sent meanwhile are lost, so every waiter re-checks now."""
    with _waiters_mutex:
        waiters = list(_waiters.values())
    for waiter in waiters:
        waiter.notify(recheck_in=0.0)


class Listener:
    """The subscribed connection of this process to one Redis client's server.

    Started by the first waiter that needs it; a daemon thread holding one pooled connection while
    any waiter of this process exists, and for :data:`IDLE_EXIT` seconds after the last one (then
    it unsubscribes and ends, so idle processes hold no extra connection). ``ready`` is set while
    subscribed.
    """

    def __init__(self, client: Any, channel: str, reply_timeout: float | None) -> None:
        self.client = client
        self.channel = channel
        self.reply_timeout = reply_timeout or DEFAULT_REPLY_TIMEOUT
        self.ready = threading.Event()
        self.connections = 0
        #: Whether the current subscription is read by :func:`connection.pubsub_reader`.
        self.lean = False
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def ensure(self, timeout: float) -> bool:
        """Start the listener if needed and wait up to ``timeout`` s until it is subscribed."""
        if not self.ready.is_set():
            with self._mutex:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="django-redislock-wakeups", daemon=True
                    )
                    self._thread.start()
        return self.ready.wait(timeout)

    def _run(self) -> None:
        backoff = 0.05
        while True:
            lost = False
            try:
                self._listen()
            except Exception as exc:  # connection lost or refused: reconnect while needed
                lost = True
                if _waiters:
                    logger.warning(
                        "django_redislock: wake-up connection lost (%s); reconnecting.", exc
                    )
            with self._mutex:
                # Clear first, then look: a waiter registers before it reads `ready`, so it
                # either sees it cleared (and calls ensure()) or is seen here.
                self.ready.clear()
                if not _waiters:
                    self._thread = None
                    return
            if lost:
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _listen(self) -> None:
        pubsub = self.client.pubsub()
        try:
            pubsub.subscribe(self.channel)
            self._await_reply(pubsub, "subscribe")
            self.connections += 1
            self.ready.set()
            if self.connections > 1:
                _wake_all()
            lean = connection.pubsub_reader(pubsub)
            self.lean = lean is not None
            read = lean or _get_message(pubsub)
            last_heard = idle_since = time.monotonic()
            pinged = False
            while True:
                reply = read(HEALTH_INTERVAL)
                now = time.monotonic()
                if _waiters:
                    idle_since = now
                elif now - idle_since > IDLE_EXIT:
                    return
                if reply is not None:
                    last_heard, pinged = now, False
                    data = connection.message_data(reply)
                    if data is not None:
                        _dispatch(data)
                    continue
                silent = now - last_heard
                if pinged and silent > HEALTH_INTERVAL + self.reply_timeout:
                    raise TimeoutError(f"no reply to PING for {silent:.1f} s")
                if not pinged and silent >= HEALTH_INTERVAL:
                    pubsub.ping()
                    pinged = True
        finally:
            # Closing a broken connection may fail too; it is gone anyway.
            with contextlib.suppress(Exception):
                pubsub.reset()

    def _await_reply(self, pubsub: Any, kind: str) -> None:
        deadline = time.monotonic() + self.reply_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} confirmation within {self.reply_timeout:g} s")
            message = pubsub.get_message(timeout=remaining)
            if message is not None and message.get("type") == kind:
                return


def _get_message(pubsub: Any) -> Callable[[float], Any]:
    """:func:`connection.pubsub_reader`'s ``read`` done by redis-py's ``get_message`` (for the
    connections that reader does not serve): the message dict as ``[kind, channel, data]``."""

    def read(timeout: float) -> Any:
        message = pubsub.get_message(timeout=timeout)
        if message is None:
            return None
        return [message.get("type"), message.get("channel"), message.get("data")]

    return read


class _AllReady:
    def __init__(self, listeners: list[Listener]) -> None:
        self._listeners = listeners

    def is_set(self) -> bool:
        return all(listener.ready.is_set() for listener in self._listeners)


class ListenerGroup:
    """The listeners of several independent masters (Redlock), used like one."""

    def __init__(self, listeners: list[Listener]) -> None:
        self.listeners = listeners
        self.ready = _AllReady(listeners)

    def ensure(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            listener.ensure(max(0.0, deadline - time.monotonic())) for listener in self.listeners
        )


_listeners: dict[tuple[int, str], Listener] = {}
_listeners_mutex = threading.Lock()


def listener_for(client: Any, prefix: str, reply_timeout: float | None) -> Listener:
    """The listener of this process for ``client`` and channel prefix ``<ns>:wake:``."""
    key = (id(client), prefix)
    listener = _listeners.get(key)
    if listener is None:
        with _listeners_mutex:
            listener = _listeners.get(key)
            if listener is None:
                channel = prefix + holds.process_token()
                listener = _listeners[key] = Listener(client, channel, reply_timeout)
    return listener


def _after_fork() -> None:
    global _waiters_mutex, _listeners_mutex
    _waiters.clear()
    _early.clear()
    _listeners.clear()
    _waiters_mutex = threading.Lock()
    _listeners_mutex = threading.Lock()


holds.on_fork(_after_fork)
