"""Benchmark django-redislock's ``Lock`` against redis-py's ``Lock`` and python-redis-lock.

One private redis-server (``django_redislock.testing.RedisServer``), one run, one table:

1. Uncontended acquire+release on one key in one process (latency, cycles/s, round trips).
2. Contended hand-off: N = 2, 4, 8 spawned processes looping acquire -> release on one key
   (acquisitions/s, cross-process hand-offs/s, hand-off latency, commands per acquisition, Jain
   fairness, and a mutual-exclusion check over the merged hold log).
3. Watchdog: 1,000 auto-renewed locks held by one process (threads, renewal round trips, losses).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_locks.py [--quick] [--json results.json]

Why the measurements are taken this way:

- Round trips are counted on the client, by wrapping redis-py's ``Redis.execute_command`` and
  ``Pipeline.execute`` in the benchmark processes only; ``INFO commandstats`` cannot tell a
  client's ``GET`` from a ``GET`` run inside a Lua script, so the server's figure is reported
  separately as "all commands" (top level + inside scripts).
- Hand-off latency uses ``time.perf_counter()``, which is ``CLOCK_MONOTONIC`` and therefore
  comparable across processes on Linux.
- The competitors share django-redis's client (same pool, same parser) so only the lock differs.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Commands the harness itself sends (never part of a lock's cost).
_HARNESS_COMMANDS = ("info", "ping", "client", "hello", "select", "config", "flushdb", "command")
_OURS = "django-redislock"
_RP_SLOW = "redis-py Lock sleep=0.1"
_RP_FAST = "redis-py Lock sleep=0.001"
_PRL = "python-redis-lock"
CONTENDED_VARIANTS = (_OURS, _RP_SLOW, _RP_FAST, _PRL)


# -- shared setup ---------------------------------------------------------------------------------
def configure_django(url: str) -> None:
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        SECRET_KEY="bench",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislock"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"{url}/0",
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
            }
        },
        REDISLOCK={},
        LOGGING_CONFIG=None,
    )
    django.setup()


def client() -> Any:
    from django_redis import get_redis_connection

    return get_redis_connection("default", write=True)


class CommandCounter:
    """Client-side count of round trips and top-level commands (redis-py is patched once)."""

    def __init__(self) -> None:
        self.enabled = False
        self.commands: Counter[str] = Counter()
        self.round_trips = 0
        self.by_thread: Counter[str] = Counter()  # round trips per thread name
        self.pipeline_sizes: list[tuple[str, int]] = []  # (thread name, commands)

    def install(self) -> None:
        import redis.client

        counter = self
        plain: Callable[..., Any] = redis.client.Redis.execute_command
        pipelined: Callable[..., Any] = redis.client.Pipeline.execute

        def execute_command(self: Any, *args: Any, **options: Any) -> Any:
            if counter.enabled:
                counter.commands[str(args[0]).lower()] += 1
                counter.round_trips += 1
                counter.by_thread[threading.current_thread().name] += 1
            return plain(self, *args, **options)

        def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.enabled:
                size = len(self.command_stack)
                for command in self.command_stack:
                    cmd_args = command[0] if isinstance(command, tuple) else command.args
                    counter.commands[str(cmd_args[0]).lower()] += 1
                counter.round_trips += 1
                thread = threading.current_thread().name
                counter.by_thread[thread] += 1
                counter.pipeline_sizes.append((thread, size))
            return pipelined(self, *args, **kwargs)

        redis.client.Redis.execute_command = execute_command  # type: ignore[method-assign]
        redis.client.Pipeline.execute = execute  # type: ignore[method-assign]

    def reset(self) -> None:
        self.commands.clear()
        self.round_trips = 0
        self.by_thread.clear()
        self.pipeline_sizes.clear()

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.enabled = True
        try:
            yield
        finally:
            self.enabled = False


COUNTER = CommandCounter()


def command_stats(conn: Any) -> Counter[str]:
    """``INFO commandstats`` calls per command, without the harness's own commands."""
    stats: Counter[str] = Counter()
    for key, value in conn.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name.split("|")[0] not in _HARNESS_COMMANDS:
            # A NOSCRIPT reply counts as a call too (and as a failed call): keep real work only.
            stats[name] = int(value["calls"]) - int(value.get("failed_calls", 0))
    return stats


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by the redis-server process (Linux /proc)."""
    if pid is None or not Path(f"/proc/{pid}/stat").exists():
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_lock(variant: str, name: str, conn: Any) -> Any:
    """A lock object of ``variant`` with the options the README compares."""
    if variant.startswith(_OURS):
        from django_redislock import Lock

        if variant.endswith("auto_renew=False"):
            return Lock(name, auto_renew=False)
        return Lock(name)  # defaults: TIMEOUT 30 s, AUTO_RENEW True
    if variant.startswith("redis-py"):
        from redis.lock import Lock as RedisPyLock

        sleep = 0.001 if variant == _RP_FAST else 0.1
        return RedisPyLock(conn, name, timeout=30, sleep=sleep)
    if variant == _PRL:
        import redis_lock

        return redis_lock.Lock(conn, name, expire=30)
    raise ValueError(variant)


def pct(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# -- 1. uncontended -------------------------------------------------------------------------------
UNCONTENDED_VARIANTS = (
    f"{_OURS} (auto_renew=True)",
    f"{_OURS} auto_renew=False",
    "redis-py Lock",
    _PRL,
)


def bench_uncontended(conn: Any, rounds: int, per_round: int) -> dict[str, Any]:
    locks: dict[str, Any] = {
        v: make_lock(v, f"bench:uc:{i}", conn) for i, v in enumerate(UNCONTENDED_VARIANTS)
    }
    cycles: dict[str, Callable[..., None]] = {}
    for variant, lock in locks.items():

        def cycle(lock: Any = lock) -> None:
            lock.acquire()
            lock.release()

        cycles[variant] = cycle

    def ping2() -> None:
        conn.ping()
        conn.ping()

    cycles["2 x PING"] = ping2

    # Round trips per cycle, counted outside the timed loops.
    trips: dict[str, float] = {}
    for variant, cycle in cycles.items():
        for _ in range(50):
            cycle()  # warm-up: scripts loaded, pools filled, watchdog thread started
        COUNTER.reset()
        with COUNTER.counting():
            for _ in range(100):
                cycle()
        trips[variant] = COUNTER.round_trips / 100
    samples: dict[str, list[float]] = {v: [] for v in cycles}
    busy: dict[str, float] = dict.fromkeys(cycles, 0.0)
    cpu: dict[str, float] = dict.fromkeys(cycles, 0.0)  # this process, watchdog thread included
    # Median of each short round: ratios are taken round by round, between variants measured
    # within milliseconds of each other, so load from other processes mostly cancels out.
    round_medians: dict[str, list[float]] = {v: [] for v in cycles}
    order = list(cycles)
    clock = time.perf_counter
    for r in range(rounds):
        for variant in order[r % len(order) :] + order[: r % len(order)]:  # rotate: no order bias
            cycle, out = cycles[variant], []
            began, began_cpu = clock(), time.process_time()
            for _ in range(per_round):
                t0 = clock()
                cycle()
                out.append(clock() - t0)
            busy[variant] += clock() - began
            cpu[variant] += time.process_time() - began_cpu
            samples[variant] += out
            round_medians[variant].append(statistics.median(out))
    results: dict[str, Any] = {}
    for variant, values in samples.items():
        values.sort()
        results[variant] = {
            "median_us": pct(values, 0.5) * 1e6,
            "p99_us": pct(values, 0.99) * 1e6,
            "cycles_per_s": len(values) / busy[variant],
            "client_cpu_us": cpu[variant] / len(values) * 1e6,
            "round_trips_per_cycle": trips[variant],
            "samples": len(values),
        }
    for variant, row in results.items():
        mine = round_medians[variant]
        row["x_2ping"] = statistics.median(
            m / p for m, p in zip(mine, round_medians["2 x PING"], strict=True)
        )
        row["x_redis_py"] = statistics.median(
            m / p for m, p in zip(mine, round_medians["redis-py Lock"], strict=True)
        )
    return results


# -- 2. contended ---------------------------------------------------------------------------------
def _worker_main(pipe: Connection, url: str, index: int) -> None:
    """A benchmark process: runs contended loops on request until told to stop."""
    configure_django(url)
    COUNTER.install()
    conn = client()
    conn.ping()
    pipe.send("ready")
    while True:
        message = pipe.recv()
        if message[0] == "stop":
            return
        _, variant, name, t_start, t_end = message
        lock = make_lock(variant, name, conn)
        events: list[tuple[float, float]] = []
        clock = time.perf_counter
        COUNTER.reset()
        time.sleep(max(0.0, t_start - clock()))
        cpu = time.process_time()
        with COUNTER.counting():
            while True:
                lock.acquire()
                acquired = clock()
                # critical section: empty (the hand-off itself is what is measured)
                releasing = clock()
                lock.release()
                events.append((acquired, releasing))
                if clock() >= t_end:
                    break
        cpu = time.process_time() - cpu
        pipe.send(
            {
                "index": index,
                "events": events,
                "cpu_s": cpu,
                "commands": dict(COUNTER.commands),
                "round_trips": COUNTER.round_trips,
            }
        )


class WorkerPool:
    def __init__(self, url: str, size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, url, i), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:  # idle before measuring: imports would steal the 2 cores
            if pipe.recv() != "ready":
                raise RuntimeError("benchmark worker failed to start")

    def run(
        self, n: int, variant: str, name: str, warmup: float, duration: float
    ) -> tuple[list[dict[str, Any]], float, float]:
        t_start = time.perf_counter() + warmup
        t_end = t_start + duration
        for pipe in self.pipes[:n]:
            pipe.send(("run", variant, name, t_start, t_end))
        return [pipe.recv() for pipe in self.pipes[:n]], t_start, t_end

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(("stop",))
        for proc in self.procs:
            proc.join(10)


def analyse_contended(
    replies: list[dict[str, Any]],
    t_start: float,
    t_end: float,
    server: Counter[str],
    server_cpu: float,
) -> dict[str, Any]:
    duration = t_end - t_start
    merged = sorted((a, r, reply["index"]) for reply in replies for a, r in reply["events"])
    overlaps = sum(1 for prev, cur in itertools.pairwise(merged) if cur[0] < prev[1])
    in_window = [e for e in merged if t_start <= e[0] < t_end]
    handoffs = sorted(
        cur[0] - prev[1]
        for prev, cur in itertools.pairwise(merged)
        if cur[2] != prev[2] and t_start <= cur[0] < t_end
    )
    per_proc = Counter(e[2] for e in in_window)
    counts = [per_proc.get(reply["index"], 0) for reply in replies]
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)) if any(counts) else 0.0
    total_acq = len(merged)
    top: Counter[str] = Counter()
    for reply in replies:
        top.update(reply["commands"])
    top_total = sum(top.values())
    all_total = sum(server.values())
    return {
        "acquisitions_per_s": len(in_window) / duration,
        "handoffs_per_s": len(handoffs) / duration,
        "handoff_p50_ms": pct(handoffs, 0.5) * 1e3,
        "handoff_p99_ms": pct(handoffs, 0.99) * 1e3,
        "top_level_per_acq": top_total / total_acq,
        "all_commands_per_acq": all_total / total_acq,
        "round_trips_per_acq": sum(r["round_trips"] for r in replies) / total_acq,
        "server_cpu_us_per_acq": server_cpu / total_acq * 1e6,
        "client_cpu_us_per_acq": sum(r["cpu_s"] for r in replies) / total_acq * 1e6,
        "jain": jain,
        "per_process": counts,
        "overlaps": overlaps,
        "acquisitions_total": total_acq,
        "top_level_by_command": dict(top),
        "server_by_command": dict(server),
    }


def bench_contended(
    conn: Any, pool: WorkerPool, ns: Sequence[int], duration: float, server_pid: int | None
) -> dict[str, dict[int, dict[str, Any]]]:
    results: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in CONTENDED_VARIANTS}
    for n in ns:
        for variant in CONTENDED_VARIANTS:
            conn.flushdb()
            before, cpu_before = command_stats(conn), server_cpu_s(server_pid)
            replies, t_start, t_end = pool.run(n, variant, f"bench:contended:{n}", 0.2, duration)
            cpu = server_cpu_s(server_pid) - cpu_before
            after = command_stats(conn)
            results[variant][n] = analyse_contended(replies, t_start, t_end, after - before, cpu)
    return results


# -- 3. watchdog ----------------------------------------------------------------------------------
def bench_watchdog(conn: Any, count: int, timeout: float, window: float) -> dict[str, Any]:
    from django_redislock import Lock, LockNotOwnedError
    from django_redislock.keys import keyspace

    locks = [Lock(f"bench:wd:{i}", timeout=timeout) for i in range(count)]
    began = time.perf_counter()
    taken = sum(1 for lock in locks if lock.acquire(blocking=False))
    acquire_s = time.perf_counter() - began
    before = command_stats(conn)
    COUNTER.reset()
    keys = [keyspace().lock(lock.name) for lock in locks]
    min_pttl = float("inf")
    with COUNTER.counting():
        end = time.monotonic() + window
        while time.monotonic() < end:
            time.sleep(0.25)
            # Lease left on every lock; this probe is counted under MainThread, not the watchdog.
            pipe = conn.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
            min_pttl = min(min_pttl, *(int(v) for v in pipe.execute()))
    renewals = (command_stats(conn) - before).get("evalsha", 0)
    threads = [t.name for t in threading.enumerate() if t.name == "django-redislock-watchdog"]
    watchdog_trips = COUNTER.by_thread.get("django-redislock-watchdog", 0)
    sizes = [
        size for thread, size in COUNTER.pipeline_sizes if thread == "django-redislock-watchdog"
    ]
    lost_flag = sum(1 for lock in locks if lock.lost)
    release_failed = 0
    for lock in locks:
        try:
            lock.release()
        except LockNotOwnedError:
            release_failed += 1
    intervals = window / (timeout / 3)
    return {
        "locks": count,
        "acquired": taken,
        "acquire_all_s": acquire_s,
        "timeout_s": timeout,
        "window_s": window,
        "watchdog_threads": len(threads),
        "renewals_per_lock": renewals / count,
        "renewal_intervals": intervals,
        "watchdog_round_trips": watchdog_trips,
        "round_trips_per_interval_per_100": watchdog_trips / intervals / (count / 100),
        "pipeline_sizes": sizes,
        "min_pttl_ms": min_pttl,
        "lost_flagged": lost_flag,
        "release_failed": release_failed,
    }


# -- report ---------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(res: dict[str, Any]) -> list[tuple[str, bool]]:
    targets: list[tuple[str, bool]] = []
    print(
        "\n== 1. Uncontended acquire+release, one process, one key (x ratios: median of "
        "per-round ratios) =="
    )
    print(
        f"{'variant':36} {'median us':>10} {'p99 us':>9} {'cycles/s':>9} {'RTT/cyc':>8} "
        f"{'cpu us':>7} {'x 2PING':>8} {'x redis-py':>10}"
    )
    for variant, row in res["uncontended"].items():
        print(
            f"{variant:36} {row['median_us']:10.1f} {row['p99_us']:9.1f} "
            f"{row['cycles_per_s']:9.0f} {row['round_trips_per_cycle']:8.2f} "
            f"{row['client_cpu_us']:7.1f} "
            f"{row['x_2ping']:8.2f} {row['x_redis_py']:10.3f}"
        )
    ours = res["uncontended"][UNCONTENDED_VARIANTS[0]]
    targets.append(
        (
            f"uncontended median <= 1.05 x redis-py Lock ({ours['x_redis_py']:.3f})",
            ours["x_redis_py"] <= 1.05,
        )
    )
    targets.append(
        (
            f"uncontended = 2 round trips per cycle ({ours['round_trips_per_cycle']:.2f})",
            ours["round_trips_per_cycle"] == 2,
        )
    )

    print(
        f"\n== 2. Contended hand-off, one key, {res['duration_s']:g} s per run "
        "(critical section empty) =="
    )
    print(
        f"{'variant':26} {'N':>2} {'acq/s':>7} {'handoff/s':>9} {'p50 ms':>7} {'p99 ms':>8} "
        f"{'RTT/acq':>7} {'top/acq':>7} {'all/acq':>7} {'cli us':>6} {'srv us':>6} {'Jain':>5} "
        f"{'overlap':>7}  per-process"
    )
    for variant, by_n in res["contended"].items():
        for n, row in by_n.items():
            print(
                f"{variant:26} {n:2d} {row['acquisitions_per_s']:7.0f} "
                f"{row['handoffs_per_s']:9.0f} {row['handoff_p50_ms']:7.3f} "
                f"{row['handoff_p99_ms']:8.3f} {row['round_trips_per_acq']:7.2f} "
                f"{row['top_level_per_acq']:7.2f} "
                f"{row['all_commands_per_acq']:7.2f} {row['client_cpu_us_per_acq']:6.0f} "
                f"{row['server_cpu_us_per_acq']:6.0f} "
                f"{row['jain']:5.3f} {row['overlaps']:7d}  "
                f"{row['per_process']}"
            )
    print(
        "handoff = consecutive holds by different processes; p50/p99 = release() call -> "
        "next holder's acquire() return (nan: none seen)\n"
        "RTT/acq = round trips, top/acq = commands the client sent; all/acq = INFO commandstats, "
        "commands inside Lua included\n"
        "cli/srv us = CPU per acquisition of all lock processes / of redis-server; "
        "overlap = holds that overlapped in time (must be 0)"
    )
    n_max = max(res["contended"][_OURS])
    ours8, prl8 = res["contended"][_OURS][n_max], res["contended"][_PRL][n_max]
    targets += [
        (
            f"N={n_max} hand-off p50 <= 0.5 ms ({ours8['handoff_p50_ms']:.3f})",
            ours8["handoff_p50_ms"] <= 0.5,
        ),
        (
            f"N={n_max} hand-off p99 <= 2 ms ({ours8['handoff_p99_ms']:.3f})",
            ours8["handoff_p99_ms"] <= 2.0,
        ),
        (
            f"N={n_max} hand-offs/s >= python-redis-lock ({ours8['handoffs_per_s']:.0f} vs "
            f"{prl8['handoffs_per_s']:.0f})",
            ours8["handoffs_per_s"] >= prl8["handoffs_per_s"],
        ),
        (
            f"N={n_max} top-level commands/acq <= 1/2 python-redis-lock "
            f"({ours8['top_level_per_acq']:.2f} vs {prl8['top_level_per_acq']:.2f})",
            ours8["top_level_per_acq"] <= prl8["top_level_per_acq"] / 2,
        ),
        (
            f"N={n_max} all commands/acq <= 1/2 python-redis-lock "
            f"({ours8['all_commands_per_acq']:.2f} vs {prl8['all_commands_per_acq']:.2f})",
            ours8["all_commands_per_acq"] <= prl8["all_commands_per_acq"] / 2,
        ),
        (f"N={n_max} Jain fairness >= 0.95 ({ours8['jain']:.3f})", ours8["jain"] >= 0.95),
        (
            "mutual exclusion: no overlapping holds (django-redislock, all N)",
            all(row["overlaps"] == 0 for row in res["contended"][_OURS].values()),
        ),
    ]

    wd = res["watchdog"]
    print(
        f"\n== 3. Watchdog: {wd['locks']} locks, timeout {wd['timeout_s']:g} s (renew every "
        f"{wd['timeout_s'] / 3:g} s), observed {wd['window_s']:g} s =="
    )
    print(
        f"acquired {wd['acquired']}/{wd['locks']} in {wd['acquire_all_s'] * 1e3:.0f} ms; "
        f"watchdog threads {wd['watchdog_threads']}; renewals/lock {wd['renewals_per_lock']:.2f} "
        f"over {wd['renewal_intervals']:.1f} intervals"
    )
    print(
        f"watchdog round trips {wd['watchdog_round_trips']} (pipelines of "
        f"{wd['pipeline_sizes']} commands) = {wd['round_trips_per_interval_per_100']:.3f} per "
        "interval per 100 locks"
    )
    print(
        f"min lease left seen {wd['min_pttl_ms']} ms; flagged lost {wd['lost_flagged']}; "
        f"failed releases {wd['release_failed']}"
    )
    targets += [
        (f"watchdog threads == 1 ({wd['watchdog_threads']})", wd["watchdog_threads"] == 1),
        (
            "watchdog <= 1 round trip per interval per 100 locks "
            f"({wd['round_trips_per_interval_per_100']:.3f})",
            wd["round_trips_per_interval_per_100"] <= 1,
        ),
        (
            f"watchdog: none of {wd['locks']} lost (lost {wd['lost_flagged']}, failed releases "
            f"{wd['release_failed']}, min lease {wd['min_pttl_ms']} ms)",
            wd["acquired"] == wd["locks"]
            and wd["lost_flagged"] == 0
            and wd["release_failed"] == 0
            and wd["min_pttl_ms"] > 0,
        ),
    ]
    print("\n== Targets ==")
    for text, ok in targets:
        print(f"{verdict(ok)}  {text}")
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI smoke (< 20 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    from django_redislock.testing import RedisServer

    wall = time.monotonic()
    with RedisServer() as server:
        version = subprocess.run(
            [server.binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        print(f"redis-server: {server.binary} ({version})")
        print(
            f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"{'quick' if args.quick else 'full'} run"
        )
        configure_django(server.url)
        import redis
        import redis_lock

        import django_redislock

        print(
            f"django-redislock {django_redislock.__version__}, redis-py {redis.__version__}, "
            f"python-redis-lock {redis_lock.__version__}"
        )
        COUNTER.install()
        conn = client()
        conn.flushdb()
        started = time.monotonic()
        pool = WorkerPool(server.url, 8)
        print(f"8 worker processes spawned in {time.monotonic() - started:.1f} s")
        rounds, per_round = (8, 150) if args.quick else (40, 500)
        res: dict[str, Any] = {
            "redis_server": server.binary,
            "redis_version": version,
            "quick": args.quick,
        }
        gc.collect()
        res["uncontended"] = bench_uncontended(conn, rounds, per_round)
        duration = 0.4 if args.quick else 3.0
        res["duration_s"] = duration
        res["contended"] = bench_contended(conn, pool, (2, 4, 8), duration, server.pid)
        pool.close()
        conn.flushdb()
        res["watchdog"] = bench_watchdog(conn, 1000, 3.0, 2.0 if args.quick else 4.0)
        targets = report(res)
        res["targets"] = [{"target": t, "pass": ok} for t, ok in targets]
        from django_redislock import stats

        stats.flush()  # while the server is still up (the exit-time flush would find it gone)
    res["wall_s"] = time.monotonic() - wall
    print(f"\nwall time {res['wall_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
