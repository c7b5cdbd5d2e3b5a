"""Bad settings are reported by ``manage.py check`` with ``django_redislock.E...`` ids."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

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
        ({"FUNCTIONS": 1}, "django_redislock.E008"),
        ({"CACHE": "locmem"}, "django_redislock.E009"),
        ({"TRANSPORT": "fast"}, "django_redislock.E015"),
        ({"TRANSPORT": None}, "django_redislock.E015"),
        ({"DURABILITY": 1}, "django_redislock.E016"),
        ({"DURABILITY": {"replica": 1}}, "django_redislock.E016"),
        ({"DURABILITY": {"replicas": -1}}, "django_redislock.E016"),
        ({"DURABILITY": {"replicas": 1.5}}, "django_redislock.E016"),
        ({"DURABILITY": {"replicas": True}}, "django_redislock.E016"),
        ({"DURABILITY": {"aof_local": 2}}, "django_redislock.E016"),
        ({"DURABILITY": {"aof_replicas": 101}}, "django_redislock.E016"),
        ({"DURABILITY": {"timeout": float("nan")}}, "django_redislock.E016"),
        ({"DURABILITY": {"timeout": float("inf")}}, "django_redislock.E016"),
        ({"DURABILITY": {"timeout": "1"}}, "django_redislock.E016"),
        ({"DURABILITY": {"timeout": 0}}, "django_redislock.E016"),
        ({"DURABILITY": {"replicas": 1}, "REPLICAS": 1}, "django_redislock.E017"),
    ],
)
def test_bad_setting_is_an_error(settings, value, expected):
    settings.REDISLOCK = value
    assert expected in ids(check_settings())


@pytest.mark.parametrize(
    "durability",
    [None, {}, {"replicas": 1}, {"aof_local": 1, "aof_replicas": 2, "replicas": 2, "timeout": 2}],
)
def test_durability_values_are_accepted(settings, durability):
    from django_redislock.conf import get_settings

    settings.REDISLOCK = {"DURABILITY": durability}
    assert [m for m in check_settings() if m.level >= 40] == []
    resolved = get_settings()
    expected = durability or {}
    assert (resolved.replicas, resolved.aof_local, resolved.aof_replicas) == (
        expected.get("replicas", 0),
        expected.get("aof_local", 0),
        expected.get("aof_replicas", 0),
    )


def test_replicas_is_the_shorthand_of_durability(settings):
    from django_redislock.conf import get_settings

    settings.REDISLOCK = {"REPLICAS": 2, "REPLICAS_TIMEOUT": 0.5}
    resolved = get_settings()
    assert (resolved.replicas, resolved.replicas_timeout, resolved.aof_local) == (2, 0.5, 0)


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


# -- issue 29: traps in the defaults ---------------------------------------------------------------
def lock_cache(settings, alias="extra", **config):
    """Point the locks at ``CACHES[alias]`` (a Redis that is never reached by the checks)."""
    settings.CACHES = {
        **settings.CACHES,
        alias: {"BACKEND": "django_redis.cache.RedisCache", **config},
    }
    settings.REDISLOCK = {"CACHE": alias}


def test_locks_in_the_default_cache_warn_that_cache_clear_drops_them(settings):
    """The smallest documented setup: a bare CACHES["default"] and no REDISLOCK."""
    settings.CACHES = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://h:6379/0"}
    }
    settings.REDISLOCK = {}
    [message] = [m for m in check_settings() if m.id == "django_redislock.W005"]
    assert "Django's default cache" in message.msg and "cache.clear()" in message.msg
    assert "REDISLOCK = {'CACHE': 'locks'}" in str(message.hint)
    assert "SILENCED_SYSTEM_CHECKS" in str(message.hint)


def test_a_lock_alias_sharing_a_database_with_another_cache_warns(settings):
    lock_cache(settings, LOCATION="redis://cache.example:6379/4")
    settings.CACHES = {
        **settings.CACHES,
        "sessions": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://cache.example:6379?db=4",  # the same database, spelled otherwise
        },
    }
    [message] = [m for m in check_settings() if m.id == "django_redislock.W005"]
    assert "CACHES['sessions']" in message.msg


@pytest.mark.parametrize(
    "other", ["redis://cache.example:6379/5", "redis://other.example:6379/4", None]
)
def test_a_lock_alias_with_a_database_of_its_own_passes(settings, other):
    lock_cache(settings, LOCATION="redis://cache.example:6379/4")
    if other is not None:
        settings.CACHES = {
            **settings.CACHES,
            "sessions": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": other},
        }
    assert "django_redislock.W005" not in ids(check_settings())


def test_the_shared_cache_warning_can_be_silenced(settings):
    settings.REDISLOCK = {}
    settings.SILENCED_SYSTEM_CHECKS = ["django_redislock.W005"]
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "W005" not in out.getvalue() + err.getvalue()
    assert "1 silenced" in out.getvalue() + err.getvalue()


def test_an_unknown_redislock_key_suggests_the_right_one(settings):
    settings.REDISLOCK = {"TIMOUT": 3}
    [message] = [m for m in check_settings() if m.id == "django_redislock.E003"]
    assert "TIMOUT (did you mean TIMEOUT?)" in message.msg


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("socket_timout", "socket_timeout"), ("SOCKET_TIMEOUT", "socket_timeout")],
)
def test_builtin_cache_options_redis_py_does_not_accept_are_an_error(settings, key, suggestion):
    """A lower-case typo passed `check` and crashed the first call with redis-py's TypeError."""
    lock_cache(
        settings,
        BACKEND="django.core.cache.backends.redis.RedisCache",
        LOCATION="redis://127.0.0.1:1/0",
        OPTIONS={key: 5},
    )
    [message] = check_settings()
    assert message.id == "django_redislock.E010"
    assert f"{key!r} (did you mean {suggestion!r}?)" in message.msg


