"""Admin Locks pages with Django's test client, against real Redis and real lock holders."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_redislock import Lock, LockNotOwnedError, RateLimiter, get_lock_info, stats
from django_redislock.admin import LockAdmin, encode_name, name_glob, parse_selection
from django_redislock.runtime import keyspace
from tests.conftest import hold, wait_for

pytestmark = pytest.mark.django_db

LIST = "admin:django_redislock_lock_changelist"
ACTION = "force_release_selected"


def list_url(**query: str) -> str:
    url = reverse(LIST)
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def detail_url(name: str) -> str:
    return reverse("admin:django_redislock_lock_change", args=[quote(name)])


@pytest.fixture
def take() -> Iterator[Callable[..., Lock]]:
    """Acquire locks in this process (no watchdog); whatever is still held is released after."""
    taken: list[Lock] = []

    def acquire(name: str, **kwargs: object) -> Lock:
        lock = Lock(name, auto_renew=False, **kwargs)  # type: ignore[arg-type]
        assert lock.acquire(blocking=False)
        taken.append(lock)
        return lock

    yield acquire
    for lock in taken:
        with contextlib.suppress(LockNotOwnedError):
            lock.release(all_holds=True)


def make_user(django_user_model, username: str, *codenames: str, staff: bool = True):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=staff)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislock", codename=codename)
        )
    return user


@pytest.fixture
def staff(django_user_model):
    return make_user(django_user_model, "staff")


@pytest.fixture
def viewer(django_user_model):
    return make_user(django_user_model, "viewer", "view_lock")


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "operator", "view_lock", "force_release_lock")


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def release_post(name: str, token: object, *, confirmed: bool) -> dict[str, object]:
    data: dict[str, object] = {"action": ACTION, "_selected_action": f"{token}:{name}"}
    if confirmed:
        data["post"] = "yes"
    return data


def texts(html: str) -> str:
    """The page's text with tags dropped and whitespace squeezed (for readable asserts)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&amp;", "&")


def cells(html: str, *, has: str) -> list[str]:
    """The text of each cell of the first table row containing ``has``."""
    for row in re.findall(r"<tr[^>]*>.*?</tr>", html, flags=re.S):
        if has in row:
            return [
                texts(cell).strip()
                for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)
            ]
    raise AssertionError(f"no table row contains {has!r}")


def names_listed(html: str) -> list[str]:
    return re.findall(r'<th class="field-name"><a href="[^"]*">([^<]+)</a>', html)


DEAD_CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
}
GARBAGE = b"\xff\xfe garbage"


# -- access control -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        list_url(),
        detail_url("x"),
        reverse("admin:django_redislock_lock_statistics"),
    ],
)
def test_anonymous_users_are_sent_to_the_admin_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login") + "?next=")


def test_anonymous_post_releases_nothing(client, holders):
    info = hold(holders, "job")
    response = client.post(list_url(), release_post("job", info["token"], confirmed=True))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert get_lock_info("job") is not None


@pytest.mark.parametrize(
    "url",
    [
        list_url(),
        detail_url("x"),
        reverse("admin:django_redislock_lock_statistics"),
    ],
)
def test_staff_without_view_permission_get_403(staff, url):
    assert logged_in(staff).get(url).status_code == 403


def test_staff_without_permission_cannot_post_the_action(staff, holders):
    info = hold(holders, "job")
    client = logged_in(staff)
    assert (
        client.post(list_url(), release_post("job", info["token"], confirmed=False)).status_code
        == 403
    )
    assert (
        client.post(list_url(), release_post("job", info["token"], confirmed=True)).status_code
        == 403
    )
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == info["token"]
    assert not LogEntry.objects.exists()


def test_view_permission_alone_shows_no_action_and_cannot_release(viewer, holders):
    info = hold(holders, "job")
    client = logged_in(viewer)
    page = client.get(list_url())
    assert page.status_code == 200
    assert ACTION not in page.content.decode()
    assert 'class="action-select"' not in page.content.decode()
    for confirmed in (False, True):
        response = client.post(list_url(), release_post("job", info["token"], confirmed=confirmed))
        assert response.status_code == 403
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == info["token"]


def test_inactive_user_with_permissions_is_refused(django_user_model):
    user = make_user(django_user_model, "gone", "view_lock", "force_release_lock")
    client = logged_in(user)
    user.is_active = False
    user.save()
    response = client.get(list_url())
    assert response.status_code == 302  # the admin treats the session as logged out


def test_admin_index_shows_locks_only_to_users_who_may_see_them(viewer, staff):
    changelist = list_url()
    page = logged_in(viewer).get(reverse("admin:index")).content.decode()
    assert f'href="{changelist}"' in page and ">Locks<" in page
    assert "Redis locks" in page
    index = logged_in(staff).get(reverse("admin:index")).content.decode()
    assert f'href="{changelist}"' not in index


