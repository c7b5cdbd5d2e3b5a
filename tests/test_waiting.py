"""Waiting for a busy lock: woken by the release through one subscription per process.

Regression tests for waits that used to fail outside our favourite configuration: waits longer
than redis-py 8's default 5 s socket timeout with a bare ``CACHES`` entry, a connection killed
while a waiter blocks, a waiter that dies in the queue, and more blocked threads than the
connection pool has connections.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from django_redislock import Lock, LockBackendError, LockOutcomeUnknown, drivers, wakeups
from django_redislock.runtime import keyspace, runtime
from django_redislock.targets import CLAIM_WINDOW
from tests.conftest import ROOT, hand_off_messages, hold, subprocess_env, wait_for


def queue_length(redis_client, name: str) -> int:
    return int(redis_client.llen(keyspace().queue(name)))


class Waiter(threading.Thread):
    """``Lock(name, **options).acquire(...)`` in a thread; records the result and the time."""

    def __init__(self, name: str, *, hold: float = 0.0, **acquire: object) -> None:
        super().__init__(daemon=True)
        self.lock_name = name
        self.hold = hold
        self.acquire_kwargs = acquire
        self.options: dict[str, object] = {}
        self.result: bool | None = None
        self.error: BaseException | None = None
        self.acquired_at: float | None = None

    def run(self) -> None:
        try:
            lock = Lock(self.lock_name, **self.options)  # type: ignore[arg-type]
            self.result = lock.acquire(**self.acquire_kwargs)  # type: ignore[arg-type]
            self.acquired_at = time.monotonic()
            if self.result:
                time.sleep(self.hold)
                lock.release()
        except BaseException as exc:
            self.error = exc


def start_waiter(name: str, *, using: str | None = None, **acquire: Any) -> Waiter:
    waiter = Waiter(name, **acquire)
    waiter.options = {"using": using} if using else {}
    waiter.start()
    return waiter


def waiting_process(name: str) -> subprocess.Popen[str]:
    """A process blocked in ``Lock(name).acquire()`` (tests/holder.py)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.holder", name, "--timeout", "30"],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def processes():
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture
def fresh_listener(monkeypatch) -> None:
    """Listeners of earlier tests are stopped first, so each test starts its own."""
    idle_exit = wakeups.IDLE_EXIT
    monkeypatch.setattr(wakeups, "IDLE_EXIT", 0.0)
    for listener in runtime.listeners():
        if isinstance(listener, wakeups.Listener):  # (a Cluster test's sharded one: not here)
            wait_for(lambda one=listener: one._thread is None, what="an idle listener to stop")
    monkeypatch.setattr(wakeups, "IDLE_EXIT", idle_exit)


@pytest.fixture
def publish_counts_nobody(monkeypatch):
    """Hand-offs as on a Redis Cluster, where PUBLISH's count cannot tell a dead waiter."""
    original = runtime.target

    def cluster_like(using=None):
        return dataclasses.replace(original(using), outright=False)

    monkeypatch.setattr(runtime, "target", cluster_like)


# -- defect: waits longer than the socket timeout -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["bare", "bare-builtin"])
def test_a_wait_longer_than_the_default_socket_timeout_succeeds(redis_client, alias):
    """redis-py 8 gives connections a 5 s socket timeout that a bare CACHES entry keeps."""
    name = f"long-wait-{alias}"
    holder = Lock(name, using=alias, timeout=30)
    holder.acquire()
    waiter = start_waiter(name, using=alias)
    wait_for(lambda: queue_length(redis_client, name) == 1, what="the waiter to queue")
    time.sleep(6.5)
    released = time.monotonic()
    holder.release()
    waiter.join(10)
    assert waiter.error is None and waiter.result is True
    assert waiter.acquired_at is not None and waiter.acquired_at - released < 0.5


# -- defect: a dropped connection is not an outage ---------------------------------------------


