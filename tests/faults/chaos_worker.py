"""A lock client under chaos, in its own process, recording its history (``tests/history.py``).

``python -m tests.faults.chaos_worker --history FILE --stop-file FILE --cache JSON ...``

Each worker runs ``--threads`` threads using :class:`~django_redislock.Lock` and ``--tasks``
asyncio tasks (one event loop, in a thread of its own) using
:class:`~django_redislock.AsyncLock`, on a few names (``--names``: contention), as users write
them:

- threads: a blocking ``acquire()`` with a ``blocking_timeout``, a non-blocking ``acquire()``, or
  ``with Lock(...)``;
- tasks: ``await acquire()`` (blocking or not), ``async with``, and acquisitions cancelled by
  ``asyncio.timeout`` (``wait_for``-style, a few ms: during the first round trip or the wait),
  some releases too (``--cancel 0``: none);
- after an error (``LockBackendError``) or a cancellation the same thread or task tries again on
  the same object (up to ``--retries`` times): what users do, and what turns a lost reply into a
  hold its owner never heard of (``orphan`` in the checker).

Critical sections are a few milliseconds (3 %: under a second), far below the lease
(``--lease``, auto-renewed), so a hold never outlives its lease unless the lock was really lost.
Every call is recorded before and after (``HistoryRecorder.call``); ``lock_outcome_resolved`` is
recorded where the package sends it.
With ``--rates NAME:COUNT:PERIOD:BURST[,...]`` and ``--rate-threads N`` the worker also runs N
threads and N asyncio tasks deciding on those rate limiters (``try_acquire`` mostly,
``acquire(timeout=…)`` sometimes), recorded as ``op="decide"`` calls (``allowed``, ``refused``
or ``error``) for the checker's ``over_limit``.

The worker stops when the stop file exists (each client finishes its cycle: releases what it
holds) or after ``--max-seconds``, writes ``ev="exit"`` and exits 0; a client that raised
anything unexpected writes ``ev="crash"`` and the worker exits 1.

Settings: like ``tests/settings.py`` reads the Redis URL from the environment, the worker builds
its own settings from its arguments — the lock cache as a ``CACHES`` entry (``--cache``: JSON;
e.g. django-redis at the fault proxy's port with a short ``SOCKET_TIMEOUT``, or a Sentinel
entry), ``REDISLOCK`` (``--redislock``: JSON; ``REPLICAS``, or ``CLIENT`` =
:func:`cluster_client`, which reads ``CHAOS_CLUSTER_NODES``). Statistics are off (less traffic
through a 2-core machine; they are not what is checked).

The parent side (:class:`ChaosWorkers`) starts workers, waits until they run, SIGKILLs one,
stops them and collects the history files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

if str(ROOT) not in sys.path:  # run as a file, not with -m
    sys.path.insert(0, str(ROOT))

from tests.history import HistoryRecorder  # noqa: E402


def cluster_client() -> Any:
    """``REDISLOCK["CLIENT"]`` for Cluster runs: ``RedisCluster`` over ``CHAOS_CLUSTER_NODES``
    (comma-separated ports) with ``CHAOS_SOCKET_TIMEOUT`` (default 1 s) socket timeouts."""
    import redis.cluster

    timeout = float(os.environ.get("CHAOS_SOCKET_TIMEOUT", "1.0"))
    ports = [int(p) for p in os.environ["CHAOS_CLUSTER_NODES"].split(",") if p]
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode("127.0.0.1", p) for p in ports],
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )


# -- the worker ----------------------------------------------------------------------------------


class Context:
    def __init__(self, opts: argparse.Namespace, recorder: HistoryRecorder) -> None:
        self.opts = opts
        self.names: list[str] = opts.names.split(",")
        self.recorder = recorder
        self.deadline = time.monotonic() + opts.max_seconds
        self.stop_file = Path(opts.stop_file)
        self.crashed = False
        self.rates = parse_rates(opts.rates)
        self.async_vias: tuple[str, ...] = ("async-blocking", "async-nonblocking", "async-with")
        if opts.cancel:
            self.async_vias += ("async-cancel",)

    def stopping(self) -> bool:
        return time.monotonic() > self.deadline or self.stop_file.exists()


def critical_section(ctx: Context, rng: random.Random) -> float:
    """How long a hold works: mostly 2-20 ms; a share (``--long-holds``) 0.2-0.8 s — still far
    below the lease, but long enough to be caught by a fault (a failover, a partition)."""
    if rng.random() < ctx.opts.long_holds:
        return rng.uniform(0.2, 0.8)
    return rng.uniform(0.002, 0.02)


def _crash(ctx: Context, exc: BaseException) -> None:
    ctx.crashed = True
    ctx.recorder.write(
        "crash",
        thread=threading.current_thread().name,
        error="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2000:],
    )


def _sync_cycle(ctx: Context, rng: random.Random, lock: Any, via: str) -> bool:
    """One acquisition (and release) of ``lock``; True: retry (the acquire failed)."""
    from django_redislock import (
        LockBackendError,
        LockLostError,
        LockNotAcquiredError,
        LockNotOwnedError,
    )

    rec = ctx.recorder
    call = rec.call("acquire", lock, via=via)
    release = None
    if via == "with":
        try:
            with lock:
                call.acquired(lock)
                time.sleep(critical_section(ctx, rng))
                release = rec.call("release", lock, via=via, lost=lock.lost)
        except LockNotAcquiredError:
            call.done("not-acquired")
            return False
        except LockLostError:
            assert release is not None
            release.done("lost")
            return False
        except LockBackendError as exc:
            if release is None:
                call.failed(exc)
                return True
            release.failed(exc)
            return False
        assert release is not None
        release.done("released")
        return False
    try:
        ok = lock.acquire(blocking=via == "blocking")
    except LockBackendError as exc:
        call.failed(exc)
        return True
    if not ok:
        call.done("not-acquired")
        return False
    call.acquired(lock)
    time.sleep(critical_section(ctx, rng))
    release = rec.call("release", lock, via=via, lost=lock.lost)
    try:
        lock.release()
    except LockNotOwnedError:
        release.done("lost")
    except LockBackendError as exc:
        release.failed(exc)
    else:
        release.done("released")
    return False


def sync_client(ctx: Context, index: int) -> None:
    from django_redislock import Lock

    rng = random.Random(f"{ctx.opts.seed}-t{index}")
    opts = ctx.opts
    try:
        while not ctx.stopping():
            name = rng.choice(ctx.names)
            via = rng.choice(("blocking", "nonblocking", "with"))
            lock = Lock(name, timeout=opts.lease, blocking_timeout=rng.uniform(0.05, opts.max_wait))
            for _ in range(opts.retries + 1):
                if not _sync_cycle(ctx, rng, lock, via):
                    break
                time.sleep(rng.uniform(0.005, 0.05))
            time.sleep(rng.uniform(0.0, 0.01))
    except BaseException as exc:
        _crash(ctx, exc)


@contextlib.asynccontextmanager
async def cancel_after(delay: float) -> AsyncIterator[None]:
    """``asyncio.timeout(delay)`` (Python >= 3.11); the same for 3.10: cancels the *current*
    task (not a new one, as ``wait_for`` did before 3.12), so the call keeps its owner."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is not None:
        async with timeout(delay):
            yield
        return
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(delay, fire)
    try:
        yield
    except asyncio.CancelledError:
        if fired:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()


