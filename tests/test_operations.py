"""``list_locks``, ``get_lock_info``, ``force_release`` and ``LockInfo`` on real Redis."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from django_redislock import Lock, LockInfo, force_release, get_lock_info, list_locks
from tests.conftest import start_holder


def test_list_locks_shows_every_active_lock_with_its_fields():
    a, b = Lock("report:1", timeout=10), Lock("report:2", timeout=10)
    a.acquire()
    a.acquire()
    b.acquire()
    infos = {i.name: i for i in list_locks()}
    assert set(infos) == {"report:1", "report:2"}
    info = infos["report:1"]
    assert isinstance(info, LockInfo)
    assert info.owner == a.owner
    assert info.pid is not None and info.pid > 0 and info.host
    assert info.thread == threading.current_thread().name
    assert info.task_id is None
    assert info.fencing_token == a.fencing_token
    assert info.hold_count == 2
    assert info.acquired_at.tzinfo is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - info.acquired_at).total_seconds()) < 5
    assert 0 < info.expires_in <= 10


def test_list_locks_match_is_a_glob_on_the_name():
    for name in ("invoice:1", "invoice:2", "import:x"):
        Lock(name, timeout=10).acquire()
    assert sorted(i.name for i in list_locks(match="invoice:*")) == ["invoice:1", "invoice:2"]
    assert [i.name for i in list_locks(match="import:?")] == ["import:x"]


def test_list_locks_pages_through_many_locks(redis_client):
    pipe = redis_client.pipeline()
    for i in range(1200):
        pipe.set(f"redislock:lock:{{bulk:{i}}}", '{"o":"x","n":1,"t":1,"at":0,"m":{}}', px=60000)
    pipe.execute()
    assert len({i.name for i in list_locks(match="bulk:*")}) == 1200


def test_list_locks_ignores_other_namespaces():
    Lock("mine", timeout=10).acquire()
    Lock("theirs", timeout=10, using="site2").acquire()
    assert [i.name for i in list_locks()] == ["mine"]
    assert [i.name for i in list_locks(using="site2")] == ["theirs"]


def test_glob_characters_in_the_namespace_do_not_widen_the_scan(settings):
    settings.REDISLOCK = {"KEY_PREFIX": "ns"}
    Lock("a", timeout=10).acquire()
    settings.REDISLOCK = {"KEY_PREFIX": "n"}
    assert list(list_locks()) == []


def test_lock_held_by_another_process_is_listed():
    proc, held = start_holder("remote", "--timeout", "10")
    try:
        info = get_lock_info("remote")
        assert info is not None and info.pid == held["pid"]
        assert info.fencing_token == held["token"]
    finally:
        proc.kill()
        proc.wait()


def test_get_lock_info_of_a_free_lock_is_none():
    assert get_lock_info("free") is None


def test_force_release_deletes_and_reports():
    lock = Lock("stuck", timeout=10)
    lock.acquire()
    assert force_release("stuck") is True
    assert not lock.locked()
    assert force_release("stuck") is False


def test_force_release_with_a_stale_token_leaves_the_lock():
    lock = Lock("handover", timeout=10)
    lock.acquire()
    token = lock.fencing_token
    assert force_release("handover", token=token + 1) is False
    assert lock.owned()
    assert force_release("handover", token=token) is True


def test_force_release_wakes_a_waiter():
    Lock("wake-on-force", timeout=30, owner="dead-worker").acquire()
    got: dict[str, bool] = {}

    def wait() -> None:
        lock = Lock("wake-on-force", timeout=30)
        got["ok"] = lock.acquire(blocking_timeout=5)

    t = threading.Thread(target=wait)
    t.start()
    threading.Event().wait(0.3)
    assert force_release("wake-on-force")
    t.join(6)
    assert got["ok"] is True


def test_force_release_validates_input():
    with pytest.raises(ValueError):
        force_release("")
    with pytest.raises(TypeError):
        force_release("x", token="3")  # type: ignore[arg-type]
