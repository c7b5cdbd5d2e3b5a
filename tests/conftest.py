"""Shared fixtures: every test talks to a real ``redis-server`` (see ``tests/redis_server.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.topology_fixtures"]

# A test that uses one of these fixtures starts processes (lock holders, Celery workers, extra
# redis-servers, a live server for the browser) and takes seconds: it is marked `slow` wherever
# it lives, as is everything under tests/faults/. `make test-fast` runs `-m "not slow"`; files
# may also mark tests themselves (`pytestmark = pytest.mark.slow`).
SLOW_FIXTURES = frozenset(
    {
        "holders",
        "redis_factory",
        "demo_factory",
        "worker",
        "live_server",
        "browser_page",
        "running_guarded",
        "proxied_redis",
        "redis_processes",
        "redis_cluster",
        "shared_redis_cluster",
        "redis_sentinel",
        "processes",
    }
)


#: Tests that build multi-process topologies (Redis Cluster, Sentinel, independent masters): CI
#: runs them as a step of their own (`make test-topology`), so `make test` stays under 10 minutes.
TOPOLOGY_FILES = frozenset(
    {
        "test_cluster.py",
        "test_cluster_flow.py",
        "test_cluster_coordination.py",
        "test_sentinel.py",
        "test_redlock.py",
        "test_harness.py",
        "test_chaos_topology.py",
    }
)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Write the run's lock statistics while the suite's Redis still runs.

    Otherwise the package's own exit flush runs after pytest closed its output streams (and,
    for statistics of a server a test already stopped, logs to a closed stream).
    """
    from django_redislock import stats

    stats.flush()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    faults = ROOT / "tests" / "faults"
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SLOW_FIXTURES or faults in item.path.parents:
            item.add_marker(pytest.mark.slow)
        if item.path.name in TOPOLOGY_FILES:
            item.add_marker(pytest.mark.topology)
        elif faults in item.path.parents:
            item.add_marker(pytest.mark.faults)  # `make test-faults`, a CI step of its own


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """A raw client on the locks' database, for looking behind the package's back."""
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _flush_lock_db() -> Iterator[None]:
    """Every test starts with an empty lock database (broker/result DBs are left alone)."""
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    client.flushdb()
    yield
    client.close()


@pytest.fixture(autouse=True)
def _forget_holds() -> Iterator[None]:
    """Locks a test leaves held are forgotten by this process afterwards.

    Their keys are flushed before the next test, so the watchdog would otherwise report them
    lost (and send ``lock_lost``) in the middle of an unrelated test.
    """
    yield
    from django_redislock.runtime import runtime

    runtime.holds.forget_all()
    runtime.watchdog.forget_pending()


@pytest.fixture(scope="session", autouse=True)
def _stop_async_faces() -> Iterator[None]:
    """Event loops that ran ``AsyncLock`` for the face-parametrised tests end with the session."""
    yield
    from tests.faces import stop_runners

    stop_runners()


@pytest.fixture
def redis_factory() -> Iterator[type[RedisServer]]:
    """Start dedicated servers that a fault test may kill, pause or restart.

    Every server started through the fixture is stopped by PID at the end of the test.
    """
    started: list[RedisServer] = []

    class _Tracked(RedisServer):
        def start(self, timeout: float = 10.0) -> RedisServer:
            if self not in started:
                started.append(self)
            return super().start(timeout)

    yield _Tracked
    for server in started:
        server.__exit__()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child Python processes: same Redis, same settings, repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    env["REDISLOCK_TEST_REDIS_URL"] = os.environ["REDISLOCK_TEST_REDIS_URL"]
    env.update(extra)
    return env


def start_holder(
    name: str, *args: str, **env: str
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """Run ``tests/holder.py`` in a child process and wait until it holds ``name``.

    Returns the process and the JSON line it printed once the lock was acquired.
    """
    import json

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.holder", name, *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"holder for {name!r} exited with {proc.returncode} before acquiring")
    return proc, json.loads(line)


def wait_for(
    # `...`, not `[]`: loops bind their variable as a lambda default (`lambda i=i: ...`), which
    # mypy cannot match against a callable of no arguments ("Cannot infer type of lambda").
    predicate: Callable[..., Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    *,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes holding locks (see :func:`hold`); killed by PID at the end of the test."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def hold(holders: list[subprocess.Popen[str]], name: str, *args: str) -> dict[str, object]:
    """Hold ``name`` in another process (renewed by its watchdog) until the test ends."""
    proc, info = start_holder(name, "--timeout", "10", *args)
    holders.append(proc)
    return info


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and wheel of this checkout (``python -m build``), built once per session."""
    from tests.venvs import build_dists

    return build_dists(tmp_path_factory.mktemp("dist"))


def hand_off_messages(spy: Any) -> list[str]:
    """The hand-off messages (``h <waiter> ...``) a ``PSUBSCRIBE``d spy saw; closes it."""
    seen = []
    while (message := spy.get_message(timeout=0.2)) is not None:
        if message["type"] == "pmessage":
            seen.append(message["data"].decode())
    spy.close()
    return [m for m in seen if m.startswith("h ")]


async def async_client_of(alias: str | None) -> Any:
    """The ``redis.asyncio`` client the default transport keeps for ``alias`` and this loop."""
    from django_redislock.runtime import runtime
    from django_redislock.transport import RedisPyTransport

    transport = runtime.transport(alias)
    assert isinstance(transport, RedisPyTransport)
    return await transport.async_client()
