"""Section 12: rate limiters: ``RateLimiter`` (GCRA) against dramatiq's and ``limits``' ones.

Peers (every one on the same private server and the same django-redis client):

- ``django-redislock RateLimiter``: GCRA, one key per name, one script call per decision, the
  server's clock; ``burst`` 1 (the default).
- ``dramatiq BucketRateLimiter``: a counter per fixed bucket (``SET NX``, then a ``WATCH`` /
  ``GET`` / ``MULTI SET EXEC`` increment, retried on a ``WatchError``); the bucket boundaries come
  from the client's clock.
- ``dramatiq WindowRateLimiter``: a counter per second plus the sum of the window's counters
  (``WATCH`` of every key of the window, ``MGET``, ``MULTI SET EXEC``); with a 1 s window, which
  is what "100 per second" is, the window is one fixed second.
- ``limits moving window``: ``limits.strategies.MovingWindowRateLimiter`` on
  ``limits.storage.RedisStorage``: a list of the last ``limit`` timestamps (client clock) and one
  script per decision.
- ``limits sliding window counter``: ``SlidingWindowCounterRateLimiter`` on the same storage: the
  current and previous fixed window's counters, the previous one weighted by overlap (an
  approximation); one script per decision.

12a: decisions per second, one thread and ``threads`` threads of one fresh process, in two
regimes: a limit no peer reaches (every decision allowed) and 100/s (nearly every decision
refused: a hot limiter); round trips per decision (sends on a redis-py connection: a pipeline is
one), Redis commands and CPU per decision, client CPU per decision. 12b: ``procs`` processes x
``threads`` threads hammer one limiter of ``rate``/s; every allowed decision's call and return
instants are kept, and the table gives allowed decisions per fixed 1 s window, per 1 s and 0.1 s
sliding window; ours runs with ``burst`` 1 and 10. 12c: Celery: ``workers`` ``celery worker``
processes (``--concurrency 1``) run ``tasks`` tasks limited to ``rate``/s, once with Celery's
``rate_limit`` (per worker) and once with ``SingleFlightTask``'s ``lock_rate`` (shared);
completions per second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from benchmarks import _common as c
from benchmarks._common import DASH, X

OURS = "django-redislock RateLimiter"
#: 12b only: ours with room for a tenth of a second's requests at once.
OURS_BURST = "django-redislock RateLimiter burst=10"
BURSTS = {OURS: 1, OURS_BURST: 10}
DQ_BUCKET = "dramatiq BucketRateLimiter"
DQ_WINDOW = "dramatiq WindowRateLimiter"
LIMITS_MOVING = "limits moving window"
LIMITS_SLIDING = "limits sliding window counter"
PEERS = (OURS, DQ_BUCKET, DQ_WINDOW, LIMITS_MOVING, LIMITS_SLIDING)

#: 12a's regimes: (label, limit per second). "allowed": a limit no peer reaches here.
REGIMES = (("allowed", 1_000_000), ("refused", 100))
WARMUP = 200

CELERY_OURS = "django-redislock lock_rate (shared)"
CELERY_THEIRS = "Celery rate_limit (per worker)"
CELERY_QUEUE = "bench-rate"


# -- availability ---------------------------------------------------------------------------------


def missing() -> dict[str, str]:
    """``{peer: why it cannot run here}`` for the peers that cannot (others are absent)."""
    out: dict[str, str] = {}
    try:
        from django_redislock import RateLimiter  # noqa: F401
    except ImportError as exc:
        out[OURS] = f"django_redislock has no RateLimiter in this checkout ({exc})"
    try:
        from dramatiq.rate_limits import BucketRateLimiter, WindowRateLimiter  # noqa: F401
        from dramatiq.rate_limits.backends import RedisBackend  # noqa: F401
    except ImportError as exc:
        out[DQ_BUCKET] = out[DQ_WINDOW] = f"pip install 'dramatiq[redis]' ({exc})"
    try:
        from limits import strategies
        from limits.storage import RedisStorage  # noqa: F401
    except ImportError as exc:
        out[LIMITS_MOVING] = out[LIMITS_SLIDING] = f"pip install limits ({exc})"
    else:
        if not hasattr(strategies, "SlidingWindowCounterRateLimiter"):
            out[LIMITS_SLIDING] = "this limits release has no SlidingWindowCounterRateLimiter"
    return out


def runnable() -> tuple[str, ...]:
    gone = missing()
    return tuple(p for p in PEERS if p not in gone)


def decider(peer: str, conn: Any, name: str, limit: int, per: int = 1) -> Callable[[], bool]:
    """One limiter of ``limit`` per ``per`` seconds named ``name``: a call = one decision."""
    if peer in BURSTS:
        from django_redislock import RateLimiter

        ours = RateLimiter(name, (limit, per), burst=BURSTS[peer])
        return lambda: bool(ours.try_acquire())
    if peer in (DQ_BUCKET, DQ_WINDOW):
        from dramatiq.rate_limits import BucketRateLimiter, WindowRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend

        backend = RedisBackend(client=conn)
        limiter: Any = (
            BucketRateLimiter(backend, name, limit=limit, bucket=per * 1000)
            if peer == DQ_BUCKET
            else WindowRateLimiter(backend, name, limit=limit, window=per)
        )

        def dramatiq_decide() -> bool:
            with limiter.acquire(raise_on_failure=False) as acquired:
                return bool(acquired)

        return dramatiq_decide
    if peer in (LIMITS_MOVING, LIMITS_SLIDING):
        from limits import RateLimitItemPerSecond, strategies
        from limits.storage import RedisStorage

        storage = _limits_storage(conn)
        strategy: Any = (
            strategies.MovingWindowRateLimiter(storage)
            if peer == LIMITS_MOVING
            else strategies.SlidingWindowCounterRateLimiter(storage)
        )
        item = RateLimitItemPerSecond(limit, per)
        assert isinstance(storage, RedisStorage)
        return lambda: bool(strategy.hit(item, name))
    raise ValueError(f"unknown peer {peer!r}")


_STORAGES: dict[int, Any] = {}


def _limits_storage(conn: Any) -> Any:
    """``limits``' Redis storage on the shared client's connection pool (one per process)."""
    storage = _STORAGES.get(id(conn))
    if storage is None:
        from limits.storage import RedisStorage

        kwargs = conn.connection_pool.connection_kwargs
        uri = f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}"
        storage = _STORAGES[id(conn)] = RedisStorage(uri, connection_pool=conn.connection_pool)
    return storage


# -- round trips: sends on a redis-py connection --------------------------------------------------


class Sends:
    """Packets redis-py sends (``send_packed_command``: a command, or a whole pipeline) while
    :meth:`counting` runs: round trips, whoever builds the command (dramatiq's ``WATCH`` runs
    through ``Pipeline.immediate_execute_command``, which the section-wide counter never sees)."""

    def __init__(self) -> None:
        self.enabled = False
        self.count = 0
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        from redis.connection import AbstractConnection

        sends = self
        original: Callable[..., Any] = AbstractConnection.send_packed_command

        def send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
            if sends.enabled:
                sends.count += 1
            return original(self, command, check_health)

        AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
        self.installed = True

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.install()
        self.count = 0
        self.enabled = True
        try:
            yield
        finally:
            self.enabled = False


SENDS = Sends()


# -- 12a: decisions per second (one fresh process) ------------------------------------------------

SCRIPT_COMMANDS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"})


def redis_time(
    server: dict[str, tuple[int, int]], sent: dict[str, float], units: int
) -> dict[str, float]:
    """:func:`_common.redis_time`, except for a peer that runs no script (dramatiq): every
    command it caused was sent by the client, including the ``WATCH`` / ``GET`` its pipeline
    runs at once, which the client-side counter does not see."""
    if any(name.split("|")[0] in SCRIPT_COMMANDS for name in server):
        return c.redis_time(server, sent, units)
    kept = {k: v for k, v in server.items() if k.split("|")[0] not in c.SETUP_COMMANDS}
    calls = sum(calls for calls, _usec in kept.values())
    return {
        "total_us": sum(usec for _calls, usec in kept.values()) / units,
        "in_scripts_us": 0.0,
        "all_calls": calls / units,
        "top_calls": calls / units,
    }


def _block(
    probe: c.ServerProbe, decide: Callable[[], bool], threads: int, seconds: float
) -> dict[str, Any]:
    """``threads`` threads call ``decide`` for ``seconds``: decisions, allowed, CPU, server."""
    counts = [0] * threads
    allowed = [0] * threads
    errors = [0] * threads
    clock = time.perf_counter

    def body(tid: int, t_start: float, t_end: float) -> None:
        c.sleep_until(t_start)
        n = ok = bad = 0
        while clock() < t_end:
            try:
                if decide():
                    ok += 1
            except Exception:
                bad += 1
            n += 1
        counts[tid], allowed[tid], errors[tid] = n, ok, bad

    with probe.measure() as srv:
        cpu = time.process_time()
        t_start = clock() + (0.02 if threads > 1 else 0.0)
        t_end = t_start + seconds
        if threads == 1:
            body(0, t_start, t_end)
        else:
            workers = [
                threading.Thread(target=body, args=(i, t_start, t_end), daemon=True)
                for i in range(threads)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        cpu = time.process_time() - cpu
    return {
        "decisions": sum(counts),
        "allowed": sum(allowed),
        "errors": sum(errors),
        "seconds": seconds,
        "cpu_s": cpu,
        "server_cpu_s": srv["cpu_s"],
        "server": srv["commands"],
    }


def decisions(runs: int, rounds: int, block: float, threads: int, count: int) -> dict[str, Any]:
    """The job of 12a: ``runs`` x ``rounds`` interleaved blocks of ``block`` seconds per peer,
    regime and thread count, in one fresh process."""
    conn = c.client()
    probe = c.ServerProbe(c.WORKER["server_pid"], conn)
    order = runnable()
    deciders = {
        (regime, peer): decider(peer, conn, f"bench:rate:{regime}:{i}", limit)
        for regime, limit in REGIMES
        for i, peer in enumerate(order)
    }
    for decide in deciders.values():  # scripts loaded, pool filled, the refused key saturated
        for _ in range(WARMUP):
            decide()
    trips: dict[str, float] = {}
    sent: dict[str, dict[str, float]] = {}
    for (regime, peer), decide in deciders.items():
        with SENDS.counting(), c.COUNTER.counting():
            for _ in range(count):
                decide()
        trips[f"{regime}|{peer}"] = SENDS.count / count
        sent[f"{regime}|{peer}"] = {k: v / count for k, v in c.COUNTER.commands.items()}
    modes = (1, threads)
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        acc: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
        for r in range(rounds):
            shift = (run_index * rounds + r) % len(order)
            for regime, _limit in REGIMES:
                for n_threads in modes:
                    for peer in order[shift:] + order[:shift]:
                        decide = deciders[(regime, peer)]
                        for _ in range(5):
                            decide()
                        out = _block(probe, decide, n_threads, block)
                        acc.setdefault((regime, n_threads, peer), []).append(out)
        metrics: dict[str, dict[str, float]] = {}
        for regime, _limit in REGIMES:
            for peer in order:
                row: dict[str, float] = {}
                for n_threads, tag in ((1, "1"), (threads, "n")):
                    blocks = acc[(regime, n_threads, peer)]
                    n = sum(b["decisions"] for b in blocks)
                    server: dict[str, tuple[int, int]] = {}
                    for b in blocks:
                        c.add_deltas(server, b["server"])
                    rt = redis_time(server, sent[f"{regime}|{peer}"], max(1, n))
                    row[f"per_s_{tag}"] = n / sum(b["seconds"] for b in blocks)
                    row[f"allowed_{tag}"] = sum(b["allowed"] for b in blocks) / max(1, n)
                    row[f"errors_{tag}"] = float(sum(b["errors"] for b in blocks))
                    row[f"client_cpu_us_{tag}"] = sum(b["cpu_s"] for b in blocks) / n * 1e6
                    row[f"redis_cpu_us_{tag}"] = (
                        sum(b["server_cpu_s"] for b in blocks) / max(1, n) * 1e6
                    )
                    row[f"redis_cmds_{tag}"] = rt["all_calls"]
                    row[f"redis_us_{tag}"] = rt["total_us"]
                    # Per-round ratio to ours, measured beside it (median over rounds).
                    if OURS in order:
                        ref = acc[(regime, n_threads, OURS)]
                        row[f"x_ours_{tag}"] = statistics.median(
                            b["decisions"] / o["decisions"] if o["decisions"] else float("nan")
                            for b, o in zip(blocks, ref, strict=True)
                        )
                    else:
                        row[f"x_ours_{tag}"] = float("nan")
                metrics[f"{regime}|{peer}"] = row
        per_run.append(metrics)
    return {
        "peers": list(order),
        "missing": missing(),
        "regimes": [list(r) for r in REGIMES],
        "threads": threads,
        "runs": runs,
        "rounds": rounds,
        "block_s": block,
        "round_trips": trips,
        "client_sent": sent,
        "per_run": per_run,
    }


# -- 12b: accuracy under load (worker processes x threads) ----------------------------------------


def accuracy_loop(
    peer: str, name: str, limit: int, threads: int, t_start: float, t_end: float
) -> dict[str, Any]:
    """One process of 12b: ``threads`` threads share one limiter object (a module-level limiter,
    as applications hold one) and decide until ``t_end``; allowed decisions' (call, return)."""
    conn = c.client()
    decide = decider(peer, conn, name, limit)
    clock = time.perf_counter
    allowed: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    counts = [0] * threads
    errors = [0] * threads

    def body(tid: int) -> None:
        mine = allowed[tid]
        n = bad = 0
        c.sleep_until(t_start)
        while True:
            called = clock()
            if called >= t_end:
                break
            try:
                ok = decide()
            except Exception:
                bad += 1
                ok = False
            n += 1
            if ok:
                mine.append((called, clock()))
        counts[tid], errors[tid] = n, bad

    cpu_s = c.run_threads(body, threads)
    return {
        "allowed": [a for part in allowed for a in part],
        "decisions": sum(counts),
        "errors": sum(errors),
        "cpu_s": cpu_s,
    }


