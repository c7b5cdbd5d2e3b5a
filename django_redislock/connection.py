"""Which redis-py client a lock uses, built from settings through public APIs only.

The connection comes from a ``CACHES`` alias so a project configures Redis once: django-redis
(through ``get_redis_connection``, so Sentinel and replication setups work), Django's built-in
``RedisCache`` (a client of Django's own ``RedisCacheClient`` built from the same ``LOCATION`` and
``OPTIONS``, with a pool of its own), or ``REDISLOCK["CLIENT"]``. This module builds clients and
answers questions about them (cluster? socket timeout?); it keeps nothing: the one client per
alias and process is kept by :mod:`django_redislock.runtime`, and commands are sent by
:mod:`django_redislock.transport` (scripts) and :mod:`django_redislock.client` (everything else).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from redis import exceptions as redis_errors

from django_redislock.conf import get_settings, suggest
from django_redislock.exceptions import LockBackendError

logger = logging.getLogger("django_redislock")

__all__ = [
    "BUILTIN_BACKEND",
    "CLIENT_ALIAS",
    "DJANGO_REDIS_BACKEND",
    "backend_kind",
    "build_client",
    "configured_socket_timeout",
    "is_cluster",
    "is_pool_exhausted",
    "make_async_client",
    "options_problems",
    "resolve_alias",
    "shared_cache_aliases",
    "socket_timeout",
]

DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
BUILTIN_BACKEND = "django.core.cache.backends.redis.RedisCache"
#: The alias under which the client of ``REDISLOCK["CLIENT"]`` is known (it is no cache).
CLIENT_ALIAS = "<REDISLOCK['CLIENT']>"

# redis-py >= 5.1 raises this subclass of ConnectionError when a pool has no connection left.
_POOL_EXHAUSTED: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(redis_errors, "MaxConnectionsError", None),) if e is not None
)


#: What ``RedisCluster`` raises when it reaches no node at all (not a ``RedisError``).
_CLUSTER_UNREACHABLE: type[Exception] = getattr(
    redis_errors, "RedisClusterException", redis_errors.RedisError
)


def is_pool_exhausted(exc: BaseException | None) -> bool:
    """True for the error redis-py raises when its connection pool has no connection left."""
    if exc is None:
        return False
    if _POOL_EXHAUSTED and isinstance(exc, _POOL_EXHAUSTED):
        return True
    # A BlockingConnectionPool that waited its timeout in vain says "No connection available."
    text = str(exc)
    return isinstance(exc, redis_errors.ConnectionError) and (
        "Too many connections" in text or "No connection available" in text
    )


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (``PUBLISH`` there counts only one node's subscribers)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def backend_kind(backend: object) -> str | None:
    """``"django-redis"``, ``"builtin"`` or ``None`` (not Redis-backed) for a ``BACKEND`` value.

    The one place that decides "is this cache Redis?", by class (subclasses count), for both the
    system checks (which see only settings) and :func:`build_client`.
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
        factory = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"django_redislock.E011: REDISLOCK['CLIENT'] = {path!r} cannot be imported: {exc}"
        ) from exc
    try:
        client = factory()
    except (redis_errors.RedisError, _CLUSTER_UNREACHABLE) as exc:
        # RedisCluster connects in its constructor (and raises RedisClusterException, which
        # is no RedisError): Redis being down is a LockBackendError, as everywhere.
        said = " ".join(str(exc).split()).rstrip(".")
        raise LockBackendError(
            f"REDISLOCK['CLIENT'] = {path!r} could not connect to Redis: {said}. Check that the "
            "servers it names are up and reachable."
        ) from exc
    if not callable(getattr(client, "evalsha", None)):
        raise ImproperlyConfigured(
            f"django_redislock.E011: REDISLOCK['CLIENT'] = {path!r} returned {client!r}, not a "
            "redis-py client (Redis, RedisCluster or a Sentinel master_for() client)."
        )
    return client


