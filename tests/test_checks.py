"""Bad settings are reported by ``manage.py check`` with ``django_redislock.E...`` ids."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redislock import Lock
from django_redislock.checks import check_settings
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
    ],
)
def test_bad_setting_is_an_error(settings, value, expected):
    settings.REDISLOCK = value
    assert expected in ids(check_settings())


def test_missing_socket_timeout_is_a_warning(settings):
    settings.CACHES = {
        **settings.CACHES,
        "bare": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    }
    settings.REDISLOCK = {"CACHE": "bare"}
    assert ids(check_settings()) == ["django_redislock.W001"]


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
