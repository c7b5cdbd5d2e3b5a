"""Where the Redis connection comes from, and how its failures surface.

The connection comes from a ``CACHES`` alias so a project configures Redis once: django-redis
(through ``get_redis_connection``, so Sentinel and replication setups work) or Django's built-in
``RedisCache``. This module decides which client a lock uses, what socket timeout that client
really applies, and turns redis-py errors into :class:`~django_redislock.LockBackendError`. It
sends no Redis command itself: those are in ``lua/`` and :mod:`django_redislock.client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from django.core.signals import setting_changed
from redis import exceptions as redis_errors
from redis._parsers import hiredis as hiredis_parser

from django_redislock.conf import get_settings
from django_redislock.exceptions import LockBackendError

__all__ = [
    "backend_error",
    "backend_errors",
    "backend_kind",
    "configured_socket_timeout",
    "get_client",
    "make_async_client",
    "reset",
    "socket_timeout",
]

DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
BUILTIN_BACKEND = "django.core.cache.backends.redis.RedisCache"

# redis-py >= 5.1 raises this subclass of ConnectionError when a pool has no connection left.
_POOL_EXHAUSTED: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(redis_errors, "MaxConnectionsError", None),) if e is not None
)

_clients: dict[str, Any] = {}
_mutex = threading.Lock()


def is_pool_exhausted(exc: BaseException | None) -> bool:
    """True for the error redis-py raises when its connection pool has no connection left."""
    if exc is None:
        return False
    if _POOL_EXHAUSTED and isinstance(exc, _POOL_EXHAUSTED):
        return True
    return isinstance(exc, redis_errors.ConnectionError) and "Too many connections" in str(exc)


_cluster_types: dict[type, bool] = {}


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (``PUBLISH`` there counts only one node's subscribers).

    Answered once per client class: the watchdog asks for every hold it renews, and
    ``isinstance`` against redis-py's cluster class costs microseconds.
    """
    kind = type(client)
    found = _cluster_types.get(kind)
    if found is None:
        from redis.cluster import RedisCluster

        found = _cluster_types[kind] = isinstance(client, RedisCluster)
    return found


def reset() -> None:
    """Forget cached clients (settings changed), giving kept connections back to their pools."""
    with _mutex:
        _clients.clear()
    _close_direct()


def _on_setting_changed(*, setting: str, **kwargs: object) -> None:
    if setting in ("REDISLOCK", "CACHES"):
        reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_redislock.connection.reset")


def backend_kind(backend: object) -> str | None:
    """``"django-redis"``, ``"builtin"`` or ``None`` (not Redis-backed) for a ``BACKEND`` value.

    The one place that decides "is this cache Redis?", by class (subclasses count), for both the
    system checks (which see only settings) and :func:`get_client`.
    """
    from django.utils.module_loading import import_string

    if not isinstance(backend, str) or not backend:
        return None
    try:
        cls = import_string(backend)
    except ImportError:
        return None
    for kind, path in (("django-redis", DJANGO_REDIS_BACKEND), ("builtin", BUILTIN_BACKEND)):
        try:
            base = import_string(path)
        except ImportError:
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return kind
    return None


#: The alias under which the client of ``REDISLOCK["CLIENT"]`` is known (it is no cache).
CLIENT_ALIAS = "<REDISLOCK['CLIENT']>"


def resolve_alias(using: str | None = None) -> str:
    """The alias a lock uses: ``using``, else ``REDISLOCK["CLIENT"]``, else ``CACHE``."""
    if using:
        return using
    settings = get_settings()
    return CLIENT_ALIAS if settings.client else settings.cache


def _client_from_setting(path: str) -> Any:
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

    try:
        client = import_string(path)()
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"django_redislock.E011: REDISLOCK['CLIENT'] = {path!r} cannot be imported: {exc}"
        ) from exc
    if not callable(getattr(client, "evalsha", None)):
        raise ImproperlyConfigured(
            f"django_redislock.E011: REDISLOCK['CLIENT'] = {path!r} returned {client!r}, not a "
            "redis-py client (Redis, RedisCluster or a Sentinel master_for() client)."
        )
    return client