def most_in_window(instants: Sequence[float], width: float) -> int:
    """Most instants in any half-open window ``[t, t + width)``."""
    ordered = sorted(instants)
    most = lo = 0
    for hi, t in enumerate(ordered):
        while ordered[lo] <= t - width:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def most_certainly_in_window(spans: Sequence[tuple[float, float]], width: float) -> int:
    """Most admissions *certainly* inside one window of ``width``: those whose whole (call,
    return) span lies in it. The server admitted each somewhere in its span, so this is a lower
    bound of the true most: a figure above the limit is a real over-admission, never jitter."""
    ordered = sorted(spans)
    most = 0
    for i, (start, _end) in enumerate(ordered):
        stop = start + width
        inside = 0
        for a, b in ordered[i:]:
            if a > stop:
                break
            if b <= stop:
                inside += 1
        most = max(most, inside)
    return most


def accuracy_figures(
    spans: Sequence[tuple[float, float]], t_start: float, t_end: float
) -> dict[str, float]:
    """Allowed decisions per fixed 1 s window (from ``t_start``), per sliding 1 s and 0.1 s
    window (the midpoint of each decision's span), and the certain 1 s figure."""
    mids = [(a + b) / 2 for a, b in spans]
    seconds = max(1, round(t_end - t_start))
    fixed = [0] * seconds
    for m in mids:
        slot = int(m - t_start)
        if 0 <= slot < seconds:
            fixed[slot] += 1
    return {
        "allowed_per_s": len(mids) / (t_end - t_start),
        "fixed_max": float(max(fixed)),
        "fixed_mean": statistics.fmean(fixed),
        "sliding_1s": float(most_in_window(mids, 1.0)) if mids else 0.0,
        "sliding_100ms": float(most_in_window(mids, 0.1)) if mids else 0.0,
        "certain_1s": float(most_certainly_in_window(spans, 1.0)),
    }


