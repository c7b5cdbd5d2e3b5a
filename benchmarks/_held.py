"""Sections 4 and 6: many held locks — the watchdog's cost, and Redis memory per lock.

Watchdog: one fresh process takes N auto-renewed locks, then does nothing for the observed
window while the parent probes every lock's remaining lease (``PTTL``, pipelined, on its own
connection) once a second. The holder's CPU over the window (``time.process_time``: all its
threads, ns resolution) is the watchdog's cost; its round trips are counted per thread.

Memory: per peer, on an empty database with the scripts already loaded, ``INFO memory``
``used_memory`` before and after N locks are held, then after they are all released (ours:
statistics flushed first, so their keys are included). Keys left are classified by kind and by
lifetime (expiring within a minute, or later) with ``SCAN`` + ``PTTL`` + ``MEMORY USAGE``.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH

_HELD: dict[str, Any] = {}
WATCHDOG_THREAD = "django-redislock-watchdog"


# -- watchdog jobs (in one fresh worker) ----------------------------------------------------------


def idle_cpu(seconds: float) -> float:
    """CPU % of one core this process uses while doing nothing (the baseline of the window)."""
    cpu = time.process_time()
    time.sleep(seconds)
    return (time.process_time() - cpu) / seconds * 100


def take(count: int, lease: float) -> dict[str, Any]:
    from django_redislock import Lock, stats
    from django_redislock.runtime import keyspace

    locks = [Lock(f"bench:wd:{i}", timeout=lease) for i in range(count)]
    began = time.perf_counter()
    taken = sum(1 for lock in locks if lock.acquire(blocking=False))
    elapsed = time.perf_counter() - began
    stats.flush()  # the acquisitions' statistics now, not inside the observed window
    _HELD["locks"] = locks
    return {
        "taken": taken,
        "acquire_s": elapsed,
        "keys": [keyspace().lock(lock.name) for lock in locks],
    }


def observe(window: float, parts: int) -> dict[str, Any]:
    """Sleep through the window; report this process's CPU (per part, for the spread) and the
    watchdog's round trips."""
    import threading

    locks = _HELD["locks"]
    part_pct: list[float] = []
    with c.COUNTER.counting():
        cpu, began = time.process_time(), time.perf_counter()
        for _ in range(parts):
            part_cpu, part_began = time.process_time(), time.perf_counter()
            time.sleep(window / parts)
            part_pct.append(
                (time.process_time() - part_cpu) / (time.perf_counter() - part_began) * 100
            )
        cpu, elapsed = time.process_time() - cpu, time.perf_counter() - began
    sizes = [size for thread, size in c.COUNTER.pipeline_sizes if thread == WATCHDOG_THREAD]
    return {
        "cpu_s": cpu,
        "elapsed_s": elapsed,
        "part_cpu_pct": part_pct,
        "watchdog_round_trips": c.COUNTER.by_thread.get(WATCHDOG_THREAD, 0),
        "other_round_trips": c.COUNTER.round_trips - c.COUNTER.by_thread.get(WATCHDOG_THREAD, 0),
        "pipeline_sizes": sizes,
        "extra_round_trips": c.COUNTER.by_thread.get(WATCHDOG_THREAD, 0) - len(sizes),
        "watchdog_threads": sum(1 for t in threading.enumerate() if t.name == WATCHDOG_THREAD),
        "threads": sorted(t.name for t in threading.enumerate()),
        "lost_flagged": sum(1 for lock in locks if lock.lost),
    }


def release_all() -> dict[str, Any]:
    from django_redislock import LockNotOwnedError

    failed = 0
    for lock in _HELD.pop("locks"):
        try:
            lock.release()
        except LockNotOwnedError:
            failed += 1
    return {"release_failed": failed}


