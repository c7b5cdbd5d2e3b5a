"""Benchmark django-redislock against redis-py's Lock and python-redis-lock, in one run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_locks.py                 # full run, ~12 min on 2 cores
    .venv/bin/python benchmarks/bench_locks.py --quick         # CI smoke run of every part
    .venv/bin/python benchmarks/bench_locks.py contended asyncio --json out.json --markdown out.md
    make bench ARGS="--section rate"                           # one section (= naming it)

Sections (positional names select some; default all): ``uncontended`` (1), ``contended`` (2),
``manykeys`` (3), ``watchdog`` (4), ``stats`` (5, measured inside ``uncontended``), ``memory``
(6), ``asyncio`` (7), ``profile`` (where an uncontended cycle spends its time), ``semaphore``
(8), and three that start servers of their own: ``cluster`` (9, 3-primary Redis Cluster vs one
Redis), ``failover`` (10, SIGKILL of a primary on Cluster and Sentinel: seconds to the next
acquisition), ``replicas`` (11, ``REDISLOCK["REPLICAS"] = 1`` vs 0), and ``rate`` (12:
``RateLimiter`` against dramatiq's and the ``limits`` library's Redis rate limiters, and
``lock_rate`` against Celery's per-worker ``rate_limit`` on real ``celery worker`` processes).
``README.md`` in this folder describes the method and how to read every column.

Every figure comes from this one run, on one private redis-server, with its spread over the
runs; the last thing printed is a Markdown block per section, ready to paste into the README,
headed by the machine and software it was measured on. Exit status 0 whatever the figures are
(a benchmark reports; the test-suite judges): non-zero only if the harness itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (
    _aio,
    _contended,
    _coord,
    _held,
    _rate,
    _semaphore,
    _topology,
    _uncontended,
)
from benchmarks import _common as c

SECTIONS = (
    "uncontended",
    "stats",
    "profile",
    "contended",
    "manykeys",
    "watchdog",
    "memory",
    "asyncio",
    "semaphore",
    "cluster",
    "failover",
    "replicas",
    "rate",
    "coordination",
)


@dataclass(frozen=True)
class Plan:
    """Sizes of one run. ``FULL`` is what the README's figures come from."""

    uc_runs: int = 3
    uc_rounds: int = 20
    uc_cycles: int = 300
    count_cycles: int = 200
    procs: int = 8
    c_runs: int = 3
    c_rounds: int = 4
    c_duration: float = 2.0
    relay_rounds: int = 2
    warm: float = 0.3
    grace: float = 1.0
    mk_procs: int = 4
    mk_threads: int = 16
    mk_keys: int = 1000
    mk_runs: int = 3
    mk_rounds: int = 3
    mk_duration: float = 2.0
    wd_locks: int = 10_000
    wd_timeout: float = 6.0
    wd_window: float = 30.0
    mem_locks: int = 10_000
    mem_settle: float = 2.0
    aio_uc_runs: int = 3
    aio_uc_rounds: int = 20
    aio_uc_cycles: int = 200
    aio_tasks: int = 100
    aio_c_runs: int = 3
    aio_c_rounds: int = 3
    aio_c_duration: float = 2.0
    lag_locks: int = 1000
    lag_timeout: float = 3.0
    lag_window: float = 30.0
    lag_baseline: float = 10.0
    prof_cycles: int = 3000
    prof_script_calls: int = 1000
    prof_ladder_rounds: int = 30
    sem_permits: int = 4
    sem_uc_runs: int = 3
    sem_uc_rounds: int = 20
    sem_uc_cycles: int = 300
    sem_procs: int = 4
    sem_threads: int = 4
    sem_hold: float = 0.001
    sem_runs: int = 3
    sem_rounds: int = 3
    sem_duration: float = 2.0
    cl_procs: int = 4
    cl_threads: int = 16
    cl_keys: int = 1000
    cl_runs: int = 3
    cl_rounds: int = 3
    cl_duration: float = 2.0
    cl_prime: float = 0.5
    fo_repeats: int = 5
    fo_lead: float = 1.0
    fo_settle: float = 1.0
    fo_max_after: float = 30.0
    #: Measure the Cluster and the Sentinel failover at the same time (quick runs only).
    fo_parallel: bool = False
    rep_runs: int = 3
    rep_rounds: int = 20
    rep_cycles: int = 300
    #: Start the topology sections' servers in the background when the run starts (quick runs:
    #: their start-up is mostly waiting; a full run starts each when its section begins, so
    #: idle cluster nodes and sentinels never run next to another section's measurement).
    topo_prestart: bool = False
    rate_runs: int = 3
    rate_rounds: int = 2
    rate_block: float = 1.0
    rate_threads: int = 8
    rate_count: int = 200
    acc_procs: int = 8
    acc_threads: int = 8
    acc_limit: int = 100
    acc_runs: int = 2
    acc_duration: float = 4.0
    #: Section 12c (real ``celery worker`` processes); 0 tasks leaves it out.
    cel_workers: int = 4
    cel_tasks: int = 200
    cel_rate: int = 20
    #: Section 13: read-mostly load on a read-write lock, and a barrier's round trip.
    rw_procs: int = 8
    rw_writes: float = 0.05
    rw_hold: float = 0.001
    rw_runs: int = 3
    rw_rounds: int = 2
    rw_duration: float = 2.0
    bar_rounds: int = 100
    bar_runs: int = 3


