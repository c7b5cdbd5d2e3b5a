"""Sections 1 and 5 (uncontended acquire+release, statistics overhead) and the cycle profile.

Runs inside one fresh benchmark process. The peers are interleaved: every round runs a block of
each peer, in an order rotated from round to round, so load from elsewhere on the machine falls
on all peers alike; ratios are taken round by round between blocks measured within milliseconds
of each other and then summarised per run (median of the round ratios).

Besides the three libraries, reference rows locate our cost:

- ``2 x PING``: the floor of any two-round-trip protocol on this client and server;
- ``django-redislock scripts only``: our acquire and release calls built by ``kinds.LockKind``
  with the arguments a ``Lock`` sends, run through the transport ``Lock`` uses
  (``RedisPyTransport.run``: redis-py's public ``evalsha``), ``EVALSHA`` x 2 and no engine code:
  what our Lua, its arguments and redis-py's command path cost. The gap between it and
  ``django-redislock`` is the Python engine (face, flow, hold table, watchdog registration,
  statistics);
- ``2 x EVALSHA empty``: a script whose body is ``return 1``, called twice with our exact keys
  and arguments through the same transport: what running *any* two scripts with them costs
  (the floor of our Redis command time and CPU while a lock is a script);
- ``minimal Lua lock``: the smallest correct script lock (set-if-free with a lease; compare
  and delete), one key and two arguments like redis-py's release: what moving redis-py's
  ``SET NX`` into a script costs, before any feature (fencing token, re-entrancy, queue,
  holder record).

The other rows reuse one lock object. Two more build a new lock object per cycle on a name never
used before (``Lock(f"order:{pk}")`` with a new ``pk`` each time), ours and redis-py's: nothing
kept per name or per object (a lock object caches its target and lease) can help there.
The ratio of ours in that row is to redis-py's in its own.
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import itertools
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

#: A new lock object per cycle on a name never used before (see the module docstring).
OURS_FRESH = "django-redislock, new name per cycle"
REDIS_PY_FRESH = "redis-py Lock, new name per cycle"
PEERS = (
    c.OURS,
    c.OURS_LEAN,
    c.OURS_NO_RENEW,
    c.OURS_NO_STATS,
    c.OURS_SCRIPTS,
    c.REDIS_PY,
    c.PRL,
    c.PING2,
    c.EMPTY_SCRIPTS,
    c.MINIMAL_LUA,
    OURS_FRESH,
    REDIS_PY_FRESH,
)
#: The row a peer's "x redis-py" ratio is taken against (redis-py's ``Lock`` unless named).
REFERENCE = {OURS_FRESH: REDIS_PY_FRESH}
WARMUP = 5  # untimed cycles at the start of every block (rebuilt caches after a settings swap)


def _peer_cycles(conn: Any) -> dict[str, tuple[Callable[[], None], Callable[[], Any]]]:
    """``{peer: (one acquire+release cycle, context the block runs in)}``."""
    cycles: dict[str, tuple[Callable[[], None], Callable[[], Any]]] = {}
    for i, peer in enumerate(PEERS):
        if peer == c.PING2:

            def ping2() -> None:
                conn.ping()
                conn.ping()

            cycles[peer] = (ping2, contextlib.nullcontext)
            continue
        if peer == c.OURS_SCRIPTS:
            cycles[peer] = (_scripts_only(f"bench:uc:{i}"), contextlib.nullcontext)
            continue
        if peer == c.EMPTY_SCRIPTS:
            cycles[peer] = (_scripts_only(f"bench:uc:{i}", empty=True), contextlib.nullcontext)
            continue
        if peer == c.MINIMAL_LUA:
            cycles[peer] = (_minimal_lua(conn, f"bench:uc:{i}"), contextlib.nullcontext)
            continue
        if peer in (OURS_FRESH, REDIS_PY_FRESH):
            cycles[peer] = (_fresh_names(peer, conn, f"bench:uc:{i}"), contextlib.nullcontext)
            continue
        lock = c.make_lock(peer, f"bench:uc:{i}", conn)

        def cycle(lock: Any = lock) -> None:
            lock.acquire()
            lock.release()

        # STATS=False and TRANSPORT=lean: the same Lock under other settings, swapped in per
        # block (the runtime rebuilds its client and transport; WARMUP cycles absorb that).
        cycles[peer] = (cycle, functools.partial(c.peer_settings, peer))
    return cycles


def _fresh_names(peer: str, conn: Any, prefix: str) -> Callable[[], None]:
    """A cycle that makes a new lock object on a name never used before: ``<prefix>:<n>``."""
    numbers = itertools.count()
    if peer == OURS_FRESH:
        from django_redislock import Lock

        def ours() -> None:
            lock = Lock(f"{prefix}:{next(numbers)}")
            lock.acquire()
            lock.release()

        return ours
    from redis.lock import Lock as RedisPyLock

    def redis_py() -> None:
        lock = RedisPyLock(conn, f"{prefix}:{next(numbers)}", timeout=c.LEASE, sleep=0.1)
        lock.acquire()
        lock.release()

    return redis_py


class AdHocScript:
    """A script of this benchmark, run through our transport like one of ``scripts.py``'s (the
    transport needs its SHA1, its source for a ``NOSCRIPT``, and a way to name its errors)."""

    #: Not a server command standing in for a script (``scripts.Command``): a script.
    command: str | None = None
    #: Not in the Functions library (``scripts.LIBRARY``): the transport runs it with EVALSHA.
    function = ""
    #: Expires no hash fields (no server-feature argument appended).
    field_ttl = False

    def __init__(self, source: str, filename: str = "benchmark.lua") -> None:
        import hashlib

        self.source = source
        self.filename = filename
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def named(self, exc: Any) -> Any:
        return exc


class LockCalls:
    """Our acquire and release calls for any name, built by ``kinds.LockKind`` with the arguments
    a default blocking ``Lock`` sends on its first call (no queueing: nobody listens yet),
    and run through the target's transport (``RedisPyTransport.run``: public ``evalsha``).

    No lock object, face, flow, hold table, watchdog, statistics or signals: what our protocol
    costs. Private API on purpose (these rows measure the engine); it breaks loudly when the
    call builders move.
    """

    def __init__(self, *, queue: bool = False, here: str | None = None) -> None:
        from django_redislock.flow import ENTRY_MARGIN
        from django_redislock.kinds import LockKind
        from django_redislock.runtime import runtime

        self.runtime = runtime
        self.kind = LockKind()
        self.target = runtime.target()
        self.transport = self.target.transport
        self.lease = self.target.settings.timeout
        self.queue = queue
        self.meta = runtime.metadata()
        # A blocking acquire without a deadline: the entry lives for a lease plus the margin.
        self.entry_ms = int((self.lease + ENTRY_MARGIN) * 1000)
        self.here = runtime.token if here is None else here

    def acquire(self, name: str, owner: str, attempt: str) -> tuple[Any, list[str], list[Any]]:
        return self.kind.acquire_call(
            self.target,
            name,
            owner=owner,
            attempt=attempt,
            meta=self.meta,
            lease=self.lease,
            queue=self.queue,
            entry_ms=self.entry_ms,
            known="-",  # a default owner that holds nothing here
        )

    def release(self, name: str, owner: str, attempt: str) -> tuple[Any, list[str], list[Any]]:
        return self.kind.release_call(
            self.target,
            name,
            owner,
            attempt=attempt,
            token=None,
            all_holds=False,
            lease=self.lease,
            here=self.here,
        )

    def run(self, call: tuple[Any, list[str], list[Any]]) -> Any:
        script, keys, args = call
        return self.transport.run(script, keys, args, "benchmark")

    def taken(self, reply: Any) -> bool:
        """Whether an acquire reply says held (busy: not taken)."""
        from django_redislock.kinds import HELD

        return bool(self.kind.read_acquire(reply).state == HELD)


def _scripts_only(name: str, *, empty: bool = False) -> Callable[[], None]:
    """Our two scripts with the exact arguments ``Lock`` sends, minus all engine code.

    Both calls are built once by ``kinds.LockKind`` (one attempt id, reused: a release deletes
    the record, so each cycle takes a free lock anew) and run through the transport ``Lock``
    uses. ``empty``: the same calls, same transport, to a script that only returns (the floor of
    any script called with these arguments).
    """
    calls = LockCalls()
    owner, attempt = calls.runtime.thread_owner(), calls.runtime.new_attempt_id()
    acquire, release = calls.acquire(name, owner, attempt), calls.release(name, owner, attempt)
    run = calls.transport.run
    if empty:
        nothing = AdHocScript("return 1")
        a_keys, a_args = acquire[1], acquire[2]
        r_keys, r_args = release[1], release[2]

        def empty_cycle() -> None:
            run(nothing, a_keys, a_args, "benchmark")
            run(nothing, r_keys, r_args, "benchmark")

        return empty_cycle

    a_script, a_keys, a_args = acquire
    r_script, r_keys, r_args = release
    taken = calls.taken

    def cycle() -> None:
        if (
            not taken(run(a_script, a_keys, a_args, "benchmark"))
            or run(r_script, r_keys, r_args, "benchmark") != 0
        ):
            raise RuntimeError("scripts-only cycle did not acquire and release")

    return cycle


#: The smallest correct script lock (see the module docstring).
MINIMAL_ACQUIRE = (
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0"
)
MINIMAL_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def minimal_lua(conn: Any) -> Callable[[str, str], bool]:
    """One cycle of the smallest correct script lock through redis-py's public ``evalsha``
    (the path our transport takes): ``cycle(name, owner)`` takes and releases ``name``;
    ``False`` when another owner holds it. Section 3 runs the same cycle on its random keys."""
    evalsha = conn.evalsha
    lease_ms = c.LEASE * 1000
    acquire, release = conn.script_load(MINIMAL_ACQUIRE), conn.script_load(MINIMAL_RELEASE)

    def cycle(name: str, owner: str) -> bool:
        if evalsha(acquire, 1, name, owner, lease_ms) != 1:
            return False
        if evalsha(release, 1, name, owner) != 1:
            raise RuntimeError("minimal Lua lock: a lock just taken was not released")
        return True

    return cycle


def scripts_cycle() -> Callable[[str, str], bool]:
    """Our acquire and release scripts on any name, without the engine: ``cycle(name, owner)``
    takes and releases ``name`` with the arguments ``Lock`` sends (built by ``LockKind`` per
    call, a new attempt id each time), through the transport ``Lock`` uses; ``False`` when
    another owner holds it. No lock object, hold table, watchdog, statistics or wake-up: what
    our protocol costs, for section 3's floor row."""
    calls = LockCalls()
    new_attempt = calls.runtime.new_attempt_id
    acquire, release, run, taken = calls.acquire, calls.release, calls.run, calls.taken

    def cycle(name: str, owner: str) -> bool:
        attempt = new_attempt()
        if not taken(run(acquire(name, owner, attempt))):
            return False
        if run(release(name, owner, attempt)) != 0:
            raise RuntimeError("scripts floor: a lock just taken was not released")
        return True

    return cycle