def build_client(alias: str) -> Any:
    """A new redis-py client for an alias (see :func:`resolve_alias`); the caller keeps it.

    Django's own ``RedisCache`` keeps its client behind a private attribute, and its cache
    objects live per thread (each with its own pool): so the locks build one client of Django's
    ``RedisCacheClient`` from the same ``LOCATION`` and ``OPTIONS``, as ``RedisCache`` does, with
    a pool of its own whose ``max_connections`` is honoured per process.
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if alias == CLIENT_ALIAS:
        return _client_from_setting(str(get_settings().client))
    configs: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {})
    config = configs.get(alias)
    if config is None:
        raise ImproperlyConfigured(
            f"django_redislock.E001: CACHES has no alias {alias!r} (REDISLOCK['CACHE'] or "
            f"using=). Defined aliases: {', '.join(configs) or 'none'}."
        )
    kind = backend_kind(config.get("BACKEND"))
    if kind is None:
        raise ImproperlyConfigured(
            f"django_redislock.E009: CACHES[{alias!r}] uses {config.get('BACKEND')!r}, which is "
            "not Redis-backed. Use django_redis.cache.RedisCache or "
            "django.core.cache.backends.redis.RedisCache."
        )
    for ident, message, hint in options_problems(alias, config):
        if ident.startswith("E"):  # redis-py would raise TypeError deep inside the first call
            raise ImproperlyConfigured(f"django_redislock.{ident}: {message} {hint}")
        logger.warning("django_redislock.%s: %s %s", ident, message, hint)
    if kind == "builtin":
        from django.core.cache.backends.redis import RedisCacheClient

        location = config.get("LOCATION") or ""
        servers = re.split("[;,]", location) if isinstance(location, str) else list(location)
        try:
            return RedisCacheClient(servers, **(config.get("OPTIONS") or {})).get_client(write=True)
        except TypeError as exc:
            raise ImproperlyConfigured(
                f"django_redislock.E010: CACHES[{alias!r}]['OPTIONS'] has a key redis-py does not "
                f"accept: {str(exc).rstrip('.')}. Django's RedisCache passes OPTIONS to redis-py "
                "as keyword arguments (lower case: socket_timeout, not SOCKET_TIMEOUT)."
            ) from exc
    from django_redis import get_redis_connection

    return get_redis_connection(alias, write=True)


# -- OPTIONS keys each backend accepts ---------------------------------------------------------

#: The ``OPTIONS`` keys django-redis reads (its documented ones, django-redis 5 to 7): it ignores
#: any other key, so a typo there silently drops the setting (a timeout, a password ...).
DJANGO_REDIS_OPTIONS = frozenset(
    {
        "CLIENT_CLASS", "SERIALIZER", "COMPRESSOR", "PICKLE_VERSION", "SOCKET_TIMEOUT",
        "SOCKET_CONNECT_TIMEOUT", "IGNORE_EXCEPTIONS", "CLOSE_CONNECTION", "CONNECTION_FACTORY",
        "CONNECTION_POOL_CLASS", "CONNECTION_POOL_KWARGS", "REDIS_CLIENT_CLASS",
        "REDIS_CLIENT_KWARGS", "PARSER_CLASS", "PASSWORD", "USERNAME", "SENTINELS",
        "SENTINEL_KWARGS", "REPLICA_READ_ONLY", "DB",
    }
)  # fmt: skip
#: Keywords of Django's ``RedisCacheClient`` itself (the rest of OPTIONS goes to redis-py).
_DJANGO_CLIENT_OPTIONS = frozenset({"serializer", "pool_class", "parser_class"})


def _init_keywords(classes: Iterable[Any]) -> set[str]:
    """Every named parameter of the ``__init__`` methods of ``classes`` and their bases (a
    connection passes ``**kwargs`` on to its base class), found by public introspection."""
    names: set[str] = set()
    for cls in classes:
        for klass in inspect.getmro(cls) if isinstance(cls, type) else ():
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            try:
                parameters = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):
                continue
            names.update(
                p.name
                for p in parameters
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
            )
    return names


@functools.lru_cache(maxsize=8)
def _redis_py_keywords(pool_class: Any = None) -> frozenset[str]:
    """What redis-py accepts as connection-pool keywords: the pools' own (``max_connections``,
    ``timeout`` ...) and those of every connection class a URL can choose (TCP, TLS, unix)."""
    from redis import connection

    classes: list[Any] = [
        connection.ConnectionPool,
        connection.BlockingConnectionPool,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
    ]
    if pool_class is not None:
        classes.append(pool_class)
    return frozenset(_init_keywords(classes))


def _unknown(keys: Iterable[object], known: Iterable[str]) -> list[str]:
    """``'KEY' (did you mean 'key'?)`` for every key not in ``known``."""
    known = list(known)
    found = []
    for key in keys:
        if key in known:
            continue
        match = suggest(key, known)
        found.append(f"{key!r} (did you mean {match!r}?)" if match else repr(key))
    return found


def options_problems(alias: str, config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(id, message, hint)`` for every ``OPTIONS`` key the alias's backend does not accept.

    Shared by the system checks and :func:`build_client` (first use, where checks do not run:
    a shell, a Celery worker, an ASGI app), so both say the same. ``E010``: a key that reaches
    redis-py as a keyword it does not take (Django's ``RedisCache`` OPTIONS, django-redis's
    ``CONNECTION_POOL_KWARGS``): the first connection would raise ``TypeError``. ``W006``: an
    OPTIONS key django-redis does not read (ignored, so the setting it meant does not apply);
    not checked when ``CLIENT_CLASS`` is a client of another package, which may read its own.
    """
    options = config.get("OPTIONS") or {}
    if not isinstance(options, dict):
        return []
    kind = backend_kind(config.get("BACKEND"))
    problems: list[tuple[str, str, str]] = []
    if kind == "builtin":
        pool_class = options.get("pool_class")
        if isinstance(pool_class, str):
            from django.utils.module_loading import import_string

            try:
                pool_class = import_string(pool_class)
            except ImportError:
                pool_class = None
        known = _redis_py_keywords(pool_class if isinstance(pool_class, type) else None)
        unknown = _unknown(options, known | _DJANGO_CLIENT_OPTIONS)
        if unknown:
            problems.append(
                (
                    "E010",
                    f"CACHES[{alias!r}]['OPTIONS'] (Django's RedisCache) has "
                    f"{', '.join(unknown)}, which redis-py does not accept: Django passes OPTIONS "
                    "to redis-py as keyword arguments, so the first cache or lock call would fail "
                    "with a TypeError.",
                    "Spell them as redis-py does, in lower case: "
                    "OPTIONS = {'socket_connect_timeout': 2, 'socket_timeout': 5}.",
                )
            )
    elif kind == "django-redis":
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
        unknown = (
            _unknown(pool_kwargs, _redis_py_keywords()) if isinstance(pool_kwargs, dict) else []
        )
        if unknown:
            problems.append(
                (
                    "E010",
                    f"CACHES[{alias!r}]['OPTIONS']['CONNECTION_POOL_KWARGS'] has "
                    f"{', '.join(unknown)}, which redis-py does not accept: the first cache or "
                    "lock call would fail with a TypeError.",
                    "CONNECTION_POOL_KWARGS takes redis-py's connection-pool keywords, in lower "
                    "case: {'max_connections': 50}.",
                )
            )
        client_class = options.get("CLIENT_CLASS")
        if client_class is None or str(client_class).startswith("django_redis."):
            lower_timeouts = {"socket_timeout", "socket_connect_timeout"}  # W002 says it
            keys = [k for k in options if k not in lower_timeouts]
            unknown = _unknown(keys, sorted(DJANGO_REDIS_OPTIONS))
            if unknown:
                pool_keys = [k for k in keys if k in _redis_py_keywords()]
                hint = (
                    f"redis-py's keywords ({', '.join(map(repr, pool_keys))}) go in "
                    "OPTIONS['CONNECTION_POOL_KWARGS']; "
                    if pool_keys
                    else ""
                )
                problems.append(
                    (
                        "W006",
                        f"CACHES[{alias!r}]['OPTIONS'] (django-redis) has {', '.join(unknown)}, "
                        "which django-redis does not read: the setting is ignored.",
                        f"{hint}django-redis spells its options in upper case "
                        "(SOCKET_TIMEOUT, CONNECTION_POOL_KWARGS ...). With a CLIENT_CLASS of "
                        "your own that reads it, silence this with SILENCED_SYSTEM_CHECKS.",
                    )
                )
    return problems


