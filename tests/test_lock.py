"""Behaviour of ``Lock`` against a real redis-server, one contract line per test."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest
import redis
from django.conf import settings

from django_redislock import (
    Lock,
    LockError,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
    force_release,
    get_lock_info,
    list_locks,
)
from django_redislock.runtime import keyspace
from tests.conftest import wait_for
from tests.faces import AsyncFace


def pytest_generate_tests(metafunc):
    """Every contract test runs against both faces: ``Lock`` and ``AsyncLock`` (through
    :class:`tests.faces.AsyncFace`, where each test thread is one asyncio task)."""
    faces = ["sync"] if metafunc.definition.get_closest_marker("sync_only") else ["sync", "async"]
    metafunc.parametrize("face", faces, indirect=True)


@pytest.fixture(autouse=True)
def face(request, monkeypatch):
    if request.param == "async":
        monkeypatch.setitem(globals(), "Lock", AsyncFace)
    return request.param


def in_thread(fn, *args):
    """Run ``fn`` in another thread (another owner) and return its result."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # pragma: no cover - surfaced below
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


def queue_length(name: str) -> int:
    return int(
        redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).llen(keyspace().queue(name))
    )


def lock_key(name: str) -> str:
    return keyspace().lock(name)


# -- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [None, 1, b"bytes", ["x"]])
def test_non_str_name_is_a_type_error(name):
    with pytest.raises(TypeError):
        Lock(name)


def test_empty_name_is_a_value_error():
    with pytest.raises(ValueError):
        Lock("")


def test_negative_timeout_is_a_value_error():
    with pytest.raises(ValueError):
        Lock("x", timeout=-1)
    with pytest.raises(ValueError):
        Lock("x", blocking_timeout=-0.5)


def test_non_numeric_timeout_is_a_type_error():
    with pytest.raises(TypeError):
        Lock("x", timeout="10")  # type: ignore[arg-type]


def test_name_is_kept_as_given():
    assert Lock("invoice:42").name == "invoice:42"


# -- acquire / release --------------------------------------------------------------------------


def test_acquire_and_release():
    lock = Lock("basic", timeout=5)
    assert lock.acquire() is True
    assert lock.locked() and lock.owned()
    assert lock.hold_count == 1
    lock.release()
    assert not lock.locked() and not lock.owned()
    assert lock.hold_count == 0


def test_lock_value_is_json_with_holder_metadata(redis_client):
    with Lock("meta", timeout=5) as lock:
        raw = redis_client.get(lock_key("meta"))
        record = json.loads(raw)
        assert record["o"] == lock.owner
        assert record["t"] == lock.fencing_token
        assert record["m"]["pid"] > 0
        assert record["m"]["thread"] == "MainThread" or record["m"]["thread"].startswith("task:")


def test_other_thread_cannot_acquire_non_blocking():
    with Lock("busy", timeout=5):
        assert in_thread(lambda: Lock("busy").acquire(blocking=False)) is False


def test_blocking_timeout_returns_false_after_the_deadline():
    with Lock("slow", timeout=5):
        start = time.monotonic()
        assert in_thread(lambda: Lock("slow").acquire(blocking_timeout=0.3)) is False
        assert 0.25 <= time.monotonic() - start < 2.0


def test_one_deadline_covers_every_wake_up():
    """A holder renewing its lease keeps the waiter waking up; the deadline still holds."""
    with Lock("renewing", timeout=0.3):  # watchdog renews every 0.1 s
        start = time.monotonic()
        assert in_thread(lambda: Lock("renewing").acquire(blocking_timeout=1.0)) is False
        assert 0.9 <= time.monotonic() - start < 2.0


def test_constructor_blocking_timeout_is_the_default():
    with Lock("ctor", timeout=5):
        start = time.monotonic()
        assert in_thread(lambda: Lock("ctor", blocking_timeout=0.2).acquire()) is False
        assert time.monotonic() - start < 1.5


def test_non_blocking_constructor_default():
    with Lock("nb", timeout=5):
        assert in_thread(lambda: Lock("nb", blocking=False).acquire()) is False


