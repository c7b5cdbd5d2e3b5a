"""Zero-argument client factories for ``REDISLOCK["CLIENT"]`` in topology tests.

A test stores the client it wants in :data:`current` (or sets REDISLOCK_TEST_CLUSTER_NODES for a
child process) and points ``REDISLOCK["CLIENT"]`` at :func:`client`.
"""

from __future__ import annotations

import os
from typing import Any

import redis.cluster

current: Any = None


def client() -> Any:
    """The client a test set up; in a child process, a ``RedisCluster`` from the environment."""
    if current is not None:
        return current
    nodes = os.environ.get("REDISLOCK_TEST_CLUSTER_NODES", "")
    startup = [
        redis.cluster.ClusterNode("127.0.0.1", int(port)) for port in nodes.split(",") if port
    ]
    return redis.cluster.RedisCluster(
        startup_nodes=startup, socket_timeout=5.0, socket_connect_timeout=2.0
    )