@pytest.mark.parametrize("kind", ["normal", "pubsub"])
def test_a_killed_connection_during_a_wait_keeps_waiting(redis_client, kind, fresh_listener):
    holder = Lock(f"kill-{kind}", timeout=30)
    holder.acquire()
    waiter = start_waiter(f"kill-{kind}", blocking_timeout=8)
    wait_for(lambda: queue_length(redis_client, f"kill-{kind}") == 1, what="the waiter to queue")
    killed = redis_client.client_kill_filter(_type=kind)
    assert killed >= 1
    time.sleep(1.5)  # the old failure surfaced here, after the killed read
    assert waiter.is_alive() and waiter.error is None, (waiter.result, repr(waiter.error))
    holder.release()
    waiter.join(10)
    assert waiter.error is None and waiter.result is True


def test_a_hand_off_from_another_process_wakes_the_waiter_at_once(
    redis_client, holders, fresh_listener
):
    """The release in another process publishes to this process's channel; the listener reads
    it and wakes the waiter, long before the holder's lease (30 s) would make it re-check."""
    hold(holders, "cross-process", "--hold", "1.0", "--timeout", "30")
    started = time.monotonic()
    waiter = start_waiter("cross-process", blocking_timeout=20)
    wait_for(lambda: queue_length(redis_client, "cross-process") == 1, what="the waiter to queue")
    waiter.join(20)
    assert waiter.error is None and waiter.result is True
    assert waiter.acquired_at is not None and waiter.acquired_at - started < 3.0


def test_redis_down_during_a_wait_raises_within_the_deadline(redis_factory, settings):
    server = redis_factory().start()
    settings.CACHES = {
        **settings.CACHES,
        "doomed": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        },
    }
    holder = Lock("doomed", using="doomed", timeout=2, auto_renew=False)
    holder.acquire()
    waiter = start_waiter("doomed", using="doomed", blocking_timeout=30)
    wait_for(lambda: server.client().llen(keyspace("doomed").queue("doomed")) == 1)
    server.kill()
    waiter.join(10)  # the holder's lease (2 s) ends, the re-check finds Redis gone
    assert not waiter.is_alive()
    assert isinstance(waiter.error, LockBackendError)


# -- defect: a waiter that dies in the queue -------------------------------------------------------


def test_a_waiter_killed_in_the_queue_is_skipped_at_once(redis_client, processes):
    holder = Lock("dead-waiter", timeout=30)
    holder.acquire()
    dead = waiting_process("dead-waiter")
    processes.append(dead)
    wait_for(lambda: queue_length(redis_client, "dead-waiter") == 1, what="the process to queue")
    dead.kill()
    dead.wait(10)
    waiter = start_waiter("dead-waiter", blocking_timeout=20)
    wait_for(lambda: queue_length(redis_client, "dead-waiter") == 2, what="the thread to queue")
    released = time.monotonic()
    holder.release()
    waiter.join(20)
    assert waiter.result is True
    assert waiter.acquired_at is not None and waiter.acquired_at - released < 0.5


@pytest.mark.slow
def test_a_dead_waiter_costs_at_most_the_claim_window_when_publish_cannot_tell(
    redis_client, processes, publish_counts_nobody
):
    holder = Lock("dead-waiter-2", timeout=30)
    holder.acquire()
    dead = waiting_process("dead-waiter-2")
    processes.append(dead)
    wait_for(lambda: queue_length(redis_client, "dead-waiter-2") == 1)
    dead.kill()
    dead.wait(10)
    waiter = start_waiter("dead-waiter-2", blocking_timeout=20)
    wait_for(lambda: queue_length(redis_client, "dead-waiter-2") == 2)
    released = time.monotonic()
    holder.release()
    waiter.join(20)
    assert waiter.result is True
    stall = waiter.acquired_at - released  # type: ignore[operator]
    assert CLAIM_WINDOW - 0.2 < stall < CLAIM_WINDOW + 1.0


