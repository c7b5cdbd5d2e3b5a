"""Hostile values for every public argument: a clear error where the value is given.

Never a hang, never a Redis error ("invalid expire time"), never an ``OverflowError`` from deep
inside: ``TypeError`` for the wrong type (``bool`` included), ``ValueError`` naming the allowed
range otherwise. Each case runs under pytest-timeout, so a hang fails the test.
"""

from __future__ import annotations

import contextlib
import math

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_redislock import Lock, distributed_lock, force_release, list_locks
from django_redislock.checks import check_settings
from django_redislock.conf import MAX_SECONDS
from django_redislock.exceptions import LockNotOwnedError

NOT_NUMBERS = [True, False, "10", b"1", [1], {}, object(), 1j]
BAD_LEASES = [float("nan"), float("inf"), -float("inf"), 0, 0.0, 0.0005, -1, 1e300, 1e12, 2**70]
BAD_WAITS = [float("nan"), float("inf"), -float("inf"), -0.001, -1, 1e300, 2**70]
GOOD_LEASES = [0.001, 0.5, 30, 30.0, MAX_SECONDS]
GOOD_WAITS = [None, 0, 0.0, 0.001, 5, MAX_SECONDS]


def error_for(value: object) -> type[Exception]:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ValueError if numeric else TypeError


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_LEASES)
def test_lock_timeout(value):
    with pytest.raises(error_for(value), match="timeout"):
        Lock("x", timeout=value)


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_WAITS)
def test_lock_blocking_timeout(value):
    with pytest.raises(error_for(value), match="blocking_timeout"):
        Lock("x", blocking_timeout=value)


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_WAITS)
def test_acquire_blocking_timeout(value):
    lock = Lock("x")
    with pytest.raises(error_for(value), match="blocking_timeout"):
        lock.acquire(blocking_timeout=value)
    assert not lock.locked()


def test_the_error_names_the_allowed_range():
    with pytest.raises(ValueError, match=r"between 0\.001 and 1e\+09 seconds"):
        Lock("x", timeout=0.0005)
    with pytest.raises(ValueError, match="finite"):
        Lock("x", blocking_timeout=math.inf)
    with pytest.raises(ValueError, match="None to wait for ever"):
        Lock("x", blocking_timeout=math.inf)


@pytest.mark.parametrize("value", GOOD_LEASES)
def test_every_accepted_lease_works_against_redis(value):
    lock = Lock(f"lease-{value}", timeout=value, auto_renew=False)
    assert lock.acquire(blocking=False)
    if value < 0.1:
        # Redis took the lease; on a loaded machine 1 ms can end before the next command.
        with contextlib.suppress(LockNotOwnedError):
            lock.release()
        assert not lock.locked()
        return
    assert lock.owned()
    lock.release()


@pytest.mark.parametrize("value", GOOD_WAITS)
def test_every_accepted_wait_works_against_redis(value):
    lock = Lock("wait-ok", blocking_timeout=value)
    assert lock.acquire()
    lock.release()


@pytest.mark.parametrize("value", [None, 1, 1.5, b"bytes", ["x"], ("x",), object()])
def test_lock_name_type(value):
    with pytest.raises(TypeError):
        Lock(value)


@pytest.mark.parametrize("value", ["", "x" * 4097, "\ud800"])
def test_lock_name_value(value):
    with pytest.raises(ValueError):
        Lock(value)


@pytest.mark.parametrize(
    "name",
    [
        "}starts-with-brace",
        "{tag}",
        "a{b}c",
        "%7B",
        "with space",
        "tab\tnew\nline",
        "nul\x00",
        "ünïcødé-✓",
        "x" * 4096,
        "*?[glob]",
        "\\",
    ],
)
def test_odd_but_valid_names_work_and_list_as_given(name):
    with Lock(name, timeout=5) as lock:
        assert lock.owned()
        assert [info.name for info in list_locks() if info.name == name] == [name]
    assert force_release(name) is False


@pytest.mark.parametrize("value", [1, b"owner", ["o"], object(), True])
def test_owner_type(value):
    with pytest.raises(TypeError, match="owner"):
        Lock("x", owner=value)


@pytest.mark.parametrize("value", ["", "a\nb", "x" * 4097])
def test_owner_value(value):
    with pytest.raises(ValueError, match="owner"):
        Lock("x", owner=value)


@pytest.mark.parametrize("arg", ["blocking", "reentrant"])
@pytest.mark.parametrize("value", [None, 1, "yes", 0.0])
def test_flags_are_bools(arg, value):
    with pytest.raises(TypeError, match=arg):
        Lock("x", **{arg: value})


@pytest.mark.parametrize("value", [1, "yes", 0.0])
def test_auto_renew_is_a_bool_or_none(value):
    with pytest.raises(TypeError, match="auto_renew"):
        Lock("x", auto_renew=value)


@pytest.mark.parametrize("value", [1, "", b"default", ["default"]])
def test_using_is_an_alias(value):
    with pytest.raises(TypeError, match="using"):
        Lock("x", using=value)


def test_an_unknown_alias_fails_at_first_use_with_the_check_id():
    with pytest.raises(ImproperlyConfigured, match="E001"):
        Lock("x", using="no-such-alias").acquire()


def test_a_non_redis_alias_fails_at_first_use_with_the_check_id():
    with pytest.raises(ImproperlyConfigured, match="E009"):
        Lock("x", using="locmem").acquire()


# -- decorator: the same rules, at decoration time ------------------------------------------------


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_LEASES)
def test_decorator_timeout(value):
    with pytest.raises(error_for(value), match="timeout"):
        distributed_lock("k", timeout=value)


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_WAITS)
def test_decorator_blocking_timeout(value):
    with pytest.raises(error_for(value), match="blocking_timeout"):
        distributed_lock("k", blocking_timeout=value)


@pytest.mark.parametrize("value", ["maybe", "", 3, None])
def test_decorator_on_busy(value):
    with pytest.raises((TypeError, ValueError), match="on_busy"):
        distributed_lock("k", on_busy=value)


@pytest.mark.parametrize("key", [3, b"k", "", ["k"]])
def test_decorator_key_type(key):
    with pytest.raises((TypeError, ValueError)):
        distributed_lock(key)(lambda: None)


@pytest.mark.parametrize("template", ["{missing}", "{0}", "{}", "{a", "a}", "{a!x}"])
def test_bad_templates_fail_at_decoration(template):
    with pytest.raises(ValueError):

        @distributed_lock(template)
        def job(a):
            return a


def test_a_template_rendering_an_empty_name_fails_clearly():
    @distributed_lock("{a}")
    def job(a):
        return a

    with pytest.raises(ValueError, match="empty"):
        job("")


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_LEASES)
def test_setting_timeout(settings, value):
    settings.REDISLOCK = {"TIMEOUT": value}
    assert "django_redislock.E006" in [m.id for m in check_settings()]
    with pytest.raises(ImproperlyConfigured, match="E006"):
        Lock("x").acquire()


@pytest.mark.parametrize("value", NOT_NUMBERS + BAD_WAITS)
def test_setting_blocking_timeout(settings, value):
    settings.REDISLOCK = {"BLOCKING_TIMEOUT": value}
    assert "django_redislock.E007" in [m.id for m in check_settings()]