def test_waiter_is_woken_by_the_release_not_by_the_lease(redis_client):
    """Lease 30 s: a waiter that acquires within a second was woken by the release."""
    holder = Lock("wake", timeout=30)
    holder.acquire()
    result: dict[str, float] = {}

    def wait() -> None:
        lock = Lock("wake", timeout=30)
        assert lock.acquire(blocking_timeout=10)
        result["acquired"] = time.monotonic()
        lock.release()

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: redis_client.llen(keyspace().queue("wake")) == 1, what="the waiter")
    released = time.monotonic()
    holder.release()
    t.join(15)
    assert 0 < result["acquired"] - released < 0.5  # woken by the release, not a 30 s lease


def test_waiting_does_not_poll(redis_client):
    """A 1.5 s wait costs a fixed handful of commands, not one per interval.

    The first wait of a process subscribes its wake-up listener (a non-queuing attempt, the
    SUBSCRIBE, the queued attempt); later waits send just the queued attempt and the cancel at
    the deadline. The listener's health-check PINGs are one per second of silence, per process.
    """
    holder = Lock("nopoll", timeout=30)
    holder.acquire()

    def commands() -> dict[str, int]:
        stats = redis_client.info("commandstats")
        return {k[len("cmdstat_") :]: v["calls"] for k, v in stats.items()}

    for attempts in (3, 2):  # the listener may be up already from an earlier test: <= 3
        redis_client.config_resetstat()
        assert in_thread(lambda: Lock("nopoll").acquire(blocking_timeout=1.5)) is False
        calls = commands()
        scripts_run = calls.get("evalsha", 0) + calls.get("fcall", 0)
        assert 2 <= scripts_run <= attempts  # (attempt,) attempt, cancel
        assert calls.get("blpop", 0) == 0  # nothing blocks on a pooled connection
        listeners = len(redis_client.client_list(_type="pubsub"))  # one per client, each PINGs
        assert calls.get("ping", 0) <= 2 * listeners  # once per second of silence
    holder.release()


def test_waiters_acquire_in_arrival_order():
    holder = Lock("fifo", timeout=30)
    holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(3):

        def wait(i: int = i) -> None:
            lock = Lock("fifo", timeout=30)
            assert lock.acquire(blocking_timeout=20)
            order.append(i)
            lock.release()

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        wait_for(lambda i=i: queue_length("fifo") == i + 1, what=f"waiter {i} to queue")
    holder.release()
    for t in threads:
        t.join(20)
    assert order == [0, 1, 2]


def test_waiter_acquires_within_the_ttl_when_the_wake_up_is_lost(redis_client):
    """The holder's key vanishes without a release (crash): the waiter gets it within one TTL."""
    holder = Lock("crashed", timeout=1.0, auto_renew=False)
    holder.acquire()
    start = time.monotonic()
    assert in_thread(lambda: Lock("crashed").acquire(blocking_timeout=5)) is True
    assert time.monotonic() - start < 1.8


def test_release_by_non_owner_raises_and_keeps_the_holders_lock():
    holder = Lock("owned", timeout=5)
    holder.acquire()

    def steal() -> str:
        with pytest.raises(LockNotOwnedError):
            Lock("owned").release()
        return "ok"

    assert in_thread(steal) == "ok"
    assert holder.owned() and holder.hold_count == 1
    holder.release()


def test_release_without_acquire_raises():
    with pytest.raises(LockNotOwnedError):
        Lock("never").release()


def test_release_after_expiry_raises_and_keeps_the_new_holders_lock():
    first = Lock("expiring", timeout=0.2, auto_renew=False)
    first.acquire()
    wait_for(lambda: not first.locked(), what="the lease to run out")
    second_token = in_thread(lambda: _acquire_and_keep("expiring"))
    with pytest.raises(LockNotOwnedError):
        first.release()
    assert first.lost
    info = get_lock_info("expiring")
    assert info is not None and info.fencing_token == second_token


def _acquire_and_keep(name: str) -> int:
    lock = Lock(name, timeout=5)
    assert lock.acquire(blocking=False)
    return lock.fencing_token  # type: ignore[return-value]


