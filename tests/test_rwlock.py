"""``ReadWriteLock`` / ``AsyncReadWriteLock``: the contract, run against both faces (the asyncio
one through ``tests.faces.AsyncFace``: one asyncio task per test thread), on a real Redis."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redislock import (
    AsyncReadWriteLock,
    LockError,
    LockNotAcquiredError,
    ReadWriteLock,
)
from tests.conftest import wait_for
from tests.faces import AsyncFace

Make = Callable[..., Any]


def _sync(name: str, side: str, timeout: float | None = None, **options: Any) -> Any:
    rw = ReadWriteLock(name, timeout=timeout)
    return rw.read_lock(**options) if side == "read" else rw.write_lock(**options)


def _async(name: str, side: str, timeout: float | None = None, **options: Any) -> Any:
    def make(n: str, **o: Any) -> Any:
        rw = AsyncReadWriteLock(n, timeout=timeout)
        return rw.read_lock(**o) if side == "read" else rw.write_lock(**o)

    return AsyncFace(name, make=make, **options)


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Make:
    return _sync if request.param == "sync" else _async


def queued(redis_client: Any, name: str) -> int:
    return int(redis_client.llen(f"redislock:rwq:{{{name}}}"))


class Worker(threading.Thread):
    """Acquire one side in a thread of its own, hold until told, then release."""

    def __init__(self, make: Make, name: str, side: str, **acquire: Any) -> None:
        super().__init__(daemon=True)
        self.lock = make(name, side, timeout=30)
        self.acquire_options = acquire
        self.go = threading.Event()
        self.result: bool | None = None
        self.error: BaseException | None = None
        self.acquired_at: float | None = None
        self.token: int | None = None

    def run(self) -> None:
        try:
            self.result = self.lock.acquire(**self.acquire_options)
            self.acquired_at = time.monotonic()
            self.token = self.lock.fencing_token
            if self.result:
                self.go.wait(30)
                self.lock.release()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self) -> None:
        self.go.set()
        self.join(30)
        assert not self.is_alive()


def started(make: Make, name: str, side: str, **acquire: Any) -> Worker:
    worker = Worker(make, name, side, **acquire)
    worker.start()
    return worker


def test_any_number_of_readers_at_once(make: Make) -> None:
    readers = [started(make, "many", "read", blocking=False) for _ in range(5)]
    wait_for(lambda: all(r.result is not None for r in readers), what="the readers")
    assert [r.result for r in readers] == [True] * 5
    probe = make("many", "read")
    assert probe.locked() and not probe.owned()
    assert not make("many", "write").locked()
    for r in readers:
        r.finish()
    assert not probe.locked()


def test_a_writer_excludes_readers_and_other_writers(make: Make) -> None:
    writer = started(make, "excl", "write")
    wait_for(lambda: writer.result is True, what="the writer")
    reader = started(make, "excl", "read", blocking=False)
    other = started(make, "excl", "write", blocking=False)
    wait_for(lambda: reader.result is not None and other.result is not None)
    assert (reader.result, other.result) == (False, False)
    assert make("excl", "write").locked()
    writer.finish()
    assert make("excl", "read").acquire(blocking=False)


def test_a_waiting_writer_blocks_new_readers(make: Make, redis_client: Any) -> None:
    reader = started(make, "prefer", "read")
    wait_for(lambda: reader.result is True, what="the first reader")
    writer = started(make, "prefer", "write", blocking_timeout=20)
    wait_for(lambda: queued(redis_client, "prefer") == 1, what="the writer to queue")
    late = started(make, "prefer", "read", blocking_timeout=20)
    wait_for(lambda: queued(redis_client, "prefer") == 2, what="the late reader to queue")
    time.sleep(0.2)
    assert late.result is None  # not let in past the queued writer
    released = time.monotonic()
    reader.finish()
    wait_for(lambda: writer.result is True, what="the writer")
    assert writer.acquired_at is not None and writer.acquired_at - released < 1.0  # woken
    assert late.result is None
    writer.finish()
    wait_for(lambda: late.result is True, what="the late reader")
    assert late.token is not None and writer.token is not None and late.token > writer.token
    late.finish()


def test_writers_are_served_in_queue_order(make: Make, redis_client: Any) -> None:
    first = started(make, "fifo", "write")
    wait_for(lambda: first.result is True)
    waiting = []
    for n in range(1, 4):
        waiting.append(started(make, "fifo", "write", blocking_timeout=20))
        wait_for(lambda n=n: queued(redis_client, "fifo") == n, what=f"writer {n} to queue")
    first.finish()
    for worker in waiting:
        wait_for(lambda w=worker: w.result is True, what="the next writer")
        assert all(other.result is None for other in waiting[waiting.index(worker) + 1 :])
        worker.finish()
    tokens = [w.token or 0 for w in waiting]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_each_side_is_reentrant_per_owner(make: Make) -> None:
    read = make("nest", "read")
    assert read.acquire() and read.acquire()
    assert read.hold_count == 2
    read.release()
    assert read.hold_count == 1 and read.owned()
    read.release()
    assert not read.owned()
    write = make("nest", "write")
    with write:
        with write:
            assert write.hold_count == 2
        assert write.owned()
    assert not write.locked()


def test_a_writer_may_downgrade_to_reading(make: Make) -> None:
    write, read = make("down", "write"), make("down", "read")
    assert write.acquire()
    token = write.fencing_token
    assert read.acquire(blocking=False)  # the writer reads too
    write.release()  # now only a reader
    assert read.owned() and not write.locked()
    other = started(make, "down", "read", blocking=False)
    other_writer = started(make, "down", "write", blocking=False)
    wait_for(lambda: other.result is not None and other_writer.result is not None)
    assert (other.result, other_writer.result) == (True, False)
    assert read.fencing_token is not None and token is not None and read.fencing_token > token
    other.finish()
    other_writer.finish()
    read.release()


def test_a_reader_asking_to_write_is_refused_at_once(make: Make) -> None:
    read = make("up", "read")
    assert read.acquire()
    began = time.monotonic()
    with pytest.raises(LockNotAcquiredError, match="holds its read lock") as raised:
        make("up", "write").acquire(blocking_timeout=10)
    assert isinstance(raised.value, LockError)
    assert time.monotonic() - began < 1.0
    assert read.hold_count == 1 and read.owned()  # nothing changed
    read.release()
    assert make("up", "write").acquire(blocking=False)


def test_the_last_reader_out_hands_over_to_the_writer_at_once(
    make: Make, redis_client: Any
) -> None:
    readers = [started(make, "wake", "read") for _ in range(3)]
    wait_for(lambda: all(r.result is True for r in readers), what="the readers")
    writer = started(make, "wake", "write", blocking_timeout=25)
    wait_for(lambda: queued(redis_client, "wake") == 1, what="the writer to queue")
    for r in readers[:2]:
        r.finish()
    time.sleep(0.2)
    assert writer.result is None  # one reader is still in
    released = time.monotonic()
    readers[2].finish()
    wait_for(lambda: writer.result is True, what="the writer")
    # The readers' leases are 30 s: only the release's wake-up can explain this.
    assert writer.acquired_at is not None and writer.acquired_at - released < 1.0
    writer.finish()


def test_tokens_increase_across_turns(make: Make) -> None:
    tokens = []
    for side in ["read", "write", "read", "read", "write"]:
        lock = make("turns", side)
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_sync_and_async_sides_of_one_name_exclude_each_other() -> None:
    writer = AsyncFace("mixed", make=lambda n, **o: AsyncReadWriteLock(n).write_lock(**o))
    assert writer.acquire()
    out: dict[str, bool] = {}
    thread = threading.Thread(
        target=lambda: out.update(r=ReadWriteLock("mixed").read_lock().acquire(blocking=False))
    )
    thread.start()
    thread.join(10)
    assert out == {"r": False}
    writer.release()
    assert ReadWriteLock("mixed").read_lock().acquire(blocking=False)


def test_keys_expire(redis_client: Any, make: Make) -> None:
    read = make("ttl", "read", timeout=5)
    assert read.acquire()
    writer = started(make, "ttl", "write", blocking_timeout=20)
    wait_for(lambda: queued(redis_client, "ttl") == 1)
    keys = [k for k in redis_client.keys("redislock:*") if not k.startswith(b"redislock:stats")]
    assert len(keys) >= 4
    assert all(redis_client.pttl(k) > 0 for k in keys), {k: redis_client.pttl(k) for k in keys}
    read.release()
    wait_for(lambda: writer.result is True)
    writer.finish()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": math.nan}, ValueError),
        ({"timeout": math.inf}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"timeout": "5"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"using": 5}, TypeError),
        ({"using": ""}, TypeError),
    ],
)
def test_hostile_arguments_are_refused_at_construction(kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        ReadWriteLock("hostile", **kwargs)
    with pytest.raises(error):
        AsyncReadWriteLock("hostile", **kwargs)


@pytest.mark.parametrize("name", [None, 5, "", "x" * 100_000, b"bytes"])
def test_hostile_names_are_refused(name: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        ReadWriteLock(name)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"reentrant": False}, TypeError),
        ({"using": "other"}, TypeError),
        ({"blocking_timeout": -1}, ValueError),
        ({"blocking_timeout": math.nan}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"blocking": "yes"}, TypeError),
    ],
)
def test_hostile_side_options_are_refused(options: Any, error: type) -> None:
    rw = ReadWriteLock("hostile")
    with pytest.raises(error):
        rw.read_lock(**options)
    with pytest.raises(error):
        rw.write_lock(**options)


def test_sides_without_options_are_one_object_each() -> None:
    rw = ReadWriteLock("same")
    assert rw.read_lock() is rw.read_lock() and rw.write_lock() is rw.write_lock()
    assert rw.read_lock() is not rw.write_lock()
    assert rw.read_lock(blocking=False) is not rw.read_lock()
    assert "read lock" in repr(rw.read_lock()) or "same" in repr(rw.read_lock())


# -- operations: listing, commands, force release, admin ----------------------------------------


def _two_readers_and_a_queued_writer(redis_client: Any, name: str) -> tuple[Any, Worker, Worker]:
    mine = ReadWriteLock(name, timeout=30).read_lock()
    assert mine.acquire()
    other = started(_sync, name, "read")
    wait_for(lambda: other.result is True)
    writer = started(_sync, name, "write", blocking_timeout=20)
    wait_for(lambda: queued(redis_client, name) == 1, what="the writer to queue")
    return mine, other, writer


def test_readers_and_writers_are_listed_per_holder(redis_client: Any) -> None:
    from django_redislock import get_lock_info, list_locks
    from django_redislock.operations import lock_holders

    mine, other, writer = _two_readers_and_a_queued_writer(redis_client, "listed")
    infos = [i for i in list_locks() if i.name == "listed"]
    assert sorted((i.kind, i.mode) for i in infos) == [("rwlock", "read")] * 2
    assert {i.fencing_token for i in infos} == {mine.fencing_token, other.token}
    assert all(i.as_dict()["mode"] == "read" for i in infos)
    mine.release()
    other.finish()
    wait_for(lambda: writer.result is True)
    info = get_lock_info("listed")
    assert info is not None and (info.kind, info.mode) == ("rwlock", "write")
    assert [i.fencing_token for i in lock_holders("listed")] == [writer.token]
    writer.finish()
    assert not [i for i in list_locks() if i.name == "listed"]


def test_force_release_of_one_reader_leaves_the_others_and_wakes_the_writer(
    redis_client: Any,
) -> None:
    from django_redislock import force_release
    from django_redislock.operations import lock_holders

    mine, other, writer = _two_readers_and_a_queued_writer(redis_client, "forced")
    assert force_release("forced", token=other.token)
    assert [i.fencing_token for i in lock_holders("forced")] == [mine.fencing_token]
    assert writer.result is None
    assert force_release("forced", token=12345) is False  # changed hands: untouched
    assert force_release("forced", token=mine.fencing_token)
    wait_for(lambda: writer.result is True, timeout=3, what="the woken writer")
    assert not mine.owned()
    with pytest.raises(LockError):
        mine.release()
    other.finish()
    writer.finish()


def test_the_list_command_shows_each_side(redis_client: Any) -> None:
    import io
    import json

    from django.core.management import call_command

    mine, other, writer = _two_readers_and_a_queued_writer(redis_client, "cmd")
    out = io.StringIO()
    call_command("redislock", "list", stdout=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("cmd\t")]
    assert len(lines) == 2 and all("side=read" in line for line in lines)
    out = io.StringIO()
    call_command("redislock", "list", "--json", stdout=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    assert {(r["kind"], r["mode"]) for r in rows if r.get("name") == "cmd"} == {("rwlock", "read")}
    mine.release()
    other.finish()
    writer.finish()


@pytest.mark.django_db
def test_the_admin_lists_readers_and_force_releases_one(
    redis_client: Any, django_user_model: Any
) -> None:
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission
    from django.test import Client
    from django.urls import reverse

    from django_redislock.operations import lock_holders

    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_lock", "force_release_lock"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislock", codename=codename)
        )
    client = Client()
    client.force_login(user)
    mine, other, writer = _two_readers_and_a_queued_writer(redis_client, "admin-rw")
    url = reverse("admin:django_redislock_lock_changelist")
    html = client.get(url).content.decode()
    assert html.count("reading: ") == 2
    assert f'value="{other.token}:admin-rw"' in html  # a checkbox per reader
    post = {
        "action": "force_release_selected",
        "_selected_action": f"{other.token}:admin-rw",
        "post": "yes",
    }
    client.post(url, post)
    assert [i.fencing_token for i in lock_holders("admin-rw")] == [mine.fencing_token]
    entry = LogEntry.objects.get()
    assert f"fencing token {other.token}" in entry.change_message
    mine.release()
    wait_for(lambda: writer.result is True)
    other.finish()
    writer.finish()


def test_both_sides_are_counted_in_the_statistics_and_the_metrics() -> None:
    from django_redislock import stats
    from django_redislock.prometheus import LockStatsCollector

    rw = ReadWriteLock("counted", timeout=5)
    for side in (rw.read_lock(), rw.write_lock(), rw.read_lock()):
        with side:
            pass
    stats.flush()
    figures = stats.get_stats("counted")
    assert figures is not None and (figures.acquired, figures.released) == (3, 3)
    samples = {
        (s.name, s.labels.get("name")): s.value
        for metric in LockStatsCollector().collect()
        for s in metric.samples
    }
    assert samples[("redislock_acquisitions_total", "counted")] == 3


@pytest.mark.parametrize("label", ["valkey", "redis"])
def test_a_readers_record_ends_with_its_lease_where_the_server_expires_fields(
    redis_factory, settings, label
):
    """Valkey 9 expires a reader's record field with its lease (renewals move it along);
    Redis 7.0 keeps it until the next script call purges it. Either way readers count by
    their leases."""
    from django_redislock.client import has_field_ttl
    from django_redislock.runtime import keyspace, runtime
    from django_redislock.testing.server import find_redis_server, valkey_server

    binary = valkey_server() if label == "valkey" else find_redis_server()
    assert binary
    server = redis_factory(binary=binary).start()
    settings.CACHES = {
        **settings.CACHES,
        "fields": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{server.url}/0"},
    }
    settings.REDISLOCK = {"CACHE": "fields"}
    records = keyspace("fields").rw_records("rw-fields")
    client = server.client()
    renewed = ReadWriteLock("rw-fields", timeout=0.3).read_lock(auto_renew=False)
    crashed = ReadWriteLock("rw-fields", timeout=0.3).read_lock(auto_renew=False)
    assert renewed.acquire()
    assert renewed.acquire()  # re-entered: the release below rewrites the record
    renewed.release()
    if has_field_ttl(client):
        (owner,) = client.hkeys(records)
        (ttl,) = client.execute_command("HPTTL", records, "FIELDS", 1, owner)
        assert 0 < ttl <= 300, ttl  # a rewritten record keeps the lease's end
    taken: list[bool] = []
    reader = threading.Thread(target=lambda: taken.append(crashed.acquire()))
    reader.start()  # another owner (a thread) reads too, and never renews
    reader.join(5)
    assert taken == [True]
    for _ in range(3):
        time.sleep(0.2)
        renewed.renew()
    runtime.holds.forget_all()
    kept = {k.decode() for k in client.hkeys(records)}
    expires_fields = has_field_ttl(client)  # Valkey 9: yes; the suite's Redis 7.0: no
    assert expires_fields or label != "valkey"
    assert len(kept) == (1 if expires_fields else 2), kept
    assert ReadWriteLock("rw-fields", timeout=5).write_lock().acquire(blocking_timeout=1)
