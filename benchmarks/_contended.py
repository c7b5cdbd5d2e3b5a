"""Sections 2 and 3: N processes on one key, and many processes x threads on 1,000 keys.

Each block starts every worker at the same instant (``perf_counter`` = ``CLOCK_MONOTONIC``,
shared by all processes on Linux) and stops them at the same instant; blocks of the peers are
interleaved round by round. The first ``warm`` seconds of a block are not counted (connections,
subscriptions, scripts), but everything that happens afterwards is, stalls included.

Every wait is bounded (``acquire_within``: the end of the block plus a grace period), so a lost
hand-off cannot hang the run: it shows up as a *stall* (an acquisition that waited more than
:data:`STALL_S`) and in the throughput.

Hand-off: two consecutive holds (merged log of all processes, ordered by acquisition time) by
different processes, where the second process was already waiting when the first called
``release()``; its latency is that ``release()`` call to the next holder's ``acquire()`` return.
An *overlap* (the next holder's ``acquire()`` returned before the previous holder called
``release()``) would be a mutual-exclusion failure and must stay 0.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

#: Section 2's rows with the processes forked from one parent instead of spawned (see
#: :func:`forked`): how Celery's prefork pool and gunicorn start theirs.
FORKED = ", forked processes"
OURS_FORKED = c.OURS + FORKED
PRL_FORKED = c.PRL + FORKED
CONTENDED_PEERS = (
    c.OURS,
    c.OURS_LEAN,
    c.PRL,
    c.REDIS_PY_SLOW,
    c.REDIS_PY_FAST,
    OURS_FORKED,
    PRL_FORKED,
)
#: The last two are floors: no lock object, just a cycle's round trips (see :func:`many_keys`).
MANY_KEYS_PEERS = (
    c.OURS,
    c.OURS_LEAN,
    c.REDIS_PY_FAST,
    c.PRL,
    c.PING2,
    c.MINIMAL_LUA,
    c.OURS_SCRIPTS,
)
#: An acquisition that waited longer than this counts as a stall (a lost hand-off, a long poll).
STALL_S = 1.0


# -- jobs (run inside worker processes) -----------------------------------------------------------


def loop(peer: str, key: str, t_start: float, t_end: float, grace: float) -> dict[str, Any]:
    """One process of a contended block: acquire -> release on ``key`` until ``t_end``, under
    the peer's settings (``TRANSPORT=lean``: set before the block's first lock)."""
    with c.peer_settings(peer):
        return _loop(peer, key, t_start, t_end, grace)


def _loop(peer: str, key: str, t_start: float, t_end: float, grace: float) -> dict[str, Any]:
    conn = c.client()
    lock = c.make_lock(peer, key, conn)
    events: list[tuple[float, float, float, float]] = []
    failures = 0
    clock = time.perf_counter
    c.sleep_until(t_start)
    cpu = time.process_time()
    with c.COUNTER.counting():
        while True:
            called = clock()
            if called >= t_end:
                break
            if not c.acquire_within(peer, lock, t_end + grace - called):
                failures += 1
                continue
            acquired = clock()
            # critical section: empty (the hand-off itself is what is measured)
            releasing = clock()
            lock.release()
            events.append((called, acquired, releasing, clock()))
    return {
        "index": c.WORKER["index"],
        "events": events,
        "failures": failures,
        "cpu_s": time.process_time() - cpu,
        "commands": dict(c.COUNTER.commands),
        "round_trips": c.COUNTER.round_trips,
    }


def forked(
    peer: str, key: str, indexes: list[int], t_start: float, t_end: float, grace: float
) -> list[dict[str, Any]]:
    """Section 2's block with its processes forked from this one (a fresh worker that has run
    no lock): one :func:`loop` per child, under the worker index it stands for.

    Spawned processes each hold their own copy of every module; forked ones share those pages
    until written, so switching between them (a hand-off is a few switches on 2 cores) finds
    more of the interpreter in the CPU caches. Both are what users run: a management command
    or a spawned worker, and Celery's prefork pool or gunicorn.
    """
    import os
    import pickle
    import traceback

    # os.fork, not multiprocessing: a pool worker is a daemonic process, which multiprocessing
    # does not let have children.
    children: list[tuple[int, int]] = []
    for index in indexes:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run the block, send the reply, leave without clean-up
            code = 1
            try:
                os.close(read)
                c.WORKER["index"] = index
                with os.fdopen(write, "wb") as out:
                    pickle.dump(loop(peer, key, t_start, t_end, grace), out)
                code = 0
            except BaseException:
                traceback.print_exc()  # the parent reports "sent no result"
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read))
    replies = []
    for pid, read in children:
        with os.fdopen(read, "rb") as source:
            data = source.read()  # EOF when the child exits, whatever happened to it
        os.waitpid(pid, 0)
        if not data:
            raise RuntimeError(f"forked process {pid} ({peer}) sent no result")
        replies.append(pickle.loads(data))
    return sorted(replies, key=lambda reply: int(reply["index"]))


#: Wake-up paths of the hand-off floor (section 2b): how a waiting process learns "your turn".
RELAY_LISTENER = (
    "PUBLISH, read through redis-py's get_message by a listener thread that opens the waiting "
    "thread's gate (django-redislock's listener)"
)
RELAY_DIRECT = "PUBLISH, read by the waiting thread itself through redis-py's get_message"
RELAY_BLPOP = "RPUSH, the waiting thread blocked in BLPOP"
RELAY_ASK = "as the first, and the passing process asks again (+1 PING)"
RELAY_SCRIPTS = (
    "our two scripts as a lock loop on one key, woken by a listener thread that reads as "
    "ours does (no engine)"
)
RELAY_SCRIPTS_DIRECT = "as the last, the waiting thread reading its own wake-up (no listener)"
RELAY_MODES = (
    RELAY_LISTENER,
    RELAY_DIRECT,
    RELAY_BLPOP,
    RELAY_ASK,
    RELAY_SCRIPTS,
    RELAY_SCRIPTS_DIRECT,
)
#: The paths where a listener thread reads and opens the waiting thread's gate.
_THREAD_MODES = (RELAY_LISTENER, RELAY_ASK, RELAY_SCRIPTS)


def _message_reader(pubsub: Any) -> Callable[[float], Any]:
    """``read(timeout)``: the data of the next published message on ``pubsub`` (``None``: none
    within ``timeout``, or not a message), read as the engine's wake-up listener
    (:class:`django_redislock.wakeups.Listener`) reads it: redis-py's ``get_message``."""

    def read(timeout: float) -> Any:
        message = pubsub.get_message(timeout=timeout)
        if message is None or message.get("type") != "message":
            return None
        return message["data"]

    return read


