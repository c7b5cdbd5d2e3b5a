"""``on_commit``: a release inside a database transaction waits for the transaction to end.

Real transactions on the test database (``transactional_db``: no test-wide wrapping atomic).
"""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group
from django.db import transaction

from django_redislock import Lock, distributed_lock

pytestmark = pytest.mark.django_db(transaction=True)


def free(name: str) -> bool:
    """Whether another thread (another owner) can take ``name`` right now."""
    out: list[bool] = []

    def attempt() -> None:
        lock = Lock(name, timeout=5)
        got = lock.acquire(blocking=False)
        if got:
            lock.release()
        out.append(got)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(10)
    return out[0]


def test_release_waits_for_the_commit():
    lock = Lock("txn-commit", timeout=5, on_commit=True)
    with transaction.atomic():
        with lock:
            Group.objects.create(name="committed")
        assert lock.owned() and not free("txn-commit")
    assert free("txn-commit")
    assert lock.hold_count == 0 and not lock.lost


def test_a_rollback_releases_too():
    lock = Lock("txn-rollback", timeout=5, on_commit=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        with lock:
            Group.objects.create(name="rolled back")
        assert not free("txn-rollback")
        raise RuntimeError("roll back")
    assert free("txn-rollback")
    assert not Group.objects.filter(name="rolled back").exists()


def test_a_savepoint_rollback_releases_what_it_protected():
    lock = Lock("txn-savepoint", timeout=5, on_commit=True)
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            with lock:
                Group.objects.create(name="inner")
            raise RuntimeError("roll back the savepoint")
        assert free("txn-savepoint")


def test_outside_a_transaction_the_release_is_immediate():
    with Lock("txn-none", timeout=5, on_commit=True):
        pass
    assert free("txn-none")


def test_another_worker_never_reads_uncommitted_data():
    """The next holder of the lock sees the previous holder's committed row."""
    seen: list[bool] = []
    started = threading.Event()

    def next_holder() -> None:
        started.set()
        with Lock("txn-reader", timeout=10, blocking_timeout=10):
            seen.append(Group.objects.filter(name="written").exists())

    lock = Lock("txn-reader", timeout=10, on_commit=True)
    with transaction.atomic():
        with lock:
            reader = threading.Thread(target=next_holder)
            reader.start()
            started.wait(5)
            Group.objects.create(name="written")
        # Released by the block, but the commit has not happened yet: the reader must wait.
        reader.join(0.5)
        assert reader.is_alive()
    reader.join(10)
    assert seen == [True]


def test_the_decorator_takes_on_commit():
    calls: list[bool] = []

    @distributed_lock("txn-decorated", timeout=5, on_commit=True)
    def job() -> None:
        calls.append(True)

    with transaction.atomic():
        job()
        assert not free("txn-decorated")
    assert free("txn-decorated") and calls == [True]


def test_a_bad_on_commit_value_is_a_type_error():
    with pytest.raises(TypeError, match="on_commit"):
        Lock("x", on_commit=1)  # type: ignore[arg-type]