def run_accuracy(
    pool: c.WorkerPool,
    workers: list[int],
    threads: int,
    limit: int,
    runs: int,
    duration: float,
) -> dict[str, Any]:
    order = runnable()
    if OURS in order:
        order = (OURS, OURS_BURST, *order[1:])
    per_run: list[dict[str, dict[str, float]]] = []
    for run_index in range(runs):
        shift = run_index % len(order)
        metrics: dict[str, dict[str, float]] = {}
        for peer in order[shift:] + order[:shift]:
            name = f"bench:rate-acc:{run_index}:{order.index(peer)}"
            t_start = time.perf_counter() + 0.5
            t_end = t_start + duration
            replies = pool.call_many(
                [(i, "benchmarks._rate:accuracy_loop", {
                    "peer": peer, "name": name, "limit": limit, "threads": threads,
                    "t_start": t_start, "t_end": t_end,
                }) for i in workers],
                timeout=duration + 120,
            )  # fmt: skip
            spans = [s for reply in replies for s in reply["allowed"]]
            decided = sum(reply["decisions"] for reply in replies)
            figures = accuracy_figures(spans, t_start, t_end)
            figures["decisions_per_s"] = decided / duration
            figures["errors"] = float(sum(reply["errors"] for reply in replies))
            figures["client_cpu_us"] = sum(r["cpu_s"] for r in replies) / max(1, decided) * 1e6
            metrics[peer] = figures
        for peer in order:
            ref = metrics.get(OURS, {}).get("sliding_1s", float("nan"))
            metrics[peer]["x_ours"] = metrics[peer]["sliding_1s"] / ref if ref else float("nan")
        per_run.append(metrics)
    return {
        "peers": list(order),
        "missing": missing(),
        "procs": len(workers),
        "threads": threads,
        "limit": limit,
        "bursts": {peer: BURSTS[peer] for peer in order if peer in BURSTS},
        "runs": runs,
        "duration": duration,
        "per_run": per_run,
    }


