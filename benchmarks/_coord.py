"""Section 13: the coordination kinds (issue 31).

13a, read-mostly load: ``procs`` processes, one thread each, on one name; every operation is a
read (95 %) or a write (5 %) that holds for ``hold`` seconds (a sleep) and releases. Peers, on
the same server and client:

- ``django-redislock ReadWriteLock``: readers share, a queued writer blocks new readers, every
  waiter woken by the release that lets it go.
- ``django-redislock Lock``: the same operations, every one exclusive: what a read-write lock
  must beat on a read-mostly load.
- ``textbook read-write lock``: written here, not a library (redis-py's read-write lock PR
  #3786 is not on PyPI and this machine reaches nothing else): the design most blog posts show,
  a reader count and a writer flag. A reader runs a script that increments the count when no
  writer flag is set; a writer sets the flag (``SET NX``) and then waits for the count to drain;
  both poll every millisecond while they wait; release is ``DECR`` or ``DEL``. No lease: a
  crashed reader keeps the writers out for ever. Writers starve while readers keep arriving.

The check is the promise itself: no write overlaps another hold (sweep over every hold, from
``acquire()`` returning to ``release()`` being called; those lie inside the real holds).

13b, barrier round trip: ``parties`` processes pass one ``Barrier`` ``rounds`` times; a round's
time is from the last arrival's call to the last party's return (the wake-up of everyone by the
last arrival), and rounds per second over the whole run.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

RW_OURS = "django-redislock ReadWriteLock"
LOCK_OURS = "django-redislock Lock"
TEXTBOOK = "textbook read-write lock (in this benchmark)"
PEERS = (RW_OURS, LOCK_OURS, TEXTBOOK)
POLL = 0.001

# KEYS[1] reader count, KEYS[2] writer flag: a reader enters when no writer is flagged.
_TEXTBOOK_READ = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('INCR', KEYS[1])
return 1
"""


class TextbookRW:
    """The reader-count / writer-flag read-write lock, polling while it waits."""

    def __init__(self, conn: Any, name: str) -> None:
        self.conn = conn
        self.count, self.flag = f"bench:tb:{name}:readers", f"bench:tb:{name}:writer"
        self._read = conn.register_script(_TEXTBOOK_READ)

    def acquire(self, write: bool, until: float) -> bool:
        clock = time.perf_counter
        if not write:
            while clock() < until:
                if self._read(keys=[self.count, self.flag]):
                    return True
                time.sleep(POLL)
            return False
        while not self.conn.set(self.flag, "1", nx=True, px=30_000):
            if clock() >= until:
                return False
            time.sleep(POLL)
        while int(self.conn.get(self.count) or 0) > 0:
            if clock() >= until:
                self.conn.delete(self.flag)
                return False
            time.sleep(POLL)
        return True

    def release(self, write: bool) -> None:
        if write:
            self.conn.delete(self.flag)
        else:
            self.conn.decr(self.count)


def read_mostly_loop(
    peer: str, name: str, writes: float, hold: float, t_start: float, t_end: float, grace: float
) -> dict[str, Any]:
    """One process of 13a: operations until ``t_end``; each ``(called, acquired, releasing,
    write)``."""
    from django_redislock import Lock, ReadWriteLock

    conn = c.client()
    rng = random.Random(c.WORKER["index"])
    clock = time.perf_counter
    events: list[tuple[float, float, float, bool]] = []
    failures = [0]
    textbook = TextbookRW(conn, name)

    def body(_tid: int) -> None:
        c.sleep_until(t_start)
        while True:
            called = clock()
            if called >= t_end:
                return
            write = rng.random() < writes
            left = t_end + grace - called
            if peer == TEXTBOOK:
                ok = textbook.acquire(write, called + left)
                release = functools.partial(textbook.release, write)
            else:
                if peer == RW_OURS:
                    rw = ReadWriteLock(name, timeout=30)
                    lock: Any = rw.write_lock() if write else rw.read_lock()
                else:
                    lock = Lock(name, timeout=30)
                ok = lock.acquire(blocking_timeout=left)
                release = lock.release
            if not ok:
                failures[0] += 1
                continue
            acquired = clock()
            time.sleep(hold)
            releasing = clock()
            release()
            events.append((called, acquired, releasing, write))

    cpu_s = c.run_threads(body, 1)
    return {"events": events, "failures": failures[0], "cpu_s": cpu_s}


