"""The one seam between the lock engine and Redis: running a script, and subscribing.

Everything the engine sends goes through a :class:`Transport` (the rest of the package's reads
and statistics pipelines are in :mod:`django_redislock.client`). The default,
:class:`RedisPyTransport`, uses redis-py's public API only: ``evalsha`` and ``script_load`` on
the client (so redis-py's own retry, health checks, metrics and instrumentation such as
OpenTelemetry's all see every lock command), pipelines, ``pubsub()``, and an asyncio twin of the
client per running event loop. It also decides, once, whether wake-ups on a Cluster go by
sharded Pub/Sub (:attr:`RedisPyTransport.sharded`), and prepares the wake-up listeners' own
connections (:meth:`RedisPyTransport.pubsub`).

What a failure means is decided here, once, for every face:

- **not sent** (the pool had no free connection, a Cluster could not be reached at all): the
  command never left the process, so :meth:`Transport.run` waits for a free connection and
  sends it; anything else becomes a plain :class:`~django_redislock.LockBackendError`;
- **an error reply**: Redis answered; :class:`~django_redislock.LockBackendError`;
- **no reply** (a timeout, a connection lost after the command may have been sent): the outcome
  is unknown. :class:`NoReply` says so, and whether the connection was lost (``lost``) rather
  than timed out. An acquisition's call whose connection was lost is resent once on a fresh
  connection (:mod:`django_redislock.drivers`): the scripts are idempotent per attempt id, so
  the resend finds what the first call did and adds nothing. Anything else is not resent; the
  engine cancels the attempt by its id (see :mod:`django_redislock.flow`). redis-py itself may
  resend a command (its ``Retry``, when the client has one): for the same reason that never
  adds a hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis import Redis
from redis import exceptions as redis_errors

from django_redislock import client as redis_client
from django_redislock import connection
from django_redislock.exceptions import LockBackendError
from django_redislock.scripts import LIBRARY, Script
from django_redislock.wakeups import DEFAULT_REPLY_TIMEOUT

__all__ = [
    "Acks",
    "NoReply",
    "RedisPyTransport",
    "Transport",
    "backend_error",
    "backend_errors",
]

#: Seconds a command keeps waiting for a free connection of an exhausted pool (threads beyond
#: ``max_connections``): one frees within moments, and nothing was sent meanwhile.
POOL_RETRY_BUDGET = 10.0
#: Seconds a script keeps being retried through a Cluster slot migration or failover.
MIGRATION_RETRY_BUDGET = 5.0

#: Answers of a Cluster whose slot is being migrated or failed over (``TRYAGAIN`` for a script
#: whose keys are split between two nodes, redirect loops, ``CLUSTERDOWN``): the script did not
#: run, and they end by themselves within moments, so they are retried rather than reported.
_MIGRATING: tuple[type[Exception], ...] = (redis_errors.TryAgainError, redis_errors.ClusterError)


def _cluster_exception() -> type[Exception]:
    return getattr(redis_errors, "RedisClusterException", redis_errors.RedisError)


@dataclass(frozen=True)
class Acks:
    """What ``WAIT`` / ``WAITAOF`` after a script answered: replicas that have the write, and
    whether the primary (``aof_local``) and how many replicas (``aof_replicas``) fsynced it to
    their append-only files. ``error``: the server refused the command (``WAITAOF`` before Redis
    7.2, or with ``appendonly no``), which counts as no acknowledgement."""

    replicas: int = 0
    aof_local: int = 0
    aof_replicas: int = 0
    error: str = ""

    def shortfall(self, replicas: int, aof_local: int, aof_replicas: int) -> str:
        """What is missing of what was asked, in words ("" when nothing is)."""
        missing = []
        if self.error:
            missing.append(f"the server refused to wait ({self.error})")
        if self.replicas < replicas:
            missing.append(f"{self.replicas} of the {replicas} replicas asked for acknowledged it")
        if self.aof_local < aof_local:
            missing.append("the primary had not fsynced it to its append-only file")
        if self.aof_replicas < aof_replicas:
            missing.append(
                f"{self.aof_replicas} of {aof_replicas} replicas fsynced it to their "
                "append-only files"
            )
        return "; ".join(missing)


class NoReply(LockBackendError):
    """A command may have reached Redis, but no reply came (timeout, connection lost): the
    outcome is unknown. The engine turns it into :class:`~django_redislock.LockOutcomeUnknown`
    with what it knows about the attempt."""

    def __init__(self, message: str, *, lost: bool = False) -> None:
        super().__init__(message)
        #: The connection was closed or reset (not a timeout): a resend goes on a new one, and
        #: an unreachable server refuses it at once rather than after another socket timeout.
        self.lost = lost


def backend_error(exc: BaseException, action: str) -> LockBackendError:
    """The :class:`LockBackendError` a redis-py error while trying to ``action`` becomes (raise
    it ``from exc``); messages say only what is known, and what to check next."""
    said = str(exc).rstrip(".")
    if connection.is_pool_exhausted(exc):
        return LockBackendError(
            f"No Redis connection was free while trying to {action}: the connection pool is "
            f"exhausted ({said}). Raise the pool's max_connections (CACHES OPTIONS) or use fewer "
            "threads. Nothing was sent."
        )
    if isinstance(exc, redis_errors.BusyLoadingError):
        return LockBackendError(
            f"Redis is loading its data set and refused to {action} ({said}); try again shortly. "
            "Nothing was changed."
        )
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        return NoReply(
            f"Redis did not answer while trying to {action}: {said}. Check the CACHES LOCATION "
            "and that the server is up.",
            lost=not isinstance(exc, redis_errors.TimeoutError),
        )
    if isinstance(exc, redis_errors.ResponseError):
        text = str(exc)
        if text.startswith(("MOVED", "ASK", "CROSSSLOT")) or "hash to the same slot" in text:
            return LockBackendError(
                f"Redis answered {text!r} while trying to {action}: the server is a Redis "
                "Cluster node, which a plain client cannot use for locks. Set "
                "REDISLOCK['CLIENT'] to the dotted path of a function returning a "
                "redis.cluster.RedisCluster."
            )
        return LockBackendError(f"Redis answered an error while trying to {action}: {said}.")
    if isinstance(exc, _cluster_exception()):
        return LockBackendError(
            f"The Redis Cluster could not be reached while trying to {action}: {said}. Check "
            "the cluster's nodes and REDISLOCK['CLIENT']. Nothing was sent."
        )
    return NoReply(f"Redis failed while trying to {action}: {said}.")


def _acks(waits: list[Any], waited: bool) -> Acks:
    """``WAIT``'s and ``WAITAOF``'s answers (each only if sent) as :class:`Acks`; an error
    reply counts as nothing acknowledged (a connection error is raised: outcome unknown)."""
    replicas, aof_local, aof_replicas, error = 0, 0, 0, ""
    for i, answer in enumerate(waits):
        if isinstance(answer, redis_errors.ResponseError):
            error = str(answer)
        elif isinstance(answer, Exception):
            raise answer
        elif i == 0 and waited:
            replicas = int(answer)
        else:
            aof_local, aof_replicas = (int(n) for n in answer)
    return Acks(replicas, aof_local, aof_replicas, error)


def _is_redis_error(exc: BaseException) -> bool:
    return isinstance(exc, (redis_errors.RedisError, _cluster_exception()))


@contextlib.contextmanager
def backend_errors(action: str) -> Iterator[None]:
    """Turn redis-py errors into :class:`LockBackendError` (the redis-py error stays available as
    ``__cause__``)."""
    try:
        yield
    except Exception as exc:
        if not _is_redis_error(exc):
            raise
        raise backend_error(exc, action) from exc


class Transport(Protocol):
    """How the engine reaches one Redis deployment (a server, a Sentinel service, a Cluster)."""

    #: The sync redis-py client, for :mod:`django_redislock.client` reads and statistics.
    client: Any
    #: True when ``PUBLISH`` there counts only one node's subscribers (a Cluster).
    cluster: bool

    @property
    def sharded(self) -> bool:
        """Whether wake-ups go by sharded Pub/Sub (a Cluster whose servers have it)."""

    def run(self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str) -> Any:
        """Run ``script`` once; redis-py errors become :class:`LockBackendError` (or
        :class:`NoReply`)."""

    def run_waited(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        replicas: int,
        timeout_ms: int,
        action: str,
        aof: tuple[int, int] = (0, 0),
    ) -> tuple[Any, Acks]:
        """Run ``script``, then ``WAIT`` (``replicas``) and ``WAITAOF`` (``aof``: local,
        replicas) on the same connection, in one round trip: ``(reply, what was
        acknowledged)``."""

    def run_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run many calls of one script in one round trip; each result or its exception."""

    async def arun(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str
    ) -> Any:
        """:meth:`run` for asyncio code (a client of the running loop)."""

    def pubsub(self, node: Any = None) -> Any:
        """A redis-py ``PubSub`` on a connection of its own for a wake-up listener (with
        ``node``: that Cluster node's, for its shard channels)."""

    def shard_node(self, channel: str) -> Any:
        """The Cluster node (primary) serving ``channel``'s slot, as the client knows it."""

    def refresh_topology(self) -> None:
        """Ask the Cluster again where its slots live (after a node was lost)."""

    def close(self) -> None:
        """Forget the asyncio clients of other loops (settings changed, or the process forked)."""