def _subscribe(conn: Any, channel: str) -> Any:
    pubsub = conn.pubsub()
    pubsub.subscribe(channel)
    while (m := pubsub.get_message(timeout=1.0)) is None or m["type"] != "subscribe":
        pass
    return pubsub


def relay(
    mode: str, position: int, procs: int, key: str, t_start: float, t_end: float, warm: float
) -> dict[str, Any]:
    """One process of a relay block: wait for the token, pass it to the next process, repeat.

    No lock at all: each pass is one command (the ``PUBLISH`` or ``RPUSH`` to the next process)
    and one wake-up of the next process, the least a queue-based hand-off between processes
    does. ``mode`` picks the wake-up path (see :data:`RELAY_MODES`). :data:`RELAY_ASK` adds
    what a lock loop adds to that: the process that passed the token asks for it again at once
    (a ``PING`` here, the cheapest round trip; a lock's next ``acquire``, which queues).
    """
    import redis

    if mode in (RELAY_SCRIPTS, RELAY_SCRIPTS_DIRECT):
        return _scripts_loop(key, t_start, t_end, warm, listener=mode == RELAY_SCRIPTS)
    conn = redis.Redis.from_url(f"{c.WORKER['url']}/0", socket_timeout=5)
    mine, following = f"{key}:{position}", f"{key}:{(position + 1) % procs}"
    stop = threading.Event()
    gate = threading.Lock()
    gate.acquire()
    pubsub: Any = None
    listener: threading.Thread | None = None
    read: Callable[[float], Any] = lambda timeout: None  # noqa: E731
    if mode != RELAY_BLPOP:
        pubsub = _subscribe(conn, mine)
        read = _message_reader(pubsub)
    if mode in _THREAD_MODES:

        def listen() -> None:
            while not stop.is_set():
                if read(0.05) is not None:
                    gate.release()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()

    def wait() -> bool:
        if mode in _THREAD_MODES:
            return gate.acquire(timeout=0.05)
        if mode == RELAY_BLPOP:
            return conn.blpop([mine], timeout=0.05) is not None
        return read(0.05) is not None

    def pass_on() -> None:
        if mode == RELAY_BLPOP:
            conn.rpush(following, 1)
        else:
            conn.publish(following, "t")
        if mode == RELAY_ASK:
            conn.ping()

    def one() -> bool:
        if not wait():
            return False
        pass_on()
        return True

    received, cpu = _passes(t_start, t_end, warm, one, first=pass_on if position == 0 else None)
    stop.set()
    if listener is not None:
        listener.join()
    if pubsub is not None:
        pubsub.close()
    conn.delete(mine)
    conn.close()
    return {"received": received, "cpu_s": cpu}


