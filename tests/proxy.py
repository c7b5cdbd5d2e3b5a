"""A loopback TCP proxy whose behaviour a fault test switches at run time.

``TcpProxy`` sits between a Redis client and a server and can forward, hold (blackhole), close
(drop) or slow down (delay) the traffic of every connection, open or new. Unlike SIGSTOPping the
server, it can break one client's path while others (the test's own inspection client) still see the
server, and it can hold one direction only — the server executes a command whose reply the client
never receives.

Why threads of the test process and not a child process: mode switches take effect before the
switching call returns (no IPC round-trip to reason about), stats are plain attributes, and
there is no interpreter start-up on a 2-core machine. All sockets are served by ONE event-loop
thread (``selectors`` with a bounded timeout and a wake-up socket pair), so an idle proxy costs no
CPU and a switch is applied to all connections at once. The price: the proxy runs only while the
test process does — a test that SIGSTOPs itself, or forks a child and exits the parent, loses it.

Blackhole semantics (documented choice): while held, the proxy neither reads nor writes; clients'
``send`` still succeeds into the kernel buffers, exactly as on a partitioned TCP path. When the hold
ends (``forward()``, or the timer of ``blackhole(for_=...)``), everything held back is delivered in
order — like retransmissions after a partition heals — so a command a client gave up on (socket
timeout) still reaches the server *after* the client moved on. To lose the held data instead, end
the hold with ``drop()``: held connections are closed and nothing is delivered. New connections
during a blackhole complete their TCP handshake (the kernel does that for a listening socket, so a
client's *connect* timeout does not fire; its *socket* timeout does), and reach the server when the
hold ends.
"""

from __future__ import annotations

import contextlib
import errno
import random
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["SCRIPT_CALLS", "ProxyStats", "TcpProxy"]

#: Requests that run one of the package's scripts, as functions or with EVALSHA.
SCRIPT_CALLS = (b"EVALSHA", b"FCALL")

LOOPBACK = "127.0.0.1"
_CHUNK = 65536
_MAX_BUFFER = 4 * 1024 * 1024  # per direction: stop reading a side whose peer does not drain
_CONNECT_TIMEOUT = 5.0  # upstream connect; loopback answers at once unless the backlog is full
_IDLE_WAKE = 0.5  # the loop wakes at least this often even when nothing happens
_CALL_TIMEOUT = 10.0  # a control call not served by the loop thread in this time is a bug

