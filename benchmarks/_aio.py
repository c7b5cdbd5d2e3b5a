"""Section 7: asyncio — ``AsyncLock`` against ``redis.asyncio.lock.Lock`` in one event loop.

Runs in one fresh process. Three parts:

- **uncontended** cycle, interleaved rounds exactly like section 1 (same server, same loop);
- **100 tasks** looping acquire -> release on one key in one loop, one ``asyncio.run`` per block
  (so every peer starts from a new loop and new connections), hand-offs analysed like section 2
  with tasks in place of processes; redis-py's asyncio lock polls every ``sleep`` seconds
  (0.1 by default, also 0.001);
- **event-loop lag** while N ``AsyncLock`` s are held and renewed: a probe task sleeps 10 ms
  again and again and records how late it wakes, first with nothing held (the baseline), then
  with the locks held. Our renewals run on the watchdog *thread* with a sync connection, so what
  the loop feels is GIL contention, not awaited I/O.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks import _common as c
from benchmarks import _contended
from benchmarks._common import DASH, X

OURS_ASYNC = "django-redislock AsyncLock"
RP_ASYNC = "redis-py asyncio Lock"
RP_ASYNC_SLOW = "redis-py asyncio Lock sleep=0.1"
RP_ASYNC_FAST = "redis-py asyncio Lock sleep=0.001"
UNCONTENDED_PEERS = (OURS_ASYNC, RP_ASYNC, c.PING2)
CONTENDED_PEERS = (OURS_ASYNC, RP_ASYNC_SLOW, RP_ASYNC_FAST)


def _redis_py_client() -> Any:
    import redis.asyncio as aredis

    return aredis.Redis.from_url(f"{c.WORKER['url']}/0", socket_timeout=5, socket_connect_timeout=2)


def _make(peer: str, name: str, aconn: Any) -> Any:
    if peer == OURS_ASYNC:
        from django_redislock import AsyncLock

        return AsyncLock(name)
    from redis.asyncio.lock import Lock

    sleep = 0.001 if peer == RP_ASYNC_FAST else 0.1
    return Lock(aconn, name, timeout=c.LEASE, sleep=sleep)


async def _parser_of(aconn: Any) -> str:
    connection = await aconn.connection_pool.get_connection()
    try:
        return type(getattr(connection, "_parser", None)).__name__
    finally:
        await aconn.connection_pool.release(connection)


# -- uncontended ----------------------------------------------------------------------------------


def uncontended(runs: int, rounds: int, per_round: int, count_cycles: int) -> dict[str, Any]:
    return asyncio.run(_uncontended(runs, rounds, per_round, count_cycles))


async def _uncontended(runs: int, rounds: int, per_round: int, count_cycles: int) -> dict[str, Any]:
    from django_redislock.runtime import runtime

    sync = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], sync)
    aconn = _redis_py_client()
    ours = _make(OURS_ASYNC, "bench:auc:ours", aconn)
    theirs = _make(RP_ASYNC, "bench:auc:redis-py", aconn)

    async def ours_cycle() -> None:
        await ours.acquire()
        await ours.release()

    async def theirs_cycle() -> None:
        await theirs.acquire()
        await theirs.release()

    async def ping2() -> None:
        await aconn.ping()
        await aconn.ping()

    cycles: dict[str, Callable[[], Awaitable[None]]] = {
        OURS_ASYNC: ours_cycle,
        RP_ASYNC: theirs_cycle,
        c.PING2: ping2,
    }
    for cycle in cycles.values():
        for _ in range(50):
            await cycle()
    parsers = {
        OURS_ASYNC: await _parser_of(await runtime.transport().async_client()),
        RP_ASYNC: await _parser_of(aconn),
    }
    sent: dict[str, dict[str, float]] = {}
    trips: dict[str, float] = {}
    for peer, cycle in cycles.items():
        with c.COUNTER.counting():
            for _ in range(count_cycles):
                await cycle()
        trips[peer] = c.COUNTER.round_trips / count_cycles
        sent[peer] = {k: v / count_cycles for k, v in c.COUNTER.commands.items()}

    clock = time.perf_counter
    order = list(cycles)
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        blocks = {p: c.Blocks.new() for p in order}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(order)
            for peer in order[shift:] + order[:shift]:
                cycle = cycles[peer]
                for _ in range(5):
                    await cycle()
                out: list[float] = []
                with probe.measure() as srv:  # sync INFO: blocks the loop, outside the timing
                    cpu = time.process_time()
                    for _ in range(per_round):
                        t0 = clock()
                        await cycle()
                        out.append(clock() - t0)
                    cpu = time.process_time() - cpu
                blocks[peer].add(out, srv, cpu)
        n = rounds * per_round
        metrics: dict[str, dict[str, float]] = {}
        for peer in order:
            b = blocks[peer]
            rt = c.redis_time(b.server, sent[peer], n)
            metrics[peer] = {
                "median_us": statistics.median(b.samples) * 1e6,
                "p99_us": c.percentile(b.samples, 0.99) * 1e6,
                "x_redis_py": b.ratio(blocks[RP_ASYNC]),
                "redis_time_us": rt["total_us"],
                "server_commands": rt["all_calls"],
                "redis_cpu_us": b.server_cpu_s / n * 1e6,
                "client_cpu_us": b.client_cpu_s / n * 1e6,
            }
        per_run.append(metrics)
    await aconn.aclose()
    return {
        "peers": order,
        "per_run": per_run,
        "round_trips": trips,
        "parsers": parsers,
        "rounds": rounds,
        "per_round": per_round,
    }


# -- 100 tasks on one key -------------------------------------------------------------------------


def contended_block(
    peer: str, key: str, tasks: int, duration: float, warm: float, grace: float
) -> dict[str, Any]:
    """One block: ``tasks`` tasks of one new event loop contend for ``key``."""
    sync = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], sync)
    with probe.measure() as srv, c.COUNTER.counting():
        cpu = time.process_time()
        events, failures, w_start, w_end = asyncio.run(
            _contended_block(peer, key, tasks, duration, warm, grace)
        )
        cpu = time.process_time() - cpu
    return {
        "events": events,
        "failures": failures,
        "w_start": w_start,
        "w_end": w_end,
        "server": srv,
        "cpu_s": cpu,
        "sent": dict(c.COUNTER.commands),
        "round_trips": c.COUNTER.round_trips,
    }


async def _contended_block(
    peer: str, key: str, tasks: int, duration: float, warm: float, grace: float
) -> tuple[list[tuple[float, float, float, float, int]], int, float, float]:
    aconn = _redis_py_client()
    clock = time.perf_counter
    events: list[tuple[float, float, float, float, int]] = []
    failures = 0
    t_start = clock() + 0.05
    t_end = t_start + warm + duration

    async def body(index: int) -> None:
        nonlocal failures
        lock = _make(peer, key, aconn)
        await asyncio.sleep(max(0.0, t_start - clock()))
        while True:
            called = clock()
            if called >= t_end:
                return
            left = max(0.001, t_end + grace - called)
            if not await lock.acquire(blocking_timeout=left):
                failures += 1
                continue
            acquired = clock()
            releasing = clock()
            await lock.release()
            events.append((called, acquired, releasing, clock(), index))

    await asyncio.gather(*(body(i) for i in range(tasks)))
    await aconn.aclose()
    return events, failures, t_start + warm, t_end


def run_contended(
    pool: c.WorkerPool,
    worker: int,
    tasks: int,
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, Any]:
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        pooled = {p: _contended.empty() for p in CONTENDED_PEERS}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(CONTENDED_PEERS)
            for peer in CONTENDED_PEERS[shift:] + CONTENDED_PEERS[:shift]:
                block = pool.call(
                    worker,
                    "benchmarks._aio:contended_block",
                    timeout=duration + warm + grace + 120,
                    peer=peer,
                    key=f"bench:acontended:{run_index}:{r}:{peer}",
                    tasks=tasks,
                    duration=duration,
                    warm=warm,
                    grace=grace,
                )
                acc = pooled[peer]
                _contended.pool_events(acc, block["events"], block["w_start"], block["w_end"])
                acc["failures"] += block["failures"]
                acc["client_cpu_s"] += block["cpu_s"]
                acc["round_trips"] += block["round_trips"]
                for name, count in block["sent"].items():
                    acc["sent"][name] = acc["sent"].get(name, 0) + count
                c.add_deltas(acc["server"], block["server"]["commands"])
                acc["server_cpu_s"] += block["server"]["cpu_s"]
        per_run.append({p: _contended.metrics(pooled[p], range(tasks)) for p in CONTENDED_PEERS})
    return {
        "peers": list(CONTENDED_PEERS),
        "tasks": tasks,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "warm": warm,
        "per_run": per_run,
    }


# -- event-loop lag -------------------------------------------------------------------------------


def loop_lag(
    locks: int, lease: float, window: float, baseline: float, parts: int = 3
) -> dict[str, Any]:
    return asyncio.run(_loop_lag(locks, lease, window, baseline, parts))


async def _probe(seconds: float, period: float = 0.01) -> list[float]:
    """How late ``asyncio.sleep(period)`` wakes, again and again for ``seconds``."""
    clock = time.perf_counter
    lags: list[float] = []
    end = clock() + seconds
    while clock() < end:
        t0 = clock()
        await asyncio.sleep(period)
        lags.append(clock() - t0 - period)
    return lags


def _lag_stats(parts: list[list[float]]) -> dict[str, dict[str, float]]:
    """p50/p99/max lag (ms) as a spread over equal parts of the probed window."""
    per_part = [
        {
            "p50_ms": c.percentile(lags, 0.5) * 1e3,
            "p99_ms": c.percentile(lags, 0.99) * 1e3,
            "max_ms": max(lags, default=float("nan")) * 1e3,
        }
        for lags in parts
    ]
    return {k: v.as_dict() for k, v in c.spreads(per_part).items()}


async def _loop_lag(
    locks: int, timeout: float, window: float, baseline: float, parts: int
) -> dict[str, Any]:
    from django_redislock import AsyncLock, stats

    sync = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], sync)
    idle = [await _probe(baseline / parts) for _ in range(parts)]
    held = [AsyncLock(f"bench:lag:{i}", timeout=timeout) for i in range(locks)]
    began = time.perf_counter()
    for lock in held:
        if not await lock.acquire(blocking=False):
            raise RuntimeError("could not take a free AsyncLock")
    acquire_s = time.perf_counter() - began
    stats.flush()
    with probe.measure() as srv, c.COUNTER.counting():
        cpu = time.process_time()
        lags = [await _probe(window / parts) for _ in range(parts)]
        cpu = time.process_time() - cpu
    renew_trips = c.COUNTER.by_thread.get("django-redislock-watchdog", 0)
    lost = sum(1 for lock in held if lock.lost)
    for lock in held:
        await lock.release()
    intervals = window / (timeout / 3)
    return {
        "locks": locks,
        "timeout_s": timeout,
        "window_s": window,
        "baseline_s": baseline,
        "parts": parts,
        "idle": _lag_stats(idle),
        "held": _lag_stats(lags),
        "acquire_s": acquire_s,
        "renewal_round_trips_per_interval": renew_trips / intervals,
        "renewals_per_lock_per_interval": srv["commands"].get("pexpire", (0, 0))[0]
        / locks
        / intervals,
        "cpu_pct": cpu / window * 100,
        "lost": lost,
    }


def _spreads(data: dict[str, dict[str, float]]) -> dict[str, c.Spread]:
    return {k: c.Spread.from_dict(v) for k, v in data.items()}


# -- report ---------------------------------------------------------------------------------------


def tables(
    unc: dict[str, Any] | None, con: dict[str, Any] | None, lag: dict[str, Any] | None
) -> dict[str, tuple[list[str], list[list[str]]]]:
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    if unc:
        rows = []
        for peer in unc["peers"]:
            s = c.spreads([run[peer] for run in unc["per_run"]])
            rows.append(
                [
                    peer if peer != c.PING2 else "floor: 2 x PING",
                    s["median_us"].fmt(0),
                    s["p99_us"].fmt(0),
                    s["x_redis_py"].fmt(2, f"{X}"),
                    c.fmt_num(unc["round_trips"][peer], 0),
                    s["redis_time_us"].fmt(1),
                    s["redis_cpu_us"].fmt(1),
                    s["client_cpu_us"].fmt(0),
                ]
            )
        out["7a. asyncio: uncontended acquire+release, one task"] = (
            [
                "peer",
                "median µs",
                "p99 µs",
                f"{X} redis-py asyncio",
                "round trips",
                "Redis cmd µs",
                "Redis CPU µs",
                "client CPU µs",
            ],
            rows,
        )
    if con:
        rows = []
        for peer in con["peers"]:
            s = c.spreads([run[peer] for run in con["per_run"]])
            rows.append(
                [
                    peer,
                    s["acq_per_s"].fmt(0),
                    s["handoffs_per_s"].fmt(0),
                    s["handoff_p50_ms"].fmt(2),
                    s["handoff_p99_ms"].fmt(2),
                    s["round_trips_per_acq"].fmt(2),
                    s["all_cmds_per_acq"].fmt(1),
                    s["redis_cpu_us"].fmt(0),
                    s["client_cpu_us"].fmt(0),
                    s["jain"].fmt(3),
                    f"{s['stalls'].fmt(0)} / {s['failures'].fmt(0)} / {s['max_wait_ms'].fmt(0)}",
                    s["overlaps"].fmt(0),
                ]
            )
        out[f"7b. asyncio: {con['tasks']} tasks on one key, one event loop"] = (
            [
                "peer",
                "acquisitions/s",
                "hand-offs/s",
                "hand-off p50 ms",
                "hand-off p99 ms",
                "cmds sent/acq",
                "cmds incl. Lua/acq",
                "Redis CPU µs/acq",
                "client CPU µs/acq",
                "Jain (tasks)",
                "stalls > 1 s / timeouts / longest wait ms",
                "overlaps",
            ],
            rows,
        )
    if lag:
        idle, held = _spreads(lag["idle"]), _spreads(lag["held"])
        rows = [
            [
                f"nothing held ({lag['baseline_s']:g} s)",
                idle["p50_ms"].fmt(2),
                idle["p99_ms"].fmt(2),
                idle["max_ms"].fmt(1),
                "-",
                "-",
            ],
            [
                f"{lag['locks']:,} AsyncLocks held, timeout {lag['timeout_s']:g} s "
                f"({lag['window_s']:g} s)",
                held["p50_ms"].fmt(2),
                held["p99_ms"].fmt(2),
                held["max_ms"].fmt(1),
                f"{lag['renewal_round_trips_per_interval']:.2f}",
                str(lag["lost"]),
            ],
        ]
        out["7c. asyncio: event-loop lag (10 ms sleeps, how late they wake)"] = (
            [
                "condition",
                "lag p50 ms",
                "lag p99 ms",
                "lag max ms",
                "renewal round trips / interval",
                "lost",
            ],
            rows,
        )
    return out


def notes(
    unc: dict[str, Any] | None, con: dict[str, Any] | None, lag: dict[str, Any] | None
) -> list[str]:
    lines = []
    if unc:
        lines.append(
            f"7a: {len(unc['per_run'])} runs x {unc['rounds']} rounds x {unc['per_round']} "
            f"cycles, interleaved; parsers: {unc['parsers']}."
        )
    if con:
        lines.append(
            f"7b: {con['runs']} runs x {con['rounds']} rounds x {con['duration']:g} s per peer "
            "(a new event loop per block); hand-off = next holder is another task."
        )
    lines.append(
        'No TRANSPORT="lean" rows here: the lean transport keeps a connection per thread for '
        "sync single calls only; AsyncLock runs on the same asyncio client (one per event loop, "
        "its own pool) under either transport."
    )
    if lag:
        lines.append(
            f"7c: lag figures: median of {lag['parts']} equal parts of each window "
            f"(min{DASH}max of the parts). Process CPU while holding: "
            f"{lag['cpu_pct']:.2f} % of one core; taking the "
            f"locks took {lag['acquire_s']:.1f} s; renewals per lock per interval "
            f"{lag['renewals_per_lock_per_interval']:.2f}."
        )
    return lines