def _overlaps(events: list[tuple[float, float, float, bool]]) -> int:
    """Holds that began while a write was held, or writes that began while anything was."""
    points = sorted(
        [(a, 1, w) for _c, a, _r, w in events] + [(r, -1, w) for _c, _a, r, w in events],
        key=lambda p: (p[0], p[1]),
    )
    readers = writers = bad = 0
    for _t, step, write in points:
        if step < 0:
            if write:
                writers -= 1
            else:
                readers -= 1
            continue
        if writers or (write and readers):
            bad += 1
        if write:
            writers += 1
        else:
            readers += 1
    return bad


def run_read_mostly(
    pool: c.WorkerPool,
    workers: list[int],
    writes: float,
    hold: float,
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, Any]:
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        acc = {p: {"reads": 0, "writes": 0, "window": 0.0, "wwaits": [], "rwaits": [],
                   "overlaps": 0, "failures": 0, "cpu_s": 0.0} for p in PEERS}  # fmt: skip
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(PEERS)
            for peer in PEERS[shift:] + PEERS[:shift]:
                name = f"bench:rw:{run_index}:{r}:{PEERS.index(peer)}"
                t_start = time.perf_counter() + 0.3
                t_end = t_start + warm + duration
                replies = pool.call_many(
                    [(i, "benchmarks._coord:read_mostly_loop", {
                        "peer": peer, "name": name, "writes": writes, "hold": hold,
                        "t_start": t_start, "t_end": t_end, "grace": grace,
                    }) for i in workers],
                    timeout=warm + duration + grace + 120,
                )  # fmt: skip
                w_start = t_start + warm
                events = [tuple(e) for reply in replies for e in reply["events"]]
                a = acc[peer]
                a["window"] += t_end - w_start
                a["failures"] += sum(reply["failures"] for reply in replies)
                a["cpu_s"] += sum(reply["cpu_s"] for reply in replies)
                a["overlaps"] += _overlaps(events)  # type: ignore[arg-type]
                for called, acquired, _releasing, write in events:
                    if w_start <= acquired <= t_end:
                        a["writes" if write else "reads"] += 1
                        a["wwaits" if write else "rwaits"].append(acquired - called)
        metrics: dict[str, dict[str, float]] = {}
        for peer in PEERS:
            a = acc[peer]
            ops = a["reads"] + a["writes"]
            metrics[peer] = {
                "ops_per_s": ops / a["window"],
                "writes_per_s": a["writes"] / a["window"],
                "read_p50_ms": c.percentile(a["rwaits"], 0.5) * 1e3,
                "write_p99_ms": c.percentile(a["wwaits"], 0.99) * 1e3,
                "overlaps": float(a["overlaps"]),
                "failures": float(a["failures"]),
                "client_cpu_us": a["cpu_s"] / max(1, ops) * 1e6,
            }
        base = metrics[RW_OURS]["ops_per_s"]
        for peer in PEERS:
            metrics[peer]["x_ours"] = metrics[peer]["ops_per_s"] / base if base else float("nan")
        per_run.append(metrics)
    return {"per_run": per_run, "procs": len(workers), "writes": writes, "hold_s": hold,
            "runs": runs, "rounds": rounds, "duration": duration, "warm": warm}  # fmt: skip