def test_post_without_csrf_token_is_rejected(operator, holders):
    info = hold(holders, "job")
    client = logged_in(operator, enforce_csrf_checks=True)
    response = client.post(list_url(), release_post("job", info["token"], confirmed=True))
    assert response.status_code == 403
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == info["token"]


def test_post_with_csrf_token_from_the_confirmation_page_works(operator, holders):
    info = hold(holders, "job")
    client = logged_in(operator, enforce_csrf_checks=True)
    page = client.get(list_url()).content.decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match is not None
    token = match.group(1)
    confirm = client.post(
        list_url(),
        {**release_post("job", info["token"], confirmed=False), "csrfmiddlewaretoken": token},
    )
    assert confirm.status_code == 200
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode())
    assert match is not None
    token = match.group(1)
    done = client.post(
        list_url(),
        {**release_post("job", info["token"], confirmed=True), "csrfmiddlewaretoken": token},
    )
    assert done.status_code == 302
    assert get_lock_info("job") is None


# -- list -----------------------------------------------------------------------------------------


def test_list_shows_locks_held_by_another_process(viewer, holders):
    info = hold(holders, "report:daily")
    page = logged_in(viewer).get(list_url())
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="result_list"' in html and 'id="changelist-search"' in html
    assert "report:daily" in html
    assert f" · {info['pid']} · MainThread" in html
    assert f'<td class="field-fencing-token">{info["token"]}</td>' in html
    assert '<td class="field-hold-count">1</td>' in html
    assert 'href="' + detail_url("report:daily") + '"' in html


def test_list_extends_the_admin_base_and_has_breadcrumbs(viewer):
    html = logged_in(viewer).get(list_url()).content.decode()
    assert 'class="breadcrumbs"' in html
    assert f'href="{reverse("admin:index")}"' in html
    assert "No lock is held right now." in html


def test_list_shows_the_celery_task_id(viewer, take):
    take("with-task", task_id="0b7e-task")
    html = logged_in(viewer).get(list_url()).content.decode()
    assert '<td class="field-task-id">0b7e-task</td>' in html


def test_search_by_glob_and_by_substring(viewer, take):
    for name in ("invoice:1", "invoice:22", "report:1"):
        take(name)
    client = logged_in(viewer)

    def names(query: str) -> set[str]:
        html = client.get(list_url(q=query)).content.decode()
        return set(re.findall(r'<th class="field-name"><a href="[^"]*">([^<]+)</a>', html))

    assert names("invoice:*") == {"invoice:1", "invoice:22"}
    assert names("invoice:?") == {"invoice:1"}
    assert names(":1") == {"invoice:1", "report:1"}
    assert names("nothing") == set()
    assert (
        "No active lock matches this search." in client.get(list_url(q="nothing")).content.decode()
    )


def test_sort_by_expiry_by_held_for_and_by_name(viewer, take):
    previous = None
    for name, timeout in (("a", 30), ("b", 10), ("c", 20)):
        if previous is not None:  # acquisitions must be apart by the record's ms resolution
            wait_for(lambda p=previous: p.held_for >= 0.002, what="the clock to move on")
        take(name, timeout=timeout)
        previous = get_lock_info(name)
    client = logged_in(viewer)

    def order(sort: str) -> list[str]:
        return names_listed(client.get(list_url(o=sort)).content.decode())

    assert order("expires") == ["b", "c", "a"]
    assert order("-expires") == ["a", "c", "b"]
    assert order("-held") == ["a", "b", "c"]
    assert order("held") == ["c", "b", "a"]
    assert order("name") == ["a", "b", "c"]
    assert order("-name") == ["c", "b", "a"]


def test_cursor_pagination_visits_every_lock_once(viewer, monkeypatch, take):
    monkeypatch.setattr(LockAdmin, "list_per_page", 7)
    names = {f"page-{i:02d}" for i in range(40)}
    for name in names:
        take(name)
    client = logged_in(viewer)
    seen: list[str] = []
    url: str | None = list_url()
    pages = 0
    while url:
        html = client.get(url).content.decode()
        seen += re.findall(r'<th class="field-name"><a href="[^"]*">([^<]+)</a>', html)
        nxt = re.search(r'<a href="(\?[^"]*)" class="showall">', html)
        url = reverse(LIST) + nxt.group(1).replace("&amp;", "&") if nxt else None
        pages += 1
        assert pages < 20
    assert pages > 1
    assert sorted(seen) == sorted(names)


