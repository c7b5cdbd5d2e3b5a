"""Where a lock lives: one Redis deployment (:func:`single_target`) or a quorum of independent
masters (:func:`quorum_target`, Redlock), and what that means for the scripts' arguments.

A :class:`Target` is built once per alias and settings by :mod:`django_redislock.runtime`. It
bundles the transport that reaches the server, the key space, the process's wake-up listener
there, and the deployment's answers to the protocol's questions: may a release hand the lock
over outright (a single Redis, where ``PUBLISH`` counts every subscriber and no replica has to
acknowledge the new holder), how long a reserved hand-off waits to be claimed, how many
replicas acknowledge a write, and where wake-ups are published (the process's channel, or on a
Cluster with sharded Pub/Sub a shard channel in each lock's slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_redislock import connection
from django_redislock.conf import LockSettings
from django_redislock.keys import KeySpace
from django_redislock.transport import Transport
from django_redislock.wakeups import DEFAULT_REPLY_TIMEOUT, ListenerGroup, WaiterRegistry

__all__ = [
    "CLAIM_WINDOW",
    "Target",
    "quorum_target",
    "server_of",
    "single_target",
]

#: Seconds a reserved hand-off waits for its waiter to claim it (the full lease starts at the
#: claim). A waiter that died in the queue therefore costs at most this long.
CLAIM_WINDOW = 2.0


@dataclass(frozen=True, eq=False)
class Target:
    """One Redis deployment as the engine uses it (or, with ``members``, a quorum of them)."""

    alias: str
    settings: LockSettings
    transport: Transport
    keys: KeySpace
    #: This process's wake-up listener there (a :class:`~django_redislock.wakeups.Listener`,
    #: or a :class:`~django_redislock.wakeups.ShardedListener`): see :meth:`listening`.
    listener: Any
    waiters: WaiterRegistry
    #: ``<ns>:wake:``; a waiter's process listens on this prefix + its process token.
    channel_prefix: str
    #: Whether a release hands the lock to the next waiter outright (full lease, token in the
    #: message) rather than reserving it for the waiter's own claim.
    outright: bool
    socket_timeout: float | None
    #: Replicas that must acknowledge every way of obtaining or keeping a lock (``WAIT``).
    replicas: int = 0
    replicas_timeout_ms: int = 0
    #: ``WAITAOF``: the primary (1) and how many replicas must have fsynced it.
    aof_local: int = 0
    aof_replicas: int = 0
    #: Independent masters of a quorum target (Redlock); empty for one deployment.
    members: tuple[Target, ...] = ()
    #: Wake-ups go by sharded Pub/Sub (``SPUBLISH`` on a shard channel of each lock's slot): a
    #: Cluster whose servers have it (see :attr:`~django_redislock.transport.Transport.sharded`).
    sharded: bool = False

    @property
    def client(self) -> Any:
        return self.transport.client

    @property
    def quorum(self) -> bool:
        return bool(self.members)

    @property
    def durable(self) -> bool:
        """Whether writes here count only once acknowledged (``REPLICAS`` / ``DURABILITY``)."""
        return bool(self.replicas or self.aof_local or self.aof_replicas)

    def wait_fields(self) -> dict[str, int]:
        """What a :class:`~django_redislock.flow.Call` must wait for after its script."""
        return {
            "replicas": self.replicas,
            "replicas_timeout_ms": self.replicas_timeout_ms,
            "aof_local": self.aof_local,
            "aof_replicas": self.aof_replicas,
        }

    @property
    def batch_renewals(self) -> bool:
        """Whether lock leases here may be renewed many per script (one slot, no ``WAIT``)."""
        return not self.transport.cluster and not self.durable and not self.members

    def claim_ms(self, lease: float) -> int:
        """The claim window of a reserved hand-off; 0 on a quorum, where one master cannot hand
        a majority over: a release wakes every waiter instead."""
        if self.members:
            return 0
        return max(1, int(min(CLAIM_WINDOW, lease) * 1000))

    def wake_prefix(self, name: str) -> str:
        """Where the wake-ups of ``name``'s waiters go (+ their process token): the process's
        channel, or the shard channel of ``name``'s slot, so a hand-off reaches only the
        lock's shard instead of every node of a Cluster."""
        return self.keys.shard_wake_prefix(name) if self.sharded else self.channel_prefix

    def channel_args(self, name: str) -> list[Any]:
        """The two arguments of every script that wakes ``name``'s waiters: the channel prefix
        and whether to ``SPUBLISH`` ("1") or ``PUBLISH`` ("0"), decided here, not in Lua."""
        return [self.wake_prefix(name), "1" if self.sharded else "0"]

    def wake_args(self, name: str, lease: float) -> list[Any]:
        """The arguments every script that may hand a lock over ends with."""
        return [*self.channel_args(name), "1" if self.outright else "0", self.claim_ms(lease)]

    def listening(self, name: str) -> Any:
        """This process's subscription that hears ``name``'s wake-ups (a
        :class:`~django_redislock.wakeups.Listening`): the listener itself, or on sharded
        Pub/Sub the subscription to ``name``'s shard channel."""
        return self.listener.subscription(self.wake_prefix(name))

    def wake_local(self, handed: tuple[str, int | None] | None) -> None:
        """A release handed the lock to a waiter of this process, without a message: wake it
        (or keep the wake-up for its registration)."""
        if handed is not None:
            self.waiters.deliver(handed[0], "h", handed[1])

    @property
    def subscribe_timeout(self) -> float:
        return (self.socket_timeout or DEFAULT_REPLY_TIMEOUT) + 1.0