async def _async_cycle(ctx: Context, rng: random.Random, lock: Any, via: str) -> str:
    """One acquisition of ``lock``; ``"retry"`` after an error or a cancelled acquire."""
    from django_redislock import (
        LockBackendError,
        LockLostError,
        LockNotAcquiredError,
        LockNotOwnedError,
    )

    rec = ctx.recorder
    call = rec.call("acquire", lock, via=via)
    release = None
    if via == "async-with":
        try:
            async with lock:
                call.acquired(lock)
                await asyncio.sleep(critical_section(ctx, rng))
                release = rec.call("release", lock, via=via, lost=lock.lost)
        except LockNotAcquiredError:
            call.done("not-acquired")
            return "done"
        except LockLostError:
            assert release is not None
            release.done("lost")
            return "done"
        except LockBackendError as exc:
            if release is None:
                call.failed(exc)
                return "retry"
            release.failed(exc)
            return "done"
        assert release is not None
        release.done("released")
        return "done"
    try:
        if via == "async-cancel":
            async with cancel_after(rng.uniform(0.0, 0.004)):
                ok = await lock.acquire()
        else:
            ok = await lock.acquire(blocking=via == "async-blocking")
    except TimeoutError:
        call.cancelled()
        return "retry"
    except LockBackendError as exc:
        call.failed(exc)
        return "retry"
    if not ok:
        call.done("not-acquired")
        return "done"
    call.acquired(lock)
    await asyncio.sleep(critical_section(ctx, rng))
    release = rec.call("release", lock, via=via, lost=lock.lost)
    try:
        if via == "async-cancel" and rng.random() < 0.3:
            # Cancelled inside release(): it must still release (API.md, asyncio).
            async with cancel_after(rng.uniform(0.0, 0.002)):
                await lock.release()
        else:
            await lock.release()
    except TimeoutError:
        release.cancelled()
    except LockNotOwnedError:
        release.done("lost")
    except LockBackendError as exc:
        release.failed(exc)
    else:
        release.done("released")
    return "done"


