"""``django_redislock.testing``: the helpers users test their locking code with, on real Redis.

The plain functions run here against the suite's server; the pytest plugin runs in a pytest of
its own (``pytester``, in a subprocess: one process cannot host two pytest-django sessions) on a
tiny project whose settings point the lock cache at a closed port, so only the plugin's private
server can make its tests pass.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings

from django_redislock import Lock, Semaphore
from django_redislock.conf import get_settings
from django_redislock.runtime import get_client, keyspace, runtime
from django_redislock.testing import (
    ENV_VAR,
    assert_locked,
    assert_not_locked,
    find_redis_server,
    flush_locks,
    held_by,
    lock_cache_settings,
    override_lock_cache,
)
from django_redislock.testing.cache import TEST_ALIAS, lock_cache_entry
from tests.conftest import ROOT

pytest_plugins = ["pytester"]


# -- flush_locks ---------------------------------------------------------------------------------


def test_flush_locks_deletes_the_lock_namespace_and_nothing_else(redis_client):
    Lock("report:1", timeout=10).acquire()
    Semaphore("pool", 2, timeout=10).acquire()
    Lock("report:1", timeout=10, using="site2").acquire()  # same database, another site
    caches["default"].set("cached", 1)
    redis_client.set("not-ours", 1)
    redis_client.set("redislockish", 1)  # shares the namespace's first letters only

    deleted = flush_locks()

    assert deleted >= 4  # lock + fence, semaphore + records + fence
    assert not [k for k in redis_client.scan_iter(match="redislock:*")]
    assert caches["default"].get("cached") == 1
    assert redis_client.get("not-ours") == b"1"
    assert redis_client.get("redislockish") == b"1"
    assert held_by("report:1", using="site2") is not None
    assert held_by("report:1") is None


def test_flush_locks_treats_glob_characters_of_a_cache_prefix_literally(redis_client):
    caches_setting = {**settings.CACHES, "globby": {**settings.CACHES["bare"], "KEY_PREFIX": "s*"}}
    with override_settings(CACHES=caches_setting):
        Lock("a", timeout=10, using="globby").acquire()
        redis_client.set("sX:redislock:lock:{a}", 1)  # an unescaped "s*:redislock:*" matches it
        assert flush_locks(using="globby") >= 1
        assert held_by("a", using="globby") is None
    assert redis_client.get("sX:redislock:lock:{a}") == b"1"


def test_flush_locks_with_using_flushes_that_alias_only():
    Lock("a", timeout=10).acquire()
    Lock("a", timeout=10, using="site2").acquire()
    flush_locks(using="site2")
    assert held_by("a", using="site2") is None
    assert held_by("a") is not None


def test_flush_locks_makes_this_process_forget_its_holds_of_that_namespace():
    mine = Lock("held", timeout=10)
    mine.acquire()
    other_site = Lock("held", timeout=10, using="site2")
    other_site.acquire()
    flush_locks()
    names = {(hold.name, hold.ident[1].split(":")[0]) for hold in runtime.holds.all()}
    assert ("held", "redislock") not in names  # the watchdog will not report it lost
    assert ("held", "site2") in names


# -- held_by / assert_locked / assert_not_locked --------------------------------------------------


def test_held_by_is_the_holder_or_none():
    assert held_by("invoice:1") is None
    with Lock("invoice:1", timeout=10) as lock:
        info = held_by("invoice:1")
        assert info is not None
        assert info.owner == lock.owner
        assert info.fencing_token == lock.fencing_token
        assert info.pid == os.getpid()
    assert held_by("invoice:1") is None


def test_names_are_encoded_like_lock_does_braces_and_globs_included():
    name = "a{b}%c*[x]"
    with Lock(name, timeout=10):
        assert held_by(name) is not None
        assert_locked(name)
        assert_not_locked("a{b}%c")
        assert held_by("a*") is None  # a name, not a pattern


def test_assert_locked_returns_the_holder_and_accepts_a_lock_or_an_owner():
    with Lock("report:7", timeout=10) as lock:
        assert assert_locked("report:7").owner == lock.owner
        assert assert_locked("report:7", by=lock).fencing_token == lock.fencing_token
        assert_locked("report:7", by=lock.owner)


def test_assert_locked_by_a_task_id():
    task_lock = Lock("sync:1", timeout=10, owner="task-123", task_id="task-123")
    task_lock.acquire()
    assert_locked("sync:1", by="task-123")


def test_assert_locked_failure_lists_what_is_held():
    with (
        Lock("report:8", timeout=10),
        Lock("invoice:{9}", timeout=10),
        pytest.raises(AssertionError) as failure,
    ):
        assert_locked("report:7")
    message = str(failure.value)
    assert message.startswith("Lock 'report:7' is not held. Held now:")
    assert "'report:8': " in message and "'invoice:{9}': " in message
    assert f"pid {os.getpid()}" in message


def test_assert_locked_failure_says_when_nothing_is_held():
    with pytest.raises(AssertionError, match=r"^Lock 'x' is not held\. No lock is held at all\."):
        assert_locked("x")


def test_assert_locked_by_the_wrong_owner_names_the_real_holder():
    with Lock("report:7", timeout=10) as lock, pytest.raises(AssertionError) as failure:
        assert_locked("report:7", by="task-999")
    message = str(failure.value)
    assert "Lock 'report:7' is held, but not by 'task-999': held by " in message
    assert repr(lock.owner) in message


def test_assert_not_locked_says_who_holds_it():
    assert_not_locked("report:7")
    with Lock("report:7", timeout=10) as lock, pytest.raises(AssertionError) as failure:
        assert_not_locked("report:7")
    message = str(failure.value)
    assert message.startswith("Lock 'report:7' is held by ")
    assert f"fencing token {lock.fencing_token}" in message and "expires in" in message


def test_semaphore_permits_count_as_holders():
    with Semaphore("pool", 2, timeout=10, owner="worker-a"):
        assert_locked("pool", by="worker-a")
        with pytest.raises(AssertionError, match="held by"):
            assert_not_locked("pool")


def test_names_are_checked_like_lock_names():
    with pytest.raises(TypeError):
        held_by(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        assert_locked("")


# -- pointing the locks at another server ------------------------------------------------------


def test_override_lock_cache_moves_the_locks_and_back(redis_client):
    url = os.environ["REDISLOCK_TEST_REDIS_URL"]
    other_db = redis.Redis.from_url(f"{url}/5")
    other_db.set("redislock:lock:{stale}", "left by an earlier run")
    try:
        with override_lock_cache(url, db=5) as aliases:
            assert aliases == ["default"]
            assert other_db.get("redislock:lock:{stale}") is None  # flushed on entry
            with Lock("moved", timeout=10):
                assert other_db.exists(keyspace().lock("moved"))
                assert not redis_client.exists(keyspace().lock("moved"))
                assert_locked("moved")
            Lock("left-held", timeout=10).acquire()
        assert not other_db.keys("redislock:*")  # flushed on exit
        assert get_client().connection_pool.connection_kwargs["db"] == 0
        assert held_by("moved") is None
    finally:
        other_db.flushdb()
        other_db.close()


def test_lock_cache_entry_keeps_the_projects_configuration_but_the_location():
    original = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://prod:6379/0",
        "KEY_PREFIX": "site",
        "OPTIONS": {
            "SOCKET_TIMEOUT": 5,
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "SENTINELS": [("sentinel", 26379)],
        },
    }
    entry = lock_cache_entry(original, "redis://127.0.0.1:7000/0")
    assert entry == {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:7000/0",
        "KEY_PREFIX": "site",
        "OPTIONS": {"SOCKET_TIMEOUT": 5},
    }
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "KEY_PREFIX": "x"}
    assert lock_cache_entry(locmem, "redis://h:1/2") == {
        "BACKEND": "django_redis.cache.RedisCache",
        "KEY_PREFIX": "x",
        "LOCATION": "redis://h:1/2",
    }


def test_lock_cache_settings_give_redlock_masters_a_database_each():
    with override_settings(REDISLOCK={"CACHE": ["default", "bare"]}):
        overrides, aliases = lock_cache_settings("redis://h:1", extra_aliases=["site2"])
    assert aliases == ["default", "bare", "site2"]
    locations = [overrides["CACHES"][a]["LOCATION"] for a in aliases]
    assert locations == ["redis://h:1/0", "redis://h:1/1", "redis://h:1/2"]
    assert "REDISLOCK" not in overrides


def test_lock_cache_settings_replace_a_client_callable_and_replicas():
    with override_settings(REDISLOCK={"CLIENT": "myproject.locks.client", "REPLICAS": 1}):
        overrides, aliases = lock_cache_settings("redis://h:1")
    assert aliases == [TEST_ALIAS]
    assert overrides["REDISLOCK"] == {"CACHE": TEST_ALIAS, "REPLICAS": 0}
    assert overrides["CACHES"][TEST_ALIAS]["LOCATION"] == "redis://h:1/0"
    assert "redis://h:1" not in overrides["CACHES"]["default"]["LOCATION"]  # not a lock alias


def test_override_lock_cache_with_a_client_callable_uses_a_cache_alias():
    url = os.environ["REDISLOCK_TEST_REDIS_URL"]
    with (
        override_settings(REDISLOCK={"CLIENT": "tests.topology_clients.client"}),
        override_lock_cache(url, db=6),
    ):
        assert not get_settings().client
        with Lock("via-client", timeout=10):
            assert_locked("via-client")
            assert get_client().connection_pool.connection_kwargs["db"] == 6


def test_the_testing_package_imports_without_pytest_and_without_settings():
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import django_redislock.testing as t\n"
        "assert 'django.test' not in sys.modules, 'django.test imported eagerly'\n"
        "print(sorted(t.__all__))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert "assert_locked" in out.stdout and "override_lock_cache" in out.stdout


# -- the pytest plugin, in a pytest of its own -----------------------------------------------------

INNER_SETTINGS = """
SECRET_KEY = "inner"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_redislock",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# Port 1 is closed: only the plugin's private server can make a lock work.
CACHES = {
    "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
}
"""

INNER_TESTS = """
import os

