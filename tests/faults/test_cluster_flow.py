"""Flow control and debounce with the locks on a Redis Cluster (issue 30: "each point works on a
single Redis and on the Cluster"): real prefork workers whose locks, limiters, permits and
debounce records live on a 3 + 3 cluster, their broker being the suite's Redis.

The same tasks as ``tests/test_celery_flow.py``; here the point is that every script touches one
slot and every key lands where its script runs, so the checks are the essentials of each option.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from django_redislock import RateLimiter, list_locks
from django_redislock.singleflight import permit_name
from tests import topology_clients
from tests.celery_workers import WorkerProcess
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

pytestmark = pytest.mark.slow

QUEUE = "cluster-flow"
TOLERANCE = 0.08


@pytest.fixture(scope="module")
def cluster_worker(
    redis_cluster_session, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    ports = ",".join(str(port) for _, port in redis_cluster_session.startup_nodes)
    mp = pytest.MonkeyPatch()
    mp.setenv("REDISLOCK_TEST_CLUSTER_NODES", ports)
    app.finalize()
    WorkerProcess.log_dir = tmp_path_factory.mktemp("cluster-flow")
    worker = WorkerProcess(QUEUE, pool="prefork", concurrency=4).start()
    try:
        yield worker
    finally:
        worker.stop()
        mp.undo()


@pytest.fixture
def on_cluster(shared_redis_cluster, settings, cluster_worker):
    topology_clients.current = shared_redis_cluster.client()
    settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    yield shared_redis_cluster
    topology_clients.current = None


def starts(key: str) -> list[float]:
    return sorted(e["at"] for e in tasks.events("start") if e["key"] == key)


def test_lock_rate_and_task_permits_hold_with_the_limits_on_the_cluster(on_cluster):
    count, seconds = tasks.FLOW_LOCK_RATE
    results = [tasks.per_key_rated.apply_async(("cl", i), queue=QUEUE) for i in range(6)]
    capped = [tasks.capped.apply_async((t, 0.4), queue=QUEUE) for t in "ABAB"]
    # The per-key limiter lives on the cluster, listed like any rate limiter there while in use
    # (its key expires once it has rested: 0.2 s after the last run at this rate).
    wait_for(
        lambda: "rated:cl" in {i.name for i in list_locks() if i.kind == "rate"},
        10,
        what="the per-key rate limiter listed",
    )
    assert sorted(r.get(timeout=30) for r in results) == list(range(6))
    assert sorted(r.get(timeout=30) for r in capped) == sorted("ABAB")
    at = starts("rated:cl")
    assert len(at) == 6
    assert min(b - a for a, b in itertools.pairwise(at)) >= seconds / count - TOLERANCE
    peaks = [int(n) for n in tasks.observer().lrange("peaks:capped", 0, -1)]
    assert max(peaks) <= 3
    wait_for(
        lambda: not [i for i in list_locks() if i.name == permit_name(tasks.capped.flight_rules)],
        10,
    )


def test_a_debounced_burst_runs_once_with_the_last_arguments_on_the_cluster(on_cluster):
    ids = set()
    last = 0.0
    for value in range(1, 4):
        ids.add(tasks.debounced.apply_async(("cl-burst", value), queue=QUEUE).id)
        last = time.time()
        time.sleep(0.1)
    assert len(ids) == 1
    [flight_id] = ids
    assert app.AsyncResult(flight_id).get(timeout=20) == 3
    runs = [e for e in tasks.events("debounced") if e["key"] == "debounce:cl-burst"]
    assert [(r["task_id"], r["value"]) for r in runs] == [(flight_id, 3)]
    assert runs[0]["at"] >= last + tasks.DEBOUNCE_QUIET - TOLERANCE


def test_rate_limiter_keys_of_one_name_share_a_slot(on_cluster):
    from redis.crc import key_slot

    from django_redislock.runtime import keyspace

    limiter = RateLimiter("a{b}c", "10/s")
    assert limiter.try_acquire()
    assert limiter.schedule(after=0.1, max_wait=5) >= 0.1
    keys = keyspace()
    assert key_slot(keys.rate("a{b}c").encode()) == key_slot(keys.rate_schedule("a{b}c").encode())


def test_rate_limiters_on_every_primary_are_listed_reset_and_shared_with_asyncio(on_cluster):
    import asyncio

    from django_redislock import AsyncRateLimiter
    from django_redislock.operations import reset_rate_limit
    from django_redislock.runtime import keyspace

    names = [f"spread-rate-{i}" for i in range(12)]
    primaries = {on_cluster.primary_for(keyspace().rate(n)) for n in names}
    assert len(primaries) > 1  # the names are spread over the cluster
    for name in names:
        assert RateLimiter(name, "1/m").try_acquire()
    assert {i.name for i in list_locks() if i.kind == "rate"} == set(names)

    async def from_asyncio() -> tuple[bool, bool]:
        limiter = AsyncRateLimiter(names[0], "1/m")
        refused = await limiter.try_acquire()
        await limiter.reset()
        return bool(refused), bool(await limiter.try_acquire())

    assert asyncio.run(from_asyncio()) == (False, True)
    assert all(reset_rate_limit(n) for n in names)
    assert not [i for i in list_locks() if i.kind == "rate"]