def _minimal_lua(conn: Any, name: str) -> Callable[[], None]:
    cycle = minimal_lua(conn)

    def one() -> None:
        if not cycle(name, "owner-token"):
            raise RuntimeError("minimal Lua cycle did not acquire and release")

    return one


def run(runs: int, rounds: int, per_round: int, count_cycles: int) -> dict[str, Any]:
    """The job: ``runs`` x ``rounds`` interleaved blocks of ``per_round`` cycles per peer."""
    conn = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], conn)
    cycles = _peer_cycles(conn)
    order = list(cycles)
    for cycle, context in cycles.values():  # load scripts, fill the pool, start threads
        with context():
            for _ in range(50):
                cycle()

    # Untimed counting pass: round trips and commands the client sends per cycle.
    sent: dict[str, dict[str, float]] = {}
    trips: dict[str, float] = {}
    for peer, (cycle, context) in cycles.items():
        with context():
            for _ in range(WARMUP):
                cycle()
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
            for peer in order[shift:] + order[:shift]:  # rotate: no peer always goes first
                cycle, context = cycles[peer]
                with context():
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
                "x_redis_py": b.ratio(blocks[REFERENCE.get(peer, c.REDIS_PY)]),
                "x_2ping": b.ratio(blocks[c.PING2]),
                "x_prl": b.ratio(blocks[c.PRL]),
                "x_ours": b.ratio(blocks[c.OURS]),
                "redis_cpu_us": b.server_cpu_s / n * 1e6,
                "redis_time_us": rt["total_us"],
                "redis_in_scripts_us": rt["in_scripts_us"],
                "server_commands": rt["all_calls"],
                "client_cpu_us": b.client_cpu_s / n * 1e6,
            }
        on, off = blocks[c.OURS].medians, blocks[c.OURS_NO_STATS].medians
        metrics["stats_overhead"] = {
            "pct": statistics.median((a - b) / a * 100 for a, b in zip(on, off, strict=True)),
            "us": statistics.median((a - b) * 1e6 for a, b in zip(on, off, strict=True)),
        }
        per_run.append(metrics)
    return {
        "peers": order,
        "per_run": per_run,
        "round_trips": trips,
        "client_sent": sent,
        "rounds": rounds,
        "per_round": per_round,
        "cpu_source": probe.cpu_source,
    }


