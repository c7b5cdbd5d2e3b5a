"""Rate limiters in the admin (issue 30, point 4): listed, their own detail page, and a reset
that takes the force-release permission, a confirmation, a CSRF token and leaves an audit entry."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.test import override_settings
from django.urls import reverse

from django_redislock import Lock, RateLimiter, stats
from tests.test_admin import (
    DEAD_CACHES,
    cells,
    detail_url,
    list_url,
    logged_in,
    make_user,
    names_listed,
    texts,
)

pytestmark = pytest.mark.django_db


def reset_url(name: str) -> str:
    return reverse("admin:django_redislock_lock_reset", args=[quote(name)])


@pytest.fixture
def viewer(django_user_model):
    return make_user(django_user_model, "viewer", "view_lock")


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "operator", "view_lock", "force_release_lock")


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
    stats.flush()
    html = logged_in(viewer).get(reverse("admin:django_redislock_lock_statistics")).content.decode()
    row = cells(html, has="counted-rate")
    assert "1&nbsp;/ 1&nbsp;/ 0" in row
