"""Redis Cluster (3 primaries + 3 replicas, real processes) through ``REDISLOCK["CLIENT"]``."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.management import call_command
from redis.crc import key_slot

from django_redislock import (
    AsyncLock,
    Lock,
    LockBackendError,
    Semaphore,
    force_release,
    list_locks,
    stats,
)
from django_redislock.runtime import keyspace, runtime
from django_redislock.wakeups import ShardedListener
from tests import topology_clients
from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def on_cluster(shared_redis_cluster, settings):
    topology_clients.current = shared_redis_cluster.client()
    settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    yield shared_redis_cluster
    topology_clients.current = None


@pytest.fixture
def on_fresh_cluster(redis_cluster, settings):
    topology_clients.current = redis_cluster.client()
    settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    yield redis_cluster
    topology_clients.current = None


def names_on_every_primary(cluster, count: int = 12) -> list[str]:
    """Lock names whose keys land on each of the primaries (at least one per primary)."""
    found: dict[str, list[str]] = {}
    i = 0
    while len(found) < 3 or min(len(v) for v in found.values()) < count // 3:
        name = f"spread-{i}"
        node = cluster.primary_for(keyspace().lock(name))
        found.setdefault(node.name if hasattr(node, "name") else str(node), []).append(name)
        i += 1
    return [n for names in found.values() for n in names[: count // 3]]


@pytest.mark.parametrize("name", ["plain", "}starts-with-brace", "{tag}", "a{b}c{d}", "%7B"])
def test_every_key_of_a_name_is_in_one_slot(on_cluster, name):
    keys = keyspace()
    slots = {
        key_slot(k.encode())
        for k in (
            keys.lock(name),
            keys.fence(name),
            keys.queue(name),
            keys.semaphore(name),
            keys.semaphore_records(name),
            keys.semaphore_queue(name),
        )
    }
    assert len(slots) == 1
    with Lock(name, timeout=5) as lock:
        assert lock.owned()
        assert [i.name for i in list_locks() if i.name == name] == [name]


def test_locks_on_every_primary_are_listed_and_released(on_cluster):
    names = names_on_every_primary(on_cluster)
    locks = [Lock(n, timeout=10) for n in names]
    for lock in locks:
        assert lock.acquire()
    assert {i.name for i in list_locks(match="spread-*")} == set(names)
    out = io.StringIO()
    call_command("redislock", "list", stdout=out)
    assert all(n in out.getvalue() for n in names)
    assert force_release(names[0]) is True
    for lock in locks[1:]:
        lock.release()
    assert list(list_locks(match="spread-*")) == []


def test_waiters_are_woken_across_nodes(on_cluster):
    holder = Lock("cluster-wake", timeout=30)
    holder.acquire()
    acquired: list[float] = []

    def wait() -> None:
        lock = Lock("cluster-wake", timeout=5)
        assert lock.acquire(blocking_timeout=15)
        acquired.append(time.monotonic())
        lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    client = topology_clients.current
    wait_for(lambda: client.llen(keyspace().queue("cluster-wake")) == 1, what="the waiter")
    released = time.monotonic()
    holder.release()
    thread.join(20)
    assert acquired and acquired[0] - released < 1.0


@contextlib.contextmanager
def held_elsewhere(cluster, *names: str) -> Iterator[Callable[[], float]]:
    """``names`` held by another process (its releases publish; a release in this process
    would wake this process's waiters without a message). Yields ``release()``, which returns
    the wall-clock time the releases began."""
    ports = ",".join(str(port) for _, port in cluster.startup_nodes)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.holder", *names, "--timeout", "30", "--until-input"],
        cwd=ROOT,
        env=subprocess_env(REDISLOCK_TEST_CLUSTER_NODES=ports),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None
    try:
        assert json.loads(stdout.readline())["token"]

        def release() -> float:
            stdin.write("release\n")
            stdin.flush()
            done = json.loads(stdout.readline())
            assert done["released"], done
            return float(done["at"])

        yield release
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        stdin.close()
        stdout.close()


def wait_in_thread(name: str, timeout: float = 5) -> tuple[threading.Thread, list[float]]:
    """A thread of this process blocked in ``Lock(name).acquire()``; the list gets the
    wall-clock time it acquired."""
    acquired: list[float] = []

    def wait() -> None:
        lock = Lock(name, timeout=timeout)
        assert lock.acquire(blocking_timeout=30)
        acquired.append(time.time())
        lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, acquired


def publishes(node) -> tuple[int, int]:
    """``PUBLISH`` and ``SPUBLISH`` calls a node ran since its last ``CONFIG RESETSTAT``."""
    stats = node.info("commandstats")
    return tuple(  # type: ignore[return-value]
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("publish", "spublish")
    )


def bus_publishes(node) -> int:
    """Pub/Sub messages a node received over the cluster bus (broadcast and shard ones)."""
    info = node.cluster_info()
    return sum(
        int(info.get(f"cluster_stats_messages_{kind}_received", 0))
        for kind in ("publish", "publishshard")
    )


def test_a_hand_off_is_published_on_the_shard_of_the_lock_only(on_cluster):
    """The release of another process ``SPUBLISH``es on the lock's shard channel: the waiter
    is woken at once, and no other primary runs or receives a publish (classic ``PUBLISH``
    goes to every node over the cluster bus)."""
    name = "shard-wake"
    primary = on_cluster.primary_for(keyspace().lock(name))
    shard = {primary.node_id, *(r.node_id for r in on_cluster.replicas_of(primary))}
    target = runtime.target()
    channel = target.wake_prefix(name) + runtime.token
    with held_elsewhere(on_cluster, name) as release:
        thread, acquired = wait_in_thread(name)
        client = topology_clients.current
        wait_for(lambda: client.llen(keyspace().queue(name)) == 1, what="the waiter")
        for node in on_cluster.primaries():
            subscribers = node.command("PUBSUB", "SHARDNUMSUB", channel)[1]
            assert subscribers == (1 if node is primary else 0), node
            node.command("CONFIG", "RESETSTAT")
        heard = {node.node_id: bus_publishes(node) for node in on_cluster.nodes}
        released_at = release()
        thread.join(10)
    assert acquired and acquired[0] - released_at < 1.0
    assert publishes(primary) == (0, 1)
    for node in on_cluster.primaries():
        if node is not primary:
            assert publishes(node) == (0, 0), node
    for node in on_cluster.nodes:
        if node.node_id not in shard:
            assert bus_publishes(node) == heard[node.node_id], node


def test_waiters_on_every_primary_are_woken_each_through_its_shard(on_cluster):
    """One subscribed connection per shard, each read by its own thread: waiters on locks of
    all three primaries are woken together when another process releases them."""
    names = names_on_every_primary(on_cluster, count=6)
    with held_elsewhere(on_cluster, *names) as release:
        waiting = [wait_in_thread(name) for name in names]
        client = topology_clients.current
        for name in names:
            wait_for(lambda n=name: client.llen(keyspace().queue(n)) == 1, what="the waiters")
        listener = runtime.target().listener
        assert isinstance(listener, ShardedListener)
        readers = {reader.node.port for reader in listener.readers()}
        assert readers == {node.port for node in on_cluster.primaries()}
        released_at = release()
        for thread, _ in waiting:
            thread.join(10)
    latencies = [acquired[0] - released_at for _, acquired in waiting if acquired]
    assert len(latencies) == len(names)
    assert max(latencies) < 1.0, latencies


def test_a_shard_connection_is_never_evicted(on_cluster):
    """Each shard's subscribed connection asked ``CLIENT NO-EVICT on`` before it subscribed."""
    name = "shard-no-evict"
    primary = on_cluster.primary_for(keyspace().lock(name))
    with held_elsewhere(on_cluster, name) as release:
        thread, _ = wait_in_thread(name)
        client = topology_clients.current
        wait_for(lambda: client.llen(keyspace().queue(name)) == 1, what="the waiter")
        subscribed = [c for c in primary.admin().client_list() if int(c.get("ssub", 0)) > 0]
        release()
        thread.join(10)
    assert subscribed and all("e" in c["flags"] for c in subscribed), subscribed


def test_semaphores_statistics_and_async_on_a_cluster(on_cluster):
    import asyncio

    with Semaphore("cluster-sem", 2, timeout=5) as first:
        second = Semaphore("cluster-sem", 2, timeout=5, owner="other")
        assert second.acquire(blocking=False)
        assert not Semaphore("cluster-sem", 2, owner="third").acquire(blocking=False)
        second.release()
        assert first.owned()
    for _ in range(3):
        with Lock("cluster-stats", timeout=5):
            pass
    stats.flush()
    figures = stats.get_stats("cluster-stats")
    assert figures is not None and figures.acquired == 3

    async def main() -> None:
        async with AsyncLock("cluster-aio", timeout=5) as lock:
            assert await lock.owned()

    asyncio.run(main())


def test_a_killed_primary_fails_over_and_waiters_acquire_or_fail_cleanly(on_fresh_cluster):
    cluster = on_fresh_cluster
    holder = Lock("failover", timeout=4)
    assert holder.acquire()
    result: dict[str, object] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            result["acquired"] = Lock("failover", timeout=5).acquire(blocking_timeout=20)
        except LockBackendError as exc:
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    client = topology_clients.current
    wait_for(lambda: client.llen(keyspace().queue("failover")) == 1, what="the waiter")
    old = cluster.primary_for(keyspace().lock("failover"))
    cluster.kill(old)
    cluster.wait_failover(old)
    # The lock survived (replicated before the kill) or not. Either way: never two holders,
    # the holder knows which, and the waiter gets the lock within its deadline.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not holder.lost and "acquired" not in result:
        if holder.owned():
            assert "acquired" not in result  # the waiter does not hold it meanwhile
            holder.release()
            break
        time.sleep(0.1)
    thread.join(30)
    assert not thread.is_alive()
    assert result.get("acquired") is True, result
    assert result["took"] < 20  # type: ignore[operator]


def test_after_a_failover_a_waiters_shard_subscription_follows_its_slot(on_fresh_cluster):
    """The waiter's shard connection dies with its primary: it is made again on the promoted
    replica, which then carries the hand-off of another process to the waiter at once."""
    cluster = on_fresh_cluster
    name = "failover-shard"
    old = cluster.primary_for(keyspace().lock(name))
    replica = cluster.replicas_of(old)[0]
    channel = runtime.target().wake_prefix(name) + runtime.token
    with held_elsewhere(cluster, name) as release:
        thread, acquired = wait_in_thread(name, timeout=10)
        client = topology_clients.current
        wait_for(lambda: client.llen(keyspace().queue(name)) == 1, what="the waiter")
        written = int(old.info("replication")["master_repl_offset"])
        wait_for(
            lambda: int(replica.info("replication")["slave_repl_offset"]) >= written,
            what="the replica to have the lock and the queue",
        )
        cluster.kill(old)
        new = cluster.wait_failover(old)
        wait_for(
            lambda: new.command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1,
            15,
            what="the waiter's shard subscription on the promoted replica",
        )
        assert not acquired  # still held by the other process
        released_at = release()
        thread.join(15)
    assert acquired and acquired[0] - released_at < 1.0


def test_moved_and_ask_during_a_reshard_leak_no_error_and_duplicate_no_lock(on_fresh_cluster):
    """A real slot migration (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) runs while the lock
    is held, renewed and contended: nobody sees an error, nobody else gets the lock."""
    cluster = on_fresh_cluster
    name = "resharded"
    slot = key_slot(keyspace().lock(name).encode())
    holder = Lock(name, timeout=10)
    holder.acquire()
    source = cluster.owner_of_slot(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    migration = cluster.slot_migration(slot, target)
    errors: list[BaseException] = []

    def reshard() -> None:
        try:
            migration.begin()
            time.sleep(0.3)  # ASK territory: keys split between the nodes
            migration.move_keys()
            time.sleep(0.3)
            migration.finish()  # MOVED from now on
        except BaseException as exc:
            errors.append(exc)

    resharding = threading.Thread(target=reshard)
    resharding.start()
    intruder = Lock(name, timeout=5, owner="intruder")  # another owner than the holder
    while resharding.is_alive():
        assert intruder.acquire(blocking=False) is False
        holder.renew()
        time.sleep(0.02)
    resharding.join()
    assert errors == []
    assert cluster.owner_of_slot(slot) is target
    assert intruder.acquire(blocking=False) is False
    assert holder.owned()
    holder.release()
    assert intruder.acquire(blocking=False)
    intruder.release()


def test_single_flight_task_with_the_lock_on_the_cluster_and_the_broker_elsewhere(
    shared_redis_cluster, settings, monkeypatch, tmp_path
):
    """A real prefork worker whose locks live on the cluster; its broker is the suite's Redis."""
    from celery import uuid as celery_uuid

    from django_redislock import get_lock_info
    from tests.celery_workers import WorkerProcess
    from tests.testapp import tasks
    from tests.testapp.celery_app import app

    ports = ",".join(str(port) for _, port in shared_redis_cluster.startup_nodes)
    monkeypatch.setenv("REDISLOCK_TEST_CLUSTER_NODES", ports)
    topology_clients.current = shared_redis_cluster.client()
    settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    app.finalize()
    WorkerProcess.log_dir = tmp_path
    worker = WorkerProcess("cluster", pool="prefork", concurrency=2).start()
    try:
        name = f"on-cluster-{celery_uuid()[:8]}"
        first = tasks.work.apply_async((name, 1.5), queue="cluster")
        second = tasks.work.apply_async((name, 1.5), queue="cluster")
        assert second.id == first.id  # deduplicated at publish, by the lock on the cluster
        info = wait_for(
            lambda: (i := get_lock_info(f"work:{name}")) is not None and not i.queued and i,
            20,
            what="the worker to run the task",
        )
        assert info.task_id == first.id and info.pid != __import__("os").getpid()
        assert first.get(timeout=20) == f"done {name}"
        wait_for(lambda: get_lock_info(f"work:{name}") is None, 10, what="the release")
        assert [e["key"] for e in tasks.events("start") if e["key"] == f"work:{name}"] == [
            f"work:{name}"
        ]
    finally:
        worker.stop()
        topology_clients.current = None


def test_a_plain_client_pointed_at_a_cluster_node_is_named_by_check_and_first_use(
    shared_redis_cluster, settings
):
    """A CACHES entry whose LOCATION is one cluster node: ``manage.py check --deploy`` says
    so (E014), and a lock call fails with the same advice instead of Redis's "Keys in request
    don't hash to the same slot" (issue 27, D19)."""
    from django_redislock import LockBackendError
    from django_redislock.checks import check_cluster_client

    node = shared_redis_cluster.nodes[0]
    settings.CACHES = {
        **settings.CACHES,
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{node.port}/0",
        },
    }
    settings.REDISLOCK = {}
    assert [m.id for m in check_cluster_client()] == ["django_redislock.E014"]
    with pytest.raises(LockBackendError, match=r"REDISLOCK\['CLIENT'\]"):
        Lock("plain-on-cluster").acquire(blocking=False)


def test_functions_are_loaded_on_every_primary_and_called_without_a_key_lookup(on_cluster):
    """``FUNCTION LOAD`` goes to every primary; each ``FCALL`` names its node outright, so
    redis-py does not ask a node for FCALL's keys (``COMMAND GETKEYS``) before each call."""
    from django_redislock import scripts

    for node in on_cluster.primaries():
        node.command("CONFIG", "RESETSTAT")
    names = names_on_every_primary(on_cluster, count=6)
    for name in names:
        with Lock(name, timeout=5):
            pass
    fcalls = 0
    for node in on_cluster.primaries():
        assert node.admin().function_list(library=scripts.LIBRARY.name), node
        stats = node.info("commandstats")
        assert "cmdstat_command|getkeys" not in stats, (node, sorted(stats))
        assert "cmdstat_evalsha" not in stats, node
        fcalls += stats.get("cmdstat_fcall", {}).get("calls", 0)
    assert fcalls >= 2 * len(names)
