"""Waking waiters: one subscribed connection per process (and Redis server) for all of them.

A blocked ``acquire`` holds no Redis connection while it waits. It registers a :class:`Waiter`
in the process's :class:`WaiterRegistry` and sleeps on it; the Lua ``hand_off`` publishes
``h <waiter id> [<token>]`` on the channel of the waiter's process (``<namespace>:wake:<process
token>``), and this process's :class:`Listener` thread — one ``SUBSCRIBE``d connection per
server, however many threads or asyncio tasks wait — wakes the waiter. So a thousand waiting
threads need one connection, and there is no polling.

On a single Redis, ``PUBLISH`` returns how many subscribers heard it: a waiter whose process died
(its connection closed) is skipped at once. Messages are not queued for a disconnected
subscriber; when the listener reconnects it makes every local waiter re-check, and each waiter
also re-checks on its own when the holder's lease would end. A periodic ``PING`` finds a
connection that went silent (a partition) within :data:`HEALTH_INTERVAL` plus the socket timeout.
The listener reads with redis-py's ``PubSub.get_message``.

On a Redis Cluster, ``PUBLISH`` goes to every node over the cluster bus. Where the servers have
sharded Pub/Sub (7.0+), the scripts ``SPUBLISH`` instead, on a shard channel in the slot of the
lock's keys (``<namespace>:wake:{<tag>}:<process token>``), which only the lock's shard hears;
a :class:`ShardedListener` subscribes (``SSUBSCRIBE``) to a lock's channel before the waiter
queues, with one connection per shard, each read by a thread of its own (a message waiting on
one shard never waits for a read on another), and drops the channel :data:`IDLE_EXIT` seconds
after the process's last waiter on it is gone. A shard connection that is lost is made again on
whichever node serves each channel's slot now (after a failover, the promoted replica), and the
waiters of each channel subscribed again re-check at once.

The connections a listener holds for long are named and exempt from client eviction where the
server allows it (see :meth:`django_redislock.transport.RedisPyTransport.pubsub`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from typing import Any, Protocol

__all__ = [
    "HEALTH_INTERVAL",
    "IDLE_EXIT",
    "Listener",
    "ListenerGroup",
    "Listening",
    "ShardedListener",
    "Waiter",
    "WaiterRegistry",
]

logger = logging.getLogger("django_redislock")

#: Seconds of silence after which the listener pings its connection.
HEALTH_INTERVAL = 1.0
#: Seconds to wait for a PONG (or a SUBSCRIBE confirmation) when the client sets no timeout.
DEFAULT_REPLY_TIMEOUT = 2.0
#: Seconds the listener stays subscribed after the last waiter of this process is gone (a
#: sharded listener: after the last waiter on a channel).
IDLE_EXIT = 30.0
#: Seconds an early message (see :meth:`WaiterRegistry.register`) is kept, and the most kept.
EARLY_TTL = 30.0
EARLY_MAX = 4096


class Waiter:
    """One blocked acquisition (its id is the attempt's): woken by a hand-off, a re-check hint,
    or its own timer.

    Sync waiters sleep on a ``threading.Event``; async waiters on a future of their loop,
    resolved from the listener thread through ``call_soon_threadsafe``.
    """

    def __init__(
        self, waiter_id: str, *, loop: asyncio.AbstractEventLoop | None = None, channel: str = ""
    ) -> None:
        self.id = waiter_id
        #: The channel its wake-ups come on (a sharded listener keeps it while waiters use it).
        self.channel = channel
        self.handed = False
        #: The fencing token of a lock handed over outright, else ``None``.
        self.token: int | None = None
        self.recheck_at = float("inf")
        self._loop = loop
        self._event = threading.Event()
        self._future: asyncio.Future[None] | None = None

    def reset(self) -> None:
        """Before each acquire call: a message arriving while the call is in flight still counts
        (it is recorded after this)."""
        self.handed = False
        self.token = None
        self.recheck_at = float("inf")

    def notify(
        self, *, handed: bool = False, token: int | None = None, recheck_in: float | None = None
    ) -> None:
        """From the listener thread, or a release of this process that handed the lock over
        (fields first, then the wake-up: no lost update)."""
        if handed:
            self.token = token
            self.handed = True
        elif recheck_in is not None:
            at = time.monotonic() + recheck_in
            if at >= self.recheck_at:
                return  # it re-checks earlier anyway
            self.recheck_at = at
        self._event.set()
        future, loop = self._future, self._loop
        if future is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                loop.call_soon_threadsafe(_resolve, future)

    def _timeout(self, until: float) -> float:
        return max(0.0, min(until, self.recheck_at) - time.monotonic())

    def wait(self, until: float) -> None:
        """Sleep until handed the lock, or ``min(until, recheck_at)`` (monotonic seconds)."""
        while not self.handed:
            timeout = self._timeout(until)
            if timeout <= 0:
                return
            self._event.wait(min(timeout, threading.TIMEOUT_MAX))
            self._event.clear()

    async def await_(self, until: float) -> None:
        """:meth:`wait` for an asyncio task of the loop given at creation."""
        loop = self._loop or asyncio.get_running_loop()
        while True:
            # Publish the future first, then look at the fields (see notify).
            future = self._future = loop.create_future()
            timeout = self._timeout(until)
            if self.handed or timeout <= 0:
                return
            if self._event.is_set():  # notified before the future existed
                self._event.clear()
                continue
            timer = loop.call_later(timeout, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()
                self._event.clear()


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class WaiterRegistry:
    """The waiters of this process by id, and messages that came before their waiter.

    An acquisition registers its waiter when its first call found the lock busy, and that call
    has queued it already, so a hand-off can arrive first: it is kept (:data:`EARLY_TTL`) and
    delivered by :meth:`register`.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, Waiter] = {}
        self._early: dict[str, tuple[float, str, int | None]] = {}
        #: Registered waiters per channel (channels with none are left out).
        self._channels: dict[str, int] = {}
        self._mutex = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def register(self, waiter: Waiter) -> None:
        with self._mutex:
            self._forget(self._waiters.get(waiter.id))
            self._waiters[waiter.id] = waiter
            self._channels[waiter.channel] = self._channels.get(waiter.channel, 0) + 1
            early = self._early.pop(waiter.id, None)
        if early is not None:
            _notify(waiter, early[1], early[2])

    def unregister(self, waiter: Waiter) -> None:
        with self._mutex:
            self._forget(self._waiters.pop(waiter.id, None))

    def _forget(self, waiter: Waiter | None) -> None:
        if waiter is not None:
            left = self._channels.pop(waiter.channel, 1) - 1
            if left:
                self._channels[waiter.channel] = left

    def waiting_on(self, channel: str) -> bool:
        """Whether a waiter of this process waits for wake-ups on ``channel``."""
        return channel in self._channels

    def deliver(self, waiter_id: str, kind: str, value: int | None) -> None:
        """Wake ``waiter_id`` ("h": handed the lock, ``value`` its token or ``None``; "r":
        re-check in ``value`` ms), or keep the message for its registration."""
        with self._mutex:
            waiter = self._waiters.get(waiter_id)
            if waiter is None:
                now = time.monotonic()
                while self._early:  # oldest first (insertion order is time order)
                    oldest = next(iter(self._early))
                    if now - self._early[oldest][0] <= EARLY_TTL and len(self._early) < EARLY_MAX:
                        break
                    del self._early[oldest]
                self._early[waiter_id] = (now, kind, value)
                return
        _notify(waiter, kind, value)

    def dispatch(self, data: bytes | str) -> None:
        """A wake-up message as published by the scripts."""
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        parts = text.split(" ")
        kind, waiter_id, number = parts[0], parts[1] if len(parts) > 1 else "", parts[2:3]
        value = int(number[0]) if number and number[0].lstrip("-").isdigit() else None
        if kind not in ("h", "r") or not waiter_id or (value is None and (kind == "r" or number)):
            logger.warning("django_redislock: ignored a malformed wake-up message %r", text[:100])
            return
        self.deliver(waiter_id, kind, value)

    def wake_all(self, channel: str | None = None) -> None:
        """Every waiter (on ``channel``) re-checks now: messages may have been lost."""
        with self._mutex:
            waiters = [w for w in self._waiters.values() if channel is None or w.channel == channel]
        for waiter in waiters:
            waiter.notify(recheck_in=0.0)

    def clear(self) -> None:
        self._mutex = threading.Lock()
        self._waiters = {}
        self._early = {}
        self._channels = {}