def test_builtin_cache_accepts_every_redis_py_and_django_option(settings):
    lock_cache(
        settings,
        BACKEND="django.core.cache.backends.redis.RedisCache",
        LOCATION="redis://127.0.0.1:1/0",
        OPTIONS={
            "socket_timeout": 5,
            "socket_connect_timeout": 2,
            "max_connections": 20,
            "db": 3,
            "health_check_interval": 30,
            "retry_on_timeout": True,
            "ssl_cert_reqs": None,
            "parser_class": "redis.connection.DefaultParser",
            "pool_class": "redis.BlockingConnectionPool",
            "timeout": 5,  # a BlockingConnectionPool's wait for a free connection
            "serializer": "django.core.cache.backends.redis.RedisSerializer",
        },
    )
    assert [m.id for m in check_settings() if m.id != "django_redislock.W005"] == []


def test_django_redis_pool_kwargs_redis_py_does_not_accept_are_an_error(settings):
    lock_cache(
        settings,
        LOCATION="redis://127.0.0.1:1/0",
        OPTIONS={"SOCKET_TIMEOUT": 5, "CONNECTION_POOL_KWARGS": {"max_conections": 10}},
    )
    [message] = check_settings()
    assert message.id == "django_redislock.E010"
    assert "'max_conections' (did you mean 'max_connections'?)" in message.msg


def test_django_redis_options_it_does_not_read_warn_with_a_suggestion(settings):
    lock_cache(
        settings,
        LOCATION="redis://127.0.0.1:1/0",
        OPTIONS={"SOCKET_TIMOUT": 5, "SOCKET_CONNECT_TIMEOUT": 2, "max_connections": 10},
    )
    found = [m for m in check_settings() if m.id == "django_redislock.W006"]
    assert len(found) == 1
    assert "'SOCKET_TIMOUT' (did you mean 'SOCKET_TIMEOUT'?)" in found[0].msg
    assert "CONNECTION_POOL_KWARGS" in str(found[0].hint)  # where max_connections belongs


def test_django_redis_with_a_client_class_of_another_package_is_not_second_guessed(settings):
    lock_cache(
        settings,
        LOCATION="redis://127.0.0.1:1/0",
        OPTIONS={"SOCKET_TIMEOUT": 5, "CLIENT_CLASS": "myproject.Client", "MY_OPTION": 1},
    )
    assert "django_redislock.W006" not in ids(check_settings())


@pytest.mark.parametrize(
    ("backend", "options", "expected"),
    [
        (
            "django.core.cache.backends.redis.RedisCache",
            {"socket_timout": 5},
            "'socket_timout' (did you mean 'socket_timeout'?)",
        ),
        (
            "django.core.cache.backends.redis.RedisCache",
            {"SOCKET_TIMEOUT": 5},
            "'SOCKET_TIMEOUT' (did you mean 'socket_timeout'?)",
        ),
        (
            "django_redis.cache.RedisCache",
            {"CONNECTION_POOL_KWARGS": {"socket_timout": 5}},
            "'socket_timout' (did you mean 'socket_timeout'?)",
        ),
    ],
)
def test_options_redis_py_does_not_accept_fail_at_first_use_with_the_check_id(
    settings, backend, options, expected
):
    """Where checks do not run (a shell, a worker, an ASGI app): not redis-py's TypeError from
    deep inside the package, but the check's id and the right spelling."""
    lock_cache(
        settings,
        alias="typo",
        BACKEND=backend,
        LOCATION=settings.CACHES["default"]["LOCATION"],
        OPTIONS=options,
    )
    with pytest.raises(ImproperlyConfigured) as excinfo:
        Lock("typo-at-first-use").acquire()
    text = str(excinfo.value)
    assert text.startswith("django_redislock.E010: ") and expected in text
    assert "\n" not in text


def without_the_app(settings_module):
    from django.test import override_settings

    apps = [a for a in settings_module.INSTALLED_APPS if a != "django_redislock"]
    return override_settings(INSTALLED_APPS=apps)


def test_a_lock_without_the_app_in_installed_apps_says_what_is_missing(settings):
    with without_the_app(settings), pytest.raises(ImproperlyConfigured) as excinfo:
        Lock("not-installed").acquire()
    assert "django_redislock is not in INSTALLED_APPS" in str(excinfo.value)
    lock = Lock("installed-again")  # and the settings are read anew once it is back
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_guarded_command_without_the_app_ends_with_one_line_naming_installed_apps(settings):
    from tests.testapp.management.commands.guarded_import import Command

    with without_the_app(settings), pytest.raises(CommandError) as excinfo:
        call_command(Command(), "crm", stdout=io.StringIO(), stderr=io.StringIO())
    assert "INSTALLED_APPS" in str(excinfo.value) and excinfo.value.returncode == 1