def test_release_after_force_release_raises():
    lock = Lock("forced", timeout=5)
    lock.acquire()
    assert force_release("forced") is True
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.lost


# -- renew ---------------------------------------------------------------------------------------


def test_renew_resets_the_ttl(redis_client):
    lock = Lock("renew", timeout=2, auto_renew=False)
    lock.acquire()
    time.sleep(0.5)
    lock.renew()
    assert redis_client.pttl(lock_key("renew")) > 1800
    lock.release()


def test_renew_when_not_held_raises():
    with pytest.raises(LockNotOwnedError):
        Lock("nothing").renew()


# -- re-entrancy -----------------------------------------------------------------------------------


def test_same_thread_nests_and_counts_holds():
    lock = Lock("nest", timeout=5)
    assert lock.acquire() and lock.acquire()
    assert lock.hold_count == 2
    token = lock.fencing_token
    lock.release()
    assert lock.hold_count == 1 and lock.owned()
    assert lock.fencing_token == token
    lock.release()
    assert lock.hold_count == 0 and not lock.locked()


def test_reentrant_acquisition_keeps_the_outer_token_across_objects():
    outer = Lock("nest2", timeout=5)
    outer.acquire()
    inner = Lock("nest2", timeout=5)
    assert inner.acquire(blocking=False)
    assert inner.fencing_token == outer.fencing_token
    assert inner.hold_count == 2
    inner.release()
    outer.release()
    assert not outer.locked()


def test_another_thread_waits_for_a_nested_lock():
    lock = Lock("nest3", timeout=5)
    lock.acquire()
    lock.acquire()
    lock.release()
    assert in_thread(lambda: Lock("nest3").acquire(blocking=False)) is False
    lock.release()
    assert in_thread(lambda: _acquire_release("nest3")) is True


def _acquire_release(name: str) -> bool:
    lock = Lock(name, timeout=5)
    ok = lock.acquire(blocking=False)
    if ok:
        lock.release()
    return ok


def test_non_reentrant_lock_refuses_to_nest():
    lock = Lock("flat", timeout=5, reentrant=False)
    lock.acquire()
    with pytest.raises(LockNotAcquiredError):
        lock.acquire()
    lock.release()


def test_explicit_owner_is_shared_across_threads():
    lock = Lock("task-lock", timeout=5, owner="task-123")
    lock.acquire()
    in_thread(lambda: Lock("task-lock", owner="task-123").release())
    assert not lock.locked()


def test_release_all_holds():
    lock = Lock("all", timeout=5)
    lock.acquire()
    lock.acquire()
    lock.release(all_holds=True)
    assert not lock.locked() and lock.hold_count == 0


# -- fencing tokens --------------------------------------------------------------------------------


def test_tokens_strictly_increase_across_releases_expiries_and_force_releases():
    tokens: list[Any] = []
    lock = Lock("fence", timeout=0.2, auto_renew=False)
    lock.acquire()
    tokens.append(lock.fencing_token)
    lock.release()
    lock.acquire()
    tokens.append(lock.fencing_token)
    time.sleep(0.3)  # expires
    lock.acquire()
    tokens.append(lock.fencing_token)
    force_release("fence")
    tokens.append(in_thread(lambda: _acquire_and_keep("fence")))
    assert tokens == sorted(set(tokens)) and len(tokens) == 4


def test_fencing_token_is_none_before_acquisition():
    assert Lock("fresh").fencing_token is None


# -- context manager and loss ----------------------------------------------------------------------


def test_context_manager_raises_when_busy():
    with Lock("cm", timeout=5):

        def enter() -> str:
            with pytest.raises(LockNotAcquiredError), Lock("cm", blocking=False):
                pass
            return "ok"

        assert in_thread(enter) == "ok"


def test_deleted_key_is_noticed_by_the_watchdog_and_raises_on_exit(redis_client):
    with pytest.raises(LockLostError), Lock("vanish", timeout=0.6) as lock:
        redis_client.delete(lock_key("vanish"))
        wait_for(lambda: lock.lost, timeout=3, what="the watchdog to notice")


def test_loss_found_at_exit_raises_lock_lost(redis_client):
    with pytest.raises(LockLostError), Lock("gone", timeout=5, auto_renew=False):
        redis_client.delete(lock_key("gone"))