# -- locks sharing a database with a cache -------------------------------------------------------


def _server_and_db(config: dict[str, Any]) -> tuple[str, int] | None:
    """``("host:port" or socket path, db)`` a ``CACHES`` entry writes to (its first LOCATION),
    or ``None`` when that cannot be told from the settings."""
    location = config.get("LOCATION")
    if isinstance(location, (list, tuple)):
        location = location[0] if location else None
    if not isinstance(location, str) or not location:
        return None
    first = re.split("[;,]", location)[0].strip()
    try:
        parts = urlsplit(first if "://" in first else f"redis://{first}")
        port = parts.port
    except ValueError:
        return None
    query = parse_qs(parts.query)
    options = config.get("OPTIONS") or {}
    db_text = (query.get("db") or [""])[0] or parts.path.strip("/")
    if not db_text and isinstance(options, dict):
        db_text = str(options.get("db", options.get("DB", "")) or "")
    try:
        db = int(db_text or 0)
    except ValueError:
        return None
    if parts.scheme == "unix":
        return (f"unix:{parts.path}", db)
    host = (parts.hostname or "").lower()
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    return (f"{host}:{port or 6379}", db)


def shared_cache_aliases(alias: str) -> list[str]:
    """The ``CACHES`` aliases whose ``cache.clear()`` would drop the locks of ``alias``.

    ``alias`` itself when it is ``"default"`` (Django's default cache: sessions, the cache
    framework and ``cache.clear()`` calls use it), and every other Redis-backed alias that writes
    to the same server and database (``clear()`` is ``FLUSHDB``, whatever the key prefix). Read
    from settings alone; check ``W005`` and the text of ``LockLostError`` use it.
    """
    from django.conf import settings

    caches: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {}) or {}
    config = caches.get(alias)
    if not isinstance(config, dict):
        return []
    shared = [alias] if alias == "default" else []
    where = _server_and_db(config)
    if where is None:
        return shared
    for other, other_config in caches.items():
        if other == alias or not isinstance(other_config, dict):
            continue
        if backend_kind(other_config.get("BACKEND")) and _server_and_db(other_config) == where:
            shared.append(other)
    return shared


