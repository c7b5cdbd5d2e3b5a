"""Section 8: ``Semaphore`` against our ``Lock`` and against other Redis semaphore designs.

Peers (every one on the same private server and the same django-redis client):

- ``django-redislock Semaphore``: a lease per permit (sorted set + records), fencing token, FIFO
  queue, waiters woken by the release; one script per acquire and per release.
- ``django-redislock Lock``: the reference of 8a (target: a semaphore cycle within 1.15x of it).
- ``py-redis-semaphore`` (PyPI, when installed): a lease per permit too (sorted set of owners
  scored by expiry, fencing counter), waiters block on ``BLPOP`` of a notification list, and
  every acquisition starts a heartbeat thread that renews it (its defaults). portalocker, the
  other name the issue mentions, has no Redis semaphore: its ``RedisLock`` is a pub/sub mutex and
  its ``BoundedSemaphore`` is made of lock files.
- ``sorted-set semaphore (textbook)``: written here, clearly not a library: the semaphore as
  commonly written after *Redis in Action* 6.3 (a sorted set of random identifiers scored by
  acquisition time; one ``MULTI`` pipeline ``ZREMRANGEBYSCORE`` expired / ``ZADD`` / ``ZRANK``,
  the permit is taken when the rank is below the limit, else ``ZREM`` and retry; release is
  ``ZREM``). Its lease is the 30 s expiry of the score, never renewed; it waits by polling every
  millisecond.
- ``counter semaphore (textbook)``: written here too: Redisson's ``RSemaphore`` data design (one
  integer; a script takes a permit if the count allows, release is one ``DECR``), waiting by
  polling every millisecond (Redisson waits on pub/sub). No lease: a holder that dies keeps its
  permit for ever. The cheapest possible protocol, a floor.

8a runs inside one fresh process, interleaved like section 1. 8b runs ``procs`` processes x
``threads`` threads on one semaphore name, each holding a permit for ``hold`` seconds (a sleep)
before releasing it, and checks what a semaphore promises: the number of holders seen at once
(sweep over every hold, from ``acquire()`` returning to ``release()`` being called) never exceeds
the permits. Those observed holds lie inside the real ones (Redis granted the permit before
``acquire()`` returned and takes it back after ``release()`` was called), so a count above the
permits is a real violation, never an artefact of the clocks.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

SEM_OURS = "django-redislock Semaphore"
LOCK_OURS = "django-redislock Lock"
PYSEM = "py-redis-semaphore"
ZSET = "sorted-set semaphore (textbook, in this benchmark)"
COUNTER = "counter semaphore (textbook, in this benchmark)"

UNCONTENDED_PEERS = (LOCK_OURS, SEM_OURS, PYSEM, ZSET, COUNTER)
CONTENDED_PEERS = (SEM_OURS, PYSEM, ZSET, COUNTER)
#: Poll interval of the textbook semaphores while they wait, seconds.
COUNTER_POLL = 0.001
#: An acquisition that waited longer than this counts as a stall.
STALL_S = 1.0
WARMUP = 5

# KEYS[1]: the holder count. ARGV[1]: permits. Returns 1 (a permit taken) or 0 (all taken).
_COUNTER_ACQUIRE = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if held < tonumber(ARGV[1]) then
    redis.call('INCR', KEYS[1])
    return 1
end
return 0
"""


def pysem_available() -> bool:
    try:
        import redis_semaphore
    except ImportError:
        return False
    return hasattr(redis_semaphore, "SemaphoreConfig")


