"""CountDownLatch, Barrier and their asyncio twins: real Redis, threads, child processes (one
killed with SIGKILL, one stopped with SIGSTOP while others wait), lost-reply resends, expiry,
hostile arguments and a Redis that does not answer."""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import key_slot

from django_redislock.exceptions import LockBackendError, LockError
from django_redislock.latch import (
    BARRIER_WAIT,
    LATCH_COUNT_DOWN,
    AsyncBarrier,
    AsyncCountDownLatch,
    Barrier,
    BrokenBarrierError,
    CountDownLatch,
)
from django_redislock.runtime import runtime
from tests.conftest import ROOT, subprocess_env, wait_for

# -- helpers -----------------------------------------------------------------------------------


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``call()`` in a thread; the list gets ``(result or exception, monotonic end)``."""
    out: list[Any] = []

    def run() -> None:
        try:
            result: Any = call()
        except BaseException as exc:
            result = exc
        out.append((result, time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: list[Any], timeout: float = 20.0) -> tuple[Any, float]:
    thread.join(timeout)
    assert not thread.is_alive(), "the waiting thread did not return"
    return out[0]  # type: ignore[no-any-return]


CHILD = textwrap.dedent(
    """
    import json, sys, time
    import django
    django.setup()
    from django_redislock.latch import Barrier, BrokenBarrierError, CountDownLatch
    kind, name, n, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    print(json.dumps({"ready": True}), flush=True)
    try:
        if kind == "barrier":
            result = {"index": Barrier(name, n, timeout=timeout).wait(60)}
        else:
            result = {"opened": CountDownLatch(name, n, timeout=timeout).wait(60)}
    except BrokenBarrierError as exc:
        result = {"broken": exc.reason}
    result["at"] = time.time()
    print(json.dumps(result), flush=True)
    """
)


@pytest.fixture
def children() -> Any:
    """Start ``CHILD`` processes; each is killed by PID at the end of the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *map(str, args)],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def last_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def target() -> Any:
    return runtime.target(None)


# -- latch -------------------------------------------------------------------------------------


def test_a_latch_counts_down_to_zero_and_never_below(redis_client):
    latch = CountDownLatch("jobs", 2)
    assert redis_client.keys("*") == []  # creating the object writes nothing
    assert latch.count == 2  # no state yet: the initial count
    assert latch.wait(0) is False
    latch.count_down()
    assert latch.count == 1
    latch.count_down()
    latch.count_down()
    assert latch.count == 0
    assert latch.wait() is True  # at once
    assert CountDownLatch("jobs", 5).count == 0  # the existing state wins


def test_a_latch_of_zero_is_open_at_once():
    assert CountDownLatch("none", 0).wait(0) is True


def test_a_waiter_is_woken_by_the_last_count_down_not_by_polling():
    latch = CountDownLatch("woken", 2, timeout=30)  # re-checks every 10 s: only a message helps
    waiters = [in_thread(lambda: latch.wait(20)) for _ in range(3)]
    wait_for(lambda: target().client.zcard(latch.keys(target())[1]) == 3, what="3 waiters")
    latch.count_down()
    time.sleep(0.1)
    assert all(not out for _, out in waiters)
    latch.count_down()
    done = time.monotonic()
    for thread, out in waiters:
        opened, at = joined(thread, out)
        assert opened is True
        assert at - done < 0.5


def test_a_wait_times_out_with_false():
    latch = CountDownLatch("slow", 1)
    started = time.monotonic()
    assert latch.wait(0.3) is False
    assert 0.3 <= time.monotonic() - started < 2.0
    assert target().client.zcard(latch.keys(target())[1]) == 0  # its entry is gone


def test_a_count_down_resent_with_the_same_id_counts_once():
    latch = CountDownLatch("resent", 5)
    there = target()
    args = [5, f"{runtime.token}.resend", 10_000, *there.channel_args("resent"), 1000]
    first = there.transport.run(LATCH_COUNT_DOWN, latch.keys(there), args, "count down")
    again = there.transport.run(LATCH_COUNT_DOWN, latch.keys(there), args, "count down")
    assert first == [4, 1]
    assert again == [4, 0]
    assert latch.count == 4