async def async_client(ctx: Context, index: int) -> None:
    from django_redislock import AsyncLock

    rng = random.Random(f"{ctx.opts.seed}-a{index}")
    opts = ctx.opts
    try:
        while not ctx.stopping():
            name = rng.choice(ctx.names)
            via = rng.choice(ctx.async_vias)
            lock = AsyncLock(
                name, timeout=opts.lease, blocking_timeout=rng.uniform(0.05, opts.max_wait)
            )
            for _ in range(opts.retries + 1):
                if await _async_cycle(ctx, rng, lock, via) == "done":
                    break
                via = "async-blocking"  # the retry is a plain acquire: an orphan shows there
                await asyncio.sleep(rng.uniform(0.005, 0.05))
            await asyncio.sleep(rng.uniform(0.0, 0.01))
    except BaseException as exc:
        _crash(ctx, exc)


def parse_rates(text: str) -> dict[str, tuple[int, float, int]]:
    """``"r:20:1:3,s:5:0.5:1"`` -> ``{"r": (20, 1.0, 3), "s": (5, 0.5, 1)}``."""
    found = {}
    for item in filter(None, text.split(",")):
        name, count, period, burst = item.split(":")
        found[name] = (int(count), float(period), int(burst))
    return found


def _decision(ctx: Context, name: str, via: str, start: float, outcome: str, **fields: Any) -> None:
    ctx.recorder.write(
        "call",
        op="decide",
        name=name,
        owner=f"rate/{ctx.recorder.pid}/{threading.current_thread().name}",
        thread=threading.current_thread().name,
        via=via,
        start=start,
        end=time.monotonic(),
        outcome=outcome,
        **fields,
    )


def rate_client(ctx: Context, index: int) -> None:
    """Decide on the rate limiters in a loop, as a thread would (see the module docstring)."""
    from django_redislock import LockBackendError, RateLimited, RateLimiter

    rng = random.Random(f"{ctx.opts.seed}-rate-{index}")
    limiters = [RateLimiter(n, (c, p), burst=b) for n, (c, p, b) in ctx.rates.items()]
    try:
        while not ctx.stopping():
            limiter = rng.choice(limiters)
            via = "try" if rng.random() < 0.7 else "acquire"
            start = time.monotonic()
            try:
                if via == "try":
                    outcome = "allowed" if limiter.try_acquire() else "refused"
                else:
                    limiter.acquire(timeout=0.2)
                    outcome = "allowed"
            except RateLimited:
                outcome = "refused"
            except LockBackendError as exc:
                _decision(ctx, limiter.name, via, start, "error", error=str(exc)[:120])
                time.sleep(0.01)
                continue
            _decision(ctx, limiter.name, via, start, outcome)
            time.sleep(rng.uniform(0.0, 0.005))
    except BaseException as exc:
        _crash(ctx, exc)


