"""Self-tests of the fault harness: the TCP proxy, Redis Cluster, Sentinel and persistence.

The lock engine's fault tests trust these tools to do what they claim; each test here checks one
claim against real ``redis-server`` processes and prints how long the topology took (run with
``-s`` to see the numbers).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.topology import (
    HASH_SLOTS,
    ClusterTopology,
    Redirect,
    RedisProcess,
    SentinelTopology,
    key_slot,
    parse_redirect,
    redis_version,
    wait_until,
)

if TYPE_CHECKING:  # imported by pytest as a plugin; importing it here would defeat rewriting
    from tests.topology_fixtures import ProxiedRedis

# Redundant once tests/conftest.py registers the plugin; harmless then (registered once).

pytestmark = pytest.mark.slow


def no_retry(**kwargs: Any) -> dict[str, Any]:
    """Client options that surface every timeout and disconnect (redis-py >= 6 retries 3x)."""
    return {"retry": Retry(NoBackoff(), 0), **kwargs}


def report(what: str, seconds: float) -> None:
    version = ".".join(map(str, redis_version()))
    print(f"\n[harness timing] {what}: {seconds:.2f} s (redis {version})")


# -- proxy ---------------------------------------------------------------------------------------


def test_proxy_forwards_traffic_and_counts_it(proxied_redis: ProxiedRedis) -> None:
    client = proxied_redis.client()
    assert client.set("k", "v" * 100_000)
    assert client.get("k") == b"v" * 100_000
    stats = proxied_redis.proxy.stats  # a snapshot between loop steps: what was delivered
    assert stats.accepted >= 1
    assert stats.open >= 1
    assert stats.bytes_up > 100_000
    assert stats.bytes_down > 100_000
    client.close()


def test_proxy_blackhole_times_out_then_delivers_held_commands(
    proxied_redis: ProxiedRedis,
) -> None:
    client = proxied_redis.client(**no_retry(socket_timeout=0.5))
    assert client.ping()
    with proxied_redis.proxy.blackholed():
        began = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.incr("held")
        assert time.monotonic() - began < 2.0
        # Nothing reached the server while the path was held.
        assert proxied_redis.direct().get("held") is None
    # Healing delivers what was held, like TCP retransmissions: the INCR the client gave up on
    # runs now.
    wait_until(lambda: proxied_redis.direct().get("held") == b"1", 5.0, what="held INCR")
    assert client.ping()  # and the client reconnects through the healed path
    client.close()


def test_proxy_timed_blackhole_resumes_by_itself(proxied_redis: ProxiedRedis) -> None:
    client = proxied_redis.client(**no_retry(socket_timeout=5.0))
    assert client.ping()
    proxied_redis.proxy.blackhole(for_=0.5)
    began = time.monotonic()
    assert client.ping()
    assert 0.4 <= time.monotonic() - began < 3.0
    assert proxied_redis.proxy.mode == "pass"
    client.close()


def test_proxy_reply_blackhole_applies_the_command_but_loses_the_reply(
    proxied_redis: ProxiedRedis,
) -> None:
    client = proxied_redis.client(**no_retry(socket_timeout=0.5))
    assert client.ping()
    with proxied_redis.proxy.blackholed(direction="down"), pytest.raises(redis.TimeoutError):
        client.set("applied", "yes")
    assert proxied_redis.direct().get("applied") == b"yes"
    client.close()


def test_proxy_drop_closes_connections_until_forwarding_again(
    proxied_redis: ProxiedRedis,
) -> None:
    client = proxied_redis.client(**no_retry(socket_timeout=2.0))
    assert client.ping()
    proxied_redis.proxy.drop()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(redis.ConnectionError):  # new connections are closed too
        client.ping()
    assert proxied_redis.proxy.stats.closed_by_proxy >= 2
    proxied_redis.proxy.forward()
    assert client.ping()  # redis-py reconnects
    client.close()


def test_proxy_delay_adds_latency_each_way(proxied_redis: ProxiedRedis) -> None:
    client = proxied_redis.client()
    assert client.ping()
    proxied_redis.proxy.delay(0.2)
    began = time.monotonic()
    assert client.ping()
    assert time.monotonic() - began >= 0.4  # 0.2 s there, 0.2 s back
    proxied_redis.proxy.forward()
    began = time.monotonic()
    assert client.ping()
    assert time.monotonic() - began < 0.2
    client.close()


def test_proxy_stop_joins_its_thread_and_frees_the_port(volatile_redis: RedisProcess) -> None:
    from tests.proxy import TcpProxy

    proxy = TcpProxy(volatile_redis.port).start()
    client = redis.Redis(host=proxy.host, port=proxy.port, **no_retry(socket_timeout=1.0))
    assert client.ping()
    with proxy.blackholed():
        port = proxy.port
        proxy.stop()  # also while a connection is held
    assert not [t for t in threading.enumerate() if t.name.startswith(f"proxy:{port}-")]
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, **no_retry(socket_connect_timeout=1.0)).ping()
    client.close()


# -- cluster -------------------------------------------------------------------------------------


def _key_per_slot() -> dict[int, str]:
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < HASH_SLOTS:
        key = f"k{i}"
        keys.setdefault(key_slot(key), key)
        i += 1
    return keys


def test_cluster_serves_every_slot(shared_redis_cluster: ClusterTopology) -> None:
    cluster = shared_redis_cluster
    report("cluster 3+3 start (session)", cluster.timings["start"])
    assert len(cluster.primaries()) == 3
    assert all(len(cluster.replicas_of(p)) == 1 for p in cluster.primaries())
    client = cluster.client()
    keys = _key_per_slot()
    pipe = client.pipeline()
    for slot, key in keys.items():
        pipe.set(key, slot)
    assert all(pipe.execute())
    pipe = client.pipeline()
    for key in keys.values():
        pipe.get(key)
    assert pipe.execute() == [str(slot).encode() for slot in keys]


def test_cluster_fails_over_a_killed_primary(redis_cluster: ClusterTopology) -> None:
    cluster = redis_cluster
    report("cluster 3+3 start", cluster.timings["start"])
    client = cluster.client()
    client.set("{lock}:a", "before")
    old = cluster.primary_for("{lock}:a")
    (replica,) = cluster.replicas_of(old)
    cluster.kill(old)
    new = cluster.wait_failover(old)
    report("cluster failover (SIGKILL -> replica serves, cluster ok)", cluster.timings["failover"])
    assert new is replica
    assert cluster.primary_for("{lock}:a") is new
    # The replica had the key; the client finds the new primary (after at most a few errors).
    assert wait_until(lambda: client.get("{lock}:a"), 10.0, what="read after failover") == (
        b"before"
    )
    assert client.set("{lock}:a", "after")
    cluster.restart(old)
    report("cluster restart of the old primary (rejoins as replica)", cluster.timings["restart"])
    assert old.command("ROLE")[0] == "slave"
    assert old.primary_id == new.node_id


def test_cluster_slot_migration_shows_ask_then_moved(
    shared_redis_cluster: ClusterTopology,
) -> None:
    cluster = shared_redis_cluster
    client = cluster.client()
    key, other = "{mig}:token", "{mig}:other"
    client.set(key, "1")
    client.set(other, "2")
    slot = key_slot(key)
    source = cluster.owner_of_slot(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    raw = source.client()

    migration = cluster.slot_migration(slot, target).begin()
    assert raw.get(key) == b"1"  # still on the source: served there
    migration.move_keys([key])
    with pytest.raises(redis.ResponseError) as ask:  # AskError on redis-py >= 5.1
        raw.get(key)
    assert parse_redirect(ask.value) == Redirect("ASK", slot, "127.0.0.1", target.port)
    assert client.get(key) == b"1"  # redis-py follows ASK
    assert cluster.locate(key)[0] is target

    migration.finish()
    with pytest.raises(redis.ResponseError) as moved:  # MovedError on redis-py >= 5.1
        raw.get(other)
    assert parse_redirect(moved.value) == Redirect("MOVED", slot, "127.0.0.1", target.port)
    assert cluster.primary_for(key) is target
    assert client.get(other) == b"2"  # redis-py follows MOVED
    raw.close()


def test_cluster_stop_kills_every_node_and_removes_its_directory() -> None:
    cluster = ClusterTopology(primaries=1, replicas=0).start()
    node = cluster.nodes[0]
    pid = node.pid
    assert pid is not None and node.dir.exists()
    cluster.stop()
    assert node.proc is None
    assert not node.dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# -- sentinel ------------------------------------------------------------------------------------


def test_sentinel_failover_promotes_the_replica_and_clients_follow(
    redis_sentinel: SentinelTopology,
) -> None:
    from django_redis.cache import RedisCache

    topo = redis_sentinel
    report("sentinel 1+1+3 start", topo.timings["start"])
    master = topo.master_client()
    entry = topo.caches_entry()
    cache = RedisCache(entry["LOCATION"], entry)
    master.set("k", "before")
    cache.set("c", "cached")
    old, replica = topo.primary, topo.replica

    topo.kill_primary()
    new = topo.wait_failover()
    report("sentinel failover (SIGKILL -> sentinels agree, new master)", topo.timings["failover"])
    assert new is replica
    assert topo.primary is new
    assert topo.master_addresses() == [("127.0.0.1", new.port)] * 3
    assert wait_until(lambda: master.set("k2", "after"), 10.0, what="write after failover")
    assert master.get("k") == b"before"
    assert new.client().get("k2") == b"after"
    assert wait_until(lambda: cache.set("c2", 1) or True, 10.0, what="django-redis write")
    assert cache.client.get_client(write=True).get(cache.make_key("c")) is not None

    topo.restart(old)
    report("sentinel restart of the old primary as replica", topo.timings["restart"])
    if topo.unexpected_failovers:  # the sentinels' own call on a starved machine: reported
        print(f"\n[harness] unexpected sentinel failovers: {topo.unexpected_failovers}")
    else:
        assert topo.replica is old
    assert topo.replica.client().execute_command("ROLE")[0] == b"slave"


# -- persistence ---------------------------------------------------------------------------------


def test_aof_server_restart_keeps_acknowledged_writes(aof_redis: RedisProcess) -> None:
    port = aof_redis.port
    aof_redis.client().set("k", "v")
    began = time.monotonic()
    aof_redis.restart(crash=True)  # SIGKILL: only what appendfsync wrote survives
    report("AOF server crash restart", time.monotonic() - began)
    assert aof_redis.port == port
    assert aof_redis.client().get("k") == b"v"


def test_volatile_server_restart_comes_back_empty(volatile_redis: RedisProcess) -> None:
    port = volatile_redis.port
    volatile_redis.client().set("k", "v")
    volatile_redis.restart(crash=True)
    assert volatile_redis.port == port
    assert volatile_redis.client().get("k") is None