def profile(cycles: int, script_calls: int, ladder_rounds: int) -> dict[str, Any]:
    """The job: where one default ``Lock`` cycle spends its time (client and server side)."""
    from django_redislock import Lock

    conn = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], conn)
    lock = Lock("bench:profile")
    for _ in range(200):
        lock.acquire()
        lock.release()
    clock = time.perf_counter
    plain = []
    for _ in range(cycles):
        t0 = clock()
        lock.acquire()
        lock.release()
        plain.append(clock() - t0)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(cycles):
        lock.acquire()
        lock.release()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    top = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: -item[1][2],
    )[:18]:
        where = path if path.startswith("<") or path == "~" else f"{_short(path)}:{line}"
        top.append(
            {
                "function": f"{where}({func})",
                "calls_per_cycle": ncalls / cycles,
                "tottime_us": tottime / cycles * 1e6,
                "cumtime_us": cumtime / cycles * 1e6,
                "share": tottime / total if total else float("nan"),
            }
        )

    # Server side, per script: a block of acquires then a block of releases on warm names
    # (fence counters exist), so commandstats separates the two scripts.
    names = [Lock(f"bench:profile:{i}", auto_renew=False) for i in range(script_calls)]
    for held in names:
        held.acquire()
        held.release()
    with probe.measure() as acquire_side:
        for held in names:
            held.acquire()
    with probe.measure() as release_side:
        for held in names:
            held.release()
    return {
        "cycles": cycles,
        "median_us": statistics.median(plain) * 1e6,
        "profiled_us": total / cycles * 1e6,
        "top": top,
        "areas": _areas(stats, cycles),
        "pieces": _pieces(lock),
        "ladder": _ladder(ladder_rounds, 200),
        "scripts": {
            "acquire.lua": _per_call(acquire_side, script_calls),
            "release.lua": _per_call(release_side, script_calls),
        },
    }