from django.conf import settings

from django_redislock import Lock
from django_redislock.testing import assert_locked, assert_not_locked, flush_locks, held_by


def test_locks_work_on_the_private_server(redislock, redislock_server):
    assert settings.CACHES["default"]["LOCATION"] == redislock_server.url + "/0"
    with Lock("report:7") as lock:
        assert_locked("report:7", by=lock)
        redislock.assert_locked("report:7")
        assert held_by("report:7").fencing_token == lock.fencing_token
    assert_not_locked("report:7")
    with open("server.pid", "w") as f:
        f.write(str(redislock_server.pid))
    with open("server.binary", "w") as f:
        f.write(redislock_server.binary)


def test_leaves_a_lock_held(redislock):
    Lock("left:over").acquire()
    redislock.assert_locked("left:over")


def test_the_next_test_starts_clean(redislock):
    redislock.assert_not_locked("left:over")


def test_a_test_without_the_fixture_keeps_the_settings():
    assert settings.CACHES["default"]["LOCATION"] == "redis://127.0.0.1:1/0"


def test_flush_locks_drops_what_is_held(redislock):
    Lock("to:flush").acquire()
    assert flush_locks() >= 1
    assert held_by("to:flush") is None


def test_a_wrong_assertion_fails_with_what_is_held(redislock):
    with Lock("report:8"):
        assert_locked("report:7")


