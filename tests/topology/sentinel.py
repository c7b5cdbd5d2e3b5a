"""Redis Sentinel on loopback: one primary, one replica and three sentinels (quorum 2).

Start order matters for speed: a sentinel asks its primary for ``INFO`` only every 10 s once it has
looked, so the replica is attached (link up) *before* the sentinels start — their first ``INFO``
already lists it — and :meth:`SentinelTopology.start` returns only once every sentinel knows the
replica and the two other sentinels (hello messages every 2 s), because a failover needs both.

``down-after-milliseconds`` defaults to 2000, not 1000. With 1000, a new primary was once declared
down exactly 1 s after the switch and failed back (a second, unrequested failover, seen once in
~25 runs on this 2-core machine) — most likely because a sentinel may wait up to its 1 s ping
period before reconnecting to the new address. 2000 ms still fails a killed primary over in ~3 s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.sentinel

from tests.topology.process import LOOPBACK, RedisProcess, wait_until

__all__ = ["SERVICE_NAME", "SentinelTopology"]

SERVICE_NAME = "mymaster"


class SentinelTopology:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels monitoring ``mymaster``.

    ``primary`` and ``replica`` follow failovers (the harness's view, refreshed by
    :meth:`wait_failover`); every process is stopped by PID and its directory removed by
    :meth:`stop`.
    """

    def __init__(
        self,
        *,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 5000,
        service_name: str = SERVICE_NAME,
        binary: str | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.service_name = service_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self._binary = binary
        data_args = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", *args]
        self.primary = RedisProcess(binary=binary, args=data_args, name="sentinel-primary")
        self.replica = RedisProcess(binary=binary, args=data_args, name="sentinel-replica")
        self.servers = [self.primary, self.replica]
        self.sentinels: list[RedisProcess] = []
        self._n_sentinels = sentinels
        self._clients: list[Any] = []
        self._managers: list[redis.sentinel.Sentinel] = []
        self._killed_at: float | None = None
        # (old port, new port) of failovers the sentinels did without being asked to.
        self.unexpected_failovers: list[tuple[int, int]] = []
        # Seconds taken by the last start / failover (from the kill) / restart.
        self.timings: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<SentinelTopology primary={self.primary!r} replica={self.replica!r}>"

    # -- build and tear down -----------------------------------------------------------------

    def _sentinel_config(self) -> list[str]:
        name = self.service_name
        return [
            f"sentinel monitor {name} {LOOPBACK} {self.primary.port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]

    def start(self, timeout: float = 30.0) -> SentinelTopology:
        """Primary and replica, replication link up, then the sentinels; wait until they know
        each other and the replica."""
        began = time.monotonic()
        try:
            # One after the other: the primary's port is final (a port race relaunches it
            # elsewhere) before the replica is told where to replicate from.
            self.primary.start(timeout)
            self.replica.args = _replicaof(self.replica.args, self.primary.port)
            self.replica.start(timeout)
            self._wait_replication(self.primary, self.replica, timeout)
            self.sentinels = [
                RedisProcess(
                    binary=self._binary,
                    sentinel_config=self._sentinel_config(),
                    name=f"sentinel{i}",
                )
                for i in range(self._n_sentinels)
            ]
            for sentinel in self.sentinels:
                sentinel.launch()
            for sentinel in self.sentinels:
                sentinel.wait_ready(timeout)
            self.wait_sentinels_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began
        return self

    def _wait_replication(
        self, primary: RedisProcess, replica: RedisProcess, timeout: float
    ) -> None:
        def linked() -> bool:
            with replica.client(socket_timeout=2.0, decode_responses=True) as client:
                info = client.info("replication")
            return bool(
                info.get("role") == "slave"
                and info.get("master_port") == primary.port
                and info.get("master_link_status") == "up"
            )

        wait_until(
            linked,
            timeout,
            what=f"{replica!r} to replicate {primary!r}",
            details=lambda: replica.log_tail(10),
        )

    def wait_sentinels_ready(self, timeout: float = 30.0) -> None:
        """Wait until the running sentinels agree on a primary that answers as one, each knows
        the other sentinels, and every running data server replicates from that primary and is
        seen by every sentinel as a good replica (up, linked) — what a failover needs.

        Should the sentinels have failed over on their own meanwhile (``down-after`` is short;
        a loaded machine can starve a server past it), ``primary``/``replica`` follow them and
        the switch is recorded in ``unexpected_failovers``.
        """
        others = len(self._running_sentinels()) - 1

        def ready() -> bool:
            ports = set()
            for sentinel in self._running_sentinels():
                with sentinel.client(socket_timeout=2.0, decode_responses=True) as client:
                    fields = _pairs(client.execute_command("SENTINEL", "MASTER", self.service_name))
                if set(fields.get("flags", "").split(",")) != {"master"}:
                    return False
                if int(fields.get("num-other-sentinels", 0)) < others:
                    return False
                ports.add(int(fields.get("port", 0)))
            if len(ports) != 1:
                return False
            primary = self._server_at(ports.pop())
            if not _is_master(primary):
                return False
            replicas = [s for s in self.servers if s is not primary and s.alive]
            for replica in replicas:
                with replica.client(socket_timeout=2.0, decode_responses=True) as client:
                    info = client.info("replication")
                if info.get("master_port") != primary.port:
                    return False
                if info.get("master_link_status") != "up":
                    return False
            for sentinel in self._running_sentinels():
                # A restarted replica is s_down or disconnected for about a second.
                with sentinel.client(socket_timeout=2.0, decode_responses=True) as client:
                    reply = client.execute_command("SENTINEL", "REPLICAS", self.service_name)
                good = {
                    int(entry.get("port", 0))
                    for entry in map(_pairs, reply)
                    if set(entry.get("flags", "").split(",")) == {"slave"}
                    and entry.get("master-link-status") == "ok"
                }
                if not {r.port for r in replicas} <= good:
                    return False
            if primary is not self.primary:
                self.unexpected_failovers.append((self.primary.port, primary.port))
                self.replica = self.primary
                self.primary = primary
            return True

        wait_until(
            ready,
            timeout,
            what="sentinels to agree on a primary, know each other and its replica(s)",
            interval=0.1,
            details=self._details,
        )

    def stop(self) -> None:
        """Close our clients, kill every process by PID, remove every directory (idempotent)."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        for manager in self._managers:
            for client in manager.sentinels:
                with contextlib.suppress(Exception):
                    client.close()
        self._managers.clear()
        errors: list[BaseException] = []
        for process in [*self.sentinels, *self.servers]:
            try:
                process.cleanup()
            except BaseException as exc:  # keep going: the others must go too
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> SentinelTopology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _running_sentinels(self) -> list[RedisProcess]:
        return [s for s in self.sentinels if s.alive]

    def _details(self) -> str:
        parts = []
        for process in [*self.servers, *self.sentinels]:
            parts.append(f"{process!r}:\n{process.log_tail(25)}")
        return "\n".join(parts)

    # -- state -----------------------------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.sentinels]

    def master_addresses(self) -> list[tuple[str, int] | None]:
        """What each running sentinel reports as the primary's address now."""
        out: list[tuple[str, int] | None] = []
        for sentinel in self._running_sentinels():
            try:
                with sentinel.client(socket_timeout=2.0, decode_responses=True) as client:
                    addr = client.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
            except (redis.ConnectionError, redis.TimeoutError):
                out.append(None)
                continue
            out.append((str(addr[0]), int(addr[1])) if addr else None)
        return out

    def _server_at(self, port: int) -> RedisProcess:
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(f"no server of this topology on port {port}")

    # -- faults ----------------------------------------------------------------------------------

    def kill_primary(self) -> RedisProcess:
        """SIGKILL the current primary; returns it (pass it to :meth:`wait_failover`)."""
        old = self.primary
        old.kill()
        self._killed_at = time.monotonic()
        return old

    def wait_failover(self, old: RedisProcess | None = None, timeout: float = 30.0) -> RedisProcess:
        """Wait until every running sentinel names another primary and that server answers as
        a primary; returns it (also ``self.primary`` from now on)."""
        old = old or self.primary
        since = self._killed_at if self._killed_at is not None else time.monotonic()
        self._killed_at = None
        found: list[RedisProcess] = []

        def promoted() -> bool:
            addrs = set(self.master_addresses())
            if len(addrs) != 1:
                return False
            (addr,) = addrs
            if addr is None or addr[1] == old.port:
                return False
            server = self._server_at(addr[1])
            if not _is_master(server):
                return False
            found[:] = [server]
            return True

        wait_until(
            promoted,
            timeout,
            what=f"sentinels to promote a replica of {old!r}",
            interval=0.1,
            details=self._details,
        )
        self.timings["failover"] = time.monotonic() - since
        new = found[0]
        self.primary = new
        self.replica = next((s for s in self.servers if s is not new), old)
        return new

    def force_failover(self, timeout: float = 30.0) -> RedisProcess:
        """``SENTINEL FAILOVER``: promote the replica without killing anyone (a planned switch;
        the old primary is demoted to a replica)."""
        old = self.primary
        sentinel = self._running_sentinels()[0]
        self._killed_at = time.monotonic()  # failover timing starts at the request
        with sentinel.client(socket_timeout=2.0) as client:
            client.execute_command("SENTINEL", "FAILOVER", self.service_name)
        self.wait_failover(old, timeout)
        self.wait_sentinels_ready(timeout)  # includes: the old primary replicates from the new
        return self.primary

    def restart(self, server: RedisProcess, timeout: float = 30.0) -> RedisProcess:
        """Start a killed data server again on its port, as a replica of the current primary.

        Sentinels would demote a returning old primary themselves, but only after their 10 s
        ``INFO`` period; starting it with ``replicaof`` skips that wait and the window in which
        it would be a second, empty primary.
        """
        if server is self.primary:
            raise ValueError("restart the primary with kill_primary() + wait_failover() first")
        began = time.monotonic()
        if server.alive:
            server.kill()
        server.args = _replicaof(server.args, self.primary.port)
        server.start(timeout)
        self.wait_sentinels_ready(timeout)
        self.timings["restart"] = time.monotonic() - began
        return server

    # -- clients ---------------------------------------------------------------------------------

    def sentinel(self, **kwargs: Any) -> redis.sentinel.Sentinel:
        """A ``redis.sentinel.Sentinel`` over the three sentinels (bounded timeouts by default)."""
        kwargs.setdefault("socket_timeout", 2.0)
        kwargs.setdefault("socket_connect_timeout", 1.0)
        manager = redis.sentinel.Sentinel(self.sentinel_addresses, **kwargs)
        self._managers.append(manager)
        return manager

    def master_client(self, **kwargs: Any) -> redis.Redis:
        """``Sentinel(...).master_for(service)``: follows failovers on reconnect."""
        client: redis.Redis = self.sentinel().master_for(
            self.service_name, **_with_timeouts(kwargs)
        )
        self._clients.append(client)
        return client

    def replica_client(self, **kwargs: Any) -> redis.Redis:
        """``Sentinel(...).slave_for(service)``."""
        client: redis.Redis = self.sentinel().slave_for(self.service_name, **_with_timeouts(kwargs))
        self._clients.append(client)
        return client

    def caches_entry(self, db: int = 0, **options: Any) -> dict[str, Any]:
        """A django-redis ``CACHES`` entry using its Sentinel support (django-redis >= 5.4).

        ``OPTIONS`` spelling as read by ``django_redis.pool.SentinelConnectionFactory`` and
        ``django_redis.client.SentinelClient``; ``options`` are added to / override ``OPTIONS``.
        Note that ``SentinelClient`` sends reads (``write=False``) to a replica.
        """
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{self.service_name}/{db}",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": list(self.sentinel_addresses),
                "SOCKET_CONNECT_TIMEOUT": 1.0,
                "SOCKET_TIMEOUT": 2.0,
                **options,
            },
        }


def _is_master(server: RedisProcess) -> bool:
    with server.client(socket_timeout=2.0) as client:
        role = client.execute_command("ROLE")
    return role[0] in (b"master", "master")


def _with_timeouts(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("socket_timeout", 2.0)
    kwargs.setdefault("socket_connect_timeout", 1.0)
    return kwargs


def _replicaof(args: list[str], port: int) -> list[str]:
    """``args`` with any ``--replicaof HOST PORT`` replaced by one pointing at ``port``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "--replicaof":
            i += 3
            continue
        out.append(args[i])
        i += 1
    return [*out, "--replicaof", LOOPBACK, str(port)]


def _pairs(reply: Any) -> dict[str, str]:
    """A ``SENTINEL MASTER`` reply (flat list, or dict on RESP3/newer redis-py) as a dict."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    items = list(reply)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}