def _connection_kwargs(client: Any) -> dict[str, Any]:
    get_kwargs = getattr(client, "get_connection_kwargs", None)  # redis-py's public accessor
    if callable(get_kwargs):
        return dict(get_kwargs())
    pool = getattr(client, "connection_pool", None)
    return dict(getattr(pool, "connection_kwargs", None) or {})


def socket_timeout(client: Any) -> float | None:
    """The read timeout the client's connections really apply, in seconds (``None``: none).

    Not just the configured keyword: redis-py 8 applies a default of 5 s that appears nowhere
    in the settings. Asked of a connection object, which is not connected by being created.
    """
    kwargs = _connection_kwargs(client)
    if "socket_timeout" in kwargs:
        value = kwargs["socket_timeout"]
    else:
        pool = getattr(client, "connection_pool", None)
        connection_class = getattr(pool, "connection_class", None)
        value = _default_socket_timeout(connection_class)
    return float(value) if value else None


def _default_socket_timeout(connection_class: Any = None) -> Any:
    """The ``socket_timeout`` a connection gets when none is passed (redis-py 8: 5 s)."""
    from redis.connection import Connection

    try:
        return (connection_class or Connection)().socket_timeout
    except Exception:  # a connection class that needs arguments: ask redis-py's own
        return Connection().socket_timeout  # type: ignore[no-untyped-call]


