"""Pytest fixtures for fault and topology tests (a plugin: ``pytest_plugins`` in conftest).

Every fixture owns what it starts and removes it on teardown, also when the test failed: processes
are stopped by PID, temporary directories deleted, proxy threads joined. Function scope is the
default so a test may kill, pause or restart anything it got; ``redis_cluster_session`` (and its
per-test view ``shared_redis_cluster``) trades that freedom for speed in tests that only read and
write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.proxy import TcpProxy
from tests.topology import ClusterTopology, RedisProcess, SentinelTopology

__all__ = [
    "ProxiedRedis",
    "aof_redis",
    "proxied_redis",
    "redis_cluster",
    "redis_cluster_session",
    "redis_processes",
    "redis_sentinel",
    "shared_redis_cluster",
    "tcp_proxy",
    "volatile_redis",
]


def pytest_configure(config: pytest.Config) -> None:
    """Register ``slow`` when the ini file does not (so ``-m "not slow"`` works either way)."""
    if not any(line.split(":")[0].strip() == "slow" for line in config.getini("markers")):
        config.addinivalue_line("markers", "slow: seconds-long (real processes, faults)")


# -- proxy ----------------------------------------------------------------------------------------


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[..., TcpProxy]]:
    """``tcp_proxy(upstream_port, **kw)`` starts a :class:`~tests.proxy.TcpProxy`; all are
    stopped (threads joined, sockets closed) at the end of the test."""
    proxies: list[TcpProxy] = []

    def make(upstream_port: int, **kwargs: Any) -> TcpProxy:
        proxy = TcpProxy(upstream_port, **kwargs).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


@dataclass
class ProxiedRedis:
    """A private server and a proxy in front of it: clients go through ``url``/``client()``,
    the test looks behind the fault with ``direct()``."""

    server: RedisProcess
    proxy: TcpProxy

    @property
    def url(self) -> str:
        return self.proxy.url

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        return redis.Redis(host=self.proxy.host, port=self.proxy.port, **kwargs)

    def direct(self, **kwargs: Any) -> redis.Redis:
        return self.server.client(**kwargs)


@pytest.fixture
def proxied_redis() -> Iterator[ProxiedRedis]:
    """A dedicated ``redis-server`` behind a :class:`~tests.proxy.TcpProxy`."""
    server = RedisProcess(name="proxied").start()
    try:
        with TcpProxy(server.port) as proxy:
            yield ProxiedRedis(server, proxy)
    finally:
        server.cleanup()


# -- single servers -------------------------------------------------------------------------------


@pytest.fixture
def redis_processes() -> Iterator[Callable[..., RedisProcess]]:
    """``redis_processes(**RedisProcess kwargs)`` starts a server; all are removed at the end."""
    started: list[RedisProcess] = []

    def make(**kwargs: Any) -> RedisProcess:
        process = RedisProcess(**kwargs)
        started.append(process)
        return process.start()

    yield make
    for process in started:
        with contextlib.suppress(Exception):
            process.cleanup()


@pytest.fixture
def aof_redis(redis_processes: Callable[..., RedisProcess]) -> RedisProcess:
    """A server with AOF (``appendfsync always``): ``restart()`` keeps every acknowledged write."""
    return redis_processes(persistent=True, name="aof")


@pytest.fixture
def volatile_redis(redis_processes: Callable[..., RedisProcess]) -> RedisProcess:
    """A server without persistence: ``restart()`` brings it back empty on the same port."""
    return redis_processes(name="volatile")


# -- cluster --------------------------------------------------------------------------------------


@pytest.fixture
def redis_cluster() -> Iterator[ClusterTopology]:
    """A fresh 3 primaries + 3 replicas cluster the test may kill, pause and migrate at will."""
    with ClusterTopology() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[ClusterTopology]:
    """One 3+3 cluster for the whole session; use it through ``shared_redis_cluster``."""
    with ClusterTopology() as cluster:
        yield cluster


@pytest.fixture
def shared_redis_cluster(redis_cluster_session: ClusterTopology) -> Iterator[ClusterTopology]:
    """The session cluster, healthy and empty, for tests that do not kill or pause nodes.

    Slot migrations are allowed (the cluster stays healthy). A test that leaves the cluster
    unhealthy fails here, naming itself, instead of breaking the next test.
    """
    cluster = redis_cluster_session
    cluster.wait_healthy(10.0)
    cluster.flushall()
    yield cluster
    if not cluster.healthy():
        with contextlib.suppress(Exception):
            cluster.wait_healthy(5.0)
            return
        pytest.fail(
            "this test left the shared cluster unhealthy; use the redis_cluster fixture for "
            "tests that kill, pause or restart nodes"
        )


# -- sentinel -------------------------------------------------------------------------------------


@pytest.fixture
def redis_sentinel() -> Iterator[SentinelTopology]:
    """A primary, a replica and three sentinels (quorum 2) monitoring ``mymaster``."""
    with SentinelTopology() as sentinel:
        yield sentinel
