"""Redis Cluster (3 primaries + 3 replicas, real processes) through ``REDISLOCK["CLIENT"]``."""

from __future__ import annotations

import io
import threading
import time

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
from django_redislock.runtime import keyspace
from tests import topology_clients
from tests.conftest import wait_for

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