def test_a_latch_remembers_only_the_recent_count_down_ids(redis_client):
    latch = CountDownLatch("recent", 100)
    there = target()
    for i in range(10):
        args = [100, f"t.{i}", 10_000, *there.channel_args("recent"), 3]
        there.transport.run(LATCH_COUNT_DOWN, latch.keys(there), args, "count down")
    recent = redis_client.zrange(latch.keys(there)[2], 0, -1)
    assert recent == [b"t.9", b"t.8", b"t.7"]


def test_every_key_of_a_latch_expires_and_waiting_keeps_them(redis_client):
    latch = CountDownLatch("expiring", 3, timeout=0.6)
    keys = latch.keys(target())
    thread, out = in_thread(lambda: latch.wait(1.5))
    wait_for(lambda: redis_client.exists(*keys) == 2, what="state and waiter")
    latch.count_down()
    for key in keys:
        assert 0 < redis_client.pttl(key) <= 600, key
    time.sleep(0.9)  # longer than the timeout: the waiter's re-checks keep the keys
    assert latch.count == 2
    assert joined(thread, out)[0] is False
    wait_for(lambda: redis_client.exists(*keys) == 0, 3.0, what="the keys to expire")
    assert latch.count == 3  # a new latch of that name starts over


def test_an_open_latch_that_expired_starts_over():
    latch = CountDownLatch("again", 1, timeout=0.2)
    latch.count_down()
    assert latch.wait(0) is True
    wait_for(lambda: latch.count == 1, 3.0, what="expiry")
    assert latch.wait(0) is False


@pytest.mark.parametrize("name", ["plain", "{tag}", "a{b}c", "%7B"])
def test_every_key_of_one_latch_or_barrier_is_in_one_slot(name):
    there = target()
    for keys in (CountDownLatch(name, 1).keys(there), Barrier(name, 2).keys(there)):
        assert len({key_slot(key.encode()) for key in keys}) == 1


def test_a_latch_across_processes_wakes_a_waiting_child_promptly(children, redis_client):
    latch = CountDownLatch("fleet", 2, timeout=30)
    child = children("latch", "fleet", 2, 30)
    key = latch.keys(target())[1]
    wait_for(lambda: redis_client.zcard(key) == 1, 20.0, what="the child to wait")
    latch.count_down()
    latch.count_down()
    done = time.time()
    result = last_line(child)
    assert result["opened"] is True
    assert result["at"] - done < 0.5


# -- barrier -----------------------------------------------------------------------------------


def test_a_barrier_releases_its_parties_together_with_distinct_indices():
    barrier = Barrier("start", 3, timeout=5)
    assert barrier.parties == 3
    for _ in range(2):  # cyclic: the next round works the same
        waiting = [in_thread(lambda: barrier.wait(20)) for _ in range(3)]
        results = [joined(thread, out) for thread, out in waiting]
        assert sorted(index for index, _ in results) == [0, 1, 2]
        ends = [at for _, at in results]
        assert max(ends) - min(ends) < 0.5
    assert barrier.n_waiting == 0
    assert barrier.broken is False


def test_a_barrier_of_one_party_passes_at_once():
    assert Barrier("alone", 1).wait(0) == 0


def test_n_waiting_counts_the_parties_of_the_current_round():
    barrier = Barrier("count", 3, timeout=5)
    assert barrier.n_waiting == 0
    first = in_thread(lambda: barrier.wait(20))
    wait_for(lambda: barrier.n_waiting == 1, what="one party")
    second = in_thread(lambda: barrier.wait(20))
    wait_for(lambda: barrier.n_waiting == 2, what="two parties")
    assert barrier.wait(5) == 2
    assert sorted(joined(*t)[0] for t in (first, second)) == [0, 1]


def test_a_wait_that_times_out_breaks_the_barrier_for_everyone_until_reset():
    barrier = Barrier("late", 3, timeout=5)
    patient = in_thread(lambda: barrier.wait(20))
    wait_for(lambda: barrier.n_waiting == 1, what="the patient party")
    started = time.monotonic()
    with pytest.raises(BrokenBarrierError) as raised:
        barrier.wait(0.3)
    assert raised.value.reason == "timeout"
    assert time.monotonic() - started < 2.0
    woken, at = joined(*patient)
    assert isinstance(woken, BrokenBarrierError)
    assert at - started < 1.0  # woken by the break, not by a re-check
    assert barrier.broken is True
    with pytest.raises(threading.BrokenBarrierError):  # threading's catches it too
        barrier.wait(1)
    barrier.reset()
    assert barrier.broken is False
    waiting = [in_thread(lambda: barrier.wait(20)) for _ in range(3)]
    assert sorted(joined(*t)[0] for t in waiting) == [0, 1, 2]