@pytest.mark.slow
def test_a_frozen_waiter_costs_at_most_the_claim_window_where_hand_offs_are_claimed(
    redis_client, processes, publish_counts_nobody
):
    """A SIGSTOPped waiter still listens (its socket is open) but never claims its reservation."""
    holder = Lock("frozen-waiter", timeout=30)
    holder.acquire()
    frozen = waiting_process("frozen-waiter")
    processes.append(frozen)
    wait_for(lambda: queue_length(redis_client, "frozen-waiter") == 1)
    os.kill(frozen.pid, signal.SIGSTOP)
    waiter = start_waiter("frozen-waiter", blocking_timeout=20)
    wait_for(lambda: queue_length(redis_client, "frozen-waiter") == 2)
    released = time.monotonic()
    holder.release()
    waiter.join(20)
    assert waiter.result is True
    stall = waiter.acquired_at - released  # type: ignore[operator]
    assert stall < CLAIM_WINDOW + 1.0


@pytest.mark.slow
def test_on_a_single_redis_a_frozen_waiter_is_handed_the_lock_like_any_holder(
    redis_client, processes
):
    """Single Redis: hand-offs are outright (no claim round trip). A frozen — not dead — waiter
    then holds the lock for its lease, exactly as a frozen holder would."""
    holder = Lock("frozen-holder", timeout=30)
    holder.acquire()
    frozen = subprocess.Popen(
        [sys.executable, "-m", "tests.holder", "frozen-holder", "--timeout", "2"],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    processes.append(frozen)
    wait_for(lambda: queue_length(redis_client, "frozen-holder") == 1)
    os.kill(frozen.pid, signal.SIGSTOP)
    waiter = start_waiter("frozen-holder", blocking_timeout=20)
    wait_for(lambda: queue_length(redis_client, "frozen-holder") == 2)
    released = time.monotonic()
    holder.release()
    waiter.join(20)
    assert waiter.result is True
    stall = waiter.acquired_at - released  # type: ignore[operator]
    assert 1.5 < stall < 2.0 + 1.0  # the frozen waiter's own lease (2 s), not the claim window


# -- defect: every blocked waiter held a pooled connection ---------------------------------------


@pytest.mark.slow
def test_a_thousand_threads_wait_with_a_pool_of_ten(redis_client, settings):
    # The default transport's promise: a "lean" one keeps a connection per thread, which a pool
    # of ten cannot give a thousand threads (see the next test).
    settings.REDISLOCK = {**settings.REDISLOCK, "TRANSPORT": "redis-py"}
    holder = Lock("crowd", using="small-pool", timeout=30)
    holder.acquire()
    waiters = [start_waiter("crowd", using="small-pool", blocking_timeout=120) for _ in range(1000)]
    wait_for(lambda: queue_length(redis_client, "crowd") == 1000, timeout=60, what="1000 waiters")
    pool = runtime.target().client.connection_pool
    # Waiting holds no connection: the last enqueue round trips give theirs back at once.
    wait_for(lambda: len(pool._in_use_connections) < 10, timeout=10, what="connections returned")
    holder.release()
    for waiter in waiters:
        waiter.join(120)
    errors = [w.error for w in waiters if w.error is not None]
    assert errors == []
    assert all(w.result is True for w in waiters)
    times = sorted(w.acquired_at for w in waiters)  # type: ignore[type-var]
    assert len(set(times)) == 1000


def test_the_lean_transport_with_more_threads_than_connections_fails_clearly(settings, monkeypatch):
    """``TRANSPORT="lean"`` keeps a connection per thread: beyond the pool's ``max_connections``
    (10 here) a call waits for one, then fails with a clear error before sending anything."""
    from django_redislock import transport

    settings.REDISLOCK = {**settings.REDISLOCK, "TRANSPORT": "lean"}
    monkeypatch.setattr(transport, "POOL_RETRY_BUDGET", 0.5)
    done = threading.Event()
    results: list[object] = []

    def one(i: int) -> None:
        lock = Lock(f"lean-crowd-{i}", using="small-pool")
        try:
            results.append(lock.acquire(blocking=False))
            lock.release()
        except LockBackendError as exc:
            results.append(exc)
        done.wait(10)  # the thread lives on, and keeps its connection

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(results) == 12, timeout=10, what="every thread's call")
    done.set()
    for thread in threads:
        thread.join(10)
    errors = [r for r in results if isinstance(r, LockBackendError)]
    # ten connections at most (the pool's listener may hold one), so two threads or more fail
    assert results.count(True) <= 10 and len(errors) >= 2
    assert results.count(True) + len(errors) == 12
    assert all(not isinstance(e, LockOutcomeUnknown) for e in errors)  # nothing was sent
    gc.collect()  # the ended threads gave their connections back: a new thread gets one
    again = Lock("lean-crowd-again", using="small-pool")
    assert again.acquire(blocking=False)
    again.release()


