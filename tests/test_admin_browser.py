"""The Locks admin in a real headless Chromium (Playwright) against a live Django server."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission

from django_redislock import get_lock_info
from tests.conftest import ROOT, start_holder

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser_page(monkeypatch):
    """One Chromium page; Playwright's sync API runs an event loop, hence the async-unsafe flag."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(15_000)
        try:
            yield page
        finally:
            browser.close()


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("ops", password="s3cret-pass", is_staff=True)
    for codename in ("view_lock", "force_release_lock"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislock", codename=codename)
        )
    return user


@pytest.mark.django_db(transaction=True)
def test_operator_force_releases_a_lock_held_by_another_process(
    live_server, browser_page, operator
):
    from playwright.sync_api import expect

    proc, held = start_holder("nightly-report", "--timeout", "10")
    try:
        page = browser_page
        ARTIFACTS.mkdir(exist_ok=True)

        page.goto(f"{live_server.url}/admin/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "s3cret-pass")
        page.click("input[type=submit]")
        page.get_by_role("link", name="Locks", exact=True).click()

        row = page.locator("#result_list tbody tr", has_text="nightly-report")
        expect(row).to_have_count(1)
        expect(row.locator(".field-owner")).to_contain_text(f" · {held['pid']} · MainThread")
        expect(row.locator(".field-fencing-token")).to_have_text(str(held["token"]))
        page.screenshot(path=str(ARTIFACTS / "admin_locks_list.png"), full_page=True)

        row.locator("input.action-select").check()
        expect(page.locator(".action-counter")).to_contain_text("1 of 1 selected")  # actions.js
        page.select_option("select[name=action]", "force_release_selected")
        page.get_by_role("button", name="Go").click()

        expect(page.locator("#content h1")).to_have_text("Force-release locks?")
        candidate = page.locator("tr.release-candidate")
        expect(candidate).to_contain_text("nightly-report")
        expect(candidate).to_contain_text(str(held["pid"]))
        assert get_lock_info("nightly-report") is not None  # nothing happens before confirming
        page.screenshot(path=str(ARTIFACTS / "admin_force_release_confirm.png"), full_page=True)

        page.get_by_role("button", name="Yes, release").click()

        expect(page.locator("ul.messagelist")).to_contain_text(
            "Force-released 1 lock: nightly-report."
        )
        expect(page.locator("#result_list tbody tr", has_text="nightly-report")).to_have_count(0)
        expect(page.locator("#content-main")).to_contain_text("No lock is held right now.")
        page.screenshot(path=str(ARTIFACTS / "admin_force_release_done.png"), full_page=True)

        assert get_lock_info("nightly-report") is None
        entry = LogEntry.objects.get()
        assert (entry.user_id, entry.object_id) == (operator.pk, "nightly-report")
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