def test_abort_and_reset_break_the_waiting_parties_at_once():
    barrier = Barrier("stop", 3, timeout=30)
    for change, reason, broken in ((barrier.abort, "abort", True), (barrier.reset, "reset", False)):
        barrier.reset()
        waiting = [in_thread(lambda: barrier.wait(20)) for _ in range(2)]
        wait_for(lambda: barrier.n_waiting == 2, what="two parties")
        change()
        done = time.monotonic()
        for thread, out in waiting:
            error, at = joined(thread, out)
            assert isinstance(error, BrokenBarrierError), error
            assert error.reason == reason
            assert at - done < 0.5
        assert barrier.broken is broken


def test_parties_must_agree_and_reset_adopts_new_ones():
    Barrier("agree", 2, timeout=5).abort()
    with pytest.raises(ValueError, match="in use with 2 parties, not 3"):
        Barrier("agree", 3).wait(0)
    Barrier("agree", 3).reset()
    assert Barrier("agree", 3).broken is False


def test_an_arrival_resent_with_the_same_id_arrives_once():
    barrier = Barrier("resent", 3, timeout=5)
    there = target()
    waiter = f"{runtime.token}.resend"
    args = ["arrive", waiter, 3, 5000, 5000, *there.channel_args("resent")]
    first = there.transport.run(BARRIER_WAIT, barrier.keys(there), args, "arrive")
    again = there.transport.run(BARRIER_WAIT, barrier.keys(there), args, "arrive")
    assert first[:2] == again[:2] == [0, 0]  # waiting, arrival index 0, both times
    assert barrier.n_waiting == 1


def test_a_party_whose_state_was_lost_raises(redis_client):
    barrier = Barrier("flushed", 2, timeout=0.6)  # re-checks every 0.2 s
    thread, out = in_thread(lambda: barrier.wait(20))
    wait_for(lambda: barrier.n_waiting == 1, what="the party")
    redis_client.flushdb()
    error, _ = joined(thread, out, 5.0)
    assert isinstance(error, BrokenBarrierError)
    assert error.reason == "lost"


def test_every_key_of_a_waiting_barrier_expires(redis_client):
    barrier = Barrier("keys", 2, timeout=3)
    thread, out = in_thread(lambda: barrier.wait(20))
    keys = barrier.keys(target())
    wait_for(lambda: redis_client.exists(*keys) == 3, what="state, round and record")
    for key in keys:
        assert 0 < redis_client.pttl(key) <= 3000, key
    assert barrier.wait(5) == 1
    assert joined(thread, out)[0] == 0
    assert redis_client.exists(keys[2]) == 0  # every record was read


def test_a_barrier_across_processes(children):
    procs = [children("barrier", "fleet", 3, 5) for _ in range(2)]
    index = Barrier("fleet", 3, timeout=5).wait(30)
    indices = [last_line(proc)["index"] for proc in procs]
    assert sorted([index, *indices]) == [0, 1, 2]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_party_that_dies_or_stops_breaks_the_barrier_within_its_lease(children, how):
    lease = 2.0
    barrier = Barrier(f"crash-{how}", 3, timeout=lease)
    child = children("barrier", barrier.name, 3, lease)
    wait_for(lambda: barrier.n_waiting == 1, 20.0, what="the child to arrive")
    thread, out = in_thread(lambda: barrier.wait(30))
    wait_for(lambda: barrier.n_waiting == 2, what="this party to arrive")
    child.send_signal(getattr(signal, how))
    stopped = time.monotonic()
    error, at = joined(thread, out, 30.0)
    assert isinstance(error, BrokenBarrierError), error
    assert error.reason == "lease"
    assert at - stopped < lease + 1.0
    assert barrier.broken is True
    if how == "SIGSTOP":  # back from the pause, it learns the barrier broke
        child.send_signal(signal.SIGCONT)
        assert last_line(child)["broken"] == "lease"


def test_a_broken_barrier_error_is_a_lock_error_and_a_threading_one():
    assert issubclass(BrokenBarrierError, LockError)
    assert issubclass(BrokenBarrierError, threading.BrokenBarrierError)
    error = pickle.loads(pickle.dumps(BrokenBarrierError("broken", name="b", reason="lease")))
    assert (str(error), error.name, error.reason) == ("broken", "b", "lease")
    assert str(BrokenBarrierError()) == ""