def test_sorted_pages_follow_each_other(viewer, monkeypatch, take):
    monkeypatch.setattr(LockAdmin, "list_per_page", 4)
    for i in range(10):
        take(f"s{i}", timeout=10 + i)
    client = logged_in(viewer)
    html = client.get(list_url(o="expires", p="2")).content.decode()
    assert re.findall(r'<th class="field-name"><a href="[^"]*">([^<]+)</a>', html) == [
        "s4",
        "s5",
        "s6",
        "s7",
    ]
    assert "Previous page" in html and "Next page" in html


def test_auto_refresh_adds_a_refresh_header(viewer):
    client = logged_in(viewer)
    assert 'http-equiv="refresh"' not in client.get(list_url()).content.decode()
    assert (
        '<meta http-equiv="refresh" content="10">'
        in client.get(list_url(refresh="10")).content.decode()
    )
    assert 'http-equiv="refresh"' not in client.get(list_url(refresh="1")).content.decode()


def test_list_follows_redislock_cache_setting(viewer, take):
    take("on-default")
    take("on-site2", using="site2")
    take("on-builtin", using="builtin")
    client = logged_in(viewer)
    assert "on-default" in client.get(list_url()).content.decode()
    for alias in ("site2", "builtin"):
        with override_settings(REDISLOCK={"CACHE": alias}):
            html = client.get(list_url()).content.decode()
        assert f"on-{alias}" in html
        assert "on-default" not in html


def test_redis_down_shows_an_error_not_a_crash(viewer):
    with override_settings(CACHES=DEAD_CACHES):
        response = logged_in(viewer).get(list_url())
    assert response.status_code == 200
    assert 'class="errornote"' in response.content.decode()
    assert "unreachable" in response.content.decode()


def test_an_empty_list_says_so_once_without_counts(viewer):
    text = texts(logged_in(viewer).get(list_url()).content.decode())
    assert text.count("No lock is held right now.") == 1
    assert "on this page" not in text


def test_owner_of_a_task_lock_is_the_worker_and_the_task(viewer, take):
    take("sync:1", task_id="task-run")
    info = get_lock_info("sync:1")
    assert info is not None
    html = logged_in(viewer).get(list_url()).content.decode()
    row = cells(html, has="sync:1")
    assert row[1:3] == [f"{info.host} · {info.pid} · {info.thread}", "task-run"]


def test_owner_of_a_queued_task_is_who_published_it(viewer, take):
    take("sync:2", task_id="task-queued", queued=True)
    info = get_lock_info("sync:2")
    assert info is not None
    client = logged_in(viewer)
    row = cells(client.get(list_url()).content.decode(), has="sync:2")
    assert row[1:3] == [f"queued — published by {info.host} · {info.pid}", "task-queued"]
    detail = texts(client.get(detail_url("sync:2")).content.decode())
    assert (
        f"Held by queued — published by {info.host} · {info.pid} "
        "(no worker has started the task yet)" in detail
    )
    assert "Celery task id task-queued" in detail


@pytest.mark.parametrize("ttl_ms", [60_000, None], ids=["with-ttl", "without-ttl"])
def test_an_unreadable_value_is_a_row_of_its_own(viewer, take, redis_client, ttl_ms):
    take("fine")
    redis_client.set(keyspace().lock("broken"), GARBAGE, px=ttl_ms)
    client = logged_in(viewer)
    response = client.get(list_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert set(names_listed(html)) == {"fine", "broken"}
    row = cells(html, has=">broken<")
    assert row[1] == "unreadable value \ufffd\ufffd garbage"
    assert row[2:5] == ["-", "-", "-"]  # no task, no token, no hold count
    assert row[5] == "-"  # held for: unknown
    if ttl_ms is None:
        assert row[6] == "never"
    else:
        assert row[6].endswith(" s") and row[6] != "never"
    for sort in ("expires", "-held", "name"):
        assert set(names_listed(client.get(list_url(o=sort)).content.decode())) == {
            "fine",
            "broken",
        }


def test_detail_of_an_unreadable_value(operator, redis_client):
    redis_client.set(keyspace().lock("broken"), GARBAGE)
    response = logged_in(operator).get(detail_url("broken"))
    assert response.status_code == 200
    text = texts(response.content.decode())
    assert "Value unreadable: not a lock record" in text
    assert "Value starts with \ufffd\ufffd garbage" in text
    assert "Expires in never" in text
    assert 'value="0:broken"' in response.content.decode()  # force release offered


def test_force_release_of_an_unreadable_value(operator, redis_client):
    key = keyspace().lock("broken")
    redis_client.set(key, GARBAGE, px=60_000)
    client = logged_in(operator)
    confirm = client.post(list_url(), release_post("broken", 0, confirmed=False))
    assert confirm.status_code == 200
    assert cells(confirm.content.decode(), has='class="release-candidate"')[:2] == [
        "broken",
        "unreadable value \ufffd\ufffd garbage",
    ]
    done = client.post(list_url(), release_post("broken", 0, confirmed=True), follow=True)
    assert "Force-released 1 lock: broken." in texts(done.content.decode())
    assert not redis_client.exists(key)
    entry = LogEntry.objects.get()
    assert entry.object_id == "broken"
    assert "unreadable value" in entry.change_message and "garbage" in entry.change_message


def test_token_0_never_releases_a_real_lock(operator, take):
    lock = take("real")
    client = logged_in(operator)
    client.post(list_url(), release_post("real", 0, confirmed=True))
    assert lock.owned()
    assert not LogEntry.objects.exists()


# -- Redis down -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [list_url(), detail_url("job"), reverse("admin:django_redislock_lock_statistics")],
    ids=["list", "detail", "statistics"],
)
def test_redis_down_is_one_clear_error_panel(viewer, url):
    with override_settings(CACHES=DEAD_CACHES):
        response = logged_in(viewer).get(url)
    assert response.status_code == 200
    html = response.content.decode()
    text = texts(html)
    assert html.count('id="redis-problem"') == 1
    assert "Redis is unreachable: locks cannot be shown or changed until it answers again." in text
    assert "Cache alias default Location redis://127.0.0.1:1/0 Error " in text
    assert 'CACHES["default"]["LOCATION"]' in text
    for misleading in (
        "No lock is held right now",
        "on this page",
        "No lock named",
        "No statistics recorded",
        "the lock was not taken or changed by this call",
        'id="result_list"',
        'id="changelist-search"',
    ):
        assert misleading not in text and misleading not in html, misleading