def _passes(
    t_start: float,
    t_end: float,
    warm: float,
    one: Callable[[], bool],
    first: Callable[[], None] | None = None,
) -> tuple[int, float]:
    """Run ``one`` (``True``: it made a pass) from ``t_start`` until ``t_end``, after ``first``;
    returns the passes made after the warm-up and the process CPU seconds of the whole block."""
    clock = time.perf_counter
    counted_from = t_start + warm
    received = 0
    c.sleep_until(t_start)
    cpu = time.process_time()
    if first is not None:
        first()
    while clock() < t_end:
        if one() and clock() >= counted_from:
            received += 1
    return received, time.process_time() - cpu


def _scripts_loop(
    key: str, t_start: float, t_end: float, warm: float, *, listener: bool
) -> dict[str, Any]:
    """One process of :data:`RELAY_SCRIPTS` (or :data:`RELAY_SCRIPTS_DIRECT`): section 2's lock
    loop done by our two scripts alone.

    Acquire with the attempt id as waiter id and queueing on (a busy lock queues the caller in
    the same call, as ``Lock`` does once its process listens); a queued caller waits for its
    hand-off message (``h <waiter> <token>``: on a single Redis the release hands the lock over
    outright), read through ``get_message`` as the engine's listener reads it, by a listener
    thread that opens the caller's gate (or, without ``listener``, by the caller itself); it
    calls again after 50 ms without one (a repeat of its attempt: it finds the lock handed to it,
    or refreshes its queue entry). The holder releases at once (the release hands the lock to the
    oldest waiter and publishes to its process). Calls are built by ``kinds.LockKind`` with the
    keys and arguments of a ``Lock`` and run through its transport; no lock object, face, flow,
    hold table, watchdog, statistics or ``Waiter``. The process listens on a channel of its own
    (its process token + ``"f"``, which its attempt ids start with), not on the engine
    listener's. With a listener thread: what our protocol costs per contended acquisition, below
    which the engine cannot go; without: what a waiter reading its own wake-up would save.
    """
    import itertools

    from benchmarks._uncontended import LockCalls

    calls = LockCalls(queue=True, here="")  # every hand-off by PUBLISH, as between processes
    token = calls.runtime.token + "f"
    owner = f"{token}-floor"
    acquire_call, release_call, run, taken = calls.acquire, calls.release, calls.run, calls.taken
    attempts = itertools.count()
    handed: set[str] = set()
    gate = threading.Lock()
    gate.acquire()
    stop = threading.Event()
    pubsub = _subscribe(calls.transport.client, calls.target.channel_prefix + token)
    read = _message_reader(pubsub)

    def take_message(timeout: float) -> bool:
        data = read(timeout)
        if data is None:
            return False
        kind, waiter = (data.decode() if isinstance(data, bytes) else data).split(" ")[:2]
        if kind == "h":
            handed.add(waiter)
        return kind == "h"

    def listen() -> None:
        while not stop.is_set():
            if take_message(0.05):
                with contextlib.suppress(RuntimeError):  # already open
                    gate.release()

    def acquire() -> str:
        attempt = f"{token}.{next(attempts)}"
        while True:
            if taken(run(acquire_call(key, owner, attempt))):
                handed.discard(attempt)
                return attempt
            deadline = time.perf_counter() + 0.05  # queued: wait for the hand-off
            while attempt not in handed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                if listener:
                    gate.acquire(timeout=left)
                else:
                    take_message(left)
            if attempt in handed:
                handed.discard(attempt)
                return attempt

    def one() -> bool:
        attempt = acquire()
        if run(release_call(key, owner, attempt)) != 0:
            raise RuntimeError("scripts loop: a lock it held was not released")
        return True

    thread = threading.Thread(target=listen, daemon=True) if listener else None
    if thread is not None:
        thread.start()
    received, cpu = _passes(t_start, t_end, warm, one)
    stop.set()
    if thread is not None:
        thread.join()
    pubsub.close()
    return {"received": received, "cpu_s": cpu}


