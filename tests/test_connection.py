"""``connection.DirectCommands`` and ``AsyncDirectCommands``: scripts on a kept connection, and
every way that connection can go stale (server closed it, a timeout or a cancellation cut a
reply, settings changed, the process forked)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from redis.connection import BlockingConnectionPool

from django_redislock import AsyncLock, Lock
from django_redislock.connection import (
    AsyncDirectCommands,
    DirectCommands,
    command_runner,
    get_client,
)


@pytest.fixture
def url() -> str:
    return str(settings.CACHES["default"]["LOCATION"])


@pytest.fixture
def bounded(url: str) -> Iterator[redis.Redis]:
    pool = BlockingConnectionPool.from_url(url, max_connections=16, timeout=0.5)
    client = redis.Redis(connection_pool=pool)
    yield client
    pool.disconnect()


def _checkouts(client: Any) -> list[int]:
    """Count the pool's checkouts by this thread from now on (the pool itself is real; the
    statistics flusher and the watchdog use it from threads of their own)."""
    pool = client.connection_pool
    counted = [0]
    original = pool.get_connection
    me = threading.get_ident()

    def counting(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            counted[0] += 1
        return original(*args, **kwargs)

    pool.get_connection = counting
    return counted


def test_the_default_cache_runs_scripts_on_a_kept_connection():
    client = get_client()
    lock = Lock("direct")
    assert isinstance(lock._spec().target.runner, DirectCommands)
    for _ in range(20):  # kept connections earlier tests' CLIENT KILLs closed are replaced
        lock.acquire()
        lock.release()
    counted = _checkouts(client)
    try:
        for _ in range(100):
            lock.acquire()
            lock.release()
    finally:
        del client.connection_pool.get_connection
    assert counted[0] == 0


def test_a_kept_connection_the_server_closed_is_replaced_without_an_error(redis_client):
    lock = Lock("direct-killed")
    lock.acquire()
    lock.release()
    runner = lock._spec().target.runner
    assert runner._idle, "a connection is kept after a cycle"
    killed = redis_client.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
    assert int(killed) >= 1
    lock.acquire()  # the kept connection is dead: one retry through the client itself
    lock.release()
    assert lock.hold_count == 0
    assert redis_client.exists(f"{lock._spec().lock_key}") == 0


def test_an_error_reply_keeps_the_connection_in_sync(bounded):
    runner = DirectCommands(bounded)
    with pytest.raises(redis.ResponseError):
        runner.execute_command("EVALSHA", "0" * 40, 0)
    assert runner.execute_command("PING") in (True, b"PONG", "PONG")
    assert len(runner._idle) == 1


def test_kept_connections_are_bounded_and_go_back_to_the_pool(bounded):
    runner = DirectCommands(bounded)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for i in range(200):
                assert int(runner.execute_command("ECHO", i)) == i
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert 1 <= len(runner._idle) <= 16 // 8
    runner.close()
    assert runner._idle == []
    # Every connection of the pool can be checked out again: none is still kept aside.
    args = runner._checkout_args  # a command name on redis-py < 5.3
    taken = [bounded.connection_pool.get_connection(*args) for _ in range(16)]
    for conn in taken:
        bounded.connection_pool.release(conn)
    runner.execute_command("PING")  # a closed runner still works, but keeps nothing
    assert runner._idle == []


def test_a_settings_change_gives_kept_connections_back():
    lock = Lock("direct-settings")
    lock.acquire()
    lock.release()
    runner = lock._spec().target.runner
    assert isinstance(runner, DirectCommands)
    assert runner._idle
    with override_settings(CACHES=dict(settings.CACHES)):
        assert runner._idle == []
        lock.acquire()
        lock.release()
        assert lock._spec().target.runner is not runner


@pytest.mark.parametrize(
    ("make", "direct"),
    [
        pytest.param(
            lambda url: redis.Redis.from_url(url, single_connection_client=True), False, id="single"
        ),
        pytest.param(lambda url: redis.Redis.from_url(url, protocol=3), False, id="resp3"),
        pytest.param(
            lambda url: redis.sentinel.Sentinel([("127.0.0.1", 1)]).master_for("m"),
            False,
            id="sentinel",
        ),
        pytest.param(lambda url: redis.Redis.from_url(url, max_connections=4), False, id="tiny"),
        pytest.param(lambda url: redis.Redis.from_url(url), True, id="plain"),
    ],
)
def test_only_a_plain_client_on_a_plain_pool_gets_a_direct_path(url, make, direct):
    import redis.sentinel  # noqa: F401

    client = make(url)
    runner = command_runner(client)
    assert isinstance(runner, DirectCommands) is direct
    assert (runner is client) is not direct


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_the_parents_kept_connection():
    lock = Lock("direct-fork")
    lock.acquire()
    lock.release()
    assert lock._spec().target.runner._idle
    pid = os.fork()
    if pid == 0:  # child: its own connections, while the parent keeps using its own
        code = 1
        try:
            for _ in range(300):
                Lock("direct-fork-child").acquire()
                Lock("direct-fork-child").release()
            code = 0
        finally:
            os._exit(code)
    for _ in range(300):
        lock.acquire()
        lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reusing_the_parents_names_and_lock_objects_has_its_own_connections():
    # Keys and targets are cached per name across lock objects (engine._specs): a child must
    # not be handed the parent's target, nor use the kept connections of a lock made before.
    lock = Lock("direct-fork-same")
    lock.acquire()
    lock.release()
    parent_runner = lock._spec().target.runner
    assert parent_runner._idle
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fresh = Lock("direct-fork-same")
            own = fresh._spec().target.runner is not parent_runner and not parent_runner._idle
            for _ in range(300):
                fresh.acquire()
                fresh.release()
                lock.acquire()  # made before the fork
                lock.release()
            code = 0 if own else 2
        finally:
            os._exit(code)
    for _ in range(300):
        lock.acquire()
        lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_timeout_is_not_repeated_and_leaves_nothing_unread(url):
    client = redis.Redis.from_url(url, socket_timeout=0.3)
    runner = command_runner(client)
    assert isinstance(runner, DirectCommands)
    runner.execute_command("PING")
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        runner.execute_command("BLPOP", "direct:nothing", 1)  # answers after 1 s
    assert time.monotonic() - started < 0.6  # one socket timeout, not one per attempt
    assert runner._idle == []
    assert runner.execute_command("PING") == b"PONG"  # not the late BLPOP reply
    client.connection_pool.disconnect()


def test_the_async_face_runs_scripts_on_a_kept_connection():
    async def main() -> tuple[int, Any]:
        lock = AsyncLock("direct-async")
        await lock.acquire()
        await lock.release()
        runner = await lock._arunner()
        counted = _checkouts(runner.client)
        for _ in range(100):
            await lock.acquire()
            await lock.release()
        return counted[0], runner

    checkouts, runner = asyncio.run(main())
    assert isinstance(runner, AsyncDirectCommands)
    assert checkouts == 0


def test_an_async_command_cancelled_mid_reply_leaves_no_connection_out_of_sync(redis_client):
    async def main() -> list[Any]:
        lock = AsyncLock("direct-async-cancel")
        await lock.acquire()
        await lock.release()
        runner = await lock._arunner()
        assert runner._idle
        # The kept connection is killed while idle: the next command still succeeds.
        redis_client.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
        await lock.acquire()
        await lock.release()
        task = asyncio.ensure_future(runner.execute_command("BLPOP", "direct:nothing", 1))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        replies = [await runner.execute_command("PING") for _ in range(3)]
        await lock.acquire()
        replies.append(lock.hold_count)
        await lock.release()
        return replies

    assert asyncio.run(main()) == [b"PONG", b"PONG", b"PONG", 1]


def test_a_due_health_check_runs_before_the_command_on_a_kept_connection(url):
    client = redis.Redis.from_url(url, health_check_interval=1)
    runner = command_runner(client)
    assert isinstance(runner, DirectCommands)
    assert runner.execute_command("ECHO", "first") == b"first"
    kept = runner._idle[0]
    time.sleep(1.1)  # the kept connection's health check is due: PING, then our command
    assert runner.execute_command("ECHO", "second") == b"second"
    assert runner._idle == [kept]
    assert kept.next_health_check > time.monotonic()
    client.connection_pool.disconnect()


def test_the_direct_path_packs_exactly_as_redis_py():
    """Scripts on kept connections are packed by hiredis directly (no per-argument pass of
    redis-py's packer) into the very bytes redis-py sends; other argument types keep redis-py's
    packer."""
    pytest.importorskip("hiredis")
    from redis.connection import Connection

    from django_redislock.connection import _pack

    class NotPackedHere(Connection):
        def pack_command(self, *args: Any) -> list[bytes]:
            raise AssertionError("redis-py's packer was used")

    conn, bypassed = Connection(), NotPackedHere()
    for args in (
        ("EVALSHA", "a" * 40, 3, "k:1", "k:2", "k:3", "owner-1", 60000, '{"m":"é"}', ""),
        ("SCRIPT LOAD", "return 1"),
        (b"SCRIPT LOAD", b"return 1"),
        ("SET", b"\x00\xff", -1),
    ):
        assert b"".join(_pack(bypassed, args)) == b"".join(conn.pack_command(*args))
    others: list[tuple[Any, ...]] = [("SET", "k", 1.5), ("SET", "k", bytearray(b"v"))]
    others.append(("SET", "k", memoryview(b"v")))
    for other in others:  # types hiredis would pack differently: redis-py's packer
        try:
            expected = b"".join(conn.pack_command(*other))
        except redis.DataError:  # redis-py < 5.1 packs no memoryview with hiredis: nor do we
            with pytest.raises(redis.DataError):
                _pack(conn, other)
            continue
        assert b"".join(_pack(conn, other)) == expected
        with pytest.raises(AssertionError):
            _pack(bypassed, other)


# -- the lean round trip (straight on the socket and the hiredis reader) ---------------------------


def test_the_default_pool_gets_the_lean_round_trip_and_others_keep_redis_pys(url):
    pytest.importorskip("hiredis")
    from redis.connection import Connection

    class Subclassed(Connection):
        pass

    plain = DirectCommands(redis.Redis.from_url(url))
    assert plain._lean_pack is not None
    checked = DirectCommands(redis.Redis.from_url(url, health_check_interval=30))
    assert checked._lean_pack is None  # its health checks are redis-py's
    pool = redis.ConnectionPool.from_url(url, connection_class=Subclassed)
    assert DirectCommands(redis.Redis(connection_pool=pool))._lean_pack is None


def test_the_reader_answers_what_the_lean_round_trip_waits_for(url):
    """An empty reader answers redis-py's "not enough data" value (the sentinel changed within
    redis-py 5.0): were it another, the lean round trip would return it as a reply."""
    pytest.importorskip("hiredis")
    from django_redislock.connection import _PENDING

    client = redis.Redis.from_url(url)
    conn = client.connection_pool.get_connection(*DirectCommands(client)._checkout_args)
    try:
        conn.connect()
        assert conn._parser._reader.gets() is _PENDING
    finally:
        client.connection_pool.release(conn)
        client.connection_pool.disconnect()


@pytest.fixture(params=["lean", "redis-py"])
def runner(request: Any, url: str) -> Iterator[DirectCommands]:
    """A direct runner with either round trip: both must behave alike."""
    client = redis.Redis.from_url(url, socket_timeout=0.5)
    found = DirectCommands(client)
    if request.param == "lean":
        if found._lean_pack is None:
            pytest.fail("the lean round trip is not used with hiredis installed")
    else:
        found._lean_pack = None
    yield found
    found.close()
    client.connection_pool.disconnect()


def test_a_reply_larger_than_one_read_arrives_whole(runner):
    big = "x" * (3 * 65536 + 17)  # several reads of the parser's 64 KiB buffer
    assert runner.execute_command("ECHO", big) == big.encode()
    assert runner.execute_command("ECHO", "next") == b"next"  # nothing left unread
    assert len(runner._idle) == 1


def test_an_error_reply_raises_its_own_class_and_keeps_the_connection(runner):
    with pytest.raises(redis.exceptions.NoScriptError):
        runner.execute_command("EVALSHA", "0" * 40, 0)
    with pytest.raises(redis.ResponseError, match="boom"):
        runner.execute_command("EVAL", "return redis.error_reply('ERR boom')", 0)
    kept = runner._idle[0]
    assert runner.execute_command("PING") == b"PONG"
    assert runner._idle == [kept]


def test_a_connection_error_reply_drops_the_connection(runner):
    """``LOADING`` is a connection error in redis-py (``BusyLoadingError``): the connection
    is disconnected and given back, not kept."""
    runner.execute_command("PING")
    kept = runner._idle[0]
    with pytest.raises(redis.exceptions.BusyLoadingError):
        runner.execute_command("EVAL", "return redis.error_reply('LOADING fake')", 0)
    assert kept not in runner._idle
    assert runner.execute_command("PING") == b"PONG"


def test_a_read_timeout_disconnects_with_redis_pys_message(runner):
    runner.execute_command("PING")
    kept = runner._idle[0]
    with pytest.raises(redis.TimeoutError, match=r"^Timeout reading from "):
        runner.execute_command("BLPOP", "direct:lean:nothing", 2)
    assert runner._idle == []
    assert kept._sock is None  # disconnected: the late reply can never be read as ours
    assert runner.execute_command("ECHO", "after") == b"after"


def test_a_connection_the_server_closed_is_retried_through_the_client(runner, redis_client):
    runner.execute_command("CLIENT", "SETNAME", "lean-kill-me")
    redis_client.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
    assert runner.execute_command("ECHO", "again") == b"again"  # one retry, through the client


# -- the lean pub/sub reader (the wake-up listener's reads) ----------------------------------------

CHANNEL = "lean:pubsub"


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def subscribed(request: Any, url: str) -> Iterator[tuple[redis.Redis, Any]]:
    """A client (RESP2 or RESP3) and a pub/sub of it subscribed to :data:`CHANNEL`."""
    pytest.importorskip("hiredis")
    client = redis.Redis.from_url(url, protocol=request.param)
    pubsub = client.pubsub()
    pubsub.subscribe(CHANNEL)
    deadline = time.monotonic() + 5
    while (m := pubsub.get_message(timeout=1.0)) is None or m["type"] != "subscribe":
        assert time.monotonic() < deadline, "no subscribe confirmation"
    yield client, pubsub
    pubsub.reset()
    client.close()


def test_only_plain_hiredis_connections_get_the_lean_pubsub_reader(url):
    pytest.importorskip("hiredis")
    from redis.connection import Connection

    from django_redislock.connection import pubsub_reader

    class Subclassed(Connection):
        pass

    def reader_of(client: redis.Redis) -> Any:
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(CHANNEL)
            return pubsub_reader(pubsub)
        finally:
            pubsub.reset()
            client.close()

    assert reader_of(redis.Redis.from_url(url, protocol=2)) is not None
    assert reader_of(redis.Redis.from_url(url, protocol=3)) is not None
    assert reader_of(redis.Redis.from_url(url, health_check_interval=30)) is None
    pool = redis.ConnectionPool.from_url(url, connection_class=Subclassed)
    assert reader_of(redis.Redis(connection_pool=pool)) is None
    assert pubsub_reader(redis.Redis.from_url(url).pubsub()) is None  # not subscribed yet


def test_the_lean_pubsub_reader_reads_messages_whole_in_order_then_times_out(subscribed):
    from django_redislock.connection import MESSAGE_KINDS, pubsub_reader

    client, pubsub = subscribed
    read = pubsub_reader(pubsub)
    assert read is not None
    sent = ["h a.1 5", "x" * (3 * 65536 + 5), "r b.2 0"]  # the middle one: several reads
    for data in sent:
        assert client.publish(CHANNEL, data) == 1
    replies = [read(2.0) for _ in sent]
    assert [r[0] in MESSAGE_KINDS for r in replies] == [True] * 3
    assert [(r[1], r[2]) for r in replies] == [(CHANNEL.encode(), d.encode()) for d in sent]
    started = time.monotonic()
    assert read(0.2) is None  # nothing more: the timeout, not a hang
    assert 0.15 <= time.monotonic() - started < 1.5
    pubsub.ping()
    assert read(2.0) is not None  # the pong (a list in RESP2, b"PONG" in RESP3)
    assert client.publish(CHANNEL, "after") == 1
    assert read(2.0)[2] == b"after"


def test_the_lean_pubsub_reader_raises_when_the_server_closes_the_connection(
    subscribed, redis_client
):
    from django_redislock.connection import pubsub_reader

    _, pubsub = subscribed
    read = pubsub_reader(pubsub)
    assert read is not None
    assert redis_client.client_kill_filter(_type="pubsub") >= 1
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        read(5.0)
    assert time.monotonic() - started < 2.0


def test_the_lean_pubsub_reader_hands_other_pushes_to_redis_py(url):
    """A RESP3 push that is not a message (here an invalidation) reaches redis-py's push
    handler, as through ``get_message``; the listener then ignores it."""
    pytest.importorskip("hiredis")
    from django_redislock.connection import pubsub_reader

    client = redis.Redis.from_url(url, protocol=3)
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(CHANNEL)
        read = pubsub_reader(pubsub)
        assert read is not None and read(2.0)[0] == b"subscribe"
        parser = pubsub.connection._parser
        seen: list[Any] = []
        handles = hasattr(parser, "invalidation_push_handler_func")
        if handles:
            parser.invalidation_push_handler_func = seen.append
        parser._reader.feed(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n")
        reply = read(2.0)
        assert list(reply) == [b"invalidate", [b"k"]]
        assert seen == ([reply] if handles else [])
    finally:
        pubsub.reset()
        client.close()