FULL = Plan()
QUICK = Plan(
    uc_runs=2,
    uc_rounds=3,
    uc_cycles=40,
    count_cycles=20,
    c_runs=2,
    c_rounds=1,
    relay_rounds=1,
    c_duration=0.3,
    warm=0.1,
    grace=0.5,
    mk_runs=2,
    mk_rounds=1,
    mk_duration=0.3,
    wd_locks=500,
    wd_timeout=1.5,
    wd_window=2.0,
    mem_locks=300,
    mem_settle=1.2,
    aio_uc_runs=2,
    aio_uc_rounds=3,
    aio_uc_cycles=40,
    aio_c_runs=2,
    aio_c_rounds=1,
    aio_c_duration=0.3,
    lag_locks=200,
    lag_timeout=1.5,
    lag_window=2.0,
    lag_baseline=0.5,
    prof_cycles=300,
    prof_script_calls=100,
    prof_ladder_rounds=2,
    sem_uc_runs=2,
    sem_uc_rounds=3,
    sem_uc_cycles=40,
    sem_procs=2,
    sem_runs=1,
    sem_rounds=1,
    sem_duration=0.2,
    cl_procs=2,
    cl_threads=4,
    cl_keys=100,
    cl_runs=1,
    cl_rounds=1,
    cl_duration=0.2,
    cl_prime=0.0,
    fo_repeats=1,
    fo_lead=0.3,
    fo_settle=0.2,
    fo_max_after=20.0,
    fo_parallel=True,
    rep_runs=2,
    rep_rounds=3,
    rep_cycles=40,
    topo_prestart=True,
    rate_runs=1,
    rate_rounds=1,
    rate_block=0.1,
    rate_count=20,
    acc_procs=2,
    acc_threads=2,
    acc_runs=1,
    acc_duration=1.0,
    cel_workers=2,
    cel_tasks=20,
    cel_rate=10,
    rw_procs=2,
    rw_runs=1,
    rw_rounds=1,
    rw_duration=0.3,
    bar_rounds=5,
    bar_runs=1,
)

Tables = dict[str, tuple[list[str], list[list[str]]]]