# -- 12c: Celery throughput (real ``celery worker`` processes) ------------------------------------


def celery_ours_missing() -> str:
    """Why ``SingleFlightTask(lock_rate=...)`` cannot run here, or ``""``."""
    try:
        from django_redislock.celery import SingleFlightTask
    except ImportError as exc:
        return f"django_redislock.celery does not import ({exc})"
    if not hasattr(SingleFlightTask, "lock_rate"):
        return "SingleFlightTask has no lock_rate option in this checkout (issue 30, point 2)"
    return ""


def _worker_env(url: str, rate: int, workers: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REDISLOCK_BENCH_RATE_URL=url,
        REDISLOCK_BENCH_RATE_PER_S=str(rate),
        REDISLOCK_BENCH_RATE_WORKERS=str(workers),
        PYTHONPATH=os.pathsep.join([str(c.ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return env


class CeleryWorkers:
    """``workers`` ``celery worker -P prefork -c 1`` processes, each in its own session, stopped
    by their process group id (the worker and its pool child)."""

    def __init__(self, app: Any, env: dict[str, str], workers: int, log_dir: str) -> None:
        self.app = app
        self.env = env
        self.names = [f"rate{i}-{os.getpid()}@localhost" for i in range(workers)]
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60) -> float:
        began = time.monotonic()
        for name in self.names:
            log = open(os.path.join(self.log_dir, f"{name}.log"), "wb")  # noqa: SIM115
            with log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "celery", "-A", "benchmarks._rate_celery",
                         "worker", "-P", "prefork", "-c", "1", "--without-mingle",
                         "--without-gossip", "--without-heartbeat", "-Q", CELERY_QUEUE,
                         "-n", name, "--loglevel", "WARNING"],
                        cwd=c.ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
        waiting = set(self.names)
        deadline = time.monotonic() + timeout
        while waiting:
            for proc, name in zip(self.procs, self.names, strict=True):
                if proc.poll() is not None:
                    raise c.WorkerError(f"celery worker {name} exited:\n{self.output(name)}")
            if time.monotonic() > deadline:
                raise c.WorkerError(f"celery workers {sorted(waiting)} did not answer a ping")
            for reply in self.app.control.ping(destination=sorted(waiting), timeout=0.5) or []:
                waiting -= set(reply)
        return time.monotonic() - began

    def output(self, name: str) -> str:
        with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            with contextlib.suppress(ProcessLookupError):  # a pool child left behind
                os.killpg(proc.pid, signal.SIGKILL)


def celery_throughput(workers: int, tasks: int, rate: int, log_dir: str) -> dict[str, Any]:
    """The job of 12c, in a fresh benchmark process: start the workers, run ``tasks`` tasks of
    each kind, one kind at a time, and time their completions."""
    url = c.WORKER["url"]
    env = _worker_env(url, rate, workers)
    os.environ.update({k: v for k, v in env.items() if k.startswith("REDISLOCK_BENCH_RATE_")})
    from benchmarks import _rate_celery

    conn = c.client()
    app = _rate_celery.app
    why_not = celery_ours_missing()
    order = [CELERY_THEIRS] + ([] if why_not else [CELERY_OURS])
    pool = CeleryWorkers(app, env, workers, log_dir)
    results: dict[str, dict[str, float]] = {}
    try:
        started_s = pool.start()
        for peer in order:
            task = _rate_celery.task_of(peer == CELERY_OURS)
            done_key = _rate_celery.DONE_KEY
            conn.delete(done_key, _rate_celery.REPUBLISHED_KEY)
            began = time.time()
            for i in range(tasks):
                task.apply_async((i,))
            published = time.time()
            deadline = time.monotonic() + max(30.0, 4 * tasks / rate)
            while conn.llen(done_key) < tasks and time.monotonic() < deadline:
                time.sleep(0.05)
            stamps = sorted(float(x) for x in conn.lrange(done_key, 0, -1))
            republished = int(conn.get(_rate_celery.REPUBLISHED_KEY) or 0)
            span = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
            results[peer] = {
                "completed": float(len(stamps)),
                "publish_s": published - began,
                "run_s": (stamps[-1] - began) if stamps else float("nan"),
                "per_s": (len(stamps) - 1) / span if span == span and span > 0 else float("nan"),
                "sliding_1s": float(most_in_window(stamps, 1.0)) if stamps else 0.0,
                "republished_per_task": republished / tasks,
            }
            _drain(conn, tasks, done_key)
    finally:
        pool.stop()
    ref = results.get(CELERY_OURS, {}).get("per_s", float("nan"))
    for figures in results.values():
        figures["x_rate"] = figures["per_s"] / rate
        figures["x_ours"] = figures["per_s"] / ref if ref == ref and ref else float("nan")
    return {
        "peers": order,
        "missing": {CELERY_OURS: why_not} if why_not else {},
        "workers": workers,
        "tasks": tasks,
        "rate": rate,
        "start_s": started_s,
        "results": results,
    }


def _drain(conn: Any, tasks: int, done_key: str) -> None:
    """Leave no message of this kind behind (a slow kind's stragglers must not run during the
    next kind's measurement): wait a little more, then purge the queue."""
    from benchmarks import _rate_celery

    deadline = time.monotonic() + 2.0
    while conn.llen(done_key) < tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    _rate_celery.app.control.purge()


# -- report ---------------------------------------------------------------------------------------


def _fmt_ratio(spread: c.Spread) -> str:
    return spread.fmt(2, X)


def _times(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}{X}"


def tables(
    dec: dict[str, Any], acc: dict[str, Any], cel: dict[str, Any] | None
) -> dict[str, tuple[list[str], list[list[str]]]]:
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    rows = []
    for regime, limit in dec["regimes"]:
        for peer in dec["peers"]:
            key = f"{regime}|{peer}"
            s = c.spreads([run[key] for run in dec["per_run"]])
            rows.append(
                [
                    peer,
                    f"{regime} ({limit:,}/s)",
                    f"{s['allowed_1'].mid * 100:.0f} %",
                    s["per_s_1"].fmt(0),
                    _fmt_ratio(s["x_ours_1"]),
                    s["per_s_n"].fmt(0),
                    _fmt_ratio(s["x_ours_n"]),
                    c.fmt_num(dec["round_trips"][key], 2),
                    s["redis_cmds_1"].fmt(1),
                    s["redis_us_1"].fmt(1),
                    s["redis_cpu_us_1"].fmt(1),
                    s["client_cpu_us_1"].fmt(0),
                    s["client_cpu_us_n"].fmt(0),
                ]
            )
    for peer in dec["missing"]:
        rows.append([peer, "not available (notes)", *["n/a"] * 11])
    out["12a. Rate limiters: decisions per second and cost per decision, one process"] = (
        [
            "peer",
            "limit",
            "allowed",
            "decisions/s, 1 thread",
            f"{X} ours",
            f"decisions/s, {dec['threads']} threads",
            f"{X} ours",
            "round trips",
            "Redis cmds",
            "Redis µs (commandstats)",
            "Redis CPU µs",
            "client CPU µs, 1 thread",
            f"client CPU µs, {dec['threads']} threads",
        ],
        rows,
    )
    rows = []
    for peer in acc["peers"]:
        s = c.spreads([run[peer] for run in acc["per_run"]])
        rows.append(
            [
                peer,
                s["decisions_per_s"].fmt(0),
                s["allowed_per_s"].fmt(1),
                s["fixed_mean"].fmt(1),
                s["fixed_max"].fmt(0),
                s["sliding_1s"].fmt(0),
                _fmt_ratio(s["x_ours"]),
                s["certain_1s"].fmt(0),
                str(acc["limit"] + acc["bursts"][peer]) if peer in acc["bursts"] else "-",
                s["sliding_100ms"].fmt(0),
                s["errors"].fmt(0),
            ]
        )
    for peer in acc["missing"]:
        rows.append([peer, "not available (notes)", *["n/a"] * 9])
    title = (
        f"12b. Rate limiters: accuracy, {acc['procs']} processes x {acc['threads']} threads on "
        f"one limiter of {acc['limit']}/s for {acc['duration']:g} s"
    )
    out[title] = (
        [
            "peer",
            "decisions/s",
            "allowed/s",
            "allowed per 1 s window, mean",
            "max",
            "worst sliding 1 s",
            f"{X} ours",
            "certainly in 1 s",
            "GCRA bound",
            "worst sliding 0.1 s",
            "errors",
        ],
        rows,
    )
    if cel is not None:
        rows = []
        for peer in cel["peers"]:
            r = cel["results"][peer]
            rows.append(
                [
                    peer,
                    f"{r['completed']:.0f} / {cel['tasks']}",
                    c.fmt_num(r["per_s"], 1),
                    _times(r["x_rate"]),
                    _times(r["x_ours"]),
                    c.fmt_num(r["sliding_1s"], 0),
                    c.fmt_num(r["run_s"], 1),
                    c.fmt_num(r["republished_per_task"], 2),
                ]
            )
        for peer in cel["missing"]:
            rows.append([peer, "not available (notes)", *["n/a"] * 6])
        title = (
            f"12c. Celery: {cel['tasks']} tasks limited to {cel['rate']}/s, {cel['workers']} "
            "worker processes (--concurrency 1 each), Redis broker"
        )
        out[title] = (
            [
                "limit",
                "completed",
                "completions/s",
                f"{X} configured rate",
                f"{X} ours",
                "worst sliding 1 s",
                "publish to last completion s",
                "re-publishes per task",
            ],
            rows,
        )
    return out


def notes(dec: dict[str, Any], acc: dict[str, Any], cel: dict[str, Any] | None) -> list[str]:
    lines = [
        f"12a: {dec['runs']} runs x {dec['rounds']} rounds x {dec['block_s']:g} s per peer, "
        f"regime and thread count, interleaved (the order rotates each round); {X} ours: median "
        "over rounds of the block's decisions / ours's in the same round; figures: median of "
        f"the runs (min{DASH}max). One limiter object per peer and regime, shared by the "
        "threads. 'allowed' regime: a limit no peer reaches; 'refused': 100/s, nearly every "
        "decision refused (a hot limiter). Round trips: packets sent on redis-py connections "
        "per decision (a pipeline is one); Redis cmds: every command executed, inside scripts "
        "too; Redis µs: commandstats time of the commands sent (scripts whole); Redis CPU: the "
        "server process's CPU clock; Redis and client CPU per decision from the 1-thread blocks "
        "unless named. With several threads one process is bound by its GIL: the 8-thread "
        "figures show contention inside Redis (dramatiq's WATCH retries), not scale-out.",
        f"12b: {acc['runs']} run(s) per peer, one fresh limiter name each; every thread loops "
        "decisions without pause. Allowed decisions are placed at the midpoint of their call "
        "and return; fixed windows start with the run; 'certainly in 1 s' counts only "
        "decisions whose whole call..return span lies in one 1 s window (a lower bound of the "
        "true count: above the GCRA bound = limit x 1 s + burst is a real over-admission). "
        f"{X} ours: worst sliding 1 s window / ours (burst 1). dramatiq's buckets and "
        "windows, and limits' timestamps, come from the client clocks.",
    ]
    if cel is not None:
        lines.append(
            f"12c: {cel['workers']} `celery worker -P prefork -c 1` processes (started in "
            f"{cel['start_s']:.1f} s), prefetch multiplier 1, Redis broker (db 1); {cel['tasks']} "
            "tasks published at once per kind, one kind after the other; each run pushes its "
            "end time to a Redis list. completions/s: (completed - 1) / (last - first "
            "completion). Celery's rate_limit is a token bucket in each worker, so n workers "
            "let n x the rate through; lock_rate is one GCRA limiter for every worker (one lock "
            "key, lock_mode while_executing with a permit per worker): a run over the rate is "
            "re-published with countdown = retry_after ('re-publishes per task')."
        )
    for section, gone in (("12a/12b", dec["missing"]), ("12c", (cel or {}).get("missing", {}))):
        for peer, why in gone.items():
            lines.append(f"{section}: not available: {peer}: {why}")
    return lines


def checks(acc: dict[str, Any]) -> list[tuple[str, bool]]:
    """What must never happen: ours admitting more than limit x 1 s + burst in a 1 s window."""
    out = []
    for peer, burst in acc["bursts"].items():
        bound = acc["limit"] + burst
        worst = max(run[peer]["certain_1s"] for run in acc["per_run"])
        out.append(
            (
                f"rate: {peer} admitted at most {bound} in any 1 s window ({worst:.0f} seen)",
                worst <= bound,
            )
        )
    return out