def test_exception_in_block_is_not_masked_by_loss(redis_client):
    with pytest.raises(ZeroDivisionError), Lock("both", timeout=5):
        redis_client.delete(lock_key("both"))
        1 / 0  # noqa: B018


def test_watchdog_keeps_a_lock_for_three_leases():
    with Lock("long", timeout=0.5) as lock:
        time.sleep(1.6)
        assert lock.owned() and not lock.lost
    assert not lock.locked()


def test_without_auto_renew_the_lease_runs_out():
    lock = Lock("short", timeout=0.3, auto_renew=False)
    lock.acquire()
    wait_for(lambda: not lock.locked(), timeout=2, what="the lease to run out")
    with pytest.raises(LockNotOwnedError):
        lock.release()


class _Interrupted(Exception):
    pass


@pytest.mark.sync_only  # signals interrupt threads; tasks are cancelled: see test_aio.py
def test_interrupted_wait_leaves_the_queue(redis_client):
    """A signal handler raising mid-wait (like Ctrl-C) leaves no queue entry behind."""
    import signal

    holder_owner = "other-process"
    holder = Lock("interrupt", timeout=30, owner=holder_owner)
    holder.acquire()

    def interrupt(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(_Interrupted):
            Lock("interrupt", timeout=30).acquire(blocking_timeout=10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert redis_client.llen(keyspace().queue("interrupt")) == 0
    holder.release()
    assert not holder.locked()


# -- namespaces and backends -----------------------------------------------------------------------


def test_cache_key_prefixes_isolate_sites(redis_client):
    with Lock("shared-name", timeout=5, using="default"):
        other = Lock("shared-name", timeout=5, using="site2")
        assert in_thread(lambda: other.acquire(blocking=False)) is True
        assert redis_client.exists("site2:redislock:lock:{shared-name}")
        assert redis_client.exists("redislock:lock:{shared-name}")


def test_djangos_builtin_redis_cache_is_supported(redis_client):
    lock = Lock("builtin", timeout=5, using="builtin")
    assert lock.acquire()
    assert redis_client.exists("builtin:redislock:lock:{builtin}")
    lock.release()
    assert not lock.locked()


def test_names_cannot_escape_the_namespace(redis_client):
    redis_client.set("victim", "x")
    with Lock("*", timeout=5), Lock("} victim {", timeout=5):
        pass
    assert redis_client.get("victim") == b"x"
    assert all(k.startswith(b"redislock:") or k == b"victim" for k in redis_client.keys("*"))


def test_released_names_leave_no_key_of_their_own_on_a_single_redis(redis_client):
    """One fencing counter per namespace on a single Redis: after 500 distinct names were
    locked and released, no key carries any of those names, and tokens still only increase."""
    tokens: list[int] = []
    for i in range(500):
        with Lock(f"invoice:{i}", timeout=5) as lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
    assert tokens == sorted(set(tokens))
    left = [k.decode() for k in redis_client.scan_iter(match="redislock:*", count=1000)]
    # (statistics keys name the key *shape*, "invoice:{n}", never a name)
    assert not [k for k in left if re.search(r"invoice:\d", k)], left[:5]
    assert keyspace().fence("invoice:1") in left  # the namespace's counter


def test_tokens_keep_increasing_when_the_counter_expires(redis_client):
    lock = Lock("seeded", timeout=5)
    lock.acquire()
    first = lock.fencing_token
    lock.release()
    assert 0 < redis_client.pttl(keyspace().fence("seeded")) <= 86_400_000
    redis_client.delete(keyspace().fence("seeded"))  # as if a day had passed
    lock.acquire()
    assert first is not None and lock.fencing_token is not None
    assert lock.fencing_token > first
    lock.release()


# -- regressions: behaviour outside the happy path ----------------------------------------------


def test_an_explicit_release_inside_the_block_ends_it_cleanly():
    with Lock("explicit", timeout=5) as lock:
        lock.release()
        assert not lock.locked()
    assert not lock.lost


def test_a_nested_explicit_release_leaves_the_outer_hold():
    with Lock("explicit-nested", timeout=5) as lock:
        lock.acquire()
        lock.release()
        assert lock.hold_count == 1 and lock.owned()
    assert not lock.locked()


def test_non_reentrant_lock_whose_lease_ran_out_can_be_taken_again(redis_client):
    """reentrant=False, no renewal, expired unnoticed: Redis holds nothing, so acquire works."""
    lock = Lock("expired-nonreentrant", timeout=0.2, auto_renew=False, reentrant=False)
    assert lock.acquire(blocking=False)
    wait_for(lambda: not redis_client.exists(lock_key("expired-nonreentrant")), what="expiry")
    assert lock.acquire(blocking=False)
    assert lock.owned() and lock.hold_count == 1
    lock.release()


def test_non_reentrant_lock_still_refuses_a_second_hold():
    lock = Lock("still-held-nonreentrant", timeout=5, reentrant=False)
    lock.acquire()
    with pytest.raises(LockNotAcquiredError, match="reentrant=False"):
        lock.acquire(blocking=False)
    assert lock.hold_count == 1
    lock.release()


@pytest.mark.parametrize("value", [b"\xff\xfe\x00garbage", b"not json", b'{"o": 1}', b"[]"])
def test_a_corrupt_record_is_a_lock_error_not_a_decoding_error(redis_client, value):
    redis_client.set(lock_key("corrupt"), value, px=5000)
    lock = Lock("corrupt", timeout=5)
    with pytest.raises(LockError, match="not a lock record"):
        lock.owned()
    assert lock.locked()
    assert lock.acquire(blocking=False) is False  # held by something unknown: busy
    current = get_lock_info("corrupt")
    assert current is not None and current.unreadable
    assert [i.unreadable for i in list_locks(match="corrupt")] == [True]
    assert force_release("corrupt") is True
    assert lock.acquire(blocking=False) is True
    lock.release()


def test_extend_adds_to_the_remaining_lease(redis_client):
    lock = Lock("extend", timeout=10, auto_renew=False)
    lock.acquire()
    lock.extend(20)
    assert 29_000 < redis_client.pttl(lock_key("extend")) <= 30_000
    lock.renew()
    assert 9_000 < redis_client.pttl(lock_key("extend")) <= 10_000
    lock.release()
    with pytest.raises(LockNotOwnedError):
        lock.extend(5)


@pytest.mark.parametrize("value", [float("nan"), -1, 0, True, "5"])
def test_extend_validates_its_argument(value):
    lock = Lock("extend-bad", timeout=5)
    lock.acquire()
    with pytest.raises((TypeError, ValueError)):
        lock.extend(value)
    lock.release()


@pytest.mark.sync_only  # the faces share the scripts
def test_every_key_a_script_touches_is_declared_and_in_the_locks_slot(redis_client):
    """MONITOR shows the commands run inside scripts: each key must be one the call declared.

    Redis Cluster routes a script by its declared keys; Dragonfly and kvrocks reject undeclared
    ones, and Redis 7.0 silently writes them on the wrong node.
    """
    from redis.crc import key_slot

    seen: list[list[str]] = []
    stop = threading.Event()
    monitor_client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])

    def watch() -> None:
        with monitor_client.monitor() as monitor:
            for event in monitor.listen():
                seen.append([event.get("client_type", ""), *event["command"].split(" ")])
                if stop.is_set() and event["command"].startswith("PING"):
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def monitoring() -> bool:
        redis_client.echo("monitor-probe")
        return any("monitor-probe" in " ".join(c) for c in seen)

    wait_for(monitoring, what="MONITOR to start")
    # Every path: take, re-enter, queue, hand off, claim, renew, extend, cancel, force release.
    holder = Lock("{slot}name", timeout=5)
    holder.acquire()
    holder.acquire()
    holder.release()
    waiter = threading.Thread(target=lambda: Lock("{slot}name").acquire(blocking_timeout=5))
    waiter.start()
    wait_for(lambda: redis_client.llen(keyspace().queue("{slot}name")))
    holder.renew()
    holder.extend(1)
    holder.release()
    waiter.join(10)
    assert Lock("{slot}name").acquire(blocking_timeout=0.2) is False
    force_release("{slot}name")
    stop.set()
    monitor_client.ping()
    watcher.join(10)
    scripts_run = 0
    declared: set[str] = set()
    # On a single Redis the fencing counter is one key per namespace (keys.KeySpace); on a
    # Cluster it is per name, in the lock's slot (the topology suite runs these paths there).
    space = keyspace()
    shared_fence = space.fence("any") if space.shared_fence else None
    for client_type, *command in seen:
        name = command[0].upper()
        if name in ("EVALSHA", "FCALL"):
            scripts_run += 1
            declared = set(command[3 : 3 + int(command[2])])
            slots = {key_slot(k.encode()) for k in declared if k != shared_fence}
            assert len(slots) == 1, command
        elif client_type == "lua" and name not in ("PUBLISH", "TIME"):
            keys = [command[1]] if len(command) > 1 else []
            assert set(keys) <= declared, (command, declared)
    assert scripts_run >= 8