class Run:
    """One benchmark run: the server, the workers, and what each section produced."""

    def __init__(
        self,
        plan: Plan,
        server: Any,
        sections: set[str],
        node_timeout_ms: int = 1000,
        down_after_ms: int = 2000,
    ) -> None:
        self.plan = plan
        self.server = server
        self.servers = _topology.Servers(node_timeout_ms, down_after_ms)
        c.configure_django(server.url)
        self.conn = c.client()
        self.conn.flushall()
        self.probe = c.ServerProbe(server.pid, self.conn)
        self.pool = c.WorkerPool(server.url, server.pid)
        self.results: dict[str, Any] = {}
        self.tables: list[tuple[str, Tables, list[str]]] = []
        self.checks: list[tuple[str, bool]] = []
        if plan.topo_prestart:  # last: close() stops them, and close() needs a whole Run
            needed = [s for s in SECTIONS if s in sections]
            self.servers.prestart(
                [kind for s in needed for kind in _topology.SECTION_SERVERS.get(s, ())]
            )

    def _fresh(self, target: str, timeout: float, **kwargs: Any) -> Any:
        worker = self.pool.fresh()
        try:
            return self.pool.call(worker, target, timeout, **kwargs)
        finally:
            self.pool.retire(worker)

    def _emit(self, section: str, tables: Tables, notes: list[str]) -> None:
        self.tables.append((section, tables, notes))
        for title, (headers, rows) in tables.items():
            print(f"\n== {title} ==")
            print(c.console_table(headers, rows))
        for note in notes:
            print(f"  {note}")
        sys.stdout.flush()

    # -- sections ---------------------------------------------------------------------------
    def uncontended(self, with_table_1: bool, with_table_5: bool) -> None:
        p = self.plan
        res = self._fresh(
            "benchmarks._uncontended:run",
            timeout=900,
            runs=p.uc_runs,
            rounds=p.uc_rounds,
            per_round=p.uc_cycles,
            count_cycles=p.count_cycles,
        )
        self.results["uncontended"] = res
        tables = _uncontended.tables(res)
        keep = {
            title: table
            for title, table in tables.items()
            if (title.startswith("1.") and with_table_1)
            or (title.startswith("5.") and with_table_5)
        }
        self._emit("uncontended", keep, _uncontended.notes(res))
        for ours in (c.OURS, c.OURS_LEAN):  # the transport changes the connection, not the calls
            self.checks.append(
                (
                    f"uncontended: 2 EVALSHA, 2 round trips per cycle ({ours})",
                    res["round_trips"][ours] == 2 and res["client_sent"][ours] == {"evalsha": 2},
                )
            )

    def profile(self) -> None:
        p = self.plan
        res = self._fresh(
            "benchmarks._uncontended:profile",
            timeout=600,
            cycles=p.prof_cycles,
            script_calls=p.prof_script_calls,
            ladder_rounds=p.prof_ladder_rounds,
        )
        self.results["profile"] = res
        print("\n== Profile of one uncontended django-redislock cycle (not a README table) ==")
        print("\n".join(_uncontended.profile_lines(res)))

    def contended(self) -> None:
        p = self.plan
        res = _contended.run_contended(
            self.pool,
            self.probe,
            self.pool.shared(p.procs),
            p.c_runs,
            p.c_rounds,
            p.c_duration,
            p.warm,
            p.grace,
        )
        self.results["contended"] = res
        self._emit("contended", _contended.contended_tables(res), _contended.contended_notes(res))
        for peer in res["peers"]:
            overlaps = sum(run[peer]["overlaps"] for run in res["per_run"])
            self.checks.append((f"contended: mutual exclusion held ({peer})", overlaps == 0))
        for ours in (c.OURS, c.OURS_LEAN, _contended.OURS_FORKED):
            stuck = sum(run[ours]["stalls"] + run[ours]["failures"] for run in res["per_run"])
            self.checks.append((f"contended: no stall > 1 s, no timeout ({ours})", stuck == 0))
        relay = _contended.run_relay(
            self.pool,
            self.probe,
            self.pool.shared(p.procs),
            p.c_runs,
            p.relay_rounds,
            p.c_duration,
            p.warm,
        )
        res["relay"] = relay
        self._emit("contended", _contended.relay_tables(relay), _contended.relay_notes(relay))
        for mode in relay["modes"]:
            moved = all(run[mode]["passes_per_s"] > 0 for run in relay["per_run"])
            self.checks.append((f"hand-off floor: the token went round ({mode})", moved))

    def manykeys(self) -> None:
        p = self.plan
        res = _contended.run_many_keys(
            self.pool,
            self.pool.shared(p.mk_procs),
            p.mk_threads,
            p.mk_keys,
            p.mk_runs,
            p.mk_rounds,
            p.mk_duration,
            p.warm,
            p.grace,
        )
        self.results["manykeys"] = res
        self._emit("manykeys", _contended.many_keys_tables(res), _contended.many_keys_notes(res))
        for ours in (c.OURS, c.OURS_LEAN):
            stuck = sum(run[ours]["stalls"] + run[ours]["failures"] for run in res["per_run"])
            self.checks.append((f"many keys: no stall > 1 s, no timeout ({ours})", stuck == 0))

    def watchdog(self) -> None:
        p = self.plan
        res = _held.run_watchdog(self.pool, self.probe, p.wd_locks, p.wd_timeout, p.wd_window)
        self.results["watchdog"] = res
        self._emit("watchdog", _held.watchdog_tables(res), _held.watchdog_notes(res))
        self.checks.append((f"watchdog: none of {res['locks']:,} locks lost", res["lost"] == 0))
        self.checks.append(("watchdog: one renewal thread", res["watchdog_threads"] == 1))

    def memory(self) -> None:
        p = self.plan
        res = self._fresh(
            "benchmarks._held:memory", timeout=900, count=p.mem_locks, settle=p.mem_settle
        )
        self.results["memory"] = res
        self._emit("memory", _held.memory_tables(res), _held.memory_notes(res))

    def asyncio(self) -> None:
        p = self.plan
        worker = self.pool.fresh()
        try:
            unc = self.pool.call(
                worker,
                "benchmarks._aio:uncontended",
                900,
                runs=p.aio_uc_runs,
                rounds=p.aio_uc_rounds,
                per_round=p.aio_uc_cycles,
                count_cycles=p.count_cycles,
            )
            con = _aio.run_contended(
                self.pool,
                worker,
                p.aio_tasks,
                p.aio_c_runs,
                p.aio_c_rounds,
                p.aio_c_duration,
                p.warm,
                p.grace,
            )
        finally:
            self.pool.retire(worker)
        lag = self._fresh(
            "benchmarks._aio:loop_lag",
            timeout=p.lag_window + p.lag_baseline + 600,
            locks=p.lag_locks,
            lease=p.lag_timeout,
            window=p.lag_window,
            baseline=p.lag_baseline,
        )
        self.results["asyncio"] = {"uncontended": unc, "contended": con, "lag": lag}
        self._emit("asyncio", _aio.tables(unc, con, lag), _aio.notes(unc, con, lag))
        overlaps = sum(run[_aio.OURS_ASYNC]["overlaps"] for run in con["per_run"])
        self.checks.append(("asyncio: mutual exclusion held (AsyncLock)", overlaps == 0))
        self.checks.append((f"asyncio: none of {lag['locks']:,} AsyncLocks lost", lag["lost"] == 0))

    def semaphore(self) -> None:
        p = self.plan
        unc = self._fresh(
            "benchmarks._semaphore:uncontended",
            timeout=900,
            runs=p.sem_uc_runs,
            rounds=p.sem_uc_rounds,
            per_round=p.sem_uc_cycles,
            count_cycles=p.count_cycles,
            permits=p.sem_permits,
        )
        con = _semaphore.run_contended(
            self.pool,
            self.pool.shared(p.sem_procs),
            p.sem_threads,
            p.sem_permits,
            p.sem_hold,
            p.sem_runs,
            p.sem_rounds,
            p.sem_duration,
            p.warm,
            p.grace,
        )
        self.results["semaphore"] = {"uncontended": unc, "contended": con}
        self._emit("semaphore", _semaphore.tables(unc, con), _semaphore.notes(unc, con))
        runs = con["per_run"]
        most = max(run[_semaphore.SEM_OURS]["max_holders"] for run in runs)
        self.checks.append(
            (f"semaphore: never more than {p.sem_permits} holders ({most:.0f} seen)",
             most <= p.sem_permits)
        )  # fmt: skip
        stuck = sum(
            run[_semaphore.SEM_OURS]["stalls"] + run[_semaphore.SEM_OURS]["failures"]
            for run in runs
        )
        self.checks.append(("semaphore: no stall > 1 s, no timeout (Semaphore)", stuck == 0))

    def cluster(self) -> None:
        p = self.plan
        res = _topology.run_cluster(
            self.servers,
            self.pool,
            self.pool.shared(p.cl_procs),
            self.server.pid,
            p.cl_threads,
            p.cl_keys,
            p.cl_runs,
            p.cl_rounds,
            p.cl_duration,
            p.warm,
            p.grace,
            p.cl_prime,
        )
        self.results["cluster"] = res
        self._emit("cluster", _topology.cluster_tables(res), _topology.cluster_notes(res))
        stuck = sum(
            run[peer]["stalls"] + run[peer]["failures"]
            for run in res["per_run"]
            for peer in res["peers"]
        )
        self.checks.append(("cluster: no stall > 1 s, no timeout", stuck == 0))

    def failover(self) -> None:
        p = self.plan
        res = _topology.run_failover(
            self.servers, p.fo_repeats, p.fo_lead, p.fo_settle, p.fo_max_after, p.fo_parallel
        )
        self.results["failover"] = res
        self._emit("failover", _topology.failover_tables(res), _topology.failover_notes(res))
        for label, topo in res["topologies"].items():
            recovered = all(r["outage_s"] == r["outage_s"] for r in topo["runs"])  # not NaN
            self.checks.append((f"failover: acquisitions resumed after every kill ({label})",
                                recovered))  # fmt: skip

    def replicas(self) -> None:
        p = self.plan
        res = _topology.run_replicas(
            self.servers, p.rep_runs, p.rep_rounds, p.rep_cycles, p.count_cycles
        )
        self.results["replicas"] = res
        self._emit("replicas", _topology.replicas_tables(res), _topology.replicas_notes(res))
        self.checks.append(
            (
                "replicas: WAIT rides in the acquisition's round trip (2 per REPLICAS=1 cycle)",
                res["round_trips"][_topology.REPLICAS_ON] == 2,
            )
        )

    def rate(self) -> None:
        p = self.plan
        dec = self._fresh(
            "benchmarks._rate:decisions",
            timeout=900,
            runs=p.rate_runs,
            rounds=p.rate_rounds,
            block=p.rate_block,
            threads=p.rate_threads,
            count=p.rate_count,
        )
        acc = _rate.run_accuracy(
            self.pool,
            self.pool.shared(p.acc_procs),
            p.acc_threads,
            p.acc_limit,
            p.acc_runs,
            p.acc_duration,
        )
        cel = None
        if p.cel_tasks:
            with tempfile.TemporaryDirectory(prefix="bench-rate-celery-") as logs:
                cel = self._fresh(
                    "benchmarks._rate:celery_throughput",
                    timeout=600,
                    workers=p.cel_workers,
                    tasks=p.cel_tasks,
                    rate=p.cel_rate,
                    log_dir=logs,
                )
        self.results["rate"] = {"decisions": dec, "accuracy": acc, "celery": cel}
        self._emit("rate", _rate.tables(dec, acc, cel), _rate.notes(dec, acc, cel))
        self.checks += _rate.checks(acc)
        errors = sum(run[p]["errors"] for run in acc["per_run"] for p in acc["peers"])
        self.checks.append(("rate: no limiter raised under load (12b)", errors == 0))

    def coordination(self) -> None:
        p = self.plan
        rw = _coord.run_read_mostly(
            self.pool,
            self.pool.shared(p.rw_procs),
            p.rw_writes,
            p.rw_hold,
            p.rw_runs,
            p.rw_rounds,
            p.rw_duration,
            p.warm,
            p.grace,
        )
        bar = _coord.run_barrier(self.pool, self.pool.shared(p.rw_procs), p.bar_rounds, p.bar_runs)
        self.results["coordination"] = {"read_mostly": rw, "barrier": bar}
        self._emit("coordination", _coord.tables(rw, bar), _coord.notes(rw, bar))
        for peer in (_coord.RW_OURS, _coord.LOCK_OURS):
            overlaps = sum(run[peer]["overlaps"] for run in rw["per_run"])
            check = f"coordination: no write overlapped a hold ({peer})"
            self.checks.append((check, overlaps == 0))

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self.servers.close()


