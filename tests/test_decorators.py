"""``@distributed_lock`` on functions, methods and management commands."""

from __future__ import annotations

import io
import logging
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_redislock import Lock, LockNotAcquiredError, distributed_lock, get_lock_info


def test_template_over_arguments_with_defaults():
    seen = []

    @distributed_lock("invoice:{invoice_id}:{mode}", timeout=5)
    def pay(invoice_id, mode="full"):
        seen.append(get_lock_info(f"invoice:{invoice_id}:{mode}"))
        return invoice_id

    assert pay(7) == 7
    assert seen[0] is not None and seen[0].name == "invoice:7:full"
    assert get_lock_info("invoice:7:full") is None


def test_template_with_item_and_attribute_access():
    names = []

    class Account:
        pk = 3

    @distributed_lock("import:{options[source]}:{account.pk}", timeout=5)
    def run(account, **options):
        names.append([i.name for i in __import__("django_redislock").list_locks()])

    run(Account(), source="crm")
    assert names == [["import:crm:3"]]


def test_unknown_template_field_fails_at_decoration_time():
    with pytest.raises(ValueError, match="invoice"):

        @distributed_lock("invoice:{invoice}")
        def pay(invoice_id):
            pass


def test_positional_template_field_fails_at_decoration_time():
    with pytest.raises(ValueError):

        @distributed_lock("x:{0}")
        def f(a):
            pass


def test_callable_key_gets_the_same_arguments():
    @distributed_lock(lambda user, **kw: f"user:{user}", timeout=5)
    def work(user, flag=False):
        return get_lock_info(f"user:{user}") is not None

    assert work("bob", flag=True) is True


def test_default_key_is_module_and_qualname():
    @distributed_lock(timeout=5)
    def job():
        return [i.name for i in __import__("django_redislock").list_locks()]

    assert job() == [f"{__name__}.test_default_key_is_module_and_qualname.<locals>.job"]


def _hold_in_thread(name: str, ready: threading.Event, done: threading.Event) -> threading.Thread:
    def hold() -> None:
        with Lock(name, timeout=10):
            ready.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    ready.wait(5)
    return t


@pytest.fixture
def busy():
    """Make a lock busy from another thread for the duration of a test."""
    holders = []

    def make(name: str) -> None:
        ready, done = threading.Event(), threading.Event()
        holders.append((done, _hold_in_thread(name, ready, done)))

    yield make
    for done, t in holders:
        done.set()
        t.join(5)


def test_on_busy_raise(busy):
    busy("r")

    @distributed_lock("r", blocking=False)
    def f():
        return 1

    with pytest.raises(LockNotAcquiredError):
        f()


def test_on_busy_skip_returns_none_and_logs(busy, caplog):
    busy("s")
    calls = []

    @distributed_lock("s", blocking_timeout=0.1, on_busy="skip")
    def f():
        calls.append(1)

    with caplog.at_level(logging.INFO, logger="django_redislock"):
        assert f() is None
    assert calls == []
    assert "skipped" in caplog.text


@pytest.mark.parametrize("on_busy", ["skip", lambda: "busy"])
def test_skip_does_not_wait_unless_told_to(busy, on_busy):
    """`@distributed_lock("job", on_busy="skip")` means "skip if already running": no wait."""
    busy("skip-now")
    calls = []

    @distributed_lock("skip-now", on_busy=on_busy)
    def f():
        calls.append(1)

    started = time.monotonic()
    f()
    assert time.monotonic() - started < 0.5 and calls == []


def test_skip_waits_when_given_a_blocking_timeout(busy):
    busy("skip-later")

    @distributed_lock("skip-later", on_busy="skip", blocking_timeout=0.4)
    def f():
        return 1

    started = time.monotonic()
    assert f() is None
    assert 0.35 < time.monotonic() - started < 2.0


def test_raise_still_waits_by_default(settings, busy):
    settings.REDISLOCK = {"BLOCKING_TIMEOUT": 0.3}
    busy("raise-waits")

    @distributed_lock("raise-waits")
    def f():
        return 1

    started = time.monotonic()
    with pytest.raises(LockNotAcquiredError):
        f()
    assert time.monotonic() - started >= 0.25


def test_on_busy_callable_result_is_returned(busy):
    busy("c:5")

    @distributed_lock("c:{n}", blocking=False, on_busy=lambda n: f"busy {n}")
    def f(n):
        return "ran"

    assert f(5) == "busy 5"

    @distributed_lock("c:{n}", blocking=False, on_busy=lambda: "busy")
    def g(n):
        return "ran"

    assert g(5) == "busy"


def test_methods_use_self_in_templates():
    class Sync:
        def __init__(self, pk):
            self.pk = pk

        @distributed_lock("sync:{self.pk}", timeout=5)
        def run(self):
            return get_lock_info(f"sync:{self.pk}") is not None

    assert Sync(9).run() is True


def test_management_command_busy_is_a_command_error(busy):
    busy("cmd:nightly")

    class Command(BaseCommand):
        @distributed_lock("cmd:{options[job]}", blocking=False)
        def handle(self, *args, **options):
            return "ran"

    with pytest.raises(CommandError, match="already running"):
        Command().handle(job="nightly")
    with pytest.raises(LockNotAcquiredError):
        Command().handle(job="nightly")


def test_lock_is_released_when_the_function_raises():
    @distributed_lock("boom", timeout=5)
    def f():
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        f()
    assert not Lock("boom").locked()


# -- on a management command's handle: the command adapter -----------------------------------


class _Guarded(BaseCommand):
    @distributed_lock("adapter-skip", on_busy="skip")
    def handle(self, *args, **options):
        self.stdout.write("ran")


class _Lost(BaseCommand):
    @distributed_lock("adapter-lost", timeout=0.3)
    def handle(self, *args, **options):
        from django_redislock import force_release

        force_release("adapter-lost")


def test_a_skipped_command_says_why_unless_verbosity_0(busy):
    busy("adapter-skip")
    out = io.StringIO()
    call_command(_Guarded(), stdout=out)
    assert "Skipped: lock 'adapter-skip' is busy (held by" in out.getvalue()
    quiet = io.StringIO()
    call_command(_Guarded(), stdout=quiet, verbosity=0)
    assert quiet.getvalue() == ""


def test_a_lock_lost_in_a_command_is_a_command_error():
    with pytest.raises(CommandError, match="was lost") as raised:
        call_command(_Lost())
    assert raised.value.returncode == 1