def get_client(using: str | None = None) -> Any:
    """The redis-py client of an alias (see :func:`resolve_alias`), cached per process; its
    pools are fork-safe."""
    alias = resolve_alias(using)
    client = _clients.get(alias)
    if client is not None:
        return client
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if alias == CLIENT_ALIAS:
        client = _client_from_setting(str(get_settings().client))
        with _mutex:
            _clients[alias] = client
        return client

    configs: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {})
    config = configs.get(alias)
    if config is None:
        raise ImproperlyConfigured(
            f"django_redislock.E001: CACHES has no alias {alias!r} (REDISLOCK['CACHE'] or "
            f"using=). Defined aliases: {', '.join(settings.CACHES) or 'none'}."
        )
    kind = backend_kind(config.get("BACKEND"))
    if kind is None:
        raise ImproperlyConfigured(
            f"django_redislock.E009: CACHES[{alias!r}] uses {config.get('BACKEND')!r}, which is "
            "not Redis-backed. Use django_redis.cache.RedisCache or "
            "django.core.cache.backends.redis.RedisCache."
        )
    from django.core.cache import caches

    if kind == "builtin":
        # Django's RedisCache exposes its redis-py client only through this private attribute.
        client = caches[alias]._cache.get_client(write=True)  # type: ignore[attr-defined]
    else:
        from django_redis import get_redis_connection

        client = get_redis_connection(alias, write=True)
    with _mutex:
        _clients[alias] = client
    return client


@functools.lru_cache(maxsize=32)
def _default_socket_timeout(connection_class: type) -> float | None:
    """The ``socket_timeout`` a connection class uses when none is passed (redis-py 8: 5 s)."""
    for klass in connection_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            param = inspect.signature(init).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            continue
        if param is not None:
            default = param.default
            return None if default is inspect.Parameter.empty else default
    return None