def _notify(waiter: Waiter, kind: str, value: int | None) -> None:
    if kind == "h":
        waiter.notify(handed=True, token=value)
    elif value is not None:
        waiter.notify(recheck_in=value / 1000)


class Listening(Protocol):
    """The subscription that hears one lock's wake-ups, as the drivers use it (see
    :meth:`django_redislock.targets.Target.listening`)."""

    #: The channel its wake-ups come on.
    channel: str
    #: ``is_set()`` while subscribed.
    ready: Any

    @property
    def connections(self) -> int:
        """Changes whenever the subscription is made again (its messages meanwhile are lost)."""

    def ensure(self, timeout: float) -> bool:
        """Subscribe if needed; wait up to ``timeout`` s until subscribed."""


class _Reader:
    """A daemon thread reading one subscribed connection, and making it again after a loss
    while it is needed: what the process's listener and a shard's reader share.

    Subclasses say what to subscribe (:meth:`_subscribe`), what a message means
    (:meth:`_handle`), when nobody needs the connection (:meth:`_idle`, :meth:`_needed`) and
    what a lost connection changes (:meth:`_disconnected`, :meth:`_recover`).
    """

    def __init__(
        self,
        transport: Any,
        reply_timeout: float | None,
        waiters: WaiterRegistry,
        mutex: threading.Lock,
    ) -> None:
        self.transport = transport
        self.reply_timeout = reply_timeout or DEFAULT_REPLY_TIMEOUT
        self.waiters = waiters
        #: Subscriptions made (connections that subscribed).
        self.connections = 0
        self._thread: threading.Thread | None = None
        self._mutex = mutex

    def _start(self) -> None:
        """Start the thread unless it runs (holding the mutex)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="django-redislock-wakeups", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        backoff = 0.05
        while True:
            lost = False
            try:
                self._listen()
            except Exception as exc:  # connection lost or refused: reconnect while needed
                lost = True
                if self._needed():
                    logger.warning(
                        "django_redislock: wake-up connection lost (%s); reconnecting.", exc
                    )
            if lost and self._needed():
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                self._recover()
            with self._mutex:
                # Disconnected first (in _listen), then look: a waiter registers before it
                # reads `ready`, so it either sees it cleared (and calls ensure()) or is seen
                # here.
                if not self._needed():
                    self._thread = None
                    self._ended()
                    return

    def _listen(self) -> None:
        pubsub = None
        try:
            pubsub = self._open()
            self._subscribe(pubsub)
            self._read(pubsub)
        finally:
            with self._mutex:
                self._disconnected()  # also when no connection could be made
            if pubsub is not None:
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    pubsub.reset()

    def _read(self, pubsub: Any) -> None:
        """Read until :meth:`_idle`; ``PING`` a connection that went silent, and give it up
        when no ``PONG`` comes."""
        last_heard = time.monotonic()
        pinged = False
        while True:
            message = pubsub.get_message(timeout=HEALTH_INTERVAL)
            now = time.monotonic()
            if self._idle(now):
                return
            if message is not None:
                last_heard, pinged = now, False
                self._handle(message)
                continue
            silent = now - last_heard
            if pinged and silent > HEALTH_INTERVAL + self.reply_timeout:
                raise TimeoutError(f"no reply to PING for {silent:.1f} s")
            if not pinged and silent >= HEALTH_INTERVAL:
                self._ping(pubsub)
                pinged = True

    # -- what a reader decides ----------------------------------------------------------------
    def _open(self) -> Any:
        """A new ``PubSub`` of its own connection."""
        raise NotImplementedError

    def _subscribe(self, pubsub: Any) -> None:
        raise NotImplementedError

    def _handle(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def _idle(self, now: float) -> bool:
        """Whether nobody needs the connection any more (then it is closed)."""
        raise NotImplementedError

    def _needed(self) -> bool:
        """Whether to keep (or make again) the connection."""
        raise NotImplementedError

    def _ping(self, pubsub: Any) -> None:
        pubsub.ping()

    def _disconnected(self) -> None:
        """The connection is gone (holding the mutex): its subscriptions no longer hear."""

    def _ended(self) -> None:
        """The thread ends (holding the mutex)."""

    def _recover(self) -> None:
        """After a lost connection, before making it again."""


class Listener(_Reader):
    """The subscribed connection of this process to one server (a transport).

    Started by the first waiter that needs it; a daemon thread holding one connection while any
    waiter of this process exists, and for :data:`IDLE_EXIT` seconds after the last one (then it
    unsubscribes and ends, so idle processes hold no extra connection). ``ready`` is set while
    subscribed; ``connections`` counts subscriptions made.
    """

    def __init__(
        self, transport: Any, channel: str, reply_timeout: float | None, waiters: WaiterRegistry
    ) -> None:
        super().__init__(transport, reply_timeout, waiters, threading.Lock())
        self.channel = channel
        self.ready = threading.Event()
        self._idle_since = 0.0
        #: Calls of :meth:`ensure` waiting: the flow subscribes before its waiter registers,
        #: so a thread about to stop for want of waiters must not stop while one waits.
        self._asking = 0

    def subscription(self, prefix: str) -> Listener:
        """Every lock's wake-ups come on this process's one channel."""
        return self

    def ensure(self, timeout: float) -> bool:
        """Start the listener if needed and wait up to ``timeout`` s until it is subscribed."""
        if self.ready.is_set():
            return True
        with self._mutex:
            self._asking += 1
            self._start()
        try:
            return self.ready.wait(timeout)
        finally:
            with self._mutex:
                self._asking -= 1

    def _open(self) -> Any:
        return self.transport.pubsub()

    def _subscribe(self, pubsub: Any) -> None:
        pubsub.subscribe(self.channel)
        self._await_reply(pubsub, "subscribe")
        self.connections += 1
        self.ready.set()
        self._idle_since = time.monotonic()
        if self.connections > 1:
            self.waiters.wake_all()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "message" and _text(message.get("channel")) == self.channel:
            self.waiters.dispatch(message["data"])
        elif kind == "subscribe":
            # redis-py reconnected on its own (a client with retries) and subscribed again:
            # make the connection anew, so that it is protected and the waiters re-check.
            raise ConnectionError("the wake-up subscription was made again by redis-py")
        # Anything else (e.g. a CLIENT TRACKING invalidation redirected here) is not ours.

    def _idle(self, now: float) -> bool:
        if self.waiters:
            self._idle_since = now
            return False
        return now - self._idle_since > IDLE_EXIT

    def _needed(self) -> bool:
        return bool(self.waiters) or self._asking > 0

    def _disconnected(self) -> None:
        self.ready.clear()

    def _await_reply(self, pubsub: Any, kind: str) -> None:
        deadline = time.monotonic() + self.reply_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} confirmation within {self.reply_timeout:g} s")
            message = pubsub.get_message(timeout=remaining)
            if message is not None and message.get("type") == kind:
                return


class _AllReady:
    def __init__(self, listeners: list[Listener]) -> None:
        self._listeners = listeners

    def is_set(self) -> bool:
        return all(listener.ready.is_set() for listener in self._listeners)


class ListenerGroup:
    """The listeners of several independent masters (Redlock), used like one."""

    channel = ""

    def __init__(self, listeners: list[Listener]) -> None:
        self.listeners = listeners
        self.ready = _AllReady(listeners)

    def subscription(self, prefix: str) -> ListenerGroup:
        return self

    @property
    def connections(self) -> int:
        return sum(listener.connections for listener in self.listeners)

    def ensure(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            listener.ensure(max(0.0, deadline - time.monotonic())) for listener in self.listeners
        )


# -- sharded Pub/Sub (a Cluster) --------------------------------------------------------------


class ShardedListener:
    """This process's subscriptions to the shard channels of the locks it waits for, on a
    Cluster with sharded Pub/Sub: one ``SSUBSCRIBE``d connection per shard (a
    :class:`_ShardReader`), subscribed to a channel while this process waits on it.

    State lives here under one mutex: which reader serves each channel, and which channels lost
    their subscription (their waiters re-check once subscribed again). :meth:`subscription`
    hands out views of one channel (:class:`_ShardChannel`) that the drivers use.
    """

    def __init__(
        self, transport: Any, token: str, reply_timeout: float | None, waiters: WaiterRegistry
    ) -> None:
        self.transport = transport
        self.token = token
        self.reply_timeout = reply_timeout
        self.waiters = waiters
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._readers: dict[str, _ShardReader] = {}  # node name -> its reader
        self._serving: dict[str, _ShardReader] = {}  # channel -> the reader subscribing it
        self._lapsed: set[str] = set()  # subscriptions lost, not yet made again
        self._generations = itertools.count(1)

    def subscription(self, prefix: str) -> _ShardChannel:
        """The subscription to the channel ``prefix`` + this process's token."""
        return _ShardChannel(self, prefix + self.token)

    def readers(self) -> list[_ShardReader]:
        """The shard connections, one per node serving a channel this process listens on."""
        with self._mutex:
            return list(self._readers.values())

    def generation(self, channel: str) -> int:
        """A number unique to the current subscription of ``channel``; 0 when not subscribed."""
        reader = self._serving.get(channel)
        return 0 if reader is None else reader.confirmed.get(channel, 0)

    def ensure(self, channel: str, timeout: float) -> bool:
        """Subscribe to ``channel`` on the shard serving it (unless subscribed) and wait up to
        ``timeout`` s for the confirmation."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                reader = self._serving.get(channel) or self._place(channel)
                now = time.monotonic()
                if reader is not None:
                    reader.used[channel] = now
                    if channel in reader.confirmed:
                        return True
                if now >= deadline:
                    return False
                # Without a reader (no node known for the slot: a failover), look again soon.
                self._changed.wait(deadline - now if reader is not None else 0.05)

    def _place(self, channel: str) -> _ShardReader | None:
        """Subscribe ``channel`` on the reader of the node serving its slot (holding the
        mutex); ``None`` when the slot map has no node for it."""
        try:
            node = self.transport.shard_node(channel)
        except Exception:
            return None
        reader = self._readers.get(node.name)
        if reader is None:
            reader = self._readers[node.name] = _ShardReader(self, node)
        reader.add(channel)
        return reader

    def _relocate(self, reader: _ShardReader, channels: set[str] | None = None) -> None:
        """After ``reader`` lost its connection (or the server dropped a channel: its slot
        moved), ask the Cluster where the slots live now and move each channel whose slot
        another node serves to that node's reader."""
        with contextlib.suppress(Exception):  # no node answered: the next round asks again
            self.transport.refresh_topology()
        with self._mutex:
            for channel in sorted(reader.wanted if channels is None else channels):
                try:
                    node = self.transport.shard_node(channel)
                except Exception:
                    continue
                if channel not in reader.wanted:
                    continue
                if node.name != reader.node.name:
                    reader.remove(channel)
                    self._place(channel)
                elif reader.pubsub is not None and channel not in reader.confirmed:
                    reader.send(reader.pubsub.ssubscribe, channel)