def test_a_lock_made_after_the_settings_change_uses_the_new_namespace(redis_client):
    # Keys are cached per name across lock objects: the cache must follow the settings.
    from django.test import override_settings

    with Lock("ns-cache"):
        assert redis_client.exists(keyspace(None).lock("ns-cache"))
    other = {**getattr(settings, "REDISLOCK", {}), "KEY_PREFIX": "otherns"}
    with override_settings(REDISLOCK=other), Lock("ns-cache"):
        assert redis_client.exists(keyspace(None).lock("ns-cache"))
        assert keyspace(None).lock("ns-cache").startswith("otherns:")
    with Lock("ns-cache"):
        assert not redis_client.exists("otherns:lock:{ns-cache}")
        assert redis_client.exists(keyspace(None).lock("ns-cache"))


def test_a_nested_hold_with_a_shorter_timeout_never_shortens_the_lease(redis_client):
    """``with Lock("r", timeout=30)`` around ``with Lock("r", timeout=1)``: the outer block
    keeps its 30 s lease (issue 27, B11)."""
    key = keyspace().lock("nest-lease")
    with Lock("nest-lease", timeout=30):
        with Lock("nest-lease", timeout=1) as inner:
            assert inner.hold_count == 2
            assert redis_client.pttl(key) > 28_000
        assert redis_client.pttl(key) > 28_000


