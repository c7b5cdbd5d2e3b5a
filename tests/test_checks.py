"""Bad settings are reported by ``manage.py check`` with ``django_redislock.E...`` ids."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redislock import Lock
from django_redislock.checks import check_eviction_policy, check_settings
from tests.conftest import ROOT, subprocess_env


def ids(messages):
    return sorted(m.id for m in messages)


def test_default_settings_pass(settings):
    assert [m for m in check_settings() if m.level >= 40] == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"CACHE": "nope"}, "django_redislock.E001"),
        ("not a dict", "django_redislock.E002"),
        ({"TIMEOUTT": 3}, "django_redislock.E003"),
        ({"CACHE": ""}, "django_redislock.E004"),
        ({"KEY_PREFIX": "a{b}"}, "django_redislock.E005"),
        ({"TIMEOUT": 0}, "django_redislock.E006"),
        ({"TIMEOUT": -2}, "django_redislock.E006"),
        ({"TIMEOUT": "30"}, "django_redislock.E006"),
        ({"BLOCKING_TIMEOUT": -1}, "django_redislock.E007"),
        ({"AUTO_RENEW": "yes"}, "django_redislock.E008"),
        ({"CACHE": "locmem"}, "django_redislock.E009"),
        ({"TRANSPORT": "fast"}, "django_redislock.E015"),
        ({"TRANSPORT": None}, "django_redislock.E015"),
    ],
)
def test_bad_setting_is_an_error(settings, value, expected):
    settings.REDISLOCK = value
    assert expected in ids(check_settings())


@pytest.mark.parametrize("transport", ["redis-py", "lean"])
def test_both_transports_are_accepted(settings, transport):
    settings.REDISLOCK = {"TRANSPORT": transport}
    assert [m for m in check_settings() if m.level >= 40] == []
    lock = Lock("transport-" + transport)
    assert lock.acquire(blocking=False)
    lock.release()


REDIS_PY_DEFAULT_TIMEOUT = int(redis.__version__.split(".")[0]) >= 8


def with_cache(settings, **config):
    settings.CACHES = {**settings.CACHES, "extra": {"LOCATION": "redis://127.0.0.1:1/0", **config}}
    settings.REDISLOCK = {"CACHE": "extra"}


@pytest.mark.parametrize(
    "backend",
    ["django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache"],
)
def test_no_socket_timeout_warns_only_where_redis_py_applies_none(settings, backend):
    """redis-py 8 gives every connection a 5 s socket timeout; older versions give none."""
    with_cache(settings, BACKEND=backend)
    expected = [] if REDIS_PY_DEFAULT_TIMEOUT else ["django_redislock.W001"]
    assert ids(check_settings()) == expected


def test_no_socket_timeout_in_the_pool_kwargs_warns(settings):
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        OPTIONS={"CONNECTION_POOL_KWARGS": {"socket_timeout": None}},
    )
    assert ids(check_settings()) == ["django_redislock.W001"]


def test_builtin_cache_with_django_redis_spelling_is_an_error(settings):
    """Django's RedisCache passes OPTIONS to redis-py: upper case keys crash at first use."""
    with_cache(
        settings,
        BACKEND="django.core.cache.backends.redis.RedisCache",
        OPTIONS={"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
    )
    messages = check_settings()
    assert ids(messages) == ["django_redislock.E010"]
    hint = messages[0].hint
    assert hint is not None and "socket_timeout" in hint


def test_builtin_cache_with_redis_py_spelling_passes(settings):
    with_cache(
        settings,
        BACKEND="django.core.cache.backends.redis.RedisCache",
        OPTIONS={"socket_connect_timeout": 2, "socket_timeout": 5},
    )
    assert ids(check_settings()) == []


def test_django_redis_with_lower_case_timeouts_warns_they_are_ignored(settings):
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        OPTIONS={"socket_timeout": 5},
    )
    expected = ["django_redislock.W002"]
    if not REDIS_PY_DEFAULT_TIMEOUT:
        expected.insert(0, "django_redislock.W001")
    assert ids(check_settings()) == expected


def test_django_redis_with_upper_case_timeouts_passes(settings):
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        OPTIONS={"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
    )
    assert ids(check_settings()) == []


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-lfu"])
def test_an_evicting_server_is_a_deploy_warning(redis_factory, settings, policy):
    server = redis_factory().start()
    server.client().config_set("maxmemory-policy", policy)
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        LOCATION=f"{server.url}/0",
        OPTIONS={"SOCKET_TIMEOUT": 2},
    )
    messages = check_eviction_policy()
    assert ids(messages) == ["django_redislock.W003"]
    assert policy in messages[0].msg


def test_a_noeviction_server_passes_the_deploy_check(settings):
    assert check_eviction_policy() == []


def test_eviction_check_runs_only_with_deploy(redis_factory, settings):
    server = redis_factory().start()
    server.client().config_set("maxmemory-policy", "allkeys-lru")
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        LOCATION=f"{server.url}/0",
        OPTIONS={"SOCKET_TIMEOUT": 2},
    )
    call_command("check")  # no network, no warning: passes
    with pytest.raises(SystemCheckError, match="W003"):
        call_command("check", deploy=True, fail_level="WARNING")


def test_eviction_check_tolerates_an_unreachable_server(settings):
    with_cache(
        settings,
        BACKEND="django_redis.cache.RedisCache",
        OPTIONS={"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    )
    assert check_eviction_policy() == []


def test_call_command_check_fails_on_bad_settings(settings):
    settings.REDISLOCK = {"CACHE": "locmem"}
    with pytest.raises(SystemCheckError, match="E009"):
        call_command("check")


def test_manage_py_check_exits_non_zero(tmp_path):
    (tmp_path / "bad_settings.py").write_text(
        "from tests.settings import *\nREDISLOCK = {'TIMEOUT': -1}\n"
    )
    env = subprocess_env(DJANGO_SETTINGS_MODULE="bad_settings")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "django_redislock.E006" in proc.stderr


def test_using_a_bad_setting_at_runtime_raises_improperly_configured(settings):
    settings.REDISLOCK = {"TIMEOUT": -1}
    with pytest.raises(ImproperlyConfigured, match="E006"):
        Lock("x").acquire()