class _ShardChannel:
    """One lock's shard channel, as the drivers use it (:class:`Listening`); the state is the
    :class:`ShardedListener`'s, so a view outlives the subscription it looks at."""

    def __init__(self, owner: ShardedListener, channel: str) -> None:
        self.channel = channel
        self.ready = _Subscribed(owner, channel)
        self._owner = owner

    @property
    def connections(self) -> int:
        return self._owner.generation(self.channel)

    def ensure(self, timeout: float) -> bool:
        return self._owner.ensure(self.channel, timeout)


class _Subscribed:
    """``ready`` of a :class:`_ShardChannel`."""

    def __init__(self, owner: ShardedListener, channel: str) -> None:
        self._owner = owner
        self._channel = channel

    def is_set(self) -> bool:
        return self._owner.generation(self._channel) > 0


class _ShardReader(_Reader):
    """The connection to one shard's primary, ``SSUBSCRIBE``d to the channels of this
    process's waiters there, and its reading thread.

    ``SSUBSCRIBE`` and ``SUNSUBSCRIBE`` are sent by whichever thread decides them, holding the
    listener's mutex (so they reach the server in the order decided); only this thread reads.
    A channel is dropped :data:`IDLE_EXIT` seconds after it was last asked for with no waiter on
    it; the thread ends with its last channel.
    """

    def __init__(self, owner: ShardedListener, node: Any) -> None:
        super().__init__(owner.transport, owner.reply_timeout, owner.waiters, owner._mutex)
        self.owner = owner
        self.node = node
        self.wanted: set[str] = set()  # channels to subscribe here
        self.confirmed: dict[str, int] = {}  # subscribed channel -> its generation
        self.used: dict[str, float] = {}  # channel -> when last asked for (monotonic)
        self.leaving: set[str] = set()  # SUNSUBSCRIBE sent, not yet confirmed
        #: The live connection; ``None`` while (re)connecting.
        self.pubsub: Any = None
        self._swept = 0.0

    def __repr__(self) -> str:
        return f"<_ShardReader {self.node.name} {len(self.wanted)} channels>"

    def add(self, channel: str) -> None:
        """Subscribe ``channel`` here (holding the mutex)."""
        self.wanted.add(channel)
        self.used[channel] = time.monotonic()
        self.owner._serving[channel] = self
        if self.pubsub is not None:
            self.send(self.pubsub.ssubscribe, channel)
        self._start()

    def remove(self, channel: str) -> None:
        """Stop subscribing ``channel`` here (holding the mutex)."""
        self.wanted.discard(channel)
        self.used.pop(channel, None)
        self.confirmed.pop(channel, None)
        if self.owner._serving.get(channel) is self:
            del self.owner._serving[channel]
        if self.pubsub is not None:
            self.leaving.add(channel)
            self.send(self.pubsub.sunsubscribe, channel)

    def send(self, command: Any, channel: str) -> None:
        """``SSUBSCRIBE`` / ``SUNSUBSCRIBE`` (holding the mutex); a broken connection is this
        thread's to find: reading fails, and the connection is made again."""
        with contextlib.suppress(Exception):
            command(channel)

    def _open(self) -> Any:
        return self.transport.pubsub(self.node)

    def _subscribe(self, pubsub: Any) -> None:
        with self._mutex:
            self.pubsub = pubsub
            for channel in sorted(self.wanted):  # one per command: each is in its own slot
                pubsub.ssubscribe(channel)
        self.connections += 1

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel"))
        if kind == "smessage":
            if channel in self.wanted:
                self.waiters.dispatch(message["data"])
            return
        lapsed = moved = False
        with self._mutex:
            if kind == "ssubscribe" and channel in self.wanted:
                if channel in self.confirmed:
                    # redis-py subscribed again on a new connection of its own.
                    raise ConnectionError("the wake-up subscription was made again by redis-py")
                self.confirmed[channel] = next(self.owner._generations)
                lapsed = channel in self.owner._lapsed
                self.owner._lapsed.discard(channel)
                self.owner._changed.notify_all()
            elif kind == "sunsubscribe":
                if channel in self.leaving:
                    self.leaving.discard(channel)
                elif channel in self.wanted:  # the server dropped it: its slot moved away
                    if self.confirmed.pop(channel, None) is not None:
                        self.owner._lapsed.add(channel)
                    moved = True
        if lapsed:
            self.waiters.wake_all(channel)
        if moved:
            self.owner._relocate(self, {channel})

    def _idle(self, now: float) -> bool:
        if now - self._swept >= HEALTH_INTERVAL:
            self._swept = now
            with self._mutex:
                for channel in sorted(self.wanted):
                    if self.waiters.waiting_on(channel):
                        self.used[channel] = now
                    elif now - self.used.get(channel, now) > IDLE_EXIT:
                        self.remove(channel)
                        self.owner._lapsed.discard(channel)
        return not self.wanted

    def _needed(self) -> bool:
        return bool(self.wanted)

    def _ping(self, pubsub: Any) -> None:
        with self._mutex:
            pubsub.ping()

    def _disconnected(self) -> None:
        # Channels nobody waits on are dropped, not made again (an ensure() under way places
        # its channel anew; a waiter registering later finds it unsubscribed and re-checks).
        self.pubsub = None
        self.leaving.clear()
        for channel in sorted(self.wanted):
            if not self.waiters.waiting_on(channel):
                self.remove(channel)
                self.owner._lapsed.discard(channel)
        self.owner._lapsed.update(self.confirmed)
        self.confirmed.clear()
        self.owner._changed.notify_all()

    def _ended(self) -> None:
        if self.owner._readers.get(self.node.name) is self:
            del self.owner._readers[self.node.name]

    def _recover(self) -> None:
        self.owner._relocate(self)
