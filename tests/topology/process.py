"""One ``redis-server`` (or sentinel) child process, restartable on its port and directory.

``tests.redis_server.RedisServer`` starts a plain, disk-less server with fixed options. Topologies
need more: cluster and sentinel options, a config file a sentinel may rewrite, an AOF that survives
a crash, a restart on the *same* port and directory (a cluster node finds its ``nodes.conf``
there), and launching several processes before waiting for any (six cluster nodes start in
parallel on two cores). Every process is signalled by the PID of our own ``Popen`` child — never
by name — and is killed at interpreter exit if a test forgot it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis

from tests.redis_server import find_redis_server, free_port

__all__ = [
    "LOOPBACK",
    "RedisProcess",
    "TopologyTimeout",
    "free_port_pair",
    "redis_version",
    "wait_until",
]

LOOPBACK = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10000  # Redis 6.2 has no cluster-port: the bus is always port + 10000

T = TypeVar("T")

# Every process not yet cleaned up, killed and removed at interpreter exit if a test forgot it.
_LIVE: set[RedisProcess] = set()


class TopologyTimeout(AssertionError):
    """A bounded wait for a topology state ran out (an AssertionError, so tests fail, not error)."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    *,
    what: str,
    interval: float = 0.05,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; raise :class:`TopologyTimeout`.

    Redis errors raised by ``predicate`` count as "not yet" (nodes come and go during the waits
    this serves); the last one is shown in the timeout message with ``details()``.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
        except (redis.RedisError, OSError) as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout:g} s waiting for {what}"
            if last_error is not None:
                msg += f"\nlast error: {last_error!r}"
            if details is not None:
                with contextlib.suppress(Exception):
                    msg += "\n" + details()
            raise TopologyTimeout(msg)
        time.sleep(interval)


@functools.lru_cache(maxsize=8)
def redis_version(binary: str | None = None) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a ``redis-server`` binary (tests branch on 6.2 vs 7.x)."""
    out = subprocess.run(
        [binary or find_redis_server(), "--version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    for word in out.split():
        if word.startswith("v="):
            major, minor, patch = (int(x) for x in word[2:].split(".")[:3])
            return (major, minor, patch)
    raise RuntimeError(f"cannot parse redis-server --version output: {out!r}")


def free_port_pair(offset: int = CLUSTER_BUS_OFFSET, attempts: int = 50) -> int:
    """A free loopback port ``p`` such that ``p + offset`` is free too (cluster bus port)."""
    import socket

    for _ in range(attempts):
        port = free_port()
        if port + offset > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port + offset))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port pair (p, p+{offset}) found in {attempts} attempts")


class RedisProcess:
    """A private ``redis-server`` on a loopback port, with a directory of its own.

    ``persistent=True`` turns on the AOF with ``appendfsync always`` (every acknowledged write
    survives SIGKILL); otherwise nothing is written to disk and a restart comes back empty.
    ``sentinel_config`` (lines) runs the process as a sentinel on a config file it may rewrite.
    ``bus_port`` reserves ``port + 10000`` too (cluster nodes).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        args: Sequence[str] = (),
        persistent: bool = False,
        sentinel_config: Sequence[str] | None = None,
        bus_port: bool = False,
        name: str = "redis",
        loglevel: str = "notice",
    ) -> None:
        self.binary = binary or find_redis_server()
        self.name = name
        self.args = list(args)
        self.persistent = persistent
        self.sentinel_config = list(sentinel_config) if sentinel_config is not None else None
        self.bus_port = bus_port
        self.loglevel = loglevel
        self._fixed_port = port is not None
        self.port = port or self._pick_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"redislock-{name}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._removed = False
        _LIVE.add(self)

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<{type(self).__name__} {self.name} {LOOPBACK}:{self.port} {state}>"

    # -- addresses and clients ----------------------------------------------------------------

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def address(self) -> tuple[str, int]:
        return (LOOPBACK, self.port)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        """Our child is running (possibly SIGSTOPped)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client to this process (bounded timeouts unless overridden)."""
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        return redis.Redis(host=LOOPBACK, port=self.port, **kwargs)

    # -- life cycle -----------------------------------------------------------------------------

    def _pick_port(self) -> int:
        return free_port_pair() if self.bus_port else free_port()

    def _command(self) -> list[str]:
        if self.sentinel_config is not None:
            conf = self.dir / "sentinel.conf"
            if not conf.exists():  # a restarted sentinel keeps what it rewrote
                lines = [
                    f"port {self.port}",
                    f"bind {LOOPBACK}",
                    "daemonize no",
                    f'dir "{self.dir}"',
                    f"loglevel {self.loglevel}",
                    *self.sentinel_config,
                ]
                conf.write_text("\n".join(lines) + "\n")
            return [self.binary, str(conf), "--sentinel"]
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--save",
            "",
            *persistence,
            "--loglevel",
            self.loglevel,
            *self.args,
        ]

    def launch(self) -> RedisProcess:
        """Start the child without waiting (pair with :meth:`wait_ready`)."""
        if self.alive:
            raise RuntimeError(f"{self!r} is already running")
        if self._removed:
            raise RuntimeError(f"{self!r} was cleaned up; its directory is gone")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )
        return self

    def wait_ready(self, timeout: float = 15.0) -> RedisProcess:
        """Wait until PING answers and no dataset is loading; relaunch once on a port race."""
        for attempt in range(3):
            try:
                return self._wait_ready(timeout)
            except _PortTaken:
                if self._fixed_port or attempt == 2:
                    raise RuntimeError(
                        f"{self.name}: port {self.port} already in use:\n{self.log_tail()}"
                    ) from None
                self.port = self._pick_port()  # somebody took our free port: pick another
                if self.sentinel_config is not None:
                    (self.dir / "sentinel.conf").unlink(missing_ok=True)
                self.launch()
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout: float) -> RedisProcess:
        assert self.proc is not None, "launch() first"
        client = self.client(socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    self.proc = None
                    log = self.log_tail()
                    if "Address already in use" in log:
                        raise _PortTaken()
                    raise RuntimeError(f"{self.name} on port {self.port} exited:\n{log}")
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if client.ping():
                        if self.sentinel_config is not None:
                            return self
                        with contextlib.suppress(redis.BusyLoadingError):
                            if not int(client.info("persistence").get("loading", 0)):
                                return self
                if time.monotonic() > deadline:
                    self.kill()
                    raise TopologyTimeout(
                        f"{self.name} on port {self.port} not ready after {timeout:g} s:\n"
                        + self.log_tail()
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def start(self, timeout: float = 15.0) -> RedisProcess:
        """Launch and wait until it answers."""
        return self.launch().wait_ready(timeout)

    def _signal(self, sig: int) -> None:
        # Only our own un-reaped child: its PID cannot have been reused.
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL (a crash: nothing flushed beyond what ``appendfsync`` already wrote)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean shutdown, AOF flushed), SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the port accepts connections but nothing answers (a hung node)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def restart(self, *, crash: bool = True, timeout: float = 15.0) -> RedisProcess:
        """Stop (SIGKILL if ``crash`` else SIGTERM) and start again on the same port and directory.

        A persistent server comes back with every acknowledged write (AOF, fsync always); a
        disk-less one comes back empty.
        """
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Stop by PID and remove the directory (idempotent)."""
        try:
            self.kill()
        finally:
            self._removed = True
            _LIVE.discard(self)
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class _PortTaken(Exception):
    pass


@atexit.register
def _kill_leftovers() -> None:
    """A test that crashed past its fixtures must not leave redis-servers behind."""
    for process in list(_LIVE):
        with contextlib.suppress(Exception):
            process.cleanup()