def markdown(info: dict[str, Any], run: Run, quick: bool) -> str:
    out = [
        "### Benchmarks" + (" (quick smoke run: sizes too small to quote)" if quick else ""),
        "",
        *[f"- {line}" for line in c.machine_lines(info)],
        "- command: `" + " ".join(["python", "benchmarks/bench_locks.py", *sys.argv[1:]]) + "`",
    ]
    for _section, tables, notes in run.tables:
        for title, (headers, rows) in tables.items():
            out += ["", f"#### {title}", "", c.markdown_table(headers, rows)]
        if notes:
            out += ["", *[f"- {n}" for n in notes]]
    return "\n".join(out) + "\n"


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: workers, server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=", ".join(SECTIONS))
    parser.add_argument(
        "--section",
        action="append",
        default=[],
        metavar="SECTION",
        help="run this section (repeatable; the same as naming it)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a CI smoke run")
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the Markdown block here")
    parser.add_argument(
        "--node-timeout",
        type=int,
        default=1000,
        metavar="MS",
        help="failover: cluster-node-timeout of the Cluster (default 1000)",
    )
    parser.add_argument(
        "--down-after",
        type=int,
        default=2000,
        metavar="MS",
        help="failover: Sentinel down-after-milliseconds (default 2000)",
    )
    args = parser.parse_args(argv)
    chosen = set(args.sections + args.section or SECTIONS)
    bad = chosen - set(SECTIONS)
    if bad:
        parser.error(f"unknown sections: {', '.join(sorted(bad))}")
    plan = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _terminate)

    wall = time.monotonic()
    with c.redis_server_class()() as server:
        bench = Run(plan, server, chosen, args.node_timeout, args.down_after)
        try:
            info = c.machine_info(server.binary, bench.conn)
            print("\n".join(c.machine_lines(info)))
            print(
                f"{'quick' if args.quick else 'full'} run of: "
                + ", ".join(s for s in SECTIONS if s in chosen)
            )
            for section in SECTIONS:
                if section not in chosen or section == "stats":
                    continue
                began = time.monotonic()
                if section == "uncontended":
                    bench.uncontended(True, "stats" in chosen)
                else:
                    getattr(bench, section)()
                print(f"  [{section}: {time.monotonic() - began:.0f} s]")
            if "stats" in chosen and "uncontended" not in chosen:
                bench.uncontended(False, True)
        finally:
            bench.close()
        info["loadavg_end"] = os.getloadavg()
    wall = time.monotonic() - wall
    print("\n== Checks (correctness seen while measuring; figures are not judged) ==")
    for text, ok in bench.checks:
        print(f"{'ok  ' if ok else 'FAIL'}  {text}")
    block = markdown(info, bench, args.quick)
    print(f"\nwall time {wall:.0f} s\n\n----- Markdown (paste into the README) -----\n")
    print(block)
    if args.markdown:
        Path(args.markdown).write_text(block)
    if args.json:
        payload = {
            "plan": asdict(plan),
            "quick": args.quick,
            "sections": sorted(chosen),
            "machine": info,
            "wall_s": wall,
            "results": bench.results,
            "checks": [{"check": t, "ok": ok} for t, ok in bench.checks],
            "markdown": block,
        }
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