def async_rate_clients(ctx: Context) -> None:
    """``--rate-threads`` asyncio tasks deciding with ``AsyncRateLimiter`` in one loop."""
    from django_redislock import AsyncRateLimiter, LockBackendError, RateLimited

    async def one(index: int) -> None:
        rng = random.Random(f"{ctx.opts.seed}-arate-{index}")
        limiters = [AsyncRateLimiter(n, (c, p), burst=b) for n, (c, p, b) in ctx.rates.items()]
        while not ctx.stopping():
            limiter = rng.choice(limiters)
            via = "async-try" if rng.random() < 0.7 else "async-acquire"
            start = time.monotonic()
            try:
                if via == "async-try":
                    outcome = "allowed" if await limiter.try_acquire() else "refused"
                else:
                    await limiter.acquire(timeout=0.2)
                    outcome = "allowed"
            except RateLimited:
                outcome = "refused"
            except LockBackendError as exc:
                _decision(ctx, limiter.name, via, start, "error", error=str(exc)[:120])
                await asyncio.sleep(0.01)
                continue
            _decision(ctx, limiter.name, via, start, outcome)
            await asyncio.sleep(rng.uniform(0.0, 0.005))

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(ctx.opts.rate_threads)))

    try:
        asyncio.run(main())
    except BaseException as exc:
        _crash(ctx, exc)


def async_clients(ctx: Context) -> None:
    async def main() -> None:
        tasks = [
            asyncio.create_task(async_client(ctx, i), name=f"task{i}")
            for i in range(ctx.opts.tasks)
        ]
        await asyncio.gather(*tasks)

    try:
        asyncio.run(main())
    except BaseException as exc:
        _crash(ctx, exc)


def configure(opts: argparse.Namespace) -> None:
    import django
    from django.conf import settings

    redislock = {"STATS": False, **json.loads(opts.redislock)}
    caches = {"default": json.loads(opts.cache)} if opts.cache else {}
    settings.configure(
        SECRET_KEY="chaos-worker",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislock"],
        DATABASES={},
        CACHES=caches or {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        REDISLOCK=redislock,
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"console": {"class": "logging.StreamHandler"}},
            "loggers": {"django_redislock": {"handlers": ["console"], "level": "WARNING"}},
        },
    )
    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--history", required=True, help="JSON-lines file to append to")
    parser.add_argument("--stop-file", required=True, help="stop once this file exists")
    parser.add_argument("--client", default="w", help="label of this worker in reports")
    parser.add_argument("--cache", default="", help="the lock cache's CACHES entry, JSON")
    parser.add_argument("--redislock", default="{}", help="REDISLOCK, JSON")
    parser.add_argument("--names", default="a,b,c")
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--max-wait", type=float, default=1.5, help="longest blocking_timeout")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--long-holds", type=float, default=0.03, help="share of long holds")
    parser.add_argument(
        "--cancel",
        type=int,
        default=1,
        help="1: tasks also cancel acquisitions and releases (asyncio.timeout); 0: never",
    )
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--rates", default="", help="rate limiters NAME:COUNT:PERIOD:BURST,...")
    parser.add_argument("--rate-threads", type=int, default=0)
    opts = parser.parse_args(argv)

    configure(opts)
    recorder = HistoryRecorder(opts.history, client=opts.client)
    resolutions = recorder.connect_signals()
    ctx = Context(opts, recorder)
    threads = [
        threading.Thread(target=sync_client, args=(ctx, i), name=f"thread{i}")
        for i in range(opts.threads)
    ]
    if opts.tasks:
        threads.append(threading.Thread(target=async_clients, args=(ctx,), name="loop"))
    if ctx.rates and opts.rate_threads:
        threads += [
            threading.Thread(target=rate_client, args=(ctx, i), name=f"rate{i}")
            for i in range(opts.rate_threads)
        ]
        threads.append(threading.Thread(target=async_rate_clients, args=(ctx,), name="rateloop"))
    recorder.write("start", resolutions=resolutions, python=sys.version.split()[0])
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorder.write("exit", clean=not ctx.crashed)
    return 1 if ctx.crashed else 0