def configured_socket_timeout(config: dict[str, Any]) -> float | None:
    """The socket timeout a ``CACHES`` entry will give its connections, from settings alone.

    For the system checks, which must not connect. Each backend has its own spelling:
    django-redis reads ``OPTIONS["SOCKET_TIMEOUT"]`` (or ``CONNECTION_POOL_KWARGS``), Django's
    ``RedisCache`` passes ``OPTIONS`` to redis-py as keyword arguments (``socket_timeout``).
    Unset, redis-py's own default applies (5 s since redis-py 8, none before).
    """
    options = config.get("OPTIONS") or {}
    kind = backend_kind(config.get("BACKEND"))
    if kind == "django-redis":
        value = options.get("SOCKET_TIMEOUT")
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
        if not value and "socket_timeout" in pool_kwargs:
            value = pool_kwargs["socket_timeout"]
        elif not value:
            value = _default_socket_timeout()
    elif "socket_timeout" in options:
        value = options["socket_timeout"]
    else:
        value = _default_socket_timeout()
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


def make_async_client(client: Any, *, read_timeout: bool = True) -> Any:
    """A ``redis.asyncio`` client for the same server(s) as the sync ``client``.

    With ``read_timeout=False`` its connections apply no socket timeout to sends and reads: the
    caller bounds each call itself (see :mod:`django_redislock.transport`: redis-py sends under
    ``asyncio.wait_for``, which on Python 3.10 and 3.11 loses a cancellation that races with
    the send's completion). Connecting keeps its own timeout.

    Built from what the sync client's pool really uses (the ``CACHES`` LOCATION and OPTIONS as
    django-redis or Django turned them into a pool): host/port/db or unix socket, credentials,
    timeouts, TLS, and Sentinel (the same sentinels and service). The caller keeps one per event
    loop: asyncio connections cannot be shared between loops. Its pool *waits* for a free
    connection (up to the socket timeout) instead of failing when thousands of tasks share it.
    """
    import redis.asyncio as aredis
    from redis.asyncio import connection as aconnection
    from redis.sentinel import SentinelConnectionPool

    if is_cluster(client):
        from redis.asyncio.cluster import ClusterNode
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        kwargs = _portable(_connection_kwargs(client))
        for key in ("host", "port", "db", "path"):
            kwargs.pop(key, None)
        if not read_timeout:
            kwargs["socket_timeout"] = None
        nodes = [ClusterNode(node.host, node.port) for node in client.get_nodes()]
        return AsyncRedisCluster(startup_nodes=nodes, **kwargs)
    pool = client.connection_pool
    kwargs = _portable(dict(pool.connection_kwargs))
    checkout_timeout = socket_timeout(client) or 20
    if not read_timeout:
        kwargs["socket_timeout"] = None
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
    # redis-py 8's asyncio pool skips its health check of a pooled connection (one the server
    # closed, e.g. CLIENT KILL, is handed out as is) while maintenance notifications are "auto";
    # the twin turns them off (they are for Redis Enterprise / Cloud endpoint moves).
    # redis-py 7 has the feature for sync connections only: ask the asyncio class what it takes.
    takes = inspect.signature(aconnection.AbstractConnection.__init__).parameters
    if "maint_notifications_config" in takes:
        from redis.maint_notifications import MaintNotificationsConfig

        kwargs["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    async_pool = aredis.BlockingConnectionPool(
        connection_class=connection_class,
        max_connections=max_connections or 100,
        timeout=checkout_timeout,
        **kwargs,
    )
    return aredis.Redis(connection_pool=async_pool)