def many_keys(
    peer: str,
    prefix: str,
    keys: int,
    threads: int,
    t_start: float,
    t_end: float,
    warm: float,
    grace: float,
    seed: int,
) -> dict[str, Any]:
    """One process of a many-keys block: ``threads`` threads, a random key per operation.

    An operation is what application code does: build the lock object, acquire, release. The
    floor rows do only the round trips of a cycle through the same pool: two ``PING`` (the least
    any lock with two round trips per cycle costs on this client, with the same threads and
    cores), or the smallest correct script lock on the random key.
    """
    with c.peer_settings(peer):  # TRANSPORT=lean: set before the threads start
        return _many_keys(peer, prefix, keys, threads, t_start, t_end, warm, grace, seed)


def _many_keys(
    peer: str,
    prefix: str,
    keys: int,
    threads: int,
    t_start: float,
    t_end: float,
    warm: float,
    grace: float,
    seed: int,
) -> dict[str, Any]:
    conn = c.client()
    clock = time.perf_counter
    floor = _floor_op(peer, conn)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    counts = [[0, 0, 0, 0] for _ in range(threads)]  # ops in window, failures, stalls, all ops

    def body(tid: int) -> None:
        rng = random.Random(seed * 1000 + tid)
        mine, count = latencies[tid], counts[tid]
        c.sleep_until(t_start)
        while True:
            t0 = clock()
            if t0 >= t_end:
                return
            name = f"{prefix}:{rng.randrange(keys)}"
            if floor is not None:
                if not floor(name, t_end + grace):
                    count[1] += 1
                    continue
            else:
                lock = c.make_lock(peer, name, conn)
                if not c.acquire_within(peer, lock, t_end + grace - t0):
                    count[1] += 1
                    continue
                lock.release()
            took = clock() - t0
            count[3] += 1
            if took > STALL_S:
                count[2] += 1
            if t0 >= t_start + warm:
                mine.append(took)
                count[0] += 1

    cpu_s = c.run_threads(body, threads)
    return {
        "latencies": [x for part in latencies for x in part],
        "ops": sum(x[0] for x in counts),
        "failures": sum(x[1] for x in counts),
        "stalls": sum(x[2] for x in counts),
        "all_ops": sum(x[3] for x in counts),
        "cpu_s": cpu_s,
    }


def _floor_op(peer: str, conn: Any) -> Any:
    """The operation of a floor row of section 3 (``None``: a lock peer)."""
    if peer == c.PING2:

        def ping2(name: str, deadline: float) -> bool:
            conn.ping()
            conn.ping()
            return True

        return ping2
    if peer in (c.MINIMAL_LUA, c.OURS_SCRIPTS):
        from benchmarks._uncontended import minimal_lua, scripts_cycle

        cycle = minimal_lua(conn) if peer == c.MINIMAL_LUA else scripts_cycle()
        process = c.WORKER.get("index", 0)

        def minimal(name: str, deadline: float) -> bool:
            owner = f"{process}.{threading.get_ident()}"  # one owner per thread
            # Busy (another thread holds this key, rare with 1,000 keys): try again at once.
            while not cycle(name, owner):
                if time.perf_counter() > deadline:
                    return False
            return True

        return minimal
    return None


# -- orchestration (parent process) ---------------------------------------------------------------


def run_contended(
    pool: c.WorkerPool,
    probe: c.ServerProbe,
    workers: list[int],
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, Any]:
    procs = len(workers)
    per_run: list[dict[str, dict[str, float]]] = []
    raw: list[dict[str, Any]] = []
    parent = pool.fresh()  # forks the processes of the forked rows; runs no lock itself
    try:
        for run_index in range(runs):
            _contended_run(
                pool, probe, workers, parent, run_index, rounds, duration, warm, grace,
                per_run, raw,
            )  # fmt: skip
    finally:
        pool.retire(parent)
    return {
        "peers": list(CONTENDED_PEERS),
        "procs": procs,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "warm": warm,
        "per_run": per_run,
        "detail": raw,
    }