def test_force_release_with_redis_down_changes_nothing_and_says_why(operator, take):
    lock = take("job")
    client = logged_in(operator)
    for confirmed in (False, True):
        with override_settings(CACHES=DEAD_CACHES):
            response = client.post(
                list_url(), release_post("job", lock.fencing_token, confirmed=confirmed)
            )
            assert response.status_code == 302 and response["Location"] == list_url()
            page = texts(client.get(list_url()).content.decode())
        assert (
            "Redis is unreachable (cache “default” at redis://127.0.0.1:1/0), so no lock was "
            "released or changed." in page
        )
        assert "Force-released" not in page
        assert lock.owned()
    assert not LogEntry.objects.exists()


# -- force release --------------------------------------------------------------------------------


def test_confirmation_page_shows_what_will_be_released_and_who_holds_it(operator, holders):
    info = hold(holders, "job")
    response = logged_in(operator).post(
        list_url(), release_post("job", info["token"], confirmed=False)
    )
    assert response.status_code == 200
    html = response.content.decode()
    text = texts(html)
    assert "Are you sure you want to force-release this lock?" in text
    assert cells(html, has='class="release-candidate"') == [
        "job",
        f"{socket.gethostname()} · {info['pid']} · MainThread",  # host · pid · thread
        "-",  # no Celery task
        str(info["token"]),
        cells(html, has='class="release-candidate"')[4],  # held for: whatever the clock says
    ]
    assert f'value="{info["token"]}:job"' in html and 'name="post" value="yes"' in html
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == info["token"]  # nothing released yet
    assert not LogEntry.objects.exists()


def test_force_release_releases_writes_log_entry_and_says_so(operator, holders):
    info = hold(holders, "job")
    client = logged_in(operator)
    response = client.post(
        list_url(), release_post("job", info["token"], confirmed=True), follow=True
    )
    assert get_lock_info("job") is None
    assert "Force-released 1 lock: job." in texts(response.content.decode())
    entry = LogEntry.objects.get()
    assert entry.user == operator
    assert entry.action_flag == DELETION
    assert entry.object_id == "job" and entry.object_repr == "job"
    assert entry.content_type.app_label == "django_redislock"
    assert f"fencing token {info['token']}" in entry.change_message
    assert f"pid {info['pid']}" in entry.change_message
    assert entry.get_admin_url() == detail_url("job")


def test_changed_token_releases_nothing_and_says_so(operator, holders):
    info = hold(holders, "job")
    stale = int(info["token"]) - 1 if int(info["token"]) > 1 else 999  # type: ignore[call-overload]
    client = logged_in(operator)
    confirm = texts(
        client.post(list_url(), release_post("job", stale, confirmed=False)).content.decode()
    )
    assert "These locks will not be touched" in confirm
    assert f"you saw fencing token {stale}; it now has token {info['token']}" in confirm
    assert "Yes, release" not in confirm
    response = client.post(list_url(), release_post("job", stale, confirmed=True), follow=True)
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == info["token"]
    assert "changed hands or was released since you looked at it: job" in texts(
        response.content.decode()
    )
    assert not LogEntry.objects.exists()