def test_independent_masters_are_refused(settings):
    settings.REDISLOCK = {"CACHE": ["default", "site2", "builtin"]}
    with pytest.raises(ImproperlyConfigured, match="needs one Redis"):
        CountDownLatch("quorum", 1).count_down()
    with pytest.raises(ImproperlyConfigured, match="needs one Redis"):
        Barrier("quorum", 2).wait(0)


# -- asyncio -----------------------------------------------------------------------------------


def test_the_async_latch():
    async def main() -> None:
        latch = AsyncCountDownLatch("async-latch", 2, timeout=30)
        assert await latch.get_count() == 2
        assert await latch.wait(0) is False
        waiters = [asyncio.create_task(latch.wait(20)) for _ in range(3)]
        await asyncio.sleep(0.3)
        await latch.count_down()
        assert await latch.get_count() == 1
        await latch.count_down()
        done = time.monotonic()
        assert await asyncio.gather(*waiters) == [True, True, True]
        assert time.monotonic() - done < 0.5
        assert await latch.get_count() == 0

    asyncio.run(main())


def test_async_and_blocking_latches_of_one_name_are_one_latch():
    async def main() -> bool:
        return await AsyncCountDownLatch("shared", 1).wait(20)

    thread, out = in_thread(lambda: asyncio.run(main()))
    wait_for(lambda: target().client.zcard(CountDownLatch("shared", 1).keys(target())[1]))
    CountDownLatch("shared", 1).count_down()
    assert joined(thread, out)[0] is True


def test_the_async_barrier():
    async def main() -> None:
        barrier = AsyncBarrier("async-barrier", 3, timeout=5)
        assert barrier.parties == 3
        assert await barrier.get_n_waiting() == 0
        parties = [asyncio.create_task(barrier.wait(20)) for _ in range(3)]
        assert sorted(await asyncio.gather(*parties)) == [0, 1, 2]
        assert await barrier.get_broken() is False
        with pytest.raises(BrokenBarrierError):
            await barrier.wait(0.2)
        assert await barrier.get_broken() is True
        await barrier.reset()
        assert await barrier.get_broken() is False
        waiting = asyncio.create_task(barrier.wait(20))
        await asyncio.sleep(0.3)
        assert await barrier.get_n_waiting() == 1
        await barrier.abort()
        with pytest.raises(BrokenBarrierError):
            await waiting

    asyncio.run(main())


def test_cancelling_an_async_wait_breaks_the_barrier_at_once():
    barrier = Barrier("cancelled", 3, timeout=30)
    other = in_thread(lambda: barrier.wait(20))
    wait_for(lambda: barrier.n_waiting == 1, what="the other party")

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(AsyncBarrier("cancelled", 3, timeout=30).wait(), 0.3)

    asyncio.run(main())
    error, _ = joined(*other, timeout=5.0)
    assert isinstance(error, BrokenBarrierError)
    assert error.reason == "abort"


# -- arguments ---------------------------------------------------------------------------------

HOSTILE_COUNTS = [
    (True, TypeError),
    (1.0, TypeError),
    (math.nan, TypeError),
    (math.inf, TypeError),
    ("3", TypeError),
    (None, TypeError),
    (-1, ValueError),
    (10**9 + 1, ValueError),
    (10**100, ValueError),
]


@pytest.mark.parametrize(("count", "error"), HOSTILE_COUNTS)
@pytest.mark.parametrize("cls", [CountDownLatch, AsyncCountDownLatch, Barrier, AsyncBarrier])
def test_hostile_counts_and_parties_are_refused(cls, count, error):
    with pytest.raises(error, match=r"count|parties"):
        cls("name", count)


@pytest.mark.parametrize("cls", [Barrier, AsyncBarrier])
def test_a_barrier_needs_a_party(cls):
    with pytest.raises(ValueError, match="parties must be between 1 and"):
        cls("name", 0)
    assert cls("name", 10**9).parties == 10**9


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"timeout": math.nan}, ValueError),
        ({"timeout": math.inf}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"timeout": True}, TypeError),
        ({"timeout": "5"}, TypeError),
        ({"using": ""}, TypeError),
        ({"using": 3}, TypeError),
    ],
)
@pytest.mark.parametrize("cls", [CountDownLatch, AsyncCountDownLatch, Barrier, AsyncBarrier])
def test_hostile_options_are_refused(cls, options, error):
    with pytest.raises(error):
        cls("name", 1, **options)