def _areas(stats: pstats.Stats, cycles: int) -> dict[str, float]:
    """Profiled time per cycle by who spends it (µs; profiler overhead included)."""
    areas: dict[str, float] = {}
    for (path, _line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        if "django_redislock" in path:
            area = "django-redislock"
        elif "/redis/" in path:
            area = "redis-py"
        elif "/django/" in path:
            area = "Django (signals, settings)"
        elif "recv_into" in func or "sendall" in func:
            area = "socket send/receive (incl. waiting for Redis)"
        elif path == "~":
            area = "other built-ins"
        else:
            area = "stdlib (threading, contextlib, ...)"
        areas[area] = areas.get(area, 0.0) + row[2] / cycles * 1e6
    return dict(sorted(areas.items(), key=lambda item: -item[1]))


def _pieces(lock: Any) -> dict[str, float]:
    """Unprofiled cost of engine pieces a cycle runs once or twice (µs per call, best of 3).

    Private API on purpose (this benchmarks the engine): a piece whose API moved raises, so the
    profile fails loudly instead of reporting a figure of something that no longer exists.
    """
    import timeit

    from django_redislock import Lock, drivers, flow, stats, wakeups
    from django_redislock.runtime import runtime

    out: dict[str, float] = {}

    def measure(label: str, fn: Callable[[], Any], number: int = 20_000) -> None:
        best = min(timeit.repeat(fn, number=number, repeat=3))
        out[label] = best / number * 1e6

    def waiter() -> None:
        w = wakeups.Waiter(runtime.new_attempt_id())
        runtime.waiters.register(w)
        runtime.waiters.unregister(w)

    lock.acquire()
    hold = lock._hold()
    lock.release()
    if hold is None:
        raise RuntimeError("profile: the lock left no hold to measure the watchdog with")

    def watch() -> None:
        runtime.watchdog.register(hold)
        runtime.watchdog.unregister(hold)

    def attempt() -> None:
        # What a blocking acquire prepares before its first call: the plan, the attempt, the
        # flow (a generator) and its first operation (the acquire call's arguments).
        prepared = lock._attempt(None, None)
        flow.acquire(prepared.plan).send(None)

    calls = LockCalls()
    owner = runtime.thread_owner()
    plan = lock._attempt(None, None).plan

    measure("Lock(name) construction (validation)", lambda: Lock("bench:piece"))
    measure("lock._spec() (settings check, cached target)", lock._spec)
    measure("lock.owner (default owner string)", lambda: lock.owner)
    measure("runtime.new_attempt_id() (attempt id, also the waiter id)", runtime.new_attempt_id)
    measure("runtime.metadata() (holder JSON, task-id providers)", runtime.metadata)
    measure("runtime._current_task_id() (task-id providers)", runtime._current_task_id)
    measure(
        "LockKind.acquire_call (keys and arguments of the acquire script)",
        lambda: calls.acquire("bench:piece", owner, "x.1"),
    )
    measure("flow.Plan.acquire_call (entry ms, the call object)", plan.acquire_call)
    measure("lock._attempt() + flow up to its first call (plan, attempt, generator)", attempt)
    measure(
        "drivers.Attempt + close (the driver's bookkeeping)",
        lambda: drivers.Attempt(plan=plan).close(),
    )
    measure("Waiter() + register + unregister (a blocking acquire that finds it busy)", waiter)
    measure("watchdog.register + unregister", watch)
    name = lock.stats_name
    measure(
        "stats.record acquired (statistics, no signal receivers)",
        lambda: stats.record(None, name, "acquired", 0.0, False),
    )
    measure(
        "stats.record released (statistics, no signal receivers)",
        lambda: stats.record(None, name, "released", 0.0),
    )
    stats.flush()

    def fold_and_flush() -> None:
        # record() only appends; the flusher thread folds the events into tallies and writes
        # them. Measured here per cycle (two events), Redis write included.
        events = 20_000
        bound = stats.MAX_EVENTS
        stats.MAX_EVENTS = 1 << 30  # no early fold by the recording thread while filling
        try:
            for _ in range(events // 2):
                stats.record(None, name, "acquired", 0.0, False)
                stats.record(None, name, "released", 0.0)
            started = time.perf_counter()
            stats.flush()
            out["stats: fold + flush of one cycle's events (flusher thread)"] = (
                (time.perf_counter() - started) / (events // 2) * 1e6
            )
        finally:
            stats.MAX_EVENTS = bound

    fold_and_flush()
    return out


def _ladder(rounds: int, per_round: int) -> list[dict[str, Any]]:
    """Cumulative ablations of one default cycle, interleaved: what each engine piece costs.

    Each rung removes one more piece (private API, monkeypatched in this process only): the
    sans-I/O flow and its driver (plan, attempt, generator: the rung builds the acquire call with
    ``LockKind`` and runs it through the transport, then records the hold as ``Lock`` does), the
    holder metadata, auto-renewal, the statistics (``stats.record``), down to our two scripts
    alone. Every rung runs its scripts through the transport ``Lock`` uses, so each step is one
    piece of the engine and nothing else.
    """
    from django_redislock import Lock, stats
    from django_redislock.flow import Acquired
    from django_redislock.runtime import runtime

    calls = LockCalls()
    meta = runtime.metadata()

    class Rung(Lock):
        fast = False
        const_meta = False

        def acquire(
            self, blocking: bool | None = None, blocking_timeout: float | None = None
        ) -> bool:
            if not self.fast:
                return super().acquire(blocking, blocking_timeout)
            spec, owner, started = self._spec(), self.owner, time.monotonic()
            attempt = runtime.new_attempt_id()
            data = meta if self.const_meta else runtime.metadata(self._task_id)
            script, keys, args = self.kind.acquire_call(
                spec.target,
                self.name,
                owner=owner,
                attempt=attempt,
                meta=data,
                lease=spec.lease,
                queue=False,
                entry_ms=calls.entry_ms,
                known=self._known(owner),
            )
            reply = spec.target.transport.run(script, keys, args, "benchmark")
            got = self.kind.read_acquire(reply)
            if not calls.taken(reply):
                raise RuntimeError("ladder lock was busy")
            plan = _PlanFacts(owner=owner, attempt=attempt, started=started)
            return self._finish(_AttemptFacts(plan), Acquired(got.token, got.count, False))

    def rung(name: str, fast: bool, const_meta: bool, auto_renew: bool | None) -> Rung:
        lock = Rung(name, auto_renew=auto_renew)
        lock.fast, lock.const_meta = fast, const_meta
        return lock

    record = stats.record

    def silenced(lock: Rung) -> Callable[[], None]:
        def cycle() -> None:
            stats.record = _no_receivers  # the faces call ``stats.record`` by module attribute
            try:
                lock.acquire()
                lock.release()
            finally:
                stats.record = record

        return cycle

    def plain(lock: Any) -> Callable[[], None]:
        def cycle() -> None:
            lock.acquire()
            lock.release()

        return cycle

    rungs: dict[str, Callable[[], None]] = {
        "default Lock cycle": plain(rung("bench:ladder:a", False, False, None)),
        "- flow and driver (plan, attempt, generator; first call made directly)": plain(
            rung("bench:ladder:b", True, False, None)
        ),
        "- holder metadata (constant)": plain(rung("bench:ladder:c", True, True, None)),
        "- auto-renew (watchdog registration)": plain(rung("bench:ladder:d", True, True, False)),
        "- statistics (stats.record on acquire and release)": silenced(
            rung("bench:ladder:e", True, True, False)
        ),
        "= our two scripts alone (LockKind calls through the transport)": _scripts_only(
            "bench:ladder:scripts"
        ),
    }
    wall: dict[str, list[float]] = {k: [] for k in rungs}
    cpu = dict.fromkeys(rungs, 0.0)
    order = list(rungs)
    for fn in rungs.values():
        for _ in range(100):
            fn()
    for r in range(rounds):
        for label in order[r % len(order) :] + order[: r % len(order)]:
            fn = rungs[label]
            began, began_cpu = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                fn()
            cpu[label] += time.process_time() - began_cpu
            wall[label].append((time.perf_counter() - began) / per_round)
    n = rounds * per_round
    return [
        {"rung": k, "wall_us": statistics.median(wall[k]) * 1e6, "cpu_us": cpu[k] / n * 1e6}
        for k in order
    ]


class _PlanFacts:
    """What ``Face._finish`` reads of a plan (the ladder's direct first call has none)."""

    def __init__(self, *, owner: str, attempt: str, started: float) -> None:
        self.owner, self.attempt, self.started = owner, attempt, started


class _AttemptFacts:
    def __init__(self, plan: _PlanFacts) -> None:
        self.plan = plan


def _no_receivers(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def _short(path: str) -> str:
    for marker in ("site-packages/", "django_redislock/", "lib/python3"):
        if marker in path:
            return (
                path.split(marker, 1)[1]
                if marker != "django_redislock/"
                else path[path.index(marker) :]
            )
    return path


def _per_call(measured: dict[str, Any], calls: int) -> dict[str, Any]:
    commands = measured["commands"]
    evalsha = commands.get("evalsha", (0, 0))
    return {
        "evalsha_us": evalsha[1] / max(1, evalsha[0]),
        "inner": {
            name: (calls_ / calls, usec / calls)
            for name, (calls_, usec) in sorted(commands.items())
            if name != "evalsha"
        },
        "redis_cpu_us": measured["cpu_s"] / calls * 1e6,
    }


# -- report ---------------------------------------------------------------------------------------

_LABELS = {
    c.OURS: "django-redislock (defaults: stats on, auto-renew on, TRANSPORT=redis-py)",
    c.OURS_LEAN: 'django-redislock TRANSPORT="lean" (a connection kept per thread)',
    c.OURS_NO_RENEW: "django-redislock auto_renew=False",
    c.OURS_NO_STATS: "django-redislock STATS=False",
    c.OURS_SCRIPTS: "django-redislock scripts only (2 x EVALSHA, no engine)",
    c.REDIS_PY: "redis-py `Lock`",
    c.PRL: "python-redis-lock",
    c.PING2: "floor: 2 x PING",
    c.EMPTY_SCRIPTS: "floor: 2 x EVALSHA of `return 1`, our keys and arguments",
    c.MINIMAL_LUA: "floor: minimal Lua lock (SET NX PX script; GET+DEL script)",
    OURS_FRESH: "django-redislock, new `Lock` on a new name per cycle (ratio: to the next row)",
    REDIS_PY_FRESH: "redis-py `Lock`, new object on a new name per cycle",
}


def tables(res: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """``{title: (headers, rows)}`` for the console and the Markdown block."""
    rows = []
    for peer in res["peers"]:
        s = c.spreads([run[peer] for run in res["per_run"]])
        rows.append(
            [
                _LABELS[peer],
                s["median_us"].fmt(0),
                s["p99_us"].fmt(0),
                s["x_redis_py"].fmt(2, f"{X}"),
                s["x_2ping"].fmt(2, f"{X}"),
                c.fmt_num(res["round_trips"][peer], 0),
                s["redis_time_us"].fmt(1),
                s["redis_in_scripts_us"].fmt(1),
                s["server_commands"].fmt(1),
                s["redis_cpu_us"].fmt(1),
                s["client_cpu_us"].fmt(0),
            ]
        )
    headers = [
        "peer",
        "median µs",
        "p99 µs",
        f"{X} redis-py",
        f"{X} 2 PING",
        "round trips",
        "Redis cmd µs",
        "of which in Lua",
        "Redis cmds",
        "Redis CPU µs",
        "client CPU µs",
    ]
    ov = c.spreads([run["stats_overhead"] for run in res["per_run"]])
    stats_rows = [
        [
            "statistics on vs `STATS=False` (auto-renew on in both)",
            ov["pct"].fmt(1, " %"),
            ov["us"].fmt(1, " µs"),
        ]
    ]
    return {
        "1. Uncontended acquire+release, one process, one key": (headers, rows),
        "5. Statistics overhead (uncontended cycle)": (
            ["comparison", "share of a cycle", "per cycle"],
            stats_rows,
        ),
    }


def notes(res: dict[str, Any]) -> list[str]:
    runs = len(res["per_run"])
    return [
        f"{runs} runs x {res['rounds']} rounds x {res['per_round']} cycles per peer, peers "
        f"interleaved and rotated each round; figures: median of the runs "
        f"(min{DASH}max of the runs).",
        f"{X} ratios: median over rounds of (peer round median / reference round median). "
        "Redis cmd µs: INFO commandstats time of the commands the client sent (a script "
        "whole), per cycle; 'of which in Lua': the part spent in commands inside scripts. "
        "Redis cmds: every command executed, those inside scripts included.",
        f"Redis CPU: server process CPU per cycle ({res['cpu_source']}), network syscalls "
        "included. Client CPU: this process, all threads (watchdog, statistics flusher).",
        _transport_note(res),
    ]


def _transport_note(res: dict[str, Any]) -> str:
    """What the default transport costs: the lean row against the default one, round by
    round, and both against python-redis-lock (not a column of the table)."""
    per_run = res["per_run"]

    def ratio(peer: str, key: str) -> str:
        return c.Spread.of([run[peer][key] for run in per_run]).fmt(2, X)

    return (
        f'TRANSPORT="lean" (each thread keeps one connection of the pool; the default '
        f'"redis-py" takes one from the pool per call): {ratio(c.OURS_LEAN, "x_ours")} the '
        f"default row's time; {X} python-redis-lock: default {ratio(c.OURS, 'x_prl')}, lean "
        f"{ratio(c.OURS_LEAN, 'x_prl')}. Both rows are the same Lock, measured in the same "
        "rounds; the lean row's settings are swapped in per block (override_settings)."
    )


def profile_lines(res: dict[str, Any]) -> list[str]:
    lines = [
        f"cProfile of {res['cycles']} default Lock cycles: unprofiled median "
        f"{res['median_us']:.0f} µs/cycle, profiled {res['profiled_us']:.0f} µs/cycle "
        "(profiler overhead inflates Python-heavy code; read shares, not absolutes)",
        f"{'tottime µs/cycle':>16} {'share':>6} {'calls/cycle':>11}  function",
    ]
    for row in res["top"]:
        lines.append(
            f"{row['tottime_us']:16.1f} {row['share'] * 100:5.1f}% "
            f"{row['calls_per_cycle']:11.1f}  {row['function']}"
        )
    lines.append("profiled time per cycle by area (µs, profiler overhead included):")
    lines += [f"  {us:7.1f}  {area}" for area, us in res["areas"].items()]
    lines.append("engine pieces, unprofiled (timeit, µs per call; a cycle runs most once):")
    lines += [f"  {us:7.2f}  {label}" for label, us in res["pieces"].items()]
    lines.append(
        "ablation ladder (interleaved, 200-cycle blocks): each rung removes one more piece"
    )
    lines.append(f"  {'wall µs':>8} {'CPU µs':>7}  rung")
    lines += [f"  {r['wall_us']:8.1f} {r['cpu_us']:7.1f}  {r['rung']}" for r in res["ladder"]]
    lines.append("Redis side per script call (INFO commandstats; EVALSHA time includes the rest):")
    for script, data in res["scripts"].items():
        inner = ", ".join(
            f"{name} {calls:g}x/{usec:.2f} µs" for name, (calls, usec) in data["inner"].items()
        )
        lines.append(
            f"  {script}: EVALSHA {data['evalsha_us']:.2f} µs, server CPU "
            f"{data['redis_cpu_us']:.1f} µs/call; inside: {inner}"
        )
    return lines