def test_waiters_of_one_process_share_one_subscription(redis_client):
    holder = Lock("shared-sub", timeout=30)
    holder.acquire()
    before = len(redis_client.client_list(_type="pubsub"))
    waiters = [start_waiter("shared-sub", blocking_timeout=20) for _ in range(20)]
    wait_for(lambda: queue_length(redis_client, "shared-sub") == 20)
    assert len(redis_client.client_list(_type="pubsub")) <= before + 1
    holder.release()
    for waiter in waiters:
        waiter.join(20)
    assert all(w.result is True for w in waiters)


@pytest.mark.parametrize("waiters", [1, 3])
def test_a_release_wakes_a_waiter_of_its_own_process_without_a_message(redis_client, waiters):
    """``release.lua`` publishes no hand-off message for a waiter of the releasing process: the
    release wakes it directly, the lock already its own (no round trip through Redis and the
    listener). Only "re-check" hints for the next waiter in line may still go out."""
    holder = Lock("local-hand-off", timeout=30)
    holder.acquire()
    spy = redis_client.pubsub()
    spy.psubscribe(runtime.target().channel_prefix + "*")
    started = [
        start_waiter("local-hand-off", blocking_timeout=20, hold=0.05) for _ in range(waiters)
    ]
    wait_for(lambda: queue_length(redis_client, "local-hand-off") == waiters)
    released = time.monotonic()
    holder.release()
    for waiter in started:
        waiter.join(20)
    assert [w.result for w in started] == [True] * waiters
    first = min(w.acquired_at or float("inf") for w in started)
    assert first - released < 0.5  # not the holder's 30 s lease, nor a re-check
    assert hand_off_messages(spy) == []


# -- the waiter is registered only when the first call finds the lock busy ----------------------


def _between_first_call_and_registration(monkeypatch, action):
    """Run ``action(attempt)`` after an acquisition's first call found the lock busy (and queued
    it) and before its waiter is registered: the window a lazily registered waiter must cover."""
    original = drivers.Attempt._waiter
    seen: list[Any] = []

    def waiter(self):
        if not seen:
            seen.append(self)
            action(self)
        return original(self)

    monkeypatch.setattr(drivers.Attempt, "_waiter", waiter)
    return seen


def test_a_hand_off_that_comes_before_the_waiter_registers_is_not_lost(redis_client, monkeypatch):
    holder = Lock("early-hand-off", timeout=30, owner="holder")  # released from the waiter's thread
    holder.acquire()
    assert runtime.target().listener.ensure(5)  # subscribed: a first call queues

    def release_now(attempt):
        assert attempt.plan.queue  # the first call queued it
        holder.release()  # hands the lock to that waiter: its wake-up comes first
        assert attempt.plan.attempt in runtime.waiters._early  # ... kept for the registration

    seen = _between_first_call_and_registration(monkeypatch, release_now)
    started = time.monotonic()
    waiter = start_waiter("early-hand-off", blocking_timeout=10)  # another thread: not re-entry
    waiter.join(10)
    assert waiter.result is True and waiter.acquired_at is not None, waiter.error
    assert waiter.acquired_at - started < 2  # not the holder's 30 s lease
    assert seen and seen[0].plan.attempt not in runtime.waiters._early  # taken by the registration


def test_a_message_of_a_renewed_subscription_missed_before_registration_costs_no_wait(
    redis_client, monkeypatch
):
    """A reconnect of the listener between the first call and the registration loses messages
    the registration cannot see, and its wake-up of every waiter missed this one: the waiter
    re-checks at once instead of at the holder's lease end."""
    holder = Lock("renewed-sub", timeout=30, owner="holder")
    holder.acquire()
    assert runtime.target().listener.ensure(5)

    def release_and_lose(attempt):
        holder.release()
        assert runtime.waiters._early.pop(attempt.plan.attempt)  # lost in the reconnect
        attempt.plan.target.listener.connections += 1  # ... which made a new subscription

    seen = _between_first_call_and_registration(monkeypatch, release_and_lose)
    started = time.monotonic()
    waiter = start_waiter("renewed-sub", blocking_timeout=10)
    waiter.join(10)
    assert seen and waiter.result is True and waiter.acquired_at is not None, waiter.error
    assert waiter.acquired_at - started < 2