@pytest.mark.parametrize("name", [None, 3, b"x", "", "x" * 5000, "\ud800"])
@pytest.mark.parametrize("cls", [CountDownLatch, Barrier])
def test_hostile_names_are_refused(cls, name):
    with pytest.raises((TypeError, ValueError), match="name"):
        cls(name, 1)


@pytest.mark.parametrize("timeout", [math.nan, -1, True, "1"])
def test_hostile_wait_timeouts_are_refused(timeout):
    with pytest.raises((TypeError, ValueError)):
        CountDownLatch("name", 1).wait(timeout)
    with pytest.raises((TypeError, ValueError)):
        Barrier("name", 2).wait(timeout)
    assert Barrier("name", 2).n_waiting == 0  # nothing arrived


# -- Redis down --------------------------------------------------------------------------------


def test_a_redis_that_does_not_answer_raises_within_the_socket_timeout(redis_factory, settings):
    server = redis_factory().start()
    settings.CACHES = {
        **settings.CACHES,
        "paused": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        },
    }
    latch = CountDownLatch("down", 1, using="paused")
    barrier = Barrier("down", 2, using="paused")
    assert latch.count == 1  # connected once
    server.pause()
    try:
        for call in (latch.count_down, latch.wait, barrier.wait, lambda: barrier.broken):
            started = time.monotonic()
            with pytest.raises(LockBackendError):
                call()
            assert time.monotonic() - started < 3.0
    finally:
        server.resume()


# -- Redis Cluster -----------------------------------------------------------------------------


@pytest.mark.topology
def test_a_latch_and_a_barrier_on_a_redis_cluster(shared_redis_cluster, settings):
    from tests import topology_clients

    topology_clients.current = shared_redis_cluster.client()
    settings.REDISLOCK = {"CLIENT": "tests.topology_clients.client"}
    try:
        latch = CountDownLatch("{cluster}latch", 1, timeout=10)
        waiting = in_thread(lambda: latch.wait(20))
        key = latch.keys(target())[1]
        wait_for(lambda: target().client.zcard(key) == 1, what="the waiter")
        latch.count_down()
        done = time.monotonic()
        opened, at = joined(*waiting)
        assert opened is True
        assert at - done < 0.5
        barrier = Barrier("cluster-barrier", 3, timeout=5)
        parties = [in_thread(lambda: barrier.wait(20)) for _ in range(3)]
        assert sorted(joined(*p)[0] for p in parties) == [0, 1, 2]
    finally:
        topology_clients.current = None


# -- listing: list_locks, the command, the admin ----------------------------------------------


@pytest.mark.django_db
def test_latches_and_barriers_are_listed_with_nothing_to_force_release(django_user_model):
    import io

    from django.contrib.auth.models import Permission
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    from django_redislock import list_locks

    latch = CountDownLatch("listed-latch", 3, timeout=30)
    latch.count_down()
    barrier = Barrier("listed-barrier", 3, timeout=30)
    waiting = in_thread(lambda: barrier.wait(timeout=2))
    wait_for(lambda: barrier.n_waiting == 1, what="a party to arrive")
    infos = {(i.kind, i.name): i for i in list_locks()}
    assert (
        infos[("latch", "listed-latch")].hold_count,
        infos[("latch", "listed-latch")].permits,
    ) == (2, 3)
    assert (
        infos[("barrier", "listed-barrier")].hold_count,
        infos[("barrier", "listed-barrier")].permits,
    ) == (1, 3)
    assert all(i.fencing_token == 0 and not i.owner for i in infos.values())
    out = io.StringIO()
    call_command("redislock", "list", stdout=out)
    assert "listed-latch\tlatch\tleft=2/3" in out.getvalue()
    assert "listed-barrier\tbarrier\twaiting=1/3" in out.getvalue()
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_lock", "force_release_lock"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislock", codename=codename)
        )
    client = Client()
    client.force_login(user)
    html = client.get(reverse("admin:django_redislock_lock_changelist")).content.decode()
    assert "count-down latch: 2 of 3 left" in html
    assert "barrier: 1 of 3 parties waiting" in html
    assert 'value="0:listed-latch"' not in html and 'value="0:listed-barrier"' not in html
    result, _ = joined(*waiting)
    assert isinstance(result, BrokenBarrierError)  # its wait timed out: broken, as threading