PASS, DELAY, BLACKHOLE, DROP = "pass", "delay", "blackhole", "drop"
UP, DOWN = "up", "down"  # client -> server, server -> client


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters (bytes are those delivered, not merely read)."""

    accepted: int
    open: int
    closed_by_proxy: int
    bytes_up: int
    bytes_down: int
    replies_lost: int = 0  # replies swallowed by lose_replies / lose_next_reply


@dataclass
class _Pipe:
    """One direction of a connection: chunks read from ``src`` waiting to be written to ``dst``."""

    chunks: deque[tuple[float, memoryview]] = field(default_factory=deque)  # (release at, data)
    size: int = 0
    eof: bool = False  # src closed its side; dst is closed once the queue drains

    def push(self, release_at: float, data: bytes) -> None:
        self.chunks.append((release_at, memoryview(data)))
        self.size += len(data)

    def ready(self, now: float) -> bool:
        return bool(self.chunks) and self.chunks[0][0] <= now

    def next_release(self) -> float | None:
        return self.chunks[0][0] if self.chunks else None


class _Conn:
    """A client socket, its upstream socket and the two pipes between them."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.connecting_since: float | None = None
        self.up = _Pipe()
        self.down = _Pipe()
        self.closed = False
        self.events: dict[socket.socket, int] = {}
        # The next reply on this connection is swallowed and the connection reset (lost reply).
        self.doomed = False

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class TcpProxy:
    """Forward ``127.0.0.1:port`` to ``upstream_host:upstream_port``, with switchable faults.

    Modes (each applies at once to open connections and to new ones):

    - ``forward()`` — pass traffic (and clear any delay);
    - ``blackhole(for_=None, direction="both")`` — hold traffic, keep connections open;
    - ``drop(reset=False)`` — close every connection now and close new ones on accept;
    - ``delay(seconds)`` — add ``seconds`` of latency to each direction.

    ``close_connections()`` is a one-shot drop that keeps the current mode. On top of any mode,
    ``lose_replies(p, seed=...)`` loses each reply with probability ``p`` and
    ``lose_next_reply(count, match=...)`` loses the next ones deterministically (see the module
    docstring); ``forward()`` ends both.
    """

    def __init__(
        self,
        upstream_port: int,
        upstream_host: str = LOOPBACK,
        *,
        port: int = 0,
        name: str = "proxy",
    ) -> None:
        if upstream_host not in (LOOPBACK, "localhost"):
            raise ValueError(f"the test proxy forwards to loopback only, not {upstream_host!r}")
        self.upstream = (LOOPBACK, upstream_port)
        self.name = name
        self._requested_port = port
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._conns: list[_Conn] = []
        self._calls: deque[tuple[Callable[[], None], threading.Event]] = deque()
        self._calls_lock = threading.Lock()
        self._timers: list[tuple[float, Callable[[], None]]] = []
        self._stop = False
        self._error: BaseException | None = None
        # Mode, read and written only by the loop thread (control calls run there).
        self._mode = PASS
        self._latency = 0.0
        self._hold = {UP: False, DOWN: False}
        self._before_blackhole: tuple[str, float] = (PASS, 0.0)
        self._reset_on_drop = False
        # Lost replies (an overlay on any mode; see lose_replies / lose_next_reply).
        self._lose_p = 0.0
        self._lose_rng = random.Random(0)
        self._lose_next = 0
        self._lose_match: tuple[bytes, ...] | None = None
        self._lose_reset = True
        self._replies_lost = 0
        # Counters (ints written by the loop thread only; reads from other threads are safe).
        self._accepted = 0
        self._closed_by_proxy = 0
        self._bytes = {UP: 0, DOWN: 0}

    # -- public API ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("proxy not started")
        return int(self._listener.getsockname()[1])

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def address(self) -> tuple[str, int]:
        return (LOOPBACK, self.port)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` — the proxy's address for a Redis client."""
        return f"redis://{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> str:
        """``"pass"``, ``"delay"``, ``"blackhole"`` or ``"drop"``."""
        return self._mode

    @property
    def replies_lost(self) -> int:
        """Replies swallowed so far (an int written by the loop thread: safe to read)."""
        return self._replies_lost

    @property
    def losing(self) -> float:
        """The probability ``lose_replies`` set (0.0 when off)."""
        return self._lose_p

    @property
    def stats(self) -> ProxyStats:
        """Counters taken between two loop steps (bytes a client has read are counted)."""
        snapshot: list[ProxyStats] = []

        def take() -> None:
            snapshot.append(
                ProxyStats(
                    accepted=self._accepted,
                    open=sum(1 for c in self._conns if not c.closed),
                    closed_by_proxy=self._closed_by_proxy,
                    bytes_up=self._bytes[UP],
                    bytes_down=self._bytes[DOWN],
                    replies_lost=self._replies_lost,
                )
            )

        if self._thread is not None and self._thread.is_alive():
            self._call(take)
        else:
            take()
        return snapshot[0]

    def start(self) -> TcpProxy:
        """Listen and start the loop thread; returns self (``with TcpProxy(p) as proxy:`` too)."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self._requested_port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(
            target=self._run, name=f"{self.name}:{self.port}->{self.upstream[1]}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close every socket and join the loop thread (idempotent)."""
        thread = self._thread
        if thread is None:
            return
        self._stop = True
        self._wake()
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"{thread.name}: loop thread did not stop within {timeout:g} s")
        self._thread = None
        if self._error is not None:
            raise RuntimeError(f"{thread.name}: the proxy loop crashed") from self._error

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def forward(self) -> None:
        """Pass traffic both ways with no added latency and lose no more replies; held data is
        delivered now (a connection already doomed still loses its reply)."""

        def apply() -> None:
            self._mode, self._latency = PASS, 0.0
            self._hold = {UP: False, DOWN: False}
            self._timers.clear()
            self._lose_p, self._lose_next, self._lose_match = 0.0, 0, None

        self._call(apply)

    def lose_replies(
        self, probability: float, *, seed: int | None = None, reset: bool = True
    ) -> None:
        """From now on, lose the reply to each request with ``probability`` (0 switches off).

        The request is forwarded and runs on the server; its reply is swallowed and the client's
        connection reset (``reset=False``: closed with FIN, the client reads end-of-stream).
        ``seed`` reseeds the proxy's own ``random.Random`` (default: keep its state, seeded 0
        at construction), so a chaos run can be replayed. Stays on until ``forward()``.
        """
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be between 0 and 1, not {probability!r}")

        def apply() -> None:
            self._lose_p = float(probability)
            self._lose_reset = reset
            if seed is not None:
                self._lose_rng.seed(seed)

        self._call(apply)

    def lose_next_reply(
        self,
        count: int = 1,
        *,
        match: bytes | str | tuple[bytes, ...] | None = None,
        reset: bool = True,
    ) -> None:
        """Lose the replies to the next ``count`` requests (those containing ``match``, or one of
        its byte strings, if given: e.g. :data:`SCRIPT_CALLS` to spare a ``PING``), whatever the
        connection. Deterministic: the request reaches the server before its connection is
        reset. ``replies_lost`` counts them.
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        needle: tuple[bytes, ...] | None
        if match is None or isinstance(match, tuple):
            needle = match
        else:
            needle = (match.encode() if isinstance(match, str) else match,)

        def apply() -> None:
            self._lose_next, self._lose_match = count, needle
            self._lose_reset = reset

        self._call(apply)

    def blackhole(self, for_: float | None = None, *, direction: str = "both") -> None:
        """Hold traffic (``"both"``, ``"up"`` = requests, ``"down"`` = replies); keep connections.

        With ``for_``, the hold ends by itself after that many seconds and the mode in force before
        (pass or delay) comes back; this call returns at once.
        """
        if direction not in ("both", UP, DOWN):
            raise ValueError(f"direction must be 'both', 'up' or 'down', not {direction!r}")

        def apply() -> None:
            if self._mode != BLACKHOLE:
                self._before_blackhole = (self._mode, self._latency)
            self._mode = BLACKHOLE
            self._hold = {UP: direction in ("both", UP), DOWN: direction in ("both", DOWN)}
            self._timers.clear()
            if for_ is not None:
                self._timers.append((time.monotonic() + for_, self._heal))

        self._call(apply)

    @contextlib.contextmanager
    def blackholed(
        self, seconds: float | None = None, *, direction: str = "both"
    ) -> Iterator[None]:
        """Blackhole inside the block; heal on exit (or earlier, after ``seconds``)."""
        self.blackhole(seconds, direction=direction)
        try:
            yield
        finally:
            if self._thread is not None and self._thread.is_alive():
                self._call(self._heal)

    def drop(self, *, reset: bool = False) -> None:
        """Close every open connection now and every new one on accept, until another mode.

        Data held by a blackhole is discarded. ``reset=True`` closes with RST (the client sees
        ``ECONNRESET``) instead of FIN (the client sees end-of-stream).
        """

        def apply() -> None:
            self._mode, self._latency = DROP, 0.0
            self._hold = {UP: False, DOWN: False}
            self._timers.clear()
            self._reset_on_drop = reset
            for conn in list(self._conns):
                self._close(conn, reset=reset, by_proxy=True)

        self._call(apply)

    def close_connections(self, *, reset: bool = False) -> None:
        """Close every open connection once (a server restart seen by clients); mode unchanged."""

        def apply() -> None:
            for conn in list(self._conns):
                self._close(conn, reset=reset, by_proxy=True)

        self._call(apply)

    def delay(self, seconds: float) -> None:
        """Add ``seconds`` of latency each way to data read from now on (0 = plain forwarding)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")

        def apply() -> None:
            self._mode, self._latency = (DELAY, seconds) if seconds else (PASS, 0.0)
            self._hold = {UP: False, DOWN: False}
            self._timers.clear()

        self._call(apply)

    # -- control plumbing ---------------------------------------------------------------------

    def _heal(self) -> None:
        """End a blackhole: back to the mode before it (loop thread only)."""
        if self._mode == BLACKHOLE:
            self._mode, self._latency = self._before_blackhole
            self._hold = {UP: False, DOWN: False}
        self._timers.clear()

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread and wait until it ran (switches apply before we return)."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError(f"{self.name} is not running") from self._error
        if threading.current_thread() is self._thread:
            fn()
            return
        done = threading.Event()
        with self._calls_lock:
            self._calls.append((fn, done))
        self._wake()
        if not done.wait(_CALL_TIMEOUT):
            raise RuntimeError(f"{self.name}: loop thread did not serve a control call") from (
                self._error
            )

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):  # full (already awake) or closed (stopping)
                self._wake_w.send(b"\0")

    # -- loop thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop:
                self._run_calls()
                self._run_timers()
                self._refresh_interest()
                assert self._selector is not None
                for key, mask in self._selector.select(self._select_timeout()):
                    self._dispatch(key, mask)
                self._flush_ready()
                self._check_connect_timeouts()
        except BaseException as exc:  # pragma: no cover - reported through _call/stop
            self._error = exc
            raise
        finally:
            self._shutdown()

    def _run_calls(self) -> None:
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                fn, done = self._calls.popleft()
            try:
                fn()
            finally:
                done.set()

    def _run_timers(self) -> None:
        now = time.monotonic()
        due = [t for t in self._timers if t[0] <= now]
        for item in due:
            if item in self._timers:
                self._timers.remove(item)
                item[1]()

    def _select_timeout(self) -> float:
        now = time.monotonic()
        wake = now + _IDLE_WAKE
        for at, _ in self._timers:
            wake = min(wake, at)
        for conn in self._conns:
            for direction, pipe in ((UP, conn.up), (DOWN, conn.down)):
                release = pipe.next_release()
                # Past release times wait for EVENT_WRITE instead (no spinning on a full peer).
                if release is not None and release > now and not self._hold[direction]:
                    wake = min(wake, release)
            if conn.connecting_since is not None:
                wake = min(wake, conn.connecting_since + _CONNECT_TIMEOUT)
        return max(0.0, wake - now)

    def _refresh_interest(self) -> None:
        """Register for exactly the events each socket can act on now (no busy loop)."""
        assert self._selector is not None
        # Connections accepted during a blackhole get their upstream once requests may flow.
        if not self._hold[UP]:
            for conn in list(self._conns):
                if conn.upstream is None and not conn.closed:
                    self._connect_upstream(conn)
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.closed:
                continue
            wanted: dict[socket.socket, int] = {}
            client_ev = 0
            if (
                not self._hold[UP]
                and not conn.up.eof
                and conn.up.size < _MAX_BUFFER
                and conn.upstream is not None
                and conn.connecting_since is None
            ):
                client_ev |= selectors.EVENT_READ
            if not self._hold[DOWN] and conn.down.ready(now):
                client_ev |= selectors.EVENT_WRITE
            wanted[conn.client] = client_ev
            if conn.upstream is not None:
                up_ev = 0
                if conn.connecting_since is not None:
                    up_ev = selectors.EVENT_WRITE
                else:
                    if not self._hold[DOWN] and not conn.down.eof and conn.down.size < _MAX_BUFFER:
                        up_ev |= selectors.EVENT_READ
                    if not self._hold[UP] and conn.up.ready(now):
                        up_ev |= selectors.EVENT_WRITE
                wanted[conn.upstream] = up_ev
            for sock, ev in wanted.items():
                old = conn.events.get(sock, 0)
                if ev == old:
                    continue
                if old and ev:
                    self._selector.modify(sock, ev, conn)
                elif ev:
                    self._selector.register(sock, ev, conn)
                else:
                    self._selector.unregister(sock)
                conn.events[sock] = ev

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        sock = key.fileobj
        if sock is self._wake_r:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while self._wake_r.recv(4096):
                    pass
            return
        if sock is self._listener:
            self._accept()
            return
        conn: _Conn = key.data
        if conn.closed:
            return
        if sock is conn.upstream and conn.connecting_since is not None:
            self._finish_connect(conn)
            return
        if mask & selectors.EVENT_READ:
            if sock is conn.client:
                self._read(conn, conn.client, conn.up, UP)
            else:
                assert conn.upstream is not None
                self._read(conn, conn.upstream, conn.down, DOWN)

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(64):  # bounded: other sockets get their turn
            try:
                client, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: leave it in the backlog, retry next turn
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                raise
            self._accepted += 1
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._mode == DROP:
                self._closed_by_proxy += 1
                self._close_socket(client, reset=self._reset_on_drop)
                continue
            conn = _Conn(client)
            self._conns.append(conn)
            if not self._hold[UP]:
                self._connect_upstream(conn)

    def _connect_upstream(self, conn: _Conn) -> None:
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.upstream = upstream
        err = upstream.connect_ex(self.upstream)
        if err in (0, errno.EISCONN):
            conn.connecting_since = None
        elif err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
            conn.connecting_since = time.monotonic()
        else:  # refused: the client sees its connection closed, as with a dead server
            self._close(conn, reset=True)

    def _finish_connect(self, conn: _Conn) -> None:
        assert conn.upstream is not None
        err = conn.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._close(conn, reset=True)
        else:
            conn.connecting_since = None

    def _check_connect_timeouts(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns):
            since = conn.connecting_since
            if since is not None and now - since > _CONNECT_TIMEOUT and not conn.closed:
                self._close(conn, reset=True)

    def _read(self, conn: _Conn, sock: socket.socket, pipe: _Pipe, direction: str) -> None:
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the peer: pass the reset on
            self._close(conn, reset=True)
            return
        if not data:
            pipe.eof = True
            return
        if direction == DOWN and conn.doomed:
            # The reply to a request that reached the server: swallow it, cut the connection.
            self._replies_lost += 1
            self._close(conn, reset=self._lose_reset, by_proxy=True)
            return
        pipe.push(time.monotonic() + self._latency, data)
        if direction == UP and not conn.doomed:
            self._maybe_doom(conn, data)

    def _maybe_doom(self, conn: _Conn, request: bytes) -> None:
        """Decide whether the reply to ``request`` (just read from the client) is lost."""
        if self._lose_next > 0 and (
            self._lose_match is None or any(n in request for n in self._lose_match)
        ):
            self._lose_next -= 1
            conn.doomed = True
        elif self._lose_p > 0.0 and self._lose_rng.random() < self._lose_p:
            conn.doomed = True

    def _flush_ready(self) -> None:
        """Write every chunk whose release time has come; close connections whose side ended."""
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.closed or conn.connecting_since is not None or conn.upstream is None:
                continue
            for direction, pipe, dst in (
                (UP, conn.up, conn.upstream),
                (DOWN, conn.down, conn.client),
            ):
                if self._hold[direction] or conn.closed:
                    continue
                while pipe.ready(now):
                    _, view = pipe.chunks[0]
                    try:
                        sent = dst.send(view)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        self._close(conn, reset=True)
                        break
                    self._bytes[direction] += sent
                    pipe.size -= sent
                    if sent == len(view):
                        pipe.chunks.popleft()
                    else:
                        pipe.chunks[0] = (pipe.chunks[0][0], view[sent:])
                        break
                if pipe.eof and not pipe.chunks and not conn.closed:
                    # One side ended and all it sent was delivered: end the other side too.
                    self._close(conn, reset=False)

    def _close(self, conn: _Conn, *, reset: bool, by_proxy: bool = False) -> None:
        if conn.closed:
            return
        conn.closed = True
        if by_proxy:
            self._closed_by_proxy += 1
        for sock in conn.sockets():
            if conn.events.get(sock) and self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
            self._close_socket(sock, reset=reset)
        conn.events.clear()
        with contextlib.suppress(ValueError):
            self._conns.remove(conn)

    @staticmethod
    def _close_socket(sock: socket.socket, *, reset: bool) -> None:
        if reset:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()

    def _shutdown(self) -> None:
        with self._calls_lock:
            pending, self._calls = list(self._calls), deque()
        for _, done in pending:  # nobody waits for a stopped proxy
            done.set()
        for conn in list(self._conns):
            self._close(conn, reset=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._selector is not None:
            self._selector.close()
