"""The coordination kinds on a Redis Cluster (3 primaries + 3 replicas, real processes): every
key of a read-write lock is in its name's slot, a ``MultiLock`` spans names on every primary
(each lock is one script on its own node), and a ``LeaderElection`` leads from any slot."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from redis.crc import key_slot

from django_redislock import (
    AsyncReadWriteLock,
    LeaderElection,
    Lock,
    LockNotAcquiredError,
    MultiLock,
    ReadWriteLock,
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


def names_on_every_primary(cluster, per_primary: int = 2) -> list[str]:
    found: dict[str, list[str]] = {}
    i = 0
    while len(found) < 3 or min(len(v) for v in found.values()) < per_primary:
        name = f"multi-{i}"
        found.setdefault(str(cluster.primary_for(keyspace().lock(name))), []).append(name)
        i += 1
    return [n for names in found.values() for n in names[:per_primary]]


@pytest.mark.parametrize("name", ["plain", "{tag}", "a{b}c", "%7B"])
def test_every_key_of_a_read_write_lock_is_in_one_slot(on_cluster, name):
    keys = keyspace()
    names = (
        keys.rw_write(name),
        keys.rw_readers(name),
        keys.rw_records(name),
        keys.rw_queue(name),
        keys.rw_waiters(name),
        keys.fence(name),
        keys.void(name, "x.1"),
    )
    assert len({key_slot(k.encode()) for k in names}) == 1
    rw = ReadWriteLock(name, timeout=5)
    with rw.write_lock() as write:
        assert write.owned()
        with rw.read_lock() as read:  # downgrade
            assert read.owned()


def test_a_writer_on_the_cluster_is_woken_by_the_last_reader(on_cluster):
    readers = [ReadWriteLock("cl-rw", timeout=30).read_lock() for _ in range(1)]
    assert readers[0].acquire()
    got: list[float] = []

    def write() -> None:
        lock = ReadWriteLock("cl-rw").write_lock()
        assert lock.acquire(blocking_timeout=15)
        got.append(time.monotonic())
        lock.release()

    thread = threading.Thread(target=write)
    thread.start()
    client = topology_clients.current
    wait_for(lambda: client.llen(keyspace().rw_queue("cl-rw")) == 1, what="the writer to queue")
    released = time.monotonic()
    readers[0].release()
    thread.join(20)
    assert got and got[0] - released < 1.0


def test_async_readers_share_and_exclude_a_writer_on_the_cluster(on_cluster):
    async def main() -> tuple[bool, bool]:
        rw = AsyncReadWriteLock("cl-async", timeout=10)
        async with rw.read_lock():
            other = await asyncio.create_task(_try(rw.read_lock(blocking=False)))
            writer = await asyncio.create_task(_try(rw.write_lock(blocking=False)))
        return other, writer

    async def _try(side) -> bool:
        ok = await side.acquire()
        if ok:
            await side.release()
        return ok

    assert asyncio.run(main()) == (True, False)


def test_a_multilock_spans_every_primary_all_or_none(on_cluster):
    names = names_on_every_primary(on_cluster)
    blocker = threading.Event()
    held = threading.Event()

    def hold_last() -> None:
        lock = Lock(names[-1], timeout=30)
        lock.acquire()
        held.set()
        blocker.wait(30)
        lock.release()

    thread = threading.Thread(target=hold_last)
    thread.start()
    assert held.wait(10)
    multi = MultiLock(*names, timeout=10)
    assert multi.acquire(blocking=False) is False
    assert not any(Lock(n).locked() for n in names[:-1])  # given back on every node
    blocker.set()
    thread.join(10)
    assert multi.acquire(blocking_timeout=5)
    assert set(multi.fencing_tokens) == set(names)
    multi.release()
    assert not multi.locked()


def test_overlapping_multilocks_on_the_cluster_never_deadlock(on_cluster):
    names = names_on_every_primary(on_cluster, per_primary=1)
    errors: list[str] = []
    inside = dict.fromkeys(names, 0)
    mutex = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(10):
            chosen = rng.sample(names, len(names))  # every order
            with MultiLock(*chosen, timeout=10, blocking_timeout=20):
                with mutex:
                    for n in names:
                        inside[n] += 1
                        if inside[n] != 1:
                            errors.append(n)
                with mutex:
                    for n in names:
                        inside[n] -= 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_leader_election_on_the_cluster(on_cluster):
    first, second = LeaderElection("cl-leader", timeout=3), LeaderElection("cl-leader", timeout=3)
    with first.lead() as term:
        assert first.is_leader() and not term.lost.is_set()
        with pytest.raises(LockNotAcquiredError, match="leads"), second.lead(blocking=False):
            pass
    with second.lead(blocking_timeout=5) as later:
        assert later.token > term.token