@pytest.mark.parametrize(
    "owner, message",
    [
        ("o" * 5000, "5000 characters long; at most 4096"),
        ("", "must not be empty"),
        ("a\nb", "must not contain a newline"),
        ("\ud800", "cannot be encoded as UTF-8"),
    ],
    ids=["too-long", "empty", "newline", "not-utf8"],
)
def test_a_bad_owner_says_which_condition_failed(owner, message):
    with pytest.raises(ValueError, match=message):
        Lock("x", owner=owner)


def test_a_lock_deleted_by_cache_clear_says_so_and_names_the_shared_cache():
    """The smallest setup keeps locks in CACHES["default"]: ``cache.clear()`` (FLUSHDB) drops
    them, and the ``LockLostError`` names that likely cause instead of "expired"."""
    from django.core.cache import cache

    with pytest.raises(LockLostError) as excinfo, Lock("cleared", timeout=5, auto_renew=False):
        cache.clear()
    text = str(excinfo.value)
    assert "cache.clear()" in text and "FLUSHDB" in text and "eviction" in text
    assert "CACHES['default'], is also Django's default cache" in text
    assert "django_redislock.W005" in text


def test_a_lost_lock_on_a_database_of_its_own_still_names_every_cause(settings):
    settings.CACHES = {
        **settings.CACHES,
        "own-db": {
            **settings.CACHES["default"],
            "LOCATION": settings.CACHES["default"]["LOCATION"][:-2] + "/9",
        },
    }
    with (
        pytest.raises(LockLostError) as excinfo,
        Lock("own", timeout=5, auto_renew=False, using="own-db"),
    ):
        force_release("own", using="own-db")
    text = str(excinfo.value)
    assert "force-released" in text and "cache.clear()" in text and "W005" not in text