def server_of(client: Any) -> tuple[Any, ...]:
    """Which server a client talks to, for sharing one wake-up subscription between aliases
    (Pub/Sub ignores the database). Clusters and Sentinel clients are told apart by identity."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if (
        connection.is_cluster(client)
        or kwargs is None
        or ("host" not in kwargs and "path" not in kwargs)
    ):
        return ("client", id(client))
    from redis.sentinel import SentinelConnectionPool

    if isinstance(pool, SentinelConnectionPool):
        return ("client", id(client))
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("username"))


def _wait_ms(replicas_timeout: float, socket_timeout: float | None) -> int:
    """``WAIT``'s timeout, kept below the socket timeout: a ``WAIT`` that outlasts the socket
    would read as an outage instead of as "not acknowledged"."""
    if socket_timeout is not None:
        replicas_timeout = min(replicas_timeout, max(0.001, socket_timeout * 0.8))
    return max(1, int(replicas_timeout * 1000))


def single_target(
    alias: str,
    settings: LockSettings,
    transport: Transport,
    keys: KeySpace,
    listener: Any,
    waiters: WaiterRegistry,
) -> Target:
    socket_timeout = connection.socket_timeout(transport.client)
    durable = bool(settings.replicas or settings.aof_local or settings.aof_replicas)
    return Target(
        alias=alias,
        settings=settings,
        transport=transport,
        keys=keys,
        listener=listener,
        waiters=waiters,
        channel_prefix=f"{keys.namespace}:wake:",
        # With REPLICAS / DURABILITY the woken waiter claims the lock with a call of its own,
        # which WAIT / WAITAOF then acknowledge: a hand-off is acknowledged like any other
        # acquisition.
        outright=not transport.cluster and not durable,
        sharded=transport.sharded,
        socket_timeout=socket_timeout,
        replicas=settings.replicas,
        replicas_timeout_ms=_wait_ms(settings.replicas_timeout, socket_timeout),
        aof_local=settings.aof_local,
        aof_replicas=settings.aof_replicas,
    )


def quorum_target(alias: str, settings: LockSettings, members: Sequence[Target]) -> Target:
    """Independent masters (``REDISLOCK["CACHE"]`` as a list): locks need a majority."""
    from django_redislock.redlock import QuorumTransport

    first = members[0]
    return Target(
        alias=alias,
        settings=settings,
        transport=QuorumTransport([m.transport for m in members]),
        keys=first.keys,
        listener=ListenerGroup([m.listener for m in members]),
        waiters=first.waiters,
        channel_prefix=first.channel_prefix,
        outright=False,
        socket_timeout=first.socket_timeout,
        members=tuple(members),
    )