class RedisPyTransport:
    """The default :class:`Transport`: redis-py's public API, nothing else."""

    def __init__(self, client: Any, *, functions: bool = True) -> None:
        self.client = client
        self.cluster = connection.is_cluster(client)
        self._sharded: bool | None = None if self.cluster else False
        #: Functions or EVALSHA (``REDISLOCK["FUNCTIONS"]``, and what the server has).
        self.scripts = _Scripts(client, functions)
        self.socket_timeout = connection.socket_timeout(client)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        self._mutex = threading.Lock()
        # (node, sha) known loaded: a WAIT after a NOSCRIPT would cost a whole REPLICAS_TIMEOUT.
        self._loaded_for_wait: set[tuple[int, str]] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.client!r}>"

    def _caller(self) -> Any:
        """The client a single call goes through: the shared one (a connection from its pool
        per call)."""
        return self.client

    # -- sync --------------------------------------------------------------------------------
    def run(self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str) -> Any:
        give_up = time.monotonic() + POOL_RETRY_BUDGET
        pause = 0.001
        while True:
            try:
                return _migrating(lambda: self.scripts.call(self._caller(), script, keys, args))
            except Exception as exc:
                if not _is_redis_error(exc):
                    raise
                if not connection.is_pool_exhausted(exc) or time.monotonic() + pause > give_up:
                    raise backend_error(exc, action) from exc
            time.sleep(pause)  # nothing was sent: wait for a connection to be given back
            pause = min(pause * 2, 0.05)

    def run_waited(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        replicas: int,
        timeout_ms: int,
        action: str,
        aof: tuple[int, int] = (0, 0),
    ) -> tuple[Any, Acks]:
        # WAIT counts the writes of one connection: on a Cluster, that of the key's node.
        node = node_client(self.client, keys[0])
        try:
            native = script.command is not None
            if not native and (id(node), script.sha) not in self._loaded_for_wait:
                self._load(node, script)  # before sending: safe to repeat
                self._loaded_for_wait.add((id(node), script.sha))
            for attempt in range(2):
                pipe = node.pipeline(transaction=False)
                self._queue(pipe, script, keys, args)
                if replicas:
                    pipe.execute_command("WAIT", replicas, timeout_ms)
                if any(aof):
                    pipe.execute_command("WAITAOF", aof[0], aof[1], timeout_ms)
                reply, *waits = pipe.execute(raise_on_error=False)
                if attempt == 0 and _not_loaded(reply):
                    self._load(node, script)
                    continue
                if isinstance(reply, redis_errors.ResponseError):
                    raise script.named(reply) from reply
                return reply, _acks(waits, bool(replicas))
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            raise backend_error(exc, action) from exc
        raise AssertionError("unreachable")

    def run_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        results: list[Any] = []
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                self._queue(pipe, script, keys, args)
            results = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(_not_loaded(r) for r in results):
                self._load(self.client, script)
                continue
            break
        return results

    def _queue(self, pipe: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add one call of ``script`` to a pipeline (of one node: no Cluster routing)."""
        args = (*args, *self.scripts.extra(script))
        if script.command is not None:
            pipe.execute_command(script.command, *keys, *args)
        elif self.scripts.functions and script.function:
            pipe.execute_command(*self.scripts.fcall_args(script, keys, args))
        else:
            pipe.evalsha(script.sha, len(keys), *keys, *args)

    def _load(self, client: Any, script: Script) -> None:
        """Make ``script`` runnable on ``client``'s server before a pipeline sends it: the
        library where the server has Functions (deciding which it has), else the script."""
        if self.scripts.functions is not False and script.function:
            try:
                self.scripts.load(client)
                self.scripts.functions = True
                return
            except redis_errors.ResponseError as exc:
                if not self.scripts.unavailable(exc):
                    raise
        client.script_load(script.source)

    @property
    def sharded(self) -> bool:
        """Whether wake-ups go by sharded Pub/Sub: on a Cluster whose servers have it (Redis
        and Valkey 7.0+), the scripts ``SPUBLISH`` on a shard channel of the lock's slot, so a
        hand-off reaches the lock's shard instead of every node (``PUBLISH`` is broadcast over
        the cluster bus). Decided once, at the first look (a round trip to one node); a
        Cluster that refuses ``PUBSUB SHARDNUMSUB`` (Redis 6.2, or an ACL) keeps ``PUBLISH``.
        An unreachable Cluster decides nothing and raises
        :class:`~django_redislock.LockBackendError`."""
        if self._sharded is None:
            with backend_errors("find out whether the Redis Cluster has sharded Pub/Sub"):
                node = self.client.get_redis_connection(self.client.get_default_node())
                try:
                    node.execute_command("PUBSUB", "SHARDNUMSUB")
                    self._sharded = True
                except redis_errors.ResponseError:
                    self._sharded = False
        return self._sharded

    def pubsub(self, node: Any = None) -> Any:
        """A ``PubSub`` for a wake-up listener, on a connection of its own that it keeps for
        long, so it is named (``CLIENT SETINFO LIB-NAME``) and exempt from client eviction
        under memory pressure (``CLIENT NO-EVICT on``: an evicted listener would leave its
        waiters to their own re-checks) before it subscribes. A refusal of either is ignored:
        ``SETINFO`` came with Redis 7.2 and ``NO-EVICT`` with 7.0, and ``NO-EVICT`` needs the
        ``@admin`` ACL category. ``node``: a Cluster node, whose own client serves its shard
        channels."""
        client = self.client if node is None else self.client.get_redis_connection(node)
        pubsub = client.pubsub()
        own = (("CLIENT", "SETINFO", "LIB-NAME", lib_name()), ("CLIENT", "NO-EVICT", "on"))
        try:
            for command in own:
                pubsub.execute_command(*command)
                _reply(pubsub, self.socket_timeout or DEFAULT_REPLY_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):
                pubsub.reset()
            raise
        return pubsub

    def shard_node(self, channel: str) -> Any:
        return self.client.get_node_from_key(channel)

    def refresh_topology(self) -> None:
        self.client.nodes_manager.initialize()

    # -- asyncio -----------------------------------------------------------------------------
    async def arun(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], action: str
    ) -> Any:
        client = await self.async_client()
        try:
            try:
                async with _deadline(self.socket_timeout):
                    return await self.scripts.acall(client, script, keys, args)
            except _MIGRATING:
                pass
            for pause in _migration_pauses():
                try:
                    async with _deadline(self.socket_timeout):
                        return await self.scripts.acall(client, script, keys, args)
                except _MIGRATING:
                    if pause is None:
                        raise
                    await asyncio.sleep(pause)
        except TimeoutError as exc:  # the call's deadline (redis-py's own is a RedisError)
            raise NoReply(
                f"Redis did not answer within {self.socket_timeout:g} s while trying to "
                f"{action}. Check the CACHES LOCATION and that the server is up."
            ) from exc
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            raise backend_error(exc, action) from exc
        raise AssertionError("unreachable")

    async def async_client(self) -> Any:
        """The asyncio twin of :attr:`client` for the running loop, closed when
        ``asyncio.run`` ends the loop."""
        loop = asyncio.get_running_loop()
        entry = self._loops.get(loop)
        if entry is None:
            # Timeouts are applied per call here (_deadline), not by redis-py's connections.
            entry = _LoopClient(connection.make_async_client(self.client, read_timeout=False))
            self._loops[loop] = entry
            await entry.closer.__anext__()  # registers it with the loop's async-generator hooks
        return entry.client

    def close(self) -> None:
        self._loops = weakref.WeakKeyDictionary()


class LeanTransport(RedisPyTransport):
    """``REDISLOCK["TRANSPORT"] = "lean"``: each thread keeps one connection of the pool for its
    single calls, so a call skips the pool's checkout and return (about a tenth of an
    uncontended cycle; see the docs' Performance page).

    Still redis-py's public API only: a per-thread ``Redis(connection_pool=...,
    single_connection_client=True)`` over the same pool. What it costs: a thread that used a
    lock holds one connection until it ends (threading.local drops the client, which gives the
    connection back), so connections grow with the threads that use locks, not with the calls
    in flight — a pool with ``max_connections`` below that number makes calls wait for a
    connection and fail. Pipelines (``WAIT``, batched renewals), the listener and asyncio take
    connections as the default transport does. On a Cluster it is the default transport.
    """

    def __init__(self, client: Any, *, functions: bool = True) -> None:
        super().__init__(client, functions=functions)
        self._kept = threading.local()

    def _caller(self) -> Any:
        if self.cluster:
            return self.client
        kept = getattr(self._kept, "client", None)
        if kept is None:
            # Takes its connection now (a full pool raises here: nothing was sent).
            kept = Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
            self._kept.client = kept
            return kept
        # What the pool checks at each checkout: a connection the server closed (a restart, an
        # idle timeout, CLIENT KILL) reads EOF; drop it so the call reconnects before sending.
        conn = kept.connection
        try:
            if conn is not None and conn.can_read():
                raise redis_errors.ConnectionError("data or EOF on an idle connection")
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
            conn.disconnect()
        return kept


class _LoopClient:
    """An asyncio client and the suspended async generator that closes it: the loop finalizes
    the generator in ``shutdown_asyncgens`` (which ``asyncio.run`` calls before closing)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.closer = self._close_at_loop_end()

    async def _close_at_loop_end(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                try:
                    await self.client.aclose(close_connection_pool=True)
                except TypeError:  # RedisCluster.aclose() closes its nodes' pools itself
                    await self.client.aclose()


class _deadline:
    """``asyncio.timeout(seconds)`` (``None``: none), also on Python 3.10: a cancellation of
    the call that came from its own timer becomes :class:`TimeoutError`; any other stays one."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False
        self._native: Any = None

    async def __aenter__(self) -> None:
        if self.seconds is None:
            return
        if sys.version_info >= (3, 11):
            self._native = asyncio.timeout(self.seconds)
            await self._native.__aenter__()
            return
        task = asyncio.current_task()
        assert task is not None

        def fire() -> None:
            self._fired = True
            task.cancel()

        self._handle = asyncio.get_running_loop().call_later(self.seconds, fire)

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> bool | None:
        if self._native is not None:
            return await self._native.__aexit__(kind, exc, tb)  # type: ignore[no-any-return]
        if self._handle is not None:
            self._handle.cancel()
        if self._fired and kind is asyncio.CancelledError:
            raise TimeoutError from exc
        return None


def lib_name() -> str:
    """``CLIENT SETINFO LIB-NAME`` of the listeners' connections: redis-py's own name with this
    package as its upstream driver, as redis-py's ``DriverInfo`` formats it."""
    import django_redislock

    return f"redis-py(django-redislock_v{django_redislock.__version__})"


def _reply(pubsub: Any, timeout: float) -> None:
    """Read the reply to a command a ``PubSub`` sent before subscribing; an error reply (a
    refusal) is ignored, and so are RESP3 pushes read before it (a connection of the pool that
    tracked keys may have invalidations waiting)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise redis_errors.TimeoutError(f"no reply within {timeout:g} s")
        try:
            reply = pubsub.parse_response(block=False, timeout=left)
        except redis_errors.ResponseError:
            return
        if reply is not None and not isinstance(reply, list):
            return


def node_client(client: Any, key: str) -> Any:
    """The client of the node serving ``key`` (the client itself off a Cluster)."""
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is None:
        return client
    return client.get_redis_connection(get_node(key))


def _not_loaded(reply: object) -> bool:
    """A pipeline's reply saying the script or the library is not on that server (nothing ran)."""
    return isinstance(reply, redis_errors.NoScriptError) or _function_missing(reply)


def _loaded_already(exc: BaseException) -> bool:
    """``FUNCTION LOAD``'s answer when another process loaded the same library first."""
    return "already exists" in str(exc)


def _function_missing(exc: object) -> bool:
    """``FCALL`` of a function the server does not have (a new or flushed server): nothing ran."""
    return isinstance(exc, redis_errors.ResponseError) and "Function not found" in str(exc)


def _no_functions(exc: BaseException) -> bool:
    """The server has no Functions (Redis 6.2), or the connection's ACL user may not use them
    (not: may not touch a key, which ``EVALSHA`` could not either)."""
    text = str(exc).lower()
    if isinstance(exc, redis_errors.NoPermissionError):
        return "'fcall'" in text or "'function" in text
    return isinstance(exc, redis_errors.ResponseError) and "unknown command" in text


class _Scripts:
    """How one deployment runs the scripts, decided at its first call: as functions of
    :data:`~django_redislock.scripts.LIBRARY` (``functions`` True) or with ``EVALSHA``
    (False: ``REDISLOCK["FUNCTIONS"] = False``, Redis 6.2, or an ACL user without
    ``FUNCTION``/``FCALL``). ``None``: not known yet, try ``FCALL``."""

    def __init__(self, client: Any, enabled: bool) -> None:
        self.client = client
        self.cluster = connection.is_cluster(client)
        self.functions: bool | None = None if enabled else False
        #: Whether the server expires hash fields (``HPEXPIREAT``); ``None``: not asked yet.
        self.field_ttl: bool | None = None

    def extra(self, script: Script) -> tuple[str, ...]:
        """Arguments the transport appends for ``script``: whether the server expires hash
        fields, for the scripts that expire their records' fields (asked once)."""
        if not script.field_ttl:
            return ()
        if self.field_ttl is None:
            self.field_ttl = redis_client.has_field_ttl(self.client)
        return ("ttl:1",) if self.field_ttl else ("ttl:0",)

    async def aextra(self, client: Any, script: Script) -> tuple[str, ...]:
        if script.field_ttl and self.field_ttl is None:
            self.field_ttl = await redis_client.ahas_field_ttl(client)
        return self.extra(script)

    # -- what is sent -------------------------------------------------------------------------
    def fcall_args(
        self, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, ...]:
        return ("FCALL", script.function, len(keys), *keys, *args)

    def node(self, client: Any, keys: Sequence[str]) -> Any:
        """On a Cluster, the key's node, to name outright: redis-py would otherwise ask a node
        for ``FCALL``'s keys (``COMMAND GETKEYS``, a round trip) before every call. ``None``:
        not a Cluster, or its slot map has no node for the key yet (then redis-py routes it)."""
        if not self.cluster or not keys:
            return None
        try:
            return client.get_node_from_key(keys[0])
        except redis_errors.SlotNotCoveredError:
            return None

    def load(self, client: Any) -> None:
        """``FUNCTION LOAD`` the library (every primary of a Cluster); another process having
        just loaded it is no error."""
        try:
            client.function_load(LIBRARY.source)
        except redis_errors.ResponseError as exc:
            if not _loaded_already(exc):
                raise

    async def aload(self, client: Any) -> None:
        try:
            await client.function_load(LIBRARY.source)
        except redis_errors.ResponseError as exc:
            if not _loaded_already(exc):
                raise

    def unavailable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says this server runs no functions (then remember it)."""
        if _no_functions(exc):
            self.functions = False
            return True
        return False

    # -- sync ---------------------------------------------------------------------------------
    def call(self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``script`` once: ``FCALL`` (loading the library when the server lacks it),
        ``EVALSHA`` (loading the script after a ``NOSCRIPT``), or a server command."""
        args = (*args, *self.extra(script))
        try:
            if script.command is not None:
                return client.execute_command(script.command, *keys, *args)
            if self.functions is not False and script.function:
                try:
                    return self._fcall(client, script, keys, args)
                except redis_errors.ResponseError as exc:
                    if _function_missing(exc):
                        try:
                            self.load(client)
                        except redis_errors.ResponseError as refused:
                            if not self.unavailable(refused):
                                raise
                        else:
                            return self._fcall(client, script, keys, args)
                    elif not self.unavailable(exc):
                        raise
            return _evalsha(client, script, keys, args)
        except redis_errors.ResponseError as exc:
            if isinstance(exc, _MIGRATING):
                raise
            raise script.named(exc) from exc

    def _fcall(self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        command = self.fcall_args(script, keys, args)
        node = self.node(client, keys)
        if node is None:
            reply = client.execute_command(*command)
        else:
            try:
                reply = client.execute_command(*command, target_nodes=node)
            except (redis_errors.ConnectionError, redis_errors.TimeoutError):
                # A named node gets no retry from redis-py: resend once, unnamed, as redis-py's
                # Cluster retry resends any command it routes itself (what EVALSHA got there).
                # The lock scripts are idempotent per attempt id; a rate decision is not, the
                # same exposure as through redis-py's own retry.
                reply = client.execute_command(*command)
        self.functions = True
        return reply

    # -- asyncio ------------------------------------------------------------------------------
    async def acall(
        self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        args = (*args, *(await self.aextra(client, script)))
        try:
            if script.command is not None:
                return await client.execute_command(script.command, *keys, *args)
            if self.functions is not False and script.function:
                try:
                    return await self._afcall(client, script, keys, args)
                except redis_errors.ResponseError as exc:
                    if _function_missing(exc):
                        try:
                            await self.aload(client)
                        except redis_errors.ResponseError as refused:
                            if not self.unavailable(refused):
                                raise
                        else:
                            return await self._afcall(client, script, keys, args)
                    elif not self.unavailable(exc):
                        raise
            return await _aevalsha(client, script, keys, args)
        except redis_errors.ResponseError as exc:
            if isinstance(exc, _MIGRATING):
                raise
            raise script.named(exc) from exc

    async def _afcall(
        self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        command = self.fcall_args(script, keys, args)
        if self.cluster:
            await client.initialize()  # the slot map (a no-op once known)
        node = self.node(client, keys)
        if node is None:
            reply = await client.execute_command(*command)
        else:
            try:
                reply = await client.execute_command(*command, target_nodes=node)
            except (redis_errors.ConnectionError, redis_errors.TimeoutError):
                reply = await client.execute_command(*command)
        self.functions = True
        return reply


def _evalsha(client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """``EVALSHA``, loading the script after a ``NOSCRIPT`` (which ran nothing)."""
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except redis_errors.NoScriptError:
        client.script_load(script.source)
        return client.evalsha(script.sha, len(keys), *keys, *args)


async def _aevalsha(client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except redis_errors.NoScriptError:
        await client.script_load(script.source)
        return await client.evalsha(script.sha, len(keys), *keys, *args)


def _migrating(call: Any) -> Any:
    """``call()``, retried while a Cluster slot is migrating or failing over."""
    try:
        return call()
    except _MIGRATING:
        pass
    for pause in _migration_pauses():
        try:
            return call()
        except _MIGRATING:
            if pause is None:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


def _migration_pauses() -> Iterator[float | None]:
    """Pauses between attempts (growing), then ``None``: give up."""
    spent, pause = 0.0, 0.01
    while spent < MIGRATION_RETRY_BUDGET:
        yield pause
        spent += pause
        pause = min(pause * 2, 0.25)
    yield None
