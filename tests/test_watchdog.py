"""The renewal thread: one per process, batched, fork-safe."""

from __future__ import annotations

import os
import threading
import time

from django_redislock import Lock
from django_redislock.holds import Hold
from django_redislock.runtime import keyspace, runtime
from django_redislock.watchdog import RENEW_BATCH

watchdog = runtime.watchdog


def held(locks: list[Lock]) -> list[Hold]:
    """The holds of ``locks`` as the watchdog sees them."""
    names = {lock.name for lock in locks}
    return [hold for hold in runtime.holds.all() if hold.name in names]


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "django-redislock-watchdog"]


def test_many_locks_share_one_thread_and_batch_their_renewals(redis_client, monkeypatch):
    from django_redislock.transport import RedisPyTransport

    pipelines = []
    real_run_many = RedisPyTransport.run_many

    def counting_run_many(self, script, calls):  # a spy: Redis does the work
        pipelines.append(sum(len(keys) for keys, _ in calls))  # locks renewed by this round trip
        return real_run_many(self, script, calls)

    monkeypatch.setattr(RedisPyTransport, "run_many", counting_run_many)
    locks = [Lock(f"many:{i}", timeout=0.9) for i in range(300)]
    for lock in locks:
        lock.acquire()
    redis_client.config_resetstat()
    del pipelines[:]
    time.sleep(1.2)  # about four renewal intervals
    # Renewals as Redis ran them: a PEXPIRE per lock, inside RENEW_MANY (a script per batch).
    renewals = redis_client.info("commandstats")["cmdstat_pexpire"]["calls"]
    assert len(watchdog_threads()) == 1
    assert renewals >= 300  # every lock was renewed at least once
    # What the spy saw is what Redis ran, give or take the pipeline in flight at either edge.
    assert abs(sum(pipelines) - renewals) <= 300
    # One round trip (pipeline) per renewal interval per 100 locks at most.
    assert len(pipelines) <= renewals / 100
    assert all(lock.owned() and not lock.lost for lock in locks)
    for lock in locks:
        lock.release()
    assert len(watchdog) == 0


def test_a_batch_larger_than_one_script_call_renews_each_lock_and_reports_each_loss(redis_client):
    """RENEW_MANY runs RENEW_BATCH locks per script: every lock of a bigger batch is renewed,
    and a lock deleted behind its holder's back is reported lost — that one only."""
    count = RENEW_BATCH + 50
    locks = [Lock(f"batch:{i}", timeout=30) for i in range(count)]
    for lock in locks:
        lock.acquire()
    try:
        gone = locks[RENEW_BATCH + 7]  # in the second script call
        redis_client.delete(keyspace().lock(gone.name))
        for lock in locks:
            redis_client.pexpire(keyspace().lock(lock.name), 5000)
        watchdog.renew_now(held(locks))
        assert gone.lost
        assert [lock for lock in locks if lock.lost] == [gone]
        ttls = [redis_client.pttl(keyspace().lock(lock.name)) for lock in locks if lock is not gone]
        assert min(ttls) > 20_000  # renewed to the 30 s lease, not left at 5 s
    finally:
        for lock in locks:
            if not lock.lost:
                lock.release()


def test_locks_of_different_leases_renewed_together_each_get_their_own(redis_client):
    """RENEW_MANY sends one lease per script call, so one round renews per lease: interleaved
    leases each come back to their own, and a loss is reported at its own lock."""
    locks = [Lock(f"leases:{i}", timeout=(30, 60, 90)[i % 3]) for i in range(30)]
    for lock in locks:
        lock.acquire()
    try:
        gone = locks[16]  # a 60 s lock, between others
        redis_client.delete(keyspace().lock(gone.name))
        for lock in locks:
            redis_client.pexpire(keyspace().lock(lock.name), 5000)
        watchdog.renew_now(held(locks))
        assert [lock for lock in locks if lock.lost] == [gone]
        for lock in locks:
            if lock is not gone:
                left = redis_client.pttl(keyspace().lock(lock.name))
                assert lock.timeout * 1000 - 5000 < left <= lock.timeout * 1000
    finally:
        for lock in locks:
            if not lock.lost:
                lock.release()


def test_released_lock_is_no_longer_renewed():
    lock = Lock("released", timeout=0.3)
    lock.acquire()
    lock.release()
    assert len(watchdog) == 0
    assert not lock.locked()


def test_watchdog_runs_in_a_forked_child():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: hold a lock for three leases, report whether it survived
        try:
            lock = Lock("forked", timeout=0.3)
            lock.acquire()
            time.sleep(1.0)
            ok = lock.owned() and not lock.lost and len(watchdog_threads()) == 1
            lock.release()
            os.write(write, b"1" if ok else b"0")
        except BaseException as exc:
            os.write(write, f"error {exc!r}".encode()[:500])
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 500) == b"1"
    os.close(read)


def test_parent_holds_are_not_renewed_by_the_child():
    lock = Lock("parent-only", timeout=5)
    lock.acquire()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if len(watchdog) == 0 and Lock("parent-only").hold_count == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    lock.release()