# -- the parent side -----------------------------------------------------------------------------


class ChaosWorkers:
    """Worker processes of one run: ``start()``, ``wait_running()``, ``kill(i)``, ``stop()``.

    Each writes ``<dir>/<label>.jsonl``; the test's own events (kills) go to ``<dir>/test.jsonl``.
    Every process is ended by its PID at :meth:`close` (SIGKILL if still running).
    """

    def __init__(self, directory: Path, **options: Any) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stop_file = self.dir / "stop"
        self.options = options
        self.procs: list[subprocess.Popen[bytes]] = []
        self.labels: list[str] = []
        self.recorder = HistoryRecorder(self.dir / "test.jsonl", client="test")
        self.killed: dict[int, float] = {}

    def start(self, count: int, env: dict[str, str] | None = None) -> ChaosWorkers:
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), child_env.get("PYTHONPATH", "")])
        child_env.pop("DJANGO_SETTINGS_MODULE", None)  # the worker configures its own
        child_env.update(env or {})
        for i in range(len(self.procs), len(self.procs) + count):
            label = f"w{i}"
            args = [
                sys.executable,
                "-m",
                "tests.faults.chaos_worker",
                "--history",
                str(self.dir / f"{label}.jsonl"),
                "--stop-file",
                str(self.stop_file),
                "--client",
                label,
                "--seed",
                f"{self.options.get('seed', 0)}-{i}",
            ]
            for key, value in self.options.items():
                if key == "seed":
                    continue
                if isinstance(value, (dict, list)):
                    value = json.dumps(value)
                args += [f"--{key.replace('_', '-')}", str(value)]
            with open(self.dir / f"{label}.log", "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        args, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
            self.labels.append(label)
        return self

    def _started(self, label: str) -> bool:
        path = self.dir / f"{label}.jsonl"
        return path.exists() and '"ev": "start"' in path.read_text()

    def wait_running(self, timeout: float = 60.0) -> None:
        """Until every worker wrote its ``start`` line (Django set up, clients starting)."""
        deadline = time.monotonic() + timeout
        while not all(self._started(label) for label in self.labels):
            for label, proc in zip(self.labels, self.procs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"{label} exited early:\n{self.log(label)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not running after {timeout:g} s")
            time.sleep(0.05)

    def kill(self, index: int) -> int:
        """SIGKILL worker ``index`` (recorded: its keys may stay one lease); returns its pid."""
        proc = self.procs[index]
        os.kill(proc.pid, signal.SIGKILL)
        at = time.monotonic()
        proc.wait(10)
        self.killed[proc.pid] = at
        self.recorder.killed(proc.pid, at)
        return proc.pid

    def stop(self, timeout: float = 30.0) -> list[int | None]:
        """Ask every worker to finish (stop file) and wait; returns their exit codes."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        return [proc.poll() for proc in self.procs]

    def log(self, label: str, chars: int = 3000) -> str:
        try:
            return (self.dir / f"{label}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.recorder.close()

    def __enter__(self) -> ChaosWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running(
    directory: Path, count: int, *, env: dict[str, str] | None = None, **options: Any
) -> Iterator[ChaosWorkers]:
    """``count`` workers started and running; all ended by PID afterwards."""
    with ChaosWorkers(directory, **options) as workers:
        workers.start(count, env).wait_running()
        yield workers


if __name__ == "__main__":
    sys.exit(main())