def _contended_run(
    pool: c.WorkerPool,
    probe: c.ServerProbe,
    workers: list[int],
    parent: int,
    run_index: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
    per_run: list[dict[str, dict[str, float]]],
    raw: list[dict[str, Any]],
) -> None:
    pooled: dict[str, dict[str, Any]] = {p: empty() for p in CONTENDED_PEERS}
    for r in range(rounds):
        shift = (run_index * rounds + r) % len(CONTENDED_PEERS)
        for peer in CONTENDED_PEERS[shift:] + CONTENDED_PEERS[:shift]:
            key = f"bench:contended:{run_index}:{r}:{peer}"
            t_start = time.perf_counter() + 0.3  # every worker is idle and listening
            t_end = t_start + warm + duration
            timeout = warm + duration + grace + 120
            with probe.measure() as srv:
                if peer.endswith(FORKED):
                    replies = pool.call(
                        parent, "benchmarks._contended:forked", timeout,
                        peer=peer.removesuffix(FORKED), key=key, indexes=workers,
                        t_start=t_start, t_end=t_end, grace=grace,
                    )  # fmt: skip
                else:
                    replies = pool.call_many(
                        [(i, "benchmarks._contended:loop", {
                            "peer": peer, "key": key, "t_start": t_start, "t_end": t_end,
                            "grace": grace,
                        }) for i in workers],
                        timeout=timeout,
                    )  # fmt: skip
            _pool_block(pooled[peer], replies, t_start + warm, t_end, srv)
    per_run.append({p: metrics(pooled[p], workers) for p in CONTENDED_PEERS})
    raw.append({p: _summary(pooled[p]) for p in CONTENDED_PEERS})


def run_relay(
    pool: c.WorkerPool,
    probe: c.ServerProbe,
    workers: list[int],
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
) -> dict[str, Any]:
    """Section 2b: the hand-off floor of each wake-up path, interleaved like section 2."""
    procs = len(workers)
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        passes: dict[str, list[float]] = {m: [] for m in RELAY_MODES}
        redis_cpu: dict[str, list[float]] = {m: [] for m in RELAY_MODES}
        client_cpu: dict[str, list[float]] = {m: [] for m in RELAY_MODES}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(RELAY_MODES)
            for mode in RELAY_MODES[shift:] + RELAY_MODES[:shift]:
                key = f"bench:relay:{run_index}:{r}:{RELAY_MODES.index(mode)}"
                t_start = time.perf_counter() + 0.3
                t_end = t_start + warm + duration
                with probe.measure() as srv:
                    replies = pool.call_many(
                        [(worker, "benchmarks._contended:relay", {
                            "mode": mode, "position": position, "procs": procs, "key": key,
                            "t_start": t_start, "t_end": t_end, "warm": warm,
                        }) for position, worker in enumerate(workers)],
                        timeout=warm + duration + 120,
                    )  # fmt: skip
                received = sum(reply["received"] for reply in replies)
                passes[mode].append(received / duration)
                if received:
                    # Whole block (warm-up included) over counted passes: an upper bound.
                    redis_cpu[mode].append(srv["cpu_s"] / received * 1e6)
                    client_cpu[mode].append(
                        sum(reply["cpu_s"] for reply in replies) / received * 1e6
                    )
        per_run.append(
            {
                mode: {
                    "passes_per_s": statistics.median(passes[mode]),
                    "redis_cpu_us": statistics.median(redis_cpu[mode] or [float("nan")]),
                    "client_cpu_us": statistics.median(client_cpu[mode] or [float("nan")]),
                }
                for mode in RELAY_MODES
            }
        )
    return {
        "modes": list(RELAY_MODES),
        "procs": procs,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "per_run": per_run,
    }


def relay_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    base = [run[RELAY_LISTENER]["passes_per_s"] for run in res["per_run"]]
    for mode in res["modes"]:
        s = c.spreads([run[mode] for run in res["per_run"]])
        ratio = c.Spread.of(
            [
                run[mode]["passes_per_s"] / b if b else float("nan")
                for run, b in zip(res["per_run"], base, strict=True)
            ]
        )
        rows.append(
            [
                mode,
                s["passes_per_s"].fmt(0),
                ratio.fmt(2, f"{X}"),
                s["redis_cpu_us"].fmt(0),
                s["client_cpu_us"].fmt(0),
            ]
        )
    headers = [
        "wake-up path",
        "passes/s",
        f"{X} our listener",
        "Redis CPU µs/pass",
        "client CPU µs/pass",
    ]
    title = (
        f"2b. Hand-off floor: a token passed round {res['procs']} processes, no lock "
        "(one command + one wake-up per pass); our scripts' lock loop, no engine"
    )
    return {title: (headers, rows)}


