"""``list_locks``, ``page_locks``, ``force_release(_info)`` and ``LockInfo`` on real Redis."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest
from django.test import override_settings

from django_redislock import (
    Lock,
    LockBackendError,
    LockInfo,
    force_release,
    get_lock_info,
    list_locks,
)
from django_redislock.operations import (
    backend_problem,
    describe_holder,
    force_release_info,
    page_locks,
)
from django_redislock.runtime import keyspace
from tests.conftest import start_holder, wait_for

GARBAGE = b"\xff\xfe garbage"


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
    assert token is not None
    assert force_release("handover", token=token + 1) is False
    assert lock.owned()
    assert force_release("handover", token=token) is True


def test_force_release_wakes_a_waiter(redis_client):
    Lock("wake-on-force", timeout=30, owner="dead-worker").acquire()
    got: dict[str, bool] = {}

    def wait() -> None:
        lock = Lock("wake-on-force", timeout=30)
        got["ok"] = lock.acquire(blocking_timeout=5)

    t = threading.Thread(target=wait)
    t.start()
    queue = keyspace().queue("wake-on-force")
    wait_for(lambda: redis_client.llen(queue) == 1, what="the waiter to queue")
    assert force_release("wake-on-force")
    t.join(6)
    assert got["ok"] is True


def test_force_release_validates_input():
    with pytest.raises(ValueError):
        force_release("")
    with pytest.raises(TypeError):
        force_release("x", token="3")  # type: ignore[arg-type]


# -- paging and sorting ------------------------------------------------------------------------


def hold_many(names_timeouts: dict[str, float]) -> None:
    for name, timeout in names_timeouts.items():
        assert Lock(name, timeout=timeout, auto_renew=False).acquire(blocking=False)


def test_unsorted_pages_follow_scan_cursors_and_visit_every_lock_once():
    names = {f"page:{i:03d}" for i in range(130)}
    hold_many(dict.fromkeys(names, 30))
    seen: list[str] = []
    cursor, pages = 0, 0
    while True:
        page = page_locks(cursor=cursor, per_page=20)
        pages += 1
        assert page.sort is None and page.number == 1
        seen += [info.name for info in page.infos]
        if not page.has_next:
            assert page.next_cursor == 0
            break
        assert len(page.infos) >= 20  # only the last page may be short
        cursor = page.next_cursor
    assert pages > 2
    assert sorted(seen) == sorted(names)


def test_sorted_pages_are_numbered_and_ordered():
    hold_many({f"s{i}": 10 + i for i in range(10)})
    first = page_locks(sort="expires", per_page=4)
    second = page_locks(sort="expires", page=2, per_page=4)
    last = page_locks(sort="expires", page=3, per_page=4)
    assert [i.name for i in first.infos] == ["s0", "s1", "s2", "s3"]
    assert [i.name for i in second.infos] == ["s4", "s5", "s6", "s7"]
    assert [i.name for i in last.infos] == ["s8", "s9"]
    assert (first.has_next, second.has_next, last.has_next) == (True, True, False)
    assert (first.has_previous, second.first_index) == (False, 5)
    assert [i.name for i in page_locks(sort="-expires", per_page=3).infos] == ["s9", "s8", "s7"]


def test_sort_by_name_and_by_time_held(redis_client):
    def put(name: str, acquired_ms: int) -> None:
        record = {"o": "x", "n": 1, "t": 1, "at": acquired_ms, "m": {}}
        redis_client.set(keyspace().lock(name), json.dumps(record), px=60_000)

    put("b", 1_000_000)  # acquired first: held longest
    put("c", 2_000_000)
    put("a", 3_000_000)
    assert [i.name for i in page_locks(sort="name").infos] == ["a", "b", "c"]
    assert [i.name for i in page_locks(sort="-name").infos] == ["c", "b", "a"]
    assert [i.name for i in page_locks(sort="held").infos] == ["a", "c", "b"]
    assert [i.name for i in page_locks(sort="-held").infos] == ["b", "c", "a"]


def test_a_sort_over_the_limit_says_it_is_truncated():
    hold_many({f"t{i}": 30 for i in range(6)})
    page = page_locks(sort="name", per_page=10, sort_limit=4)
    assert page.truncated and len(page.infos) == 4
    assert not page_locks(sort="name", per_page=10).truncated


def test_per_page_none_puts_every_lock_on_one_page():
    hold_many({f"all{i}": 30 for i in range(7)})
    page = page_locks(sort="name", per_page=None)
    assert [i.name for i in page.infos] == [f"all{i}" for i in range(7)]
    assert not page.has_next
    assert len(page_locks(per_page=None).infos) == 7


def test_unknown_sort_is_refused():
    with pytest.raises(ValueError, match="sort must be one of"):
        page_locks(sort="owner")


# -- force release that says what it released --------------------------------------------------


def test_force_release_info_reports_the_holder_it_released():
    proc, held = start_holder("remote", "--timeout", "10")
    try:
        [info] = force_release_info("remote")
        assert (info.name, info.pid, info.fencing_token) == ("remote", held["pid"], held["token"])
        assert info.thread == "MainThread" and info.hold_count == 1 and info.expires_in == 0
        assert get_lock_info("remote") is None
        assert force_release_info("remote") == []
    finally:
        proc.kill()
        proc.wait()


def test_force_release_info_with_a_stale_token_releases_nothing():
    lock = Lock("kept", timeout=10, auto_renew=False)
    lock.acquire()
    assert lock.fencing_token is not None
    assert force_release_info("kept", token=lock.fencing_token + 1) == []
    assert lock.owned()
    [info] = force_release_info("kept", token=lock.fencing_token)
    assert info.owner == lock.owner


def test_force_release_info_reports_the_old_holder_not_the_waiter_it_handed_to(redis_client):
    Lock("handover", timeout=30, owner="dead-worker").acquire()
    got: dict[str, int | None] = {}

    def wait() -> None:
        lock = Lock("handover", timeout=30, owner="next-worker", auto_renew=False)
        lock.acquire(blocking_timeout=5)
        got["token"] = lock.fencing_token

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: redis_client.llen(keyspace().queue("handover")) == 1, what="the waiter")
    [released] = force_release_info("handover")
    waiter.join(6)
    assert released.owner == "dead-worker"
    current = get_lock_info("handover")
    assert current is not None and current.owner == "next-worker"
    current = get_lock_info("handover")
    assert current is not None and got["token"] == current.fencing_token != released.fencing_token


# -- unreadable values ---------------------------------------------------------------------------


@pytest.mark.parametrize("ttl_ms", [60_000, None])
def test_an_unreadable_value_is_listed_and_does_not_break_the_listing(redis_client, ttl_ms):
    Lock("fine", timeout=10, auto_renew=False).acquire()
    redis_client.set(keyspace().lock("broken"), GARBAGE, px=ttl_ms)
    infos = {i.name: i for i in list_locks()}
    assert set(infos) == {"fine", "broken"}
    broken = infos["broken"]
    assert broken.unreadable and not infos["fine"].unreadable
    assert broken.raw_excerpt.endswith(" garbage")
    assert (broken.owner, broken.host, broken.pid, broken.fencing_token) == ("", "", None, 0)
    if ttl_ms is None:
        assert not broken.expires and broken.as_dict()["expires_in"] is None
    else:
        assert broken.expires and 0 < broken.expires_in <= 60
    assert json.loads(json.dumps(broken.as_dict()))["unreadable"] is True  # strict JSON
    assert [i.name for i in page_locks(sort="expires").infos] == ["fine", "broken"]


@pytest.mark.parametrize("token", [None, 0])
def test_an_unreadable_value_can_be_force_released(redis_client, token):
    key = keyspace().lock("broken")
    redis_client.set(key, GARBAGE)
    [info] = force_release_info("broken", token=token)
    assert info.unreadable and info.raw_excerpt.endswith(" garbage")
    assert not redis_client.exists(key)


@pytest.mark.parametrize("value", [GARBAGE, b"[1, 2]", b"42", b'{"t": 7}'])
def test_a_token_other_than_0_leaves_an_unreadable_value_alone(redis_client, value):
    redis_client.set(keyspace().lock("broken"), value)
    current = get_lock_info("broken")
    assert current is not None and current.fencing_token == 0
    assert force_release_info("broken", token=7) == []
    assert redis_client.get(keyspace().lock("broken")) == value
    assert force_release("broken", token=0)


def test_a_readable_lock_is_not_released_by_token_0():
    lock = Lock("real", timeout=10, auto_renew=False)
    lock.acquire()
    assert force_release_info("real", token=0) == []
    assert lock.owned()


# -- describing holders and failures -------------------------------------------------------------


def test_describe_holder_names_the_worker_the_publisher_or_the_value():
    worker = Lock("w", timeout=10, auto_renew=False, task_id="task-1")
    worker.acquire()
    queued = Lock("q", timeout=10, auto_renew=False, task_id="task-2", queued=True)
    queued.acquire()
    w, q = get_lock_info("w"), get_lock_info("q")
    assert w is not None and q is not None
    assert describe_holder(w) == (
        f"{w.host} pid {w.pid} thread {w.thread}, Celery task task-1, "
        f"fencing token {w.fencing_token}"
    )
    assert q.queued and describe_holder(q).startswith(
        f"Celery task task-2, queued (published by {q.host} pid {q.pid})"
    )


def test_backend_problem_names_the_cache_and_hides_the_password():
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://:s3cret@127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        }
    }
    with override_settings(CACHES=caches), pytest.raises(LockBackendError) as excinfo:
        list(list_locks())
    with override_settings(CACHES=caches):
        problem = backend_problem(excinfo.value)
    assert problem.unreachable
    assert (problem.alias, problem.location) == ("default", "redis://:***@127.0.0.1:1/0")
    summary = problem.summary()
    assert "s3cret" not in summary and "\n" not in summary
    assert summary.startswith(
        "Redis is unreachable (cache 'default' at redis://:***@127.0.0.1:1/0)"
    )
    assert "CACHES['default']['LOCATION']" in summary


def test_a_non_string_value_under_a_lock_key_lists_as_unreadable_and_can_be_released(
    redis_client,
):
    from django_redislock.runtime import keyspace

    key = keyspace().lock("hashed")
    redis_client.hset(key, "field", "value")
    [info] = list(list_locks(match="hashed"))
    assert info.unreadable and "not a string" in info.raw_excerpt
    current = get_lock_info("hashed")
    assert current is not None and current.unreadable
    assert force_release("hashed", token=0) is True
    assert not redis_client.exists(key)