def run_watchdog(
    pool: c.WorkerPool,
    probe: c.ServerProbe,
    count: int,
    timeout: float,
    window: float,
    parts: int = 3,
) -> dict[str, Any]:
    worker = pool.fresh()
    try:
        idle = pool.call(worker, "benchmarks._held:idle_cpu", 60, seconds=min(3.0, window))
        held = pool.call(worker, "benchmarks._held:take", 600, count=count, lease=timeout)
        keys = held.pop("keys")
        conn = probe.conn
        min_pttl = float("inf")
        pid = pool.pid(worker)
        with probe.measure() as srv:
            cpu_outside = c.process_cpu_s(pid)
            pool.start(worker, "benchmarks._held:observe", window=window, parts=parts)
            end = time.perf_counter() + window
            while time.perf_counter() < end - 0.5:
                time.sleep(min(1.0, max(0.0, end - 0.5 - time.perf_counter())))
                pipe = conn.pipeline(transaction=False)
                for key in keys:
                    pipe.pttl(key)
                min_pttl = min(min_pttl, *(int(v) for v in pipe.execute()))
            seen = pool.collect([worker], timeout=window + 120)[0]
            cpu_outside = c.process_cpu_s(pid) - cpu_outside
        released = pool.call(worker, "benchmarks._held:release_all", 600)
    finally:
        pool.retire(worker)
    intervals = seen["elapsed_s"] / (timeout / 3)
    renewals = srv["commands"].get("pexpire", (0, 0))[0]  # one PEXPIRE per renewal (in Lua)
    return {
        "locks": count,
        "timeout_s": timeout,
        "window_s": seen["elapsed_s"],
        "idle_cpu_pct": idle,
        "cpu_pct": seen["cpu_s"] / seen["elapsed_s"] * 100,
        "cpu_pct_parts": c.Spread.of(seen["part_cpu_pct"]).as_dict(),
        "parts": parts,
        "cpu_pct_proc": cpu_outside / seen["elapsed_s"] * 100,
        "cpu_source": probe.cpu_source,
        "watchdog_threads": seen["watchdog_threads"],
        "threads": seen["threads"],
        "intervals": intervals,
        "round_trips_per_interval": seen["watchdog_round_trips"] / intervals,
        "other_round_trips": seen["other_round_trips"],
        "pipeline_sizes": seen["pipeline_sizes"],
        "extra_round_trips": seen["extra_round_trips"],
        "renewals_per_lock_per_interval": renewals / count / intervals,
        "redis_cpu_pct": srv["cpu_s"] / seen["elapsed_s"] * 100,
        "min_lease_left_ms": min_pttl,
        "lost": seen["lost_flagged"] + released["release_failed"],
        "taken": held["taken"],
        "acquire_s": held["acquire_s"],
    }


def watchdog_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    sizes = res["pipeline_sizes"]
    rows = [
        [
            f"{res['locks']:,} locks, timeout {res['timeout_s']:g} s "
            f"(renewed every {res['timeout_s'] / 3:g} s), {res['window_s']:.0f} s observed",
            f"{c.Spread.from_dict(res['cpu_pct_parts']).fmt(2, ' %')}; idle process "
            f"{res['idle_cpu_pct']:.2f} %",
            f"{res['round_trips_per_interval']:.2f}",
            f"{min(sizes, default=0)}{DASH}{max(sizes, default=0)}",
            f"{res['renewals_per_lock_per_interval']:.2f}",
            f"{res['redis_cpu_pct']:.2f} %",
            f"{res['min_lease_left_ms'] / 1000:.2f} s",
            f"{res['lost']}",
        ]
    ]
    headers = [
        "held by one process",
        "holder CPU (% of one core)",
        "renewal round trips / interval",
        "commands per pipeline",
        "renewals / lock / interval",
        "Redis CPU",
        "least lease left",
        "locks lost",
    ]
    return {"4. Watchdog": (headers, rows)}


def watchdog_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"holder CPU: time.process_time of the holding process (all threads), median of "
        f"{res['parts']} equal parts of the window (min{DASH}max of the parts); over the whole "
        f"window {res['cpu_pct']:.2f} %, "
        f"cross-check from outside: {res['cpu_pct_proc']:.2f} % ({res['cpu_source']}). "
        f"Threads in the holder: {', '.join(res['threads'])}.",
        f"taking the {res['locks']:,} locks took {res['acquire_s']:.1f} s "
        f"({res['taken']:,} taken); lease probed once a second from another process; "
        f"watchdog pipelines in the window: {len(res['pipeline_sizes'])} over "
        f"{res['intervals']:.1f} intervals, plus {res['extra_round_trips']} other round trip(s) "
        "from the watchdog thread (SCRIPT LOAD after NOSCRIPT).",
    ]


# -- memory (one fresh worker) --------------------------------------------------------------------

MEMORY_PEERS = (c.OURS, c.REDIS_PY, c.PRL)