def relay_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"{res['runs']} runs x {res['rounds']} rounds x {res['duration']:g} s per path, paths "
        f"interleaved; figures: median of the runs (min{DASH}max). CPU per pass: the whole "
        "block (warm-up included) over the passes counted after it.",
        "A lock hand-off between processes does at least this: the release is the command, the "
        "next holder's wake-up the rest. django-redislock wakes waiters by the first path (one "
        "subscribed connection per process, however many threads and tasks wait, read with "
        "redis-py's get_message); python-redis-lock by the BLPOP path (one blocked connection "
        "per waiting thread).",
        "'asks again': the floor of a lock loop like section 2's: a holder that releases "
        "(the pass) asks for the lock again at once, one more round trip per hand-off that "
        "competes for the same cores (django-redislock: its next acquire, which queues; "
        "python-redis-lock: a failed SET NX and a BLPOP).",
        "Our two scripts as a lock loop: section 2's loop with acquire.lua (a busy lock queues "
        "the caller) and release.lua (hands the lock to the oldest waiter, publishes to its "
        "process), calls built by kinds.LockKind with the keys and arguments of a Lock and run "
        "through its transport (redis-py's evalsha), and no engine (lock object, face, flow, "
        "hold table, watchdog, statistics). With a listener thread per process, as the engine "
        "has: what our protocol costs per contended acquisition. Without one (the waiting "
        "thread reads its own wake-up): what that design would save. A pass is an acquisition "
        "here.",
    ]


def empty() -> dict[str, Any]:
    return {
        "window_s": 0.0,
        "acq_window": 0,
        "acq_total": 0,
        "handoffs": 0,
        "latencies": [],
        "per_process": {},
        "overlaps": 0,
        "stalls": 0,
        "max_wait_s": 0.0,
        "failures": 0,
        "client_cpu_s": 0.0,
        "sent": {},
        "round_trips": 0,
        "server": {},
        "server_cpu_s": 0.0,
    }


def _pool_block(
    acc: dict[str, Any],
    replies: list[dict[str, Any]],
    w_start: float,
    w_end: float,
    srv: dict[str, Any],
) -> None:
    """Add one block's replies (one per process) to a run's pooled figures of one peer."""
    for reply in replies:
        acc["per_process"].setdefault(reply["index"], 0)
        acc["failures"] += reply["failures"]
        acc["client_cpu_s"] += reply["cpu_s"]
        acc["round_trips"] += reply["round_trips"]
        for name, count in reply["commands"].items():
            acc["sent"][name] = acc["sent"].get(name, 0) + count
    events = [(*event, reply["index"]) for reply in replies for event in reply["events"]]
    pool_events(acc, events, w_start, w_end)
    c.add_deltas(acc["server"], srv["commands"])
    acc["server_cpu_s"] += srv["cpu_s"]


def pool_events(
    acc: dict[str, Any],
    events: list[tuple[float, float, float, float, int]],
    w_start: float,
    w_end: float,
) -> None:
    """Hand-offs, stalls and overlaps of one block's holds ``(called, acquired, releasing,
    released, holder)``, counted over the window ``[w_start, w_end]``."""
    merged = sorted(
        (acquired, called, releasing, who) for called, acquired, releasing, _, who in events
    )
    acc["window_s"] += w_end - w_start
    acc["acq_total"] += len(merged)
    for i, (acquired, called, _releasing, who) in enumerate(merged):
        wait = acquired - called
        acc["max_wait_s"] = max(acc["max_wait_s"], wait)
        if not w_start <= acquired <= w_end:
            continue
        acc["acq_window"] += 1
        acc["per_process"][who] = acc["per_process"].get(who, 0) + 1
        if wait > STALL_S:
            acc["stalls"] += 1
        if i == 0:
            continue
        _prev_acq, _prev_called, prev_releasing, prev_who = merged[i - 1]
        if acquired < prev_releasing:
            acc["overlaps"] += 1
        if who != prev_who and called <= prev_releasing:
            acc["handoffs"] += 1
            acc["latencies"].append(acquired - prev_releasing)