class CounterSemaphore:
    """The textbook counter semaphore (see the module docstring): one integer per name."""

    _scripts: dict[int, Any] = {}

    def __init__(self, conn: Any, name: str, permits: int) -> None:
        self.conn = conn
        self.key = f"bench:counter-sem:{{{name}}}"
        self.permits = permits
        script = self._scripts.get(id(conn))
        if script is None:
            script = self._scripts[id(conn)] = conn.register_script(_COUNTER_ACQUIRE)
        self._try = script

    def acquire(self, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while True:
            if int(self._try(keys=[self.key], args=[self.permits])) == 1:
                return True
            if time.perf_counter() >= deadline:
                return False
            time.sleep(COUNTER_POLL)

    def release(self) -> None:
        self.conn.decr(self.key)


class SortedSetSemaphore:
    """The textbook sorted-set semaphore (see the module docstring), *Redis in Action* 6.3.1."""

    def __init__(self, conn: Any, name: str, permits: int, lease: float = c.LEASE) -> None:
        self.conn = conn
        self.key = f"bench:zset-sem:{{{name}}}"
        self.permits = permits
        self.lease = lease
        self.ident = ""

    def _try(self) -> bool:
        ident = uuid.uuid4().hex
        now = time.time()
        pipe = self.conn.pipeline(transaction=True)
        pipe.zremrangebyscore(self.key, "-inf", now - self.lease)
        pipe.zadd(self.key, {ident: now})
        pipe.zrank(self.key, ident)
        if pipe.execute()[-1] < self.permits:
            self.ident = ident
            return True
        self.conn.zrem(self.key, ident)
        return False

    def acquire(self, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while True:
            if self._try():
                return True
            if time.perf_counter() >= deadline:
                return False
            time.sleep(COUNTER_POLL)

    def release(self) -> None:
        self.conn.zrem(self.key, self.ident)


def _pysem(conn: Any, name: str, permits: int, acquire_timeout: float | None) -> Any:
    from redis_semaphore import Semaphore, SemaphoreConfig

    config = SemaphoreConfig(
        name=name,
        limit=permits,
        lock_timeout=c.LEASE,
        acquire_timeout=acquire_timeout,
        # Below the client's 5 s socket timeout (it warns and caps the wait otherwise).
        blpop_timeout=1.0,
    )
    return Semaphore(conn, config)


def peers() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(uncontended peers, contended peers) that can run here."""
    skip = () if pysem_available() else (PYSEM,)
    return (
        tuple(p for p in UNCONTENDED_PEERS if p not in skip),
        tuple(p for p in CONTENDED_PEERS if p not in skip),
    )


# -- 8a: uncontended (one fresh process) ----------------------------------------------------------


def _cycles(conn: Any, permits: int, order: tuple[str, ...]) -> dict[str, Callable[[], None]]:
    from django_redislock import Lock, Semaphore

    out: dict[str, Callable[[], None]] = {}
    for i, peer in enumerate(order):
        name = f"bench:sem-uc:{i}"
        obj: Any
        if peer == LOCK_OURS:
            obj = Lock(name)
        elif peer == SEM_OURS:
            obj = Semaphore(name, permits)
        elif peer == PYSEM:
            obj = _pysem(conn, name, permits, None)
        elif peer == ZSET:
            zset = SortedSetSemaphore(conn, name, permits)

            def zset_cycle(sem: SortedSetSemaphore = zset) -> None:
                if not sem.acquire(0.0):
                    raise RuntimeError("uncontended sorted-set semaphore was full")
                sem.release()

            out[peer] = zset_cycle
            continue
        else:
            counter = CounterSemaphore(conn, name, permits)

            def counter_cycle(sem: CounterSemaphore = counter) -> None:
                if not sem.acquire(0.0):
                    raise RuntimeError("uncontended counter semaphore was full")
                sem.release()

            out[peer] = counter_cycle
            continue

        def cycle(obj: Any = obj) -> None:
            obj.acquire()
            obj.release()

        out[peer] = cycle
    return out


def uncontended(
    runs: int, rounds: int, per_round: int, count_cycles: int, permits: int
) -> dict[str, Any]:
    """The job: ``runs`` x ``rounds`` interleaved blocks of ``per_round`` cycles per peer."""
    conn = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], conn)
    order = peers()[0]
    cycles = _cycles(conn, permits, order)
    for cycle in cycles.values():  # load scripts, fill the pool, start threads
        for _ in range(50):
            cycle()
    trips: dict[str, float] = {}
    sent: dict[str, dict[str, float]] = {}
    for peer, cycle in cycles.items():
        with c.COUNTER.counting():
            for _ in range(count_cycles):
                cycle()
        trips[peer] = c.COUNTER.round_trips / count_cycles
        sent[peer] = {k: v / count_cycles for k, v in c.COUNTER.commands.items()}

    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        blocks = {p: c.Blocks.new() for p in order}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(order)
            for peer in order[shift:] + order[:shift]:
                cycle = cycles[peer]
                for _ in range(WARMUP):
                    cycle()
                blocks[peer].add(*c.timed_block(probe, cycle, per_round))
        n = rounds * per_round
        metrics: dict[str, dict[str, float]] = {}
        for peer in order:
            b = blocks[peer]
            rt = c.redis_time(b.server, sent[peer], n)
            metrics[peer] = {
                "median_us": statistics.median(b.samples) * 1e6,
                "p99_us": c.percentile(b.samples, 0.99) * 1e6,
                "x_lock": b.ratio(blocks[LOCK_OURS]),
                "x_sem": b.ratio(blocks[SEM_OURS]),
                "server_commands": rt["all_calls"],
                "redis_cpu_us": b.server_cpu_s / n * 1e6,
                "client_cpu_us": b.client_cpu_s / n * 1e6,
            }
        per_run.append(metrics)
    return {
        "peers": list(order),
        "permits": permits,
        "per_run": per_run,
        "round_trips": trips,
        "client_sent": sent,
        "rounds": rounds,
        "per_round": per_round,
    }


# -- 8b: contended (worker processes x threads) ---------------------------------------------------


def contended_loop(
    peer: str,
    name: str,
    permits: int,
    threads: int,
    hold: float,
    t_start: float,
    t_end: float,
    grace: float,
) -> dict[str, Any]:
    """One process of a contended block: ``threads`` threads take a permit, hold it ``hold`` s,
    release it, until ``t_end``. An operation builds its semaphore object, as application code
    does."""
    from django_redislock import Semaphore

    conn = c.client()
    clock = time.perf_counter
    events: list[list[tuple[float, float, float, int]]] = [[] for _ in range(threads)]
    failures = [0] * threads
    base = c.WORKER["index"] * 1000

    def take(remaining: float) -> Any:
        """A held semaphore object, or None when the bounded wait ran out."""
        if peer == SEM_OURS:
            sem: Any = Semaphore(name, permits, blocking_timeout=remaining)
            return sem if sem.acquire() else None
        if peer == PYSEM:
            from redis_semaphore import AcquireTimeoutError

            sem = _pysem(conn, name, permits, max(0.001, remaining))
            try:
                sem.acquire()
            except AcquireTimeoutError:
                return None
            return sem
        textbook: SortedSetSemaphore | CounterSemaphore = (
            SortedSetSemaphore(conn, name, permits)
            if peer == ZSET
            else CounterSemaphore(conn, name, permits)
        )
        return textbook if textbook.acquire(remaining) else None

    def body(tid: int) -> None:
        mine = events[tid]
        c.sleep_until(t_start)
        while True:
            called = clock()
            if called >= t_end:
                return
            sem = take(t_end + grace - called)
            if sem is None:
                failures[tid] += 1
                continue
            acquired = clock()
            time.sleep(hold)
            releasing = clock()
            sem.release()
            mine.append((called, acquired, releasing, base + tid))

    cpu_s = c.run_threads(body, threads)
    return {
        "events": [e for part in events for e in part],
        "failures": sum(failures),
        "cpu_s": cpu_s,
    }


def holders_profile(
    events: list[tuple[float, float, float, int]], permits: int, w_start: float, w_end: float
) -> dict[str, float]:
    """Most holders seen at once (whole block), how many acquisitions found more than
    ``permits`` holding, and the mean number of holders over the window (time-weighted)."""
    points: list[tuple[float, int]] = []
    for _called, acquired, releasing, _who in events:
        points.append((acquired, 1))
        points.append((releasing, -1))
    points.sort()  # at equal times -1 sorts first: a hand-over at one instant is not an overlap
    held = most = over = 0
    for _t, step in points:
        held += step
        most = max(most, held)
        if step > 0 and held > permits:
            over += 1
    inside = sum(
        max(0.0, min(releasing, w_end) - max(acquired, w_start))
        for _called, acquired, releasing, _who in events
    )
    return {
        "max_holders": float(most),
        "over_limit": float(over),
        "mean_holders": inside / (w_end - w_start),
    }


def run_contended(
    pool: c.WorkerPool,
    workers: list[int],
    threads: int,
    permits: int,
    hold: float,
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, Any]:
    order = peers()[1]
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        acc: dict[str, dict[str, Any]] = {
            p: {"waits": [], "acq": 0, "window": 0.0, "per_thread": {}, "failures": 0,
                "stalls": 0, "cpu_s": 0.0, "max_holders": 0.0, "over_limit": 0.0,
                "mean_holders": []}
            for p in order
        }  # fmt: skip
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(order)
            for peer in order[shift:] + order[:shift]:
                name = f"bench:sem-c:{run_index}:{r}:{order.index(peer)}"
                t_start = time.perf_counter() + 0.3
                t_end = t_start + warm + duration
                replies = pool.call_many(
                    [(i, "benchmarks._semaphore:contended_loop", {
                        "peer": peer, "name": name, "permits": permits, "threads": threads,
                        "hold": hold, "t_start": t_start, "t_end": t_end, "grace": grace,
                    }) for i in workers],
                    timeout=warm + duration + grace + 120,
                )  # fmt: skip
                w_start, w_end = t_start + warm, t_end
                events = [e for reply in replies for e in reply["events"]]
                a = acc[peer]
                a["window"] += w_end - w_start
                a["failures"] += sum(reply["failures"] for reply in replies)
                a["cpu_s"] += sum(reply["cpu_s"] for reply in replies)
                for called, acquired, _releasing, who in events:
                    a["per_thread"].setdefault(who, 0)
                    if acquired - called > STALL_S:
                        a["stalls"] += 1
                    if w_start <= acquired <= w_end:
                        a["acq"] += 1
                        a["per_thread"][who] += 1
                        a["waits"].append(acquired - called)
                prof = holders_profile(events, permits, w_start, w_end)
                a["max_holders"] = max(a["max_holders"], prof["max_holders"])
                a["over_limit"] += prof["over_limit"]
                a["mean_holders"].append(prof["mean_holders"])
        metrics: dict[str, dict[str, float]] = {}
        for peer in order:
            a = acc[peer]
            metrics[peer] = {
                "acq_per_s": a["acq"] / a["window"],
                "wait_p50_ms": c.percentile(a["waits"], 0.5) * 1e3,
                "wait_p99_ms": c.percentile(a["waits"], 0.99) * 1e3,
                "max_holders": a["max_holders"],
                "mean_holders": statistics.fmean(a["mean_holders"]),
                "over_limit": a["over_limit"],
                "jain": c.jain(list(a["per_thread"].values())),
                "client_cpu_us": a["cpu_s"] / max(1, a["acq"]) * 1e6,
                "stalls": float(a["stalls"]),
                "failures": float(a["failures"]),
            }
        base = metrics[SEM_OURS]["acq_per_s"]
        for peer in order:
            metrics[peer]["x_ours"] = metrics[peer]["acq_per_s"] / base if base else float("nan")
        per_run.append(metrics)
    return {
        "peers": list(order),
        "procs": len(workers),
        "threads": threads,
        "permits": permits,
        "hold_s": hold,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "warm": warm,
        "per_run": per_run,
    }


# -- report ---------------------------------------------------------------------------------------


def tables(
    unc: dict[str, Any], con: dict[str, Any]
) -> dict[str, tuple[list[str], list[list[str]]]]:
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    rows = []
    for peer in unc["peers"]:
        s = c.spreads([run[peer] for run in unc["per_run"]])
        rows.append(
            [
                peer,
                s["median_us"].fmt(0),
                s["p99_us"].fmt(0),
                s["x_lock"].fmt(2, X),
                s["x_sem"].fmt(2, X),
                c.fmt_num(unc["round_trips"][peer], 1),
                s["server_commands"].fmt(1),
                s["redis_cpu_us"].fmt(1),
                s["client_cpu_us"].fmt(0),
            ]
        )
    out[f"8a. Semaphore: uncontended acquire+release, one process (permits={unc['permits']})"] = (
        [
            "peer",
            "median µs",
            "p99 µs",
            f"{X} our Lock",
            f"{X} our Semaphore",
            "round trips",
            "Redis cmds",
            "Redis CPU µs",
            "client CPU µs",
        ],
        rows,
    )
    rows = []
    for peer in con["peers"]:
        s = c.spreads([run[peer] for run in con["per_run"]])
        rows.append(
            [
                peer,
                s["acq_per_s"].fmt(0),
                s["x_ours"].fmt(2, X),
                s["wait_p50_ms"].fmt(2),
                s["wait_p99_ms"].fmt(1),
                f"{s['max_holders'].fmt(0)} / {con['permits']}",
                s["over_limit"].fmt(0),
                s["mean_holders"].fmt(2),
                s["jain"].fmt(3),
                s["client_cpu_us"].fmt(0),
                f"{s['stalls'].fmt(0)} / {s['failures'].fmt(0)}",
            ]
        )
    title = (
        f"8b. Semaphore: {con['procs']} processes x {con['threads']} threads on one semaphore of "
        f"{con['permits']} permits, {con['hold_s'] * 1e3:g} ms critical section"
    )
    out[title] = (
        [
            "peer",
            "acquisitions/s",
            f"{X} our Semaphore",
            "wait p50 ms",
            "wait p99 ms",
            "most holders seen / permits",
            "acquisitions over the limit",
            "mean holders",
            "Jain (threads)",
            "client CPU µs/acq",
            "stalls > 1 s / timeouts",
        ],
        rows,
    )
    return out


def notes(unc: dict[str, Any], con: dict[str, Any]) -> list[str]:
    lines = [
        f"8a: {len(unc['per_run'])} runs x {unc['rounds']} rounds x {unc['per_round']} cycles per "
        f"peer, interleaved; {X} ratios: median over rounds of the per-round median ratio; "
        f"figures: median of the runs (min{DASH}max). Each peer reuses one object per cycle.",
        f"8b: {con['runs']} runs x {con['rounds']} rounds x {con['duration']:g} s per peer (after "
        f"{con['warm']:g} s warm-up); an operation builds the semaphore object, acquires (bounded "
        "wait), sleeps the critical section, releases. 'most holders seen': sweep over every "
        "hold (acquire() returned .. release() called), which lies inside the real hold, so a "
        "figure above the permits is a real violation; 'mean holders': time-weighted over the "
        "window (the permits are the ceiling).",
        "sorted-set semaphore: the semaphore as commonly written (Redis in Action 6.3.1), in "
        "this benchmark: MULTI pipeline ZREMRANGEBYSCORE expired / ZADD uuid now / ZRANK, taken "
        "if the rank is below the permits, else ZREM; release ZREM; 30 s lease never renewed; "
        f"polls every {COUNTER_POLL * 1e3:g} ms while it waits. Its score is the client's clock "
        "read before the round trip, so a client that read the clock earlier but arrives later "
        "ranks ahead of a holder and pushes it past the limit: holders over the permits are "
        "this design's known race (the book's 'fair' variant adds a counter), not the harness.",
        f"counter semaphore: Redisson RSemaphore's design written in this benchmark (a Lua "
        f"check-and-INCR, DECR to release), polling every {COUNTER_POLL * 1e3:g} ms while it "
        "waits; no lease, so a crashed holder keeps its permit for ever.",
    ]
    if PYSEM in unc["peers"]:
        lines.append(
            "py-redis-semaphore: its defaults (30 s lease, BLPOP wake-ups, a heartbeat thread "
            "started per acquisition and joined on release, which dominates its uncontended "
            "cycle); blpop_timeout 1 s (below the 5 s socket timeout). portalocker has no Redis "
            "semaphore (RedisLock is a pub/sub mutex, BoundedSemaphore uses lock files)."
        )
    else:
        lines.append(
            "py-redis-semaphore is not installed (pip install py-redis-semaphore): its rows "
            "are missing. portalocker has no Redis semaphore (RedisLock is a pub/sub mutex, "
            "BoundedSemaphore uses lock files)."
        )
    return lines