def test_assert_not_locked_fails_while_held(redislock):
    with Lock("report:9"):
        assert_not_locked("report:9")


def test_assert_locked_by_the_wrong_owner_fails(redislock):
    with Lock("report:10"):
        redislock.assert_locked("report:10", by="task-999")
"""


@pytest.fixture
def inner_project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(inner_settings=INNER_SETTINGS)
    pytester.makeconftest('pytest_plugins = ["django_redislock.testing.pytest_plugin"]\n')
    pytester.makeini("[pytest]\npythonpath = .\n")
    return pytester


def test_the_plugin_runs_a_users_tests_on_a_private_server(inner_project, monkeypatch):
    binary = find_redis_server()
    monkeypatch.setenv(ENV_VAR, binary)  # the plugin finds its server like everything else
    inner_project.makepyfile(test_user=INNER_TESTS)
    result = inner_project.runpytest_subprocess("--ds=inner_settings", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_a_wrong_assertion_fails_with_what_is_held*",
            "E * AssertionError: Lock 'report:7' is not held. Held now:",
            "E *'report:8': * pid *, fencing token * (owner '*', expires in *",
            "*test_assert_not_locked_fails_while_held*",
            "E * AssertionError: Lock 'report:9' is held by *",
            "*test_assert_locked_by_the_wrong_owner_fails*",
            "E * AssertionError: Lock 'report:10' is held, but not by 'task-999': held by *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "FAILED test_user.py::test_a_wrong_assertion_fails_with_what_is_held*",
            "FAILED test_user.py::test_assert_not_locked_fails_while_held*",
            "FAILED test_user.py::test_assert_locked_by_the_wrong_owner_fails*",
        ]
    )
    assert (inner_project.path / "server.binary").read_text() == binary
    pid = int((inner_project.path / "server.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_plugin_is_inert_unless_a_test_asks_for_it(inner_project):
    inner_project.makepyfile(
        test_plain="""
        from django.conf import settings

        def test_nothing_is_started_or_changed():
            assert settings.CACHES["default"]["LOCATION"] == "redis://127.0.0.1:1/0"
            import django_redislock.testing.pytest_plugin as plugin
            assert plugin.redislock_server
        """
    )
    result = inner_project.runpytest_subprocess(
        "--ds=inner_settings", "-p", "no:cacheprovider", "--setup-show"
    )
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*redislock_server*")