def test_an_interruption_before_the_waiter_registers_leaves_the_queue(redis_client, monkeypatch):
    """Interrupted between a first call that queued it and its registration (a KeyboardInterrupt
    can come anywhere): the entry is removed, so no release hands the lock to nobody."""
    holder = Lock("interrupted-early", timeout=30, owner="holder")
    holder.acquire()
    assert runtime.target().listener.ensure(5)

    class Interrupted(Exception):
        pass

    def interrupt(attempt):
        assert queue_length(redis_client, "interrupted-early") == 1  # queued by the first call
        raise Interrupted

    _between_first_call_and_registration(monkeypatch, interrupt)
    waiter = start_waiter("interrupted-early", blocking_timeout=10)
    waiter.join(10)
    assert isinstance(waiter.error, Interrupted)
    assert queue_length(redis_client, "interrupted-early") == 0
    holder.release()
    assert not Lock("interrupted-early").locked()  # not handed to the interrupted waiter


def test_a_listener_not_ready_at_registration_is_awaited_and_the_place_in_line_kept(
    redis_client, monkeypatch
):
    """The listener stops when no waiter is registered, so it may stop right after a first call
    that queued us: the flow subscribes again (``Subscribe``) and keeps its queue entry."""
    holder = Lock("stopped-listener", timeout=30)
    holder.acquire()
    first = start_waiter("stopped-listener", blocking_timeout=10, hold=0.05)
    wait_for(lambda: queue_length(redis_client, "stopped-listener") == 1)
    listener = runtime.target().listener
    resubscribed = threading.Timer(0.2, listener.ready.set)
    ensured: list[float] = []
    ensure = listener.ensure

    def spy(timeout: float) -> bool:
        ensured.append(timeout)
        return ensure(timeout)

    monkeypatch.setattr(listener, "ensure", spy)

    def listener_gone(attempt):
        listener.ready.clear()  # as if it stopped; it is "subscribed again" 0.2 s later
        resubscribed.start()

    _between_first_call_and_registration(monkeypatch, listener_gone)
    second = start_waiter("stopped-listener", blocking_timeout=10)
    wait_for(lambda: resubscribed.finished.is_set())
    wait_for(lambda: queue_length(redis_client, "stopped-listener") == 2)
    holder.release()
    first.join(10)
    second.join(10)
    assert (first.result, second.result) == (True, True), (first.error, second.error)
    assert first.acquired_at is not None and second.acquired_at is not None
    assert first.acquired_at < second.acquired_at  # FIFO: the entry kept its place
    assert ensured  # the flow subscribed again (Subscribe), not relying on the stale `ready`
    assert queue_length(redis_client, "stopped-listener") == 0


def test_early_messages_for_waiters_that_never_register_are_dropped(monkeypatch):
    monkeypatch.setattr(wakeups, "EARLY_MAX", 8)
    registry = wakeups.WaiterRegistry()
    for n in range(20):
        registry.dispatch(f"r gone.{n} 100")
    assert len(registry._early) <= 8
    monkeypatch.setattr(wakeups, "EARLY_TTL", -1.0)  # every kept message is too old now
    registry.dispatch("r gone.last 100")
    assert list(registry._early) == ["gone.last"]


def test_a_message_kept_for_a_waiter_is_delivered_at_its_registration():
    registry = wakeups.WaiterRegistry()
    waiter = wakeups.Waiter("early.1")
    registry.dispatch("h early.1 41")
    assert not waiter.handed
    registry.register(waiter)
    assert waiter.handed and waiter.token == 41
    assert "early.1" not in registry._early
    registry.dispatch("r early.1 0")  # registered: delivered at once
    assert waiter.recheck_at <= time.monotonic()