def test_lock_that_changed_hands_between_confirmation_and_post_is_left_alone(operator, take):
    first = take("job")
    client = logged_in(operator)
    seen = first.fencing_token
    assert client.post(list_url(), release_post("job", seen, confirmed=False)).status_code == 200
    first.release()
    second = take("job")  # same name, new holder, new token
    client.post(list_url(), release_post("job", seen, confirmed=True))
    assert second.owned()
    current = get_lock_info("job")
    assert current is not None and current.fencing_token == second.fencing_token


def test_force_release_wakes_a_waiter(operator, holders, redis_client):
    info = hold(holders, "job")
    result: dict[str, Any] = {}

    def wait() -> None:
        lock = Lock("job", auto_renew=False, timeout=5)
        started = time.monotonic()
        result["acquired"] = lock.acquire(blocking_timeout=20)
        result["waited"] = time.monotonic() - started
        result["token"] = lock.fencing_token
        if result["acquired"]:
            lock.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    queue = keyspace().queue("job")
    wait_for(lambda: redis_client.llen(queue) == 1, what="the waiter to queue")
    logged_in(operator).post(list_url(), release_post("job", info["token"], confirmed=True))
    waiter.join(20)
    assert result["acquired"] is True
    assert result["waited"] < 8  # woken by the release, not by the holder's 10 s lease
    assert result["token"] > info["token"]


def test_several_locks_at_once_with_one_stale(operator, holders):
    a = hold(holders, "a")
    b = hold(holders, "b")
    client = logged_in(operator)
    response = client.post(
        list_url(),
        {
            "action": ACTION,
            "post": "yes",
            "_selected_action": [f"{a['token']}:a", f"{int(b['token']) + 100}:b"],  # type: ignore[call-overload]
        },
        follow=True,
    )
    text = texts(response.content.decode())
    assert "Force-released 1 lock: a." in text and "looked at it: b" in text
    assert get_lock_info("a") is None and get_lock_info("b") is not None
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == ["a"]


def test_post_without_action_or_selection_changes_nothing(operator, holders):
    info = hold(holders, "job")
    client = logged_in(operator)
    no_action = client.post(list_url(), {"_selected_action": f"{info['token']}:job"}, follow=True)
    assert "No action selected." in no_action.content.decode()
    nothing = client.post(list_url(), {"action": ACTION, "post": "yes"}, follow=True)
    assert "Items must be selected" in nothing.content.decode()
    assert get_lock_info("job") is not None


# -- detail, statistics ---------------------------------------------------------------------------


def test_detail_page_shows_every_lockinfo_field_and_statistics(operator, take):
    stats.connect_receivers()
    lock = take("odd/name with spaces", task_id="task-123")
    lock.acquire()  # re-entrant: hold count 2
    stats.flush()
    response = logged_in(operator).get(detail_url(lock.name))
    assert response.status_code == 200
    text = texts(response.content.decode())
    info = get_lock_info(lock.name)
    assert info is not None
    for label, value in (
        ("Name", info.name),
        ("Owner id", info.owner),
        ("Host", info.host),
        ("Process id", info.pid),
        ("Thread", info.thread),
        ("Celery task id", "task-123"),
        ("Fencing token", info.fencing_token),
        ("Hold count", 2),
    ):
        assert f"{label} {value}" in text
    assert info.acquired_at.isoformat() in text
    assert "Expires in" in text and "Held for" in text
    assert "Statistics (this name, last 24 hours)" in text
    assert "odd/name with spaces 1 0 0 100.0%" in text  # acquired, contended, failed, rate
    html = response.content.decode()
    assert 'value="Force release…"' in html  # the operator may start a release from here
    # The name as the admin encodes it in URLs and form values (survives any browser).
    assert f'value="{info.fencing_token}:{encode_name(info.name)}"' in html


def test_detail_of_a_free_lock_is_404(viewer):
    response = logged_in(viewer).get(detail_url("ghost"))
    assert response.status_code == 404
    assert "No lock named “ghost” is held right now." in response.content.decode()


def test_statistics_page_shows_success_rate_and_means(viewer, take):
    stats.connect_receivers()
    holder = take("busy")
    other = threading.Thread(target=lambda: Lock("busy").acquire(blocking=False))
    other.start()
    other.join()
    holder.release()
    stats.flush()
    text = texts(
        logged_in(viewer).get(reverse("admin:django_redislock_lock_statistics")).content.decode()
    )
    assert "busy 1 0 1 50.0%" in text  # acquired, contended, failed, success rate
    assert "Mean hold" in text and "Mean wait" in text


# -- wiring -------------------------------------------------------------------------------------