def _kind(key: str) -> str:
    if key.startswith("redislock:"):
        return key.split(":", 2)[1]
    if key.startswith("lock-signal:"):
        return "signal"
    return "lock"


def _used(conn: Any) -> int:
    return int(conn.info("memory")["used_memory"])


def _census(conn: Any) -> dict[str, dict[str, float]]:
    """Keys by kind: count, bytes (MEMORY USAGE) and how many live longer than a minute."""
    out: dict[str, dict[str, float]] = {}
    keys = [k.decode() if isinstance(k, bytes) else k for k in conn.scan_iter(count=1000)]
    for start in range(0, len(keys), 2000):
        chunk = keys[start : start + 2000]
        pipe = conn.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
            pipe.memory_usage(key, samples=0)
        values = pipe.execute()
        for i, key in enumerate(chunk):
            pttl, size = int(values[2 * i]), int(values[2 * i + 1] or 0)
            row = out.setdefault(_kind(key), {"keys": 0, "bytes": 0, "long_lived": 0})
            row["keys"] += 1
            row["bytes"] += size
            if pttl == -1 or pttl > 60_000:
                row["long_lived"] += 1
    return out


def memory(count: int, settle: float) -> dict[str, Any]:
    """The job: bytes per held lock and what N distinct names leave behind, per peer."""
    from django_redislock import stats

    conn = c.client()
    results: dict[str, Any] = {}
    for peer in MEMORY_PEERS:
        stats.flush()
        conn.flushdb()
        warm = c.make_lock(peer, "bench:mem:warm", conn)  # scripts loaded, pool filled
        warm.acquire()
        warm.release()
        stats.flush()
        conn.flushdb()
        time.sleep(0.2)
        base_mem, base_keys = _used(conn), int(conn.dbsize())
        locks = [c.make_lock(peer, f"bench:mem:{i}", conn) for i in range(count)]
        for lock in locks:
            if not lock.acquire(blocking=False):
                raise RuntimeError(f"{peer}: could not take a free lock")
        stats.flush()
        held_mem, held_keys = _used(conn) - base_mem, int(conn.dbsize()) - base_keys
        held_census = _census(conn)
        for lock in locks:
            lock.release()
        stats.flush()
        time.sleep(settle)
        left_mem, left_keys = _used(conn) - base_mem, int(conn.dbsize()) - base_keys
        results[peer] = {
            "held_bytes_per_lock": held_mem / count,
            "held_keys_per_lock": held_keys / count,
            "held_census": held_census,
            "left_keys": left_keys,
            "left_bytes": left_mem,
            "left_census": _census(conn),
        }
        del locks
    stats.flush()
    conn.flushdb()
    return {"count": count, "settle_s": settle, "peers": results}


def memory_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer, r in res["peers"].items():
        census = r["left_census"]
        long_lived = sum(int(v["long_lived"]) for v in census.values())
        kinds = ", ".join(
            f"{kind} {int(v['keys']):,}" for kind, v in sorted(census.items()) if v["keys"]
        )
        held_kinds = ", ".join(
            f"{kind} {v['bytes'] / res['count']:.0f} B"
            for kind, v in sorted(r["held_census"].items())
        )
        rows.append(
            [
                peer,
                f"{r['held_bytes_per_lock']:.0f}",
                f"{r['held_keys_per_lock']:.1f} ({held_kinds})",
                f"{r['left_keys']:,}",
                f"{long_lived:,}",
                f"{r['left_bytes'] / 1024:,.0f} KiB",
                kinds or "-",
            ]
        )
    headers = [
        "peer",
        "bytes per held lock",
        "keys per held lock (MEMORY USAGE per kind)",
        f"keys left after {res['count']:,} names",
        "of which live > 1 min",
        "memory left",
        "keys left by kind",
    ]
    return {"6. Redis memory": (headers, rows)}


def memory_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"One measurement (memory figures repeat to within a few bytes); "
        f"{res['count']:,} distinct names per peer; bytes per held lock = INFO memory "
        "used_memory delta / locks (statistics flushed, so their keys count); left = after "
        f"every lock was released and {res['settle_s']:g} s passed (ours: statistics flushed "
        "first). Kinds: lock, fence (fencing counter, 24 h), stats / stats-max (per-name "
        "statistics, 24 h), queue, signal (python-redis-lock's wake-up list, 1 s).",
    ]