def metrics(acc: dict[str, Any], holders: Sequence[int]) -> dict[str, float]:
    """A run's figures of one peer from its pooled blocks; ``holders``: processes (tasks)."""
    window = acc["window_s"] or float("nan")
    total = acc["acq_total"] or float("nan")
    sent = {k: v / total for k, v in acc["sent"].items()}
    rt = c.redis_time(acc["server"], sent, total)
    counts = [acc["per_process"].get(i, 0) for i in holders]
    return {
        "acq_per_s": acc["acq_window"] / window,
        "handoffs_per_s": acc["handoffs"] / window,
        "handoff_p50_ms": c.percentile(acc["latencies"], 0.5) * 1e3,
        "handoff_p99_ms": c.percentile(acc["latencies"], 0.99) * 1e3,
        "round_trips_per_acq": acc["round_trips"] / total,
        "sent_per_acq": sum(sent.values()),
        "all_cmds_per_acq": rt["all_calls"],
        "redis_time_us": rt["total_us"],
        "redis_cpu_us": acc["server_cpu_s"] / total * 1e6,
        "client_cpu_us": acc["client_cpu_s"] / total * 1e6,
        "jain": c.jain(counts),
        "stalls": float(acc["stalls"]),
        "max_wait_ms": acc["max_wait_s"] * 1e3,
        "overlaps": float(acc["overlaps"]),
        "failures": float(acc["failures"]),
    }


def _summary(acc: dict[str, Any]) -> dict[str, Any]:
    return {
        "per_process": acc["per_process"],
        "sent": acc["sent"],
        "server": {k: list(v) for k, v in acc["server"].items()},
        "acquisitions": acc["acq_total"],
    }


def run_many_keys(
    pool: c.WorkerPool,
    workers: list[int],
    threads: int,
    keys: int,
    runs: int,
    rounds: int,
    duration: float,
    warm: float,
    grace: float,
) -> dict[str, Any]:
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        lat: dict[str, list[float]] = {p: [] for p in MANY_KEYS_PEERS}
        ops = dict.fromkeys(MANY_KEYS_PEERS, 0)
        stalls = dict.fromkeys(MANY_KEYS_PEERS, 0)
        failures = dict.fromkeys(MANY_KEYS_PEERS, 0)
        cpu = dict.fromkeys(MANY_KEYS_PEERS, 0.0)
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(MANY_KEYS_PEERS)
            for peer in MANY_KEYS_PEERS[shift:] + MANY_KEYS_PEERS[:shift]:
                prefix = f"bench:many:{run_index}:{r}:{peer}"
                t_start = time.perf_counter() + 0.3
                t_end = t_start + warm + duration
                replies = pool.call_many(
                    [(i, "benchmarks._contended:many_keys", {
                        "peer": peer, "prefix": prefix, "keys": keys, "threads": threads,
                        "t_start": t_start, "t_end": t_end, "warm": warm, "grace": grace,
                        "seed": run_index * 10_000 + r * 100 + i,
                    }) for i in workers],
                    timeout=warm + duration + grace + 120,
                )  # fmt: skip
                for reply in replies:
                    lat[peer] += reply["latencies"]
                    ops[peer] += reply["ops"]
                    stalls[peer] += reply["stalls"]
                    failures[peer] += reply["failures"]
                    cpu[peer] += reply["cpu_s"]
        window = rounds * duration
        metrics: dict[str, dict[str, float]] = {}
        for peer in MANY_KEYS_PEERS:
            metrics[peer] = {
                "ops_per_s": ops[peer] / window,
                "p50_ms": c.percentile(lat[peer], 0.5) * 1e3,
                "p99_ms": c.percentile(lat[peer], 0.99) * 1e3,
                "max_ms": max(lat[peer], default=float("nan")) * 1e3,
                "client_cpu_us": cpu[peer] / max(1, ops[peer]) * 1e6,
                "stalls": float(stalls[peer]),
                "failures": float(failures[peer]),
            }
        for peer in MANY_KEYS_PEERS:
            base = metrics[c.OURS]["ops_per_s"]
            metrics[peer]["x_ours"] = metrics[peer]["ops_per_s"] / base if base else float("nan")
        per_run.append(metrics)
    return {
        "peers": list(MANY_KEYS_PEERS),
        "procs": len(workers),
        "threads": threads,
        "keys": keys,
        "runs": runs,
        "rounds": rounds,
        "duration": duration,
        "per_run": per_run,
    }