@pytest.mark.urls("tests.testapp.admin_urls")
def test_a_custom_admin_site_hosts_the_pages(operator, holders):
    info = hold(holders, "job")
    url = reverse("admin:django_redislock_lock_changelist", current_app="ops")
    assert url == "/ops/django_redislock/lock/"
    client = logged_in(operator)
    page = client.get(url).content.decode()
    assert "Ops console" in page and "job" in page
    assert 'href="/ops/django_redislock/lock/job/change/"' in page  # links stay on this site
    response = client.post(url, release_post("job", info["token"], confirmed=True))
    assert response.status_code == 302 and response["Location"] == url
    assert get_lock_info("job") is None
    assert client.get("/ops/django_redislock/lock/statistics/").status_code == 200


@pytest.mark.urls("tests.testapp.admin_urls")
def test_custom_admin_site_checks_permissions_too(staff, client):
    assert client.get("/ops/django_redislock/lock/").status_code == 302
    assert logged_in(staff).get("/ops/django_redislock/lock/").status_code == 403


def test_pages_are_translated(viewer, holders):
    hold(holders, "job")
    client = logged_in(viewer)
    html = client.get(list_url(), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "所有者（主机 · 进程号 · 线程）" in html  # noqa: RUF001
    assert "防护令牌" in html
    assert "Fencing token" not in html


def test_new_pages_states_are_translated(viewer, take):
    take("sync:3", task_id="t-3", queued=True)
    client = logged_in(viewer)
    html = client.get(list_url(), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "排队中 — 由 " in html
    with override_settings(CACHES=DEAD_CACHES):
        down = client.get(list_url(), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "无法连接 Redis：在它恢复响应之前，无法显示或更改锁。" in down  # noqa: RUF001
    assert "Redis is unreachable" not in down


def test_shipped_migration_matches_the_model():
    call_command("makemigrations", "django_redislock", "--check", "--dry-run", verbosity=0)


def test_lock_model_has_no_table_and_the_two_permissions():
    from django.db import connection

    from django_redislock.models import Lock as LockModel

    assert LockModel._meta.managed is False
    assert LockModel._meta.db_table not in connection.introspection.table_names()
    codenames = set(
        Permission.objects.filter(content_type__app_label="django_redislock").values_list(
            "codename", flat=True
        )
    )
    assert codenames == {"view_lock", "force_release_lock"}


# -- small pure functions -----------------------------------------------------------------------


def test_name_glob_turns_plain_text_into_a_substring_match():
    assert name_glob("") is None
    assert name_glob(" invoice ") == "*invoice*"
    assert name_glob("invoice:*") == "invoice:*"
    assert name_glob("a?c") == "a?c"


def test_parse_selection_keeps_each_token_and_name_pair_once():
    # 0 is an unreadable value's token; two tokens of one name are two holders (semaphores).
    assert parse_selection(["3:a", "x:b", "0:c", "4", ":d", "-1:g", "5:e:f", "6:a", "3:a"]) == [
        (3, "a"),
        (0, "c"),
        (5, "e:f"),
        (6, "a"),
    ]


def test_statistics_page_counts_skips_apart_and_draws_svg_charts(viewer, take):
    for _ in range(3):
        with Lock("report:{n}"):
            pass
    stats.record(None, "report:{n}", "skipped")
    stats.record(None, "report:{n}", "deduplicated")
    stats.record(None, "report:{n}", "deduplicated")
    take("held-now")
    stats.flush()
    html = logged_in(viewer).get(reverse("admin:django_redislock_lock_statistics")).content.decode()
    text = texts(html)
    assert "Skipped / deduplicated" in text
    row = cells(html, has="report:")
    assert row[:6] == ["report:{n}", "3", "0", "0", "100.0%", "1&nbsp;/ 2"], row  # rate stays 100 %
    assert "<script" not in html.split('id="redislock-charts"')[1]  # server-rendered, no JS
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing from a CDN
    charts = html.split('id="redislock-charts"')[1]
    cards = charts.split('class="chart-card"')[1:]
    [report] = [card for card in cards if "<h3>report:{n}</h3>" in card]
    assert report.count('<svg class="chart"') == 2  # its wait and hold distributions
    assert "n = 3" in report  # three waits, three holds
    assert 'class="redislock-chart chart-timeline"' in charts  # acquisitions this minute
    assert 'class="bar bar-acquired"' in charts
    assert re.search(r"0 min ago \(.*\): \d+ acquired", charts)
    assert 'class="bar bar-holder"' in charts and "held-now" in charts


def test_statistics_charts_fall_back_to_totals_without_recent_minutes(viewer):
    from django_redislock.client import StatsUpdate, write_stats
    from django_redislock.runtime import get_client, keyspace

    space = keyspace()
    update = StatsUpdate(
        space.stats("old"), space.stats_max("old"), {"acquired": 5, "failed": 1}, {}, {}
    )
    write_stats(get_client(), [update], now=0, ttl=60)
    html = logged_in(viewer).get(reverse("admin:django_redislock_lock_statistics")).content.decode()
    charts = html.split('id="redislock-charts"')[1]
    assert "chart-outcomes" in charts and "No acquisition in the last hour" in charts
    assert "No lock is held right now." in charts


# -- every name reachable: dot segments, control characters (issue 27) -----------------------------

#: Names a naive URL or form would lose: dot segments a browser removes from a path (``%2E``
#: too), characters HTML forms rewrite (CR, LF, NUL), and text that looks like an escape.
HOSTILE_NAMES = [
    ".",
    "..",
    "...",
    "a/../b",
    "%2E",
    "%2e%2E",
    "_2E",
    "_5F",
    "line\nbreak",
    "cr\rreturn",
    "nul\x00byte",
    "tab\tx",
    "back\\slash",
    "q?x#y",
]

_DOT_SEGMENT = re.compile(r"(?:\.|%2e){1,2}", flags=re.IGNORECASE)


def browser_path(href: str) -> str:
    """The path a browser requests for ``href``: dot segments (``.``, ``..``, and their
    ``%2e`` spellings, as the WHATWG URL standard says) resolved away."""
    from urllib.parse import urljoin

    segments = [
        segment.lower().replace("%2e", ".") if _DOT_SEGMENT.fullmatch(segment) else segment
        for segment in href.split("/")
    ]
    return urljoin("http://testserver/", "/".join(segments)).removeprefix("http://testserver")


def as_a_browser_submits(value: str) -> str:
    """A form value after HTML parsing (NUL -> U+FFFD, CR/CRLF -> LF) and form submission
    (every line break sent as CRLF)."""
    value = value.replace("\x00", "\ufffd").replace("\r\n", "\n").replace("\r", "\n")
    return value.replace("\n", "\r\n")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_every_lock_name_links_to_its_detail_page_and_can_be_force_released(operator, take, name):
    from html import escape, unescape

    lock = take(name, timeout=60)
    client = logged_in(operator)
    listing = client.get(list_url()).content.decode()
    [href] = re.findall(r'<th class="field-name"><a href="([^"]*)">', listing)
    detail = client.get(browser_path(unescape(href)))
    assert detail.status_code == 200, (href, browser_path(unescape(href)))
    page = detail.content.decode()
    assert f"<td>{escape(name, quote=False)}</td>" in page.replace("&#x27;", "'")
    [value] = re.findall(r'name="_selected_action" value="([^"]*)"', page)
    selected = as_a_browser_submits(unescape(value))
    confirm = client.post(
        list_url(), {"action": ACTION, "_selected_action": selected}
    ).content.decode()
    assert 'class="release-candidate"' in confirm, texts(confirm).split("Force-release locks?")[-1]
    [value] = re.findall(r'name="_selected_action" value="([^"]*)"', confirm)
    selected = as_a_browser_submits(unescape(value))
    client.post(list_url(), {"action": ACTION, "_selected_action": selected, "post": "yes"})
    assert get_lock_info(name) is None
    entry = LogEntry.objects.get()
    assert entry.object_id == name and f"fencing token {lock.fencing_token}" in entry.change_message


def test_encoded_names_decode_exactly_and_django_quoted_ones_too():
    from django.contrib.admin.utils import quote as django_quote

    from django_redislock.admin import decode_name

    for name in [*HOSTILE_NAMES, "_0A", "a_2Fb", "\x85\x7f", "caf\u00e9 \u2028", "_"]:
        assert decode_name(encode_name(name)) == name
        assert decode_name(django_quote(name)) == name  # links made before the change
    assert encode_name(".") == "_2E" and encode_name("..") == "_2E_2E"
    assert parse_selection(["7:" + encode_name("a_b\r\n")]) == [(7, "a_b\r\n")]


def test_ordinary_names_keep_their_detail_urls():
    """URLs bookmarked or logged before dot names were encoded still lead to the same lock."""
    from django.contrib import admin

    from django_redislock.models import Lock as LockModel

    admin_view = admin.site._registry[LockModel]
    assert isinstance(admin_view, LockAdmin)
    for name in ("job", "odd/name with spaces", "billing.tasks.sync_ledger:12", "a_b:c", "é x"):
        assert admin_view.detail_url(name) == detail_url(name)


def test_detail_urls_of_dot_names_check_permissions_too(client, staff, viewer, take):
    take("..", timeout=60)
    url = reverse("admin:django_redislock_lock_change", args=["_2E_2E"])
    assert client.get(url).status_code == 302
    assert logged_in(staff).get(url).status_code == 403
    assert logged_in(viewer).get(url).status_code == 200


# -- rate limiters (issue 30): listed, a page of their own, Reset ----------------------------------


def reset_url(name: str) -> str:
    return reverse("admin:django_redislock_lock_reset", args=[quote(name)])


def drained(name: str, rate: str = "1/h") -> RateLimiter:
    limiter = RateLimiter(name, rate)
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    return limiter


def test_a_limiter_is_listed_without_a_force_release_checkbox(operator):
    drained("api:geocoder")
    with Lock("a-lock", timeout=30):
        html = logged_in(operator).get(list_url()).content.decode()
    assert sorted(names_listed(html)) == ["a-lock", "api:geocoder"]
    row = cells(html, has="api:geocoder")
    assert "rate limiter" in row[2]
    assert row[3:6] == ["-", "-", "-"]
    assert html.count('class="action-select"') == 1  # the lock's, not the limiter's


def test_the_detail_page_shows_what_the_limiter_allowed_and_refused(viewer):
    drained("tenant:7")
    stats.flush()
    response = logged_in(viewer).get(detail_url("tenant:7"))
    assert response.status_code == 200
    text = texts(response.content.decode())
    assert "Rate limiter" in text and "Rested in" in text
    assert "This minute so far 1 allowed, 1 limited" in text
    assert "Reset" not in text  # viewing is not resetting


def test_reset_takes_a_confirmation_then_resets_and_is_audited(operator):
    limiter = drained("export")
    client = logged_in(operator, enforce_csrf_checks=True)
    page = client.get(detail_url("export")).content.decode()
    assert f'action="{reset_url("export")}"' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    confirm = client.post(reset_url("export"), {"csrfmiddlewaretoken": token})
    assert confirm.status_code == 200
    assert "Are you sure you want to reset the rate limiter" in texts(confirm.content.decode())
    assert not limiter.try_acquire()  # nothing reset yet
    token = re.search(  # type: ignore[union-attr]
        r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode()
    ).group(1)
    done = client.post(reset_url("export"), {"csrfmiddlewaretoken": token, "post": "yes"})
    assert done.status_code == 302
    assert limiter.try_acquire()
    entry = LogEntry.objects.get(object_id="export")
    assert (entry.user_id, entry.action_flag) == (operator.pk, CHANGE)
    assert "Reset rate limiter" in entry.change_message


def test_reset_without_csrf_token_is_rejected(operator):
    limiter = drained("no-csrf")
    client = logged_in(operator, enforce_csrf_checks=True)
    assert client.post(reset_url("no-csrf"), {"post": "yes"}).status_code == 403
    assert not limiter.try_acquire()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_viewer_cannot_reset_on_any_request(viewer, method):
    limiter = drained("guarded")
    response = getattr(logged_in(viewer), method)(reset_url("guarded"), {"post": "yes"})
    assert response.status_code == 403
    assert not limiter.try_acquire()


def test_reset_is_post_only(operator):
    assert logged_in(operator).get(reset_url("x")).status_code == 405


def test_a_name_with_odd_characters_round_trips(operator):
    name = "a/b?c=d&e {f}"
    limiter = drained(name)
    client = logged_in(operator)
    assert client.get(detail_url(name)).status_code == 200
    assert client.post(reset_url(name), {"post": "yes"}).status_code == 302
    assert limiter.try_acquire()


def test_a_posted_limiter_is_no_force_release_candidate(operator):
    limiter = drained("not-a-lock")
    client = logged_in(operator)
    page = client.post(list_url(), release_post("not-a-lock", 0, confirmed=False))
    assert "Are you sure" not in texts(page.content.decode())
    client.post(list_url(), release_post("not-a-lock", 0, confirmed=True))
    assert not limiter.try_acquire()  # untouched
    assert not LogEntry.objects.exists()


def test_resetting_a_rested_limiter_says_so(operator):
    client = logged_in(operator)
    response = client.post(reset_url("never-used"), {"post": "yes"}, follow=True)
    assert "had no history to reset" in texts(response.content.decode())
    assert not LogEntry.objects.exists()


def test_reset_with_redis_down_changes_nothing_and_says_why(operator):
    with override_settings(CACHES=DEAD_CACHES):
        response = logged_in(operator).post(reset_url("down"), {"post": "yes"}, follow=True)
    assert "Redis is unreachable" in texts(response.content.decode())
    assert not LogEntry.objects.exists()


def test_the_statistics_page_shows_allowed_limited_and_throttled(viewer):
    drained("counted-rate")
    stats.record(None, "counted-rate", "throttled")
    stats.flush()
    html = logged_in(viewer).get(reverse("admin:django_redislock_lock_statistics")).content.decode()
    # The outcomes chart draws them (the table keeps its width; the cell's title says throttled);
    # a limiter's decisions are not acquisitions, so they stay out of the timeline.
    assert '<rect class="bar bar-allowed"' in html
    assert '<rect class="bar bar-limited"' in html and '<rect class="bar bar-throttled"' in html
    assert "0 skipped, 0 deduplicated, 1 throttled" in html