def socket_timeout(client: Any) -> float | None:
    """The read timeout the client's connections really apply, in seconds (``None``: none).

    Not just ``connection_kwargs["socket_timeout"]``: redis-py 8 applies a default of 5 s that
    does not appear there when the ``CACHES`` entry sets no ``OPTIONS``.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if "socket_timeout" in kwargs:
        value = kwargs["socket_timeout"]
    else:
        value = _default_socket_timeout(pool.connection_class)
    return float(value) if value else None


def configured_socket_timeout(config: dict[str, Any]) -> float | None:
    """The socket timeout a ``CACHES`` entry will give its connections, from settings alone.

    For the system checks, which must not connect. Each backend has its own spelling:
    django-redis reads ``OPTIONS["SOCKET_TIMEOUT"]`` (or ``CONNECTION_POOL_KWARGS``), Django's
    ``RedisCache`` passes ``OPTIONS`` to redis-py as keyword arguments (``socket_timeout``).
    Unset, redis-py's own default applies (5 s since redis-py 8, none before).
    """
    from redis.connection import Connection

    options = config.get("OPTIONS") or {}
    kind = backend_kind(config.get("BACKEND"))
    if kind == "django-redis":
        value = options.get("SOCKET_TIMEOUT")
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
        if not value and "socket_timeout" in pool_kwargs:
            value = pool_kwargs["socket_timeout"]
        elif not value:
            value = _default_socket_timeout(Connection)
    elif "socket_timeout" in options:
        value = options["socket_timeout"]
    else:
        value = _default_socket_timeout(Connection)
    return float(value) if isinstance(value, (int, float)) and value else None


#: Connection settings that mean the same to redis-py's sync and asyncio connections. Everything
#: else in a sync pool's kwargs (parser and retry classes, redis-py 8's maintenance hooks, the
#: Sentinel pool proxy) is sync-specific and left to the asyncio defaults.
_PORTABLE_KWARGS = frozenset(
    {
        "host", "port", "path", "db", "username", "password", "credential_provider",
        "socket_timeout", "socket_connect_timeout", "socket_keepalive",
        "socket_keepalive_options", "retry_on_timeout", "encoding", "encoding_errors",
        "decode_responses", "client_name", "health_check_interval", "protocol", "lib_name",
        "lib_version", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs",
        "ssl_ca_data", "ssl_check_hostname", "ssl_min_version", "ssl_ciphers", "ssl_password",
        "ssl_ca_path",
    }
)  # fmt: skip


def _portable(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k in _PORTABLE_KWARGS}


def make_async_client(client: Any) -> Any:
    """A ``redis.asyncio`` client for the same server(s) as the sync ``client``.

    Built from what the sync client's pool really uses (the ``CACHES`` LOCATION and OPTIONS as
    django-redis or Django turned them into a pool): host/port/db or unix socket, credentials,
    timeouts, TLS, and Sentinel (the same sentinels and service). The caller keeps one per event
    loop: asyncio connections cannot be shared between loops.
    """
    import redis.asyncio as aredis
    from redis.asyncio import connection as aconnection
    from redis.sentinel import SentinelConnectionPool

    if is_cluster(client):
        from redis.asyncio.cluster import ClusterNode
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        kwargs = _portable(dict(client.nodes_manager.connection_kwargs))
        for key in ("host", "port", "db", "path"):
            kwargs.pop(key, None)
        nodes = [ClusterNode(node.host, node.port) for node in client.get_nodes()]
        return AsyncRedisCluster(startup_nodes=nodes, **kwargs)
    pool = client.connection_pool
    kwargs = _portable(dict(pool.connection_kwargs))
    max_connections = getattr(pool, "max_connections", None)
    if isinstance(pool, SentinelConnectionPool):
        from redis.asyncio.sentinel import Sentinel

        sentinels = [
            (
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in pool.sentinel_manager.sentinels
        ]
        sentinel_kwargs = _portable(
            dict(pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs)
        )
        for key in ("host", "port", "db"):
            sentinel_kwargs.pop(key, None)
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        manager = Sentinel(  # type: ignore[no-untyped-call]
            sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs
        )
        if pool.is_master:
            return manager.master_for(pool.service_name)
        return manager.slave_for(pool.service_name)
    from redis.connection import SSLConnection, UnixDomainSocketConnection

    if issubclass(pool.connection_class, SSLConnection):
        connection_class: type = aconnection.SSLConnection
    elif issubclass(pool.connection_class, UnixDomainSocketConnection):
        connection_class = aconnection.UnixDomainSocketConnection
    else:
        connection_class = aconnection.Connection
    # redis-py 8's asyncio pool skips its check of a pooled connection's health (a connection the
    # server closed, e.g. CLIENT KILL, is handed out as is) while maintenance notifications are
    # "auto"; our twin turns them off (they are for Redis Enterprise / Cloud endpoint moves).
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py < 7: no such feature, the check always runs
        pass
    else:
        kwargs["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    # Thousands of tasks may share the loop's connections: a task waits (awaits) for a free one,
    # up to the socket timeout, instead of failing with "Too many connections".
    async_pool = _pool_class()(
        connection_class=_lean(connection_class),
        max_connections=max_connections or 100,
        checkout_timeout=kwargs.get("socket_timeout") or 20,
        **kwargs,
    )
    return aredis.Redis(connection_pool=async_pool)


#: Argument types hiredis packs exactly as redis-py does (not bool, float, memoryview...).
_PACKABLE = frozenset({str, bytes, int})


def _hiredis_packed(pack: Callable[[tuple[Any, ...]], bytes], args: tuple[Any, ...]) -> list[bytes]:
    """``args`` packed by hiredis as redis-py's packers do ("SCRIPT LOAD" is two arguments).
    Only for arguments of the :data:`_PACKABLE` types."""
    name = args[0]
    if type(name) is str and " " not in name:  # EVALSHA: the same bytes, without the copy
        return [pack(args)]
    name = name.encode() if isinstance(name, str) else name
    return [pack((*name.split(), *args[1:]))]


@functools.cache
def _sync_packer() -> tuple[type | None, Callable[[tuple[Any, ...]], bytes] | None]:
    """redis-py's hiredis packer class, and hiredis' ``pack_command`` (``None`` without either)."""
    from redis import connection as sync_connection

    serializer = getattr(sync_connection, "HiredisRespSerializer", None)
    try:
        from hiredis import pack_command
    except ImportError:
        return None, None
    return serializer, pack_command


def _pack(conn: Any, args: tuple[Any, ...]) -> Any:
    """``conn.pack_command(*args)``, without redis-py's per-argument conversion pass (a generator
    over every argument: ≈ 1.2 µs of a script call with our 16 arguments) when the connection
    packs with hiredis anyway and every argument is of a type hiredis packs identically."""
    serializer, pack = _sync_packer()
    if (
        pack is not None
        and type(getattr(conn, "_command_packer", None)) is serializer
        and _PACKABLE.issuperset(map(type, args))
    ):
        return _hiredis_packed(pack, args)
    return conn.pack_command(*args)


@functools.cache
def _lean(connection_class: type) -> type:
    """``connection_class`` without two per-command costs of ``redis.asyncio`` connections.

    - **Sending.** With a socket timeout set, redis-py wraps every send in
      ``asyncio.wait_for``, which runs it as a task of its own (≈ 20 µs per command on the
      benchmark machine). Our commands are a few hundred bytes: the write goes to the kernel at
      once and ``drain()`` only waits when 64 KiB are already unsent. So on a connected socket
      without a health-check due the send runs inline; the reply is still read under the socket
      timeout, which is where a frozen or unreachable Redis shows (``LockBackendError``). A
      connect (or reconnect), and its handshake, keeps redis-py's own timeouts.
    - **Packing.** The asyncio connection packs commands in Python; with hiredis installed
      (and the default UTF-8 encoding) it is packed by hiredis, as redis-py's sync client does.
    """
    pack: Callable[[tuple[Any, ...]], bytes] | None
    try:
        from hiredis import pack_command as pack
    except ImportError:  # redis-py's Python packer stays
        pack = None

    class LeanConnection(connection_class):  # type: ignore[misc]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            timeout: float | None = getattr(self, "socket_timeout", None)
            if not (timeout and self.is_connected and not self.health_check_interval):
                await super().send_packed_command(command, check_health)
                return
            self.socket_timeout = None
            try:
                await super().send_packed_command(command, check_health)
            finally:
                self.socket_timeout = timeout

        def pack_command(self, *args: Any) -> list[bytes]:
            encoder = self.encoder
            if (
                pack is None
                or encoder.encoding.lower().replace("-", "") != "utf8"
                or encoder.encoding_errors != "strict"
                or not _PACKABLE.issuperset(map(type, args))
            ):
                return super().pack_command(*args)  # type: ignore[no-any-return]
            return _hiredis_packed(pack, args)

    LeanConnection.__name__ = LeanConnection.__qualname__ = "Lean" + connection_class.__name__
    return LeanConnection


@functools.cache
def _pool_class() -> type:
    """``redis.asyncio.ConnectionPool`` that *awaits* a free connection when exhausted.

    redis-py's ``BlockingConnectionPool`` does the same, but enters an ``asyncio.Condition`` and
    a timeout context on every checkout: about 10 µs per command, 20 µs per lock cycle (the
    benchmark's asyncio section). This pool takes the plain pool's path while a connection is
    free and only a caller that meets an exhausted pool waits — for a release, not on a timer —
    at most ``checkout_timeout`` seconds, then gets the pool's own "Too many connections" error.
    Not strictly FIFO: a caller arriving as a connection frees may take it before a waiter,
    which then waits again (within its deadline); no waiter is left asleep while one is free.
    """
    import collections

    from redis import asyncio as aredis

    class AwaitingConnectionPool(aredis.ConnectionPool):
        def __init__(self, *args: Any, checkout_timeout: float, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.checkout_timeout = checkout_timeout
            self._freed: collections.deque[asyncio.Future[bool]] = collections.deque()

        async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
            connection, exhausted = await self._checkout(args, kwargs)
            if connection is not None:  # the usual case: no deadline to set up
                return connection
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.checkout_timeout
            while connection is None:
                if not await self._freed_before(loop, deadline):
                    raise exhausted
                connection, exhausted = await self._checkout(args, kwargs)
            return connection

        async def _checkout(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
            """``(connection, None)``, or ``(None, error)`` when every connection is in use."""
            try:
                return await super().get_connection(*args, **kwargs), None  # type: ignore[no-untyped-call]
            except redis_errors.ConnectionError as exc:
                if not is_pool_exhausted(exc):
                    raise
                return None, exc

        async def _freed_before(self, loop: asyncio.AbstractEventLoop, deadline: float) -> bool:
            """Wait for a release (True) or the deadline (False). Not ``asyncio.wait_for``: on
            Python 3.11 it can swallow a cancellation that races with the wake-up."""
            freed: asyncio.Future[bool] = loop.create_future()
            timer = loop.call_at(deadline, _settle, freed, False)
            self._freed.append(freed)
            try:
                return await freed
            except BaseException:
                # Cancelled after a release woke us: wake the next waiter instead.
                if freed.done() and not freed.cancelled() and freed.result():
                    self._wake_one()
                raise
            finally:
                timer.cancel()
                with contextlib.suppress(ValueError):
                    self._freed.remove(freed)

        async def release(self, connection: Any) -> None:
            await super().release(connection)
            if self._freed:
                self._wake_one()

        def _wake_one(self) -> None:
            while self._freed:
                if _settle(self._freed.popleft(), True):
                    return

    return AwaitingConnectionPool


def _settle(future: asyncio.Future[bool], value: bool) -> bool:
    """Resolve ``future`` unless it already is (cancelled, or woken); True if it was."""
    if future.done():
        return False
    future.set_result(value)
    return True


class _LoopClients:
    """The asyncio clients of one event loop, closed when ``asyncio.run`` ends the loop."""

    def __init__(self) -> None:
        self.clients: dict[int, Any] = {}
        #: What scripts run through, per asyncio client: an :class:`AsyncDirectCommands` or
        #: the client itself (kept connections close with the client's pool).
        self.runners: dict[int, Any] = {}
        self.closer: AsyncGenerator[None, None] | None = None


_loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = (
    weakref.WeakKeyDictionary()
)


async def _close_at_loop_end(clients: dict[int, Any]) -> AsyncGenerator[None, None]:
    """A suspended async generator: the loop finalizes it in ``shutdown_asyncgens`` (which
    ``asyncio.run`` calls before closing the loop), and its ``finally`` closes our clients."""
    try:
        yield
    finally:
        for async_client in list(clients.values()):
            with contextlib.suppress(Exception):
                try:
                    await async_client.aclose(close_connection_pool=True)
                except TypeError:  # RedisCluster.aclose() closes its nodes' pools itself
                    await async_client.aclose()
        clients.clear()


async def async_client_for(client: Any) -> Any:
    """The ``redis.asyncio`` twin of a sync client, one per running event loop."""
    loop = asyncio.get_running_loop()
    entry = _loop_clients.get(loop)
    if entry is None:
        entry = _loop_clients[loop] = _LoopClients()
        entry.closer = _close_at_loop_end(entry.clients)
        await entry.closer.__anext__()  # registers it with the loop's async-generator hooks
    async_client = entry.clients.get(id(client))
    if async_client is None:
        async_client = entry.clients[id(client)] = make_async_client(client)
    return async_client


#: Connections a direct runner keeps between calls, at most (and at most an eighth of the pool's
#: ``max_connections``: the rest of the pool stays free for the cache's own use).
DIRECT_IDLE_MAX = 8


def _checkout_args_of(pool: Any) -> tuple[str, ...]:
    """The arguments a checkout passes ``pool.get_connection``: redis-py < 5.3 requires a
    command name (later versions warn when one is passed). A subclass that forwards
    ``*args`` (our asyncio pool) answers as the class it forwards to."""
    for cls in type(pool).__mro__:
        method = cls.__dict__.get("get_connection")
        if method is None:
            continue
        params = inspect.signature(method).parameters
        name = params.get("command_name")
        if name is None and any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            continue  # forwards its arguments: ask the class it forwards to
        return ("EVALSHA",) if name is not None and name.default is name.empty else ()
    return ()


class _KeptConnections:
    """What :class:`DirectCommands` and :class:`AsyncDirectCommands` share: the connections kept
    aside, and what an error means for the connection it happened on.

    redis-py checks a connection out of its pool and back in for every command: the sync pool
    takes its lock twice, checks the pid, polls the socket for stale data and (redis-py 8)
    records connection metrics and dispatches a release event; the asyncio pool takes an
    ``asyncio.Lock`` and reads the socket without blocking; both run the retry wrapper. That is
    about 10 µs per sync command and 20 µs per asyncio command on the benchmark machine — a fifth
    of an uncontended lock cycle. A direct runner keeps the connection it used last aside (still
    checked out of the pool, so the pool counts it) and runs the next script on it: pack, send,
    read. It stays in sync by construction: a reply is always read whole before the connection
    is kept; any other outcome disconnects it and gives it back to the pool.

    What the pool's check would have caught — a kept connection the server closed meanwhile
    (restart, ``CLIENT KILL``, idle ``timeout``) — surfaces as a ``ConnectionError`` on first use;
    the command then runs once more through the client itself, so the client's own reconnect and
    retry policy decides, as it would have. A *timeout* is not repeated: Redis may have run the
    script, and a frozen server must surface within the socket timeout.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pool = client.connection_pool
        limit = getattr(self.pool, "max_connections", None) or 2**31
        self._bound = min(DIRECT_IDLE_MAX, limit // 8)
        self._idle: list[Any] = []
        #: What a checkout passes the pool's ``get_connection``.
        self._checkout_args = _checkout_args_of(self.pool)

    def _keep(self, conn: Any) -> Any | None:
        """Keep ``conn`` for the next call; returns a connection beyond the bound, which the
        caller gives back to the pool (append first, then trim: threads need no lock)."""
        idle = self._idle
        idle.append(conn)
        if len(idle) <= self._bound:
            return None
        try:
            return idle.pop()
        except IndexError:  # another thread took one meanwhile
            return None

    def _settle(self, conn: Any | None, exc: BaseException) -> tuple[Any | None, bool]:
        """After ``exc``: ``(a connection to disconnect and give back to the pool, or None;
        run the command again through the client)``.

        An error *reply*, or an argument the packer refused, leaves the connection in sync: it
        is kept. Anything else may have left a reply unread (redis-py has already disconnected
        it for its own errors).
        """
        if conn is not None and isinstance(
            exc, (redis_errors.ResponseError, redis_errors.DataError)
        ):
            return self._keep(conn), False
        retry = isinstance(exc, redis_errors.ConnectionError) and not isinstance(
            exc, redis_errors.TimeoutError
        )
        return conn, retry


class DirectCommands(_KeptConnections):
    """Runs the engine's scripts on a plain ``redis.Redis`` with a kept connection (see
    :class:`_KeptConnections`): a client-like object with ``execute_command`` and
    ``script_load``."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        #: hiredis' ``pack_command`` when the lean round trip serves this pool (see
        #: :func:`_lean_io`), else ``None``: redis-py's methods.
        self._lean_pack = _lean_io(self.pool)

    def execute_command(self, *args: Any) -> Any:
        conn = None
        try:
            try:
                conn = self._idle.pop()
            except IndexError:  # none kept (or another thread took it): the pool's
                conn = self.pool.get_connection(*self._checkout_args)
            name, pack = args[0], self._lean_pack
            if (
                pack is not None
                and type(name) is str
                and " " not in name
                and _PACKABLE.issuperset(map(type, args))
            ):  # every script call: packed by hiredis exactly as by redis-py (see _pack)
                reply = _lean_round_trip(conn, [pack(args)])
            else:
                reply = _round_trip(conn, _pack(conn, args))
        except BaseException as exc:
            drop, retry = self._settle(conn, exc)
            if drop is not None:
                drop.disconnect()
                self.pool.release(drop)
            if not retry:
                raise
            return self.client.execute_command(*args)
        excess = self._keep(conn)
        if excess is not None:
            self.pool.release(excess)
        return reply

    def script_load(self, source: str) -> Any:
        return self.client.script_load(source)

    def close(self) -> None:
        """Give the kept connections back to the pool; keep none from now on."""
        self._bound = 0
        while self._idle:
            self.pool.release(self._idle.pop())


#: What redis-py's hiredis reader answers while a reply is incomplete: its ``NOT_ENOUGH_DATA``
#: sentinel in redis-py 5.0.8 and later, hiredis' default ``False`` in 5.0.0 to 5.0.5.
_PENDING = getattr(hiredis_parser, "NOT_ENOUGH_DATA", False)


def _round_trip(conn: Any, packed: Any) -> Any:
    """Send a packed command on ``conn`` and read its reply, as redis-py does."""
    conn.send_packed_command(packed)
    return conn.read_response()


def _lean_class(cls: type, parser_class: type | None, health_check_interval: Any) -> bool:
    """Whether connections of ``cls`` with this parser do nothing on the socket but what
    :func:`_lean_round_trip` and :func:`pubsub_reader` do: redis-py's own connection classes
    (send and read not overridden), the hiredis parser, no health checks."""
    from redis import connection as rc

    try:
        from redis._parsers.hiredis import _HiredisParser
    except ImportError:
        return False
    base = getattr(rc, "AbstractConnection", None)
    return (
        base is not None
        and getattr(rc, "HIREDIS_AVAILABLE", False)
        and cls in (rc.Connection, rc.SSLConnection, rc.UnixDomainSocketConnection)
        and cls.send_packed_command is base.send_packed_command
        and cls.read_response is base.read_response
        and (parser_class or rc.DefaultParser) is _HiredisParser
        and not health_check_interval
    )


def _lean_io(pool: Any) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis' ``pack_command`` if :func:`_lean_round_trip` may serve the connections of
    ``pool`` (else ``None``): see :func:`_lean_class`, and no custom command packer. Anything
    else keeps redis-py's methods."""
    try:
        from hiredis import pack_command
    except ImportError:
        return None
    kwargs = pool.connection_kwargs
    lean = _lean_class(
        pool.connection_class, kwargs.get("parser_class"), kwargs.get("health_check_interval")
    ) and not kwargs.get("command_packer")
    return pack_command if lean else None


#: The kind of a published message in a reply read by :func:`pubsub_reader` (bytes, or text
#: for a client with ``decode_responses``), and in redis-py's message dicts.
MESSAGE_KINDS = (b"message", "message")


def message_data(reply: Any) -> Any:
    """The data of a published message read by :func:`pubsub_reader` (or shaped like one:
    ``[kind, channel, data]``), ``None`` for any other reply (a pong, a confirmation)."""
    if isinstance(reply, list) and len(reply) == 3 and reply[0] in MESSAGE_KINDS:
        return reply[2]
    return None


def pubsub_reader(pubsub: Any) -> Callable[[float], Any] | None:
    """A function that reads the next reply of ``pubsub``'s subscribed connection straight from
    its socket into its hiredis reader, or ``None`` when the connection is not one
    :func:`_lean_class` admits: use ``get_message`` then.

    ``read(timeout)`` returns the reply as hiredis parses it (a message is ``[kind, channel,
    data]``, a RESP3 push being a list too), or ``None`` when nothing whole arrived within
    ``timeout`` seconds (a partial reply stays in the reader). It raises redis-py's
    ``ConnectionError`` when the connection is closed or fails, and an error reply as the
    exception it is. A RESP3 push that is not a message (a maintenance notice, an invalidation)
    still goes to redis-py's push handlers. Why: redis-py's ``get_message`` spends far more
    Python per message (health check, ``can_read`` poll, push dispatch, a dict per message)
    than the rest of a hand-off's wake-up, and a hand-off between processes waits on it.

    Call it only after the subscription was confirmed, from one thread. It leaves the socket's
    timeout changed; the caller disconnects the connection when done (``PubSub.reset``).
    """
    conn: Any = getattr(pubsub, "connection", None)
    parser: Any = getattr(conn, "_parser", None)
    if conn is None or not _lean_class(
        type(conn), type(parser), getattr(conn, "health_check_interval", 0)
    ):
        return None
    buffer = getattr(parser, "_buffer", None)
    if getattr(parser, "_reader", None) is None or buffer is None or conn._sock is None:
        return None
    pending = _PENDING
    push_type: Any = getattr(parser, "_hiredis_PushNotificationType", None)
    on_push: Any = getattr(parser, "handle_push_response", None) if push_type else None
    kinds = MESSAGE_KINDS

    def read(timeout: float) -> Any:
        # Socket and reader are looked up each time: a reconnect replaces both.
        sock, reader = conn._sock, parser._reader
        if sock is None or reader is None:
            raise redis_errors.ConnectionError("Connection closed.")
        reply: Any = reader.gets()
        if reply is pending:
            try:
                if sock.gettimeout() != timeout:  # no system call, unlike settimeout
                    sock.settimeout(timeout)
                while reply is pending:
                    size = sock.recv_into(buffer)
                    if not size:
                        raise redis_errors.ConnectionError("Connection closed by server.")
                    reader.feed(buffer, 0, size)
                    reply = reader.gets()
            except TimeoutError:  # socket.timeout: nothing whole yet
                return None
            except OSError as exc:
                raise redis_errors.ConnectionError(
                    f"Error while reading from {conn._host_error()} : {exc.args}"
                ) from None
        if type(reply) is not list:  # RESP2 messages are plain lists: nothing more to do
            if isinstance(reply, redis_errors.RedisError):
                raise reply
            if on_push is not None and type(reply) is push_type and reply[0] not in kinds:
                on_push(reply)
        return reply

    return read


def _lean_round_trip(conn: Any, packed: list[bytes]) -> Any:
    """:func:`_round_trip` straight on the socket and the hiredis reader.

    redis-py's ``send_packed_command`` and ``read_response`` wrap these same calls in four
    layers of Python (health check, host string, timeout juggling, push handling): a third of
    the client-side bytecode of a lock cycle, paid twice per cycle. For the connections
    :func:`_lean_io` admits, on a connected socket, they do nothing else; so this sends, then
    reads and feeds the reader until it has a whole reply, and fails as they fail — the same
    exception classes and messages, the connection disconnected on every error but an error
    reply. A disconnected connection goes through redis-py's methods, which reconnect it.

    Nothing is ever buffered ahead: the pool hands out a connection only after its ``can_read``
    check found no data (and redis-py < 8 kept none in the parser's ``_next_response``), and a
    kept connection always had its last reply read whole.
    """
    parser = conn._parser
    sock = conn._sock
    reader = parser._reader
    if sock is None or reader is None:
        return _round_trip(conn, packed)
    sent = False
    try:
        for item in packed:
            sock.sendall(item)
        sent = True
        buffer = parser._buffer
        while True:  # the reader holds nothing yet (see above): read first
            size = sock.recv_into(buffer)
            if not size:
                raise redis_errors.ConnectionError("Connection closed by server.")
            reader.feed(buffer, 0, size)
            reply = reader.gets()
            if reply is not _PENDING:
                break
    except TimeoutError:  # socket.timeout
        conn.disconnect()
        if not sent:
            raise redis_errors.TimeoutError("Timeout writing to socket") from None
        raise redis_errors.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
    except OSError as exc:
        conn.disconnect()
        if not sent:
            errno, message = exc.args if len(exc.args) == 2 else ("UNKNOWN", exc)
            raise redis_errors.ConnectionError(
                f"Error {errno} while writing to socket. {message}."
            ) from None
        raise redis_errors.ConnectionError(
            f"Error while reading from {conn._host_error()} : {exc.args}"
        ) from None
    except BaseException:
        conn.disconnect()
        raise
    if isinstance(reply, redis_errors.RedisError):  # an error reply
        if isinstance(reply, redis_errors.ConnectionError):  # LOADING and the like
            conn.disconnect()
        raise reply
    if type(reply) is list and reply and isinstance(reply[0], redis_errors.ConnectionError):
        conn.disconnect()
        raise reply[0]
    return reply


class AsyncDirectCommands(_KeptConnections):
    """:class:`DirectCommands` for the ``redis.asyncio`` twin of a plain client, one per event
    loop (its connections are closed with the loop's client)."""

    async def execute_command(self, *args: Any) -> Any:
        conn = None
        try:
            # One loop, no await before the pop: no other task can take it in between.
            conn = (
                self._idle.pop()
                if self._idle
                else await self.pool.get_connection(*self._checkout_args)
            )
            await conn.send_packed_command(conn.pack_command(*args))
            reply = await conn.read_response()
        except BaseException as exc:
            drop, retry = self._settle(conn, exc)
            if drop is not None:
                await drop.disconnect(nowait=True)
                await self.pool.release(drop)
            if not retry:
                raise
            return await self.client.execute_command(*args)
        excess = self._keep(conn)
        if excess is not None:
            await self.pool.release(excess)
        return reply

    async def script_load(self, source: str) -> Any:
        return await self.client.script_load(source)


def direct_eligible(client: Any) -> bool:
    """Whether scripts for ``client`` may run on kept connections.

    Not for a Cluster or Sentinel client (a pool that may move to another server), a
    single-connection client, client-side caching, or RESP3 (push messages may arrive between
    commands): those keep redis-py's own path.
    """
    import redis
    from redis.connection import BlockingConnectionPool, ConnectionPool

    pool: Any = getattr(client, "connection_pool", None)
    return (
        type(client) is redis.Redis
        and getattr(client, "connection", None) is None
        and type(pool) in (ConnectionPool, BlockingConnectionPool)
        and getattr(pool, "cache", None) is None
        and str(pool.connection_kwargs.get("protocol") or 2) == "2"
        and (getattr(pool, "max_connections", None) or 2**31) >= 8  # room to keep one
    )


_direct: dict[int, DirectCommands] = {}


def command_runner(client: Any) -> Any:
    """What the engine runs its scripts through: a :class:`DirectCommands` in front of
    ``client`` when :func:`direct_eligible`, else the client itself."""
    pool = getattr(client, "connection_pool", None)
    found = _direct.get(id(pool))
    if found is not None and found.pool is pool:
        return found
    if not direct_eligible(client):
        return client
    with _mutex:  # one per pool: django-redis shares a pool between aliases of one URL
        runner = _direct.get(id(pool))
        if runner is None or runner.pool is not pool:
            runner = _direct[id(pool)] = DirectCommands(client)
    return runner


def _close_direct() -> None:
    with _mutex:
        runners = list(_direct.values())
        _direct.clear()
    for runner in runners:
        runner.close()


def _forget_direct_in_child() -> None:
    # The parent's sockets are not ours: drop them unused (the pool resets itself on its pid),
    # also from runners something still refers to (a lock object made before the fork).
    for runner in _direct.values():
        runner._idle = []
    _direct.clear()


os.register_at_fork(after_in_child=_forget_direct_in_child)


#: (loop, sync client, runner) of the last :func:`async_runner_for`: most processes run one loop
#: on one client, and a lookup through the loop's weak mapping costs a microsecond per command.
_last_runner: tuple[Any, Any, Any] = (None, None, None)


def cached_async_runner(client: Any) -> Any | None:
    """The runner of :func:`async_runner_for` if it was the last one asked for (in this loop)."""
    loop, last_client, runner = _last_runner
    if last_client is client and loop is asyncio.get_running_loop():
        return runner
    return None


async def async_runner_for(client: Any) -> Any:
    """What an asyncio face runs its scripts through, for the sync ``client``: the asyncio
    twin, behind an :class:`AsyncDirectCommands` when :func:`direct_eligible`."""
    global _last_runner
    async_client = await async_client_for(client)
    loop = asyncio.get_running_loop()
    runners = _loop_clients[loop].runners
    runner = runners.get(id(async_client))
    if runner is None:
        runner = AsyncDirectCommands(async_client) if direct_eligible(client) else async_client
        runners[id(async_client)] = runner
    _last_runner = (loop, client, runner)
    return runner


def backend_error(exc: redis_errors.RedisError, action: str) -> LockBackendError:
    """The :class:`LockBackendError` a redis-py error while trying to ``action`` becomes (raise
    it ``from exc``); messages say what to check next."""
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        if is_pool_exhausted(exc):
            return LockBackendError(
                f"No Redis connection was free while trying to {action}: the connection pool is "
                f"exhausted ({exc}). Raise the pool's max_connections (CACHES OPTIONS) or use "
                "fewer threads; the lock was not taken or changed by this call."
            )
        return LockBackendError(
            f"Redis is unreachable while trying to {action}: {exc}. Check the CACHES LOCATION "
            "and that the server is up; the lock was not taken or changed by this call."
        )
    return LockBackendError(f"Redis answered an error while trying to {action}: {exc}")


@contextlib.contextmanager
def backend_errors(action: str) -> Iterator[None]:
    """Turn redis-py connection/timeout/server errors into :class:`LockBackendError`.

    The redis-py error stays available as ``__cause__``. (The engine's hot path catches and calls
    :func:`backend_error` itself: a context manager costs a microsecond per call.)
    """
    try:
        yield
    except redis_errors.RedisError as exc:
        raise backend_error(exc, action) from exc