# -- report ---------------------------------------------------------------------------------------


def contended_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer in res["peers"]:
        s = c.spreads([run[peer] for run in res["per_run"]])
        base = PRL_FORKED if peer.endswith(FORKED) else c.PRL  # forked rows: forked peer
        ratio = c.Spread.of(
            [
                run[peer]["handoffs_per_s"] / run[base]["handoffs_per_s"]
                if run[base]["handoffs_per_s"]
                else 0.0
                for run in res["per_run"]
            ]
        )
        rows.append(
            [
                peer,
                s["acq_per_s"].fmt(0),
                s["handoffs_per_s"].fmt(0),
                ratio.fmt(2, f"{X}"),
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
    headers = [
        "peer",
        "acquisitions/s",
        "hand-offs/s",
        f"hand-offs {X} python-redis-lock",
        "hand-off p50 ms",
        "hand-off p99 ms",
        "cmds sent/acq",
        "cmds incl. Lua/acq",
        "Redis CPU µs/acq",
        "client CPU µs/acq",
        "Jain",
        "stalls > 1 s / timeouts / longest wait ms",
        "overlaps",
    ]
    title = f"2. Contended: {res['procs']} processes on one key, empty critical section"
    return {title: (headers, rows)}


def contended_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"{res['runs']} runs x {res['rounds']} rounds x {res['duration']:g} s per peer (after "
        f"{res['warm']:g} s warm-up), peers interleaved; figures: median of the runs "
        f"(min{DASH}max).",
        "cmds sent/acq: commands the client sent = round trips (no pipelines here; a BLPOP is "
        "one); cmds incl. Lua: every command Redis executed (INFO commandstats), per acquisition.",
        "stalls: acquisitions that waited > 1 s; timeouts: waits given up at the end of the "
        "block + grace (a stuck waiter); overlaps: holds that overlapped (must be 0).",
        f"'{FORKED.lstrip(', ')}': the same block with the {res['procs']} processes forked from "
        "one parent that ran no lock (as Celery's prefork pool and gunicorn start theirs) "
        "instead of spawned; their ratio is to python-redis-lock's forked row.",
        f"{c.OURS_LEAN}: the first row's Lock with REDISLOCK['TRANSPORT'] = 'lean' (each thread "
        "keeps one connection of the pool) in the same processes, set for its blocks before "
        "their first lock; the first row runs the default 'redis-py' transport (a pooled "
        "connection per call).",
    ]


def many_keys_tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    rows = []
    for peer in res["peers"]:
        s = c.spreads([run[peer] for run in res["per_run"]])
        rows.append(
            [
                peer,
                s["ops_per_s"].fmt(0),
                s["x_ours"].fmt(2, f"{X}"),
                s["p50_ms"].fmt(2),
                s["p99_ms"].fmt(2),
                s["max_ms"].fmt(0),
                s["client_cpu_us"].fmt(0),
                f"{s['stalls'].fmt(0)} / {s['failures'].fmt(0)}",
            ]
        )
    headers = [
        "peer",
        "ops/s",
        f"{X} django-redislock",
        "p50 ms",
        "p99 ms",
        "max ms",
        "client CPU µs/op",
        "stalls > 1 s / timeouts",
    ]
    title = (
        f"3. {res['keys']:,} keys, {res['procs']} processes x {res['threads']} threads, "
        "random key per operation"
    )
    return {title: (headers, rows)}


def many_keys_notes(res: dict[str, Any]) -> list[str]:
    return [
        f"{res['runs']} runs x {res['rounds']} rounds x {res['duration']:g} s per peer; an "
        "operation = construct the lock, acquire, release (latency of all three).",
        "Floor rows, same processes and threads, no lock object: two PINGs through redis-py's "
        "pool; the minimal Lua lock (redis-py's evalsha) and our own two scripts (calls built "
        "by kinds.LockKind with the arguments a Lock sends, through its transport), one owner "
        "per thread, a busy key retried at once. The last row is what our protocol costs "
        "without the engine; the gap between it and the first is the Python engine (face, "
        "flow, hold table, watchdog, statistics).",
        f"{c.OURS_LEAN}: the first row's operation with REDISLOCK['TRANSPORT'] = 'lean' (each "
        f"thread keeps one connection of the pool: {res['threads']} per process here) instead "
        "of the default 'redis-py' (a pooled connection per call); its ratio is lean / default.",
    ]