def barrier_loop(name: str, parties: int, rounds: int, t_start: float) -> dict[str, Any]:
    """One party of 13b: ``(called, returned)`` of every round."""
    from django_redislock import Barrier

    barrier = Barrier(name, parties, timeout=30)
    clock = time.perf_counter
    c.sleep_until(t_start)
    times = []
    for _ in range(rounds):
        called = clock()
        barrier.wait(timeout=60)
        times.append((called, clock()))
    return {"times": times}


def run_barrier(pool: c.WorkerPool, workers: list[int], rounds: int, runs: int) -> dict[str, Any]:
    per_run = []
    for run_index in range(runs):
        t_start = time.perf_counter() + 0.3
        replies = pool.call_many(
            [(i, "benchmarks._coord:barrier_loop", {
                "name": f"bench:barrier:{run_index}", "parties": len(workers), "rounds": rounds,
                "t_start": t_start,
            }) for i in workers],
            timeout=rounds * 5 + 120,
        )  # fmt: skip
        rtts = []
        for r in range(rounds):
            last_call = max(reply["times"][r][0] for reply in replies)
            last_out = max(reply["times"][r][1] for reply in replies)
            rtts.append(last_out - last_call)
        first = min(reply["times"][0][0] for reply in replies)
        end = max(reply["times"][-1][1] for reply in replies)
        per_run.append({
            "rtt_p50_ms": statistics.median(rtts) * 1e3,
            "rtt_p99_ms": c.percentile(rtts, 0.99) * 1e3,
            "rounds_per_s": rounds / (end - first),
        })  # fmt: skip
    return {"per_run": per_run, "parties": len(workers), "rounds": rounds, "runs": runs}


def tables(rw: dict[str, Any], bar: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer in PEERS:
        s = c.spreads([run[peer] for run in rw["per_run"]])
        rows.append([
            peer, s["ops_per_s"].fmt(0), s["x_ours"].fmt(2, X), s["writes_per_s"].fmt(0),
            s["read_p50_ms"].fmt(1), s["write_p99_ms"].fmt(0), s["overlaps"].fmt(0),
            s["failures"].fmt(0), s["client_cpu_us"].fmt(0),
        ])  # fmt: skip
    out = {
        f"13a. Read-mostly: {rw['procs']} processes, {rw['writes']:.0%} writes, "
        f"{rw['hold_s'] * 1e3:g} ms holds": (
            ["peer", "ops/s", f"{X} ours", "writes/s", "read wait p50 ms", "write wait p99 ms",
             "overlaps", "timeouts", "client CPU µs/op"],
            rows,
        )
    }  # fmt: skip
    s = c.spreads(bar["per_run"])
    out[f"13b. Barrier: {bar['parties']} processes, {bar['rounds']} rounds"] = (
        ["peer", "last arrival → all out p50 ms", "p99 ms", "rounds/s"],
        [["django-redislock Barrier", s["rtt_p50_ms"].fmt(1), s["rtt_p99_ms"].fmt(1),
          s["rounds_per_s"].fmt(0)]],
    )  # fmt: skip
    return out


def notes(rw: dict[str, Any], bar: dict[str, Any]) -> list[str]:
    return [
        f"13a: {rw['runs']} runs x {rw['rounds']} rounds x {rw['duration']:g} s per peer (after "
        f"{rw['warm']:g} s warm-up), peers interleaved; figures: median of the runs "
        f"(min{DASH}max). An operation builds its lock object, acquires (bounded wait), sleeps "
        "the hold, releases. 'overlaps': holds that began while a write was held, or writes that "
        "began while anything was (must be 0).",
        f"textbook read-write lock: reader count + writer flag, polling every {POLL * 1e3:g} ms "
        "while waiting; no lease for readers (a crashed reader blocks writers for ever); readers "
        "can starve writers. redis-py PR #3786's lock could not be installed (not on PyPI).",
        f"13b: {bar['runs']} runs; a round's time runs from the last party's wait() call to the "
        "last party's return: the last arrival's script, its wake-up messages and every "
        "party's re-check.",
    ]
