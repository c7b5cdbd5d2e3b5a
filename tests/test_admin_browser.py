"""The Locks admin in a real headless Chromium (Playwright) against a live Django server.

Besides the force-release walk-through, the layout tests look at the pages as an operator does,
at 1280 px (admin navigation sidebar open) and 390 px (a phone): every column of the locks list
and of the statistics is on screen or in its table's own scroll box, the page itself never
scrolls sideways, and column headers are apart. Each check is made twice: on the DOM geometry,
and on the screenshot's pixels (the header text is painted inside the visible area; there is
background between two headers). The statistics charts keep their text at 11 px or more (a
compact drawing on a phone), the timeline opens on its latest minute with round ticks, and
statistics names wrap between their dotted parts, never inside a word. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client

from django_redislock import Lock, get_lock_info
from django_redislock.client import StatsUpdate, write_stats
from django_redislock.runtime import get_client, keyspace
from tests.conftest import ROOT, start_holder
from tests.screenshots import read_png

pytestmark = pytest.mark.slow

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
def browser(monkeypatch):
    """Headless Chromium; Playwright's sync API runs an event loop, hence the async-unsafe flag."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def browser_page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(15_000)
    return page


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


@pytest.mark.django_db(transaction=True)
def test_operator_resets_a_rate_limiter_from_its_page(live_server, browser_page, operator):
    from playwright.sync_api import expect

    from django_redislock import RateLimiter

    limiter = RateLimiter("partner-api", "1/h")
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    page = browser_page
    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.get_by_role("link", name="Locks", exact=True).click()
    row = page.locator("#result_list tbody tr", has_text="partner-api")
    expect(row.locator(".field-owner")).to_contain_text("rate limiter")
    expect(row.locator("input.action-select")).to_have_count(0)
    row.get_by_role("link", name="partner-api").click()
    expect(page.locator("#rate-detail")).to_contain_text("Rested in")
    page.locator("#rate-reset").click()
    expect(page.locator("#content-main")).to_contain_text("Are you sure you want to reset")
    assert not limiter.try_acquire()  # nothing happens before confirming
    page.screenshot(path=str(ARTIFACTS / "admin_rate_reset_confirm.png"), full_page=True)
    page.locator("#confirm-reset").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Reset rate limiter “partner-api”.")
    assert limiter.try_acquire()
    entry = LogEntry.objects.get()
    assert (entry.user_id, entry.object_id) == (operator.pk, "partner-api")


# -- names a browser would rewrite ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_locks_named_dot_and_dot_dot_are_reachable_and_releasable(live_server, browser, operator):
    """A browser drops ``.`` and ``..`` segments from a path (``%2E`` too) and HTML forms turn a
    lone LF into CRLF: every name still leads from the list to its detail page, and on to its
    force release."""
    from playwright.sync_api import expect

    names = [".", "..", "line\nbreak"]
    for name in names:
        assert Lock(name, timeout=60, auto_renew=False).acquire()
    page = open_page(browser, live_server, operator, 1280, "/admin/django_redislock/lock/")
    list_url = page.url
    for name in (".", ".."):
        page.goto(list_url)
        page.locator("#result_list th.field-name a").filter(
            has_text=re.compile(f"^{re.escape(name)}$")
        ).click()
        expect(page.locator("#lock-detail td").first).to_have_text(name)
        expect(page.locator("#content h1")).to_have_text(name)
    page.screenshot(path=str(ARTIFACTS / "admin-detail-dot-dot.png"), full_page=True)

    # From the detail page of "..": force release, confirmation, done.
    page.get_by_role("button", name="Force release…").click()
    expect(page.locator("#content h1")).to_have_text("Force-release locks?")
    expect(page.locator("tr.release-candidate td").first).to_have_text("..")
    assert get_lock_info("..") is not None  # nothing happens before confirming
    page.get_by_role("button", name="Yes, release").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Force-released 1 lock: ...")
    assert get_lock_info("..") is None and get_lock_info(".") is not None

    # From the list, by its checkbox: a name with a line break comes back unchanged.
    page.goto(list_url)
    row = page.locator("#result_list tbody tr", has_text="line break")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "force_release_selected")
    page.get_by_role("button", name="Go").click()
    expect(page.locator("tr.release-candidate")).to_have_count(1)
    page.get_by_role("button", name="Yes, release").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Force-released 1 lock: line")
    assert get_lock_info("line\nbreak") is None and get_lock_info(".") is not None
    assert sorted(LogEntry.objects.values_list("object_id", flat=True)) == ["..", "line\nbreak"]


# -- layout ----------------------------------------------------------------------------------------

#: Lock records as production writes them: long dotted task names, pod host names, task ids.
NOW_MS = int(time.time() * 1000)
REALISTIC_LOCKS = [
    (
        f"billing.tasks.reconcile_ledger_entries_for_customer_account:{account}",
        {
            "host": f"celery-worker-billing-7d9f8b6c5d-{suffix}.prod.eu-west-1.internal",
            "pid": 41234 + i,
            "thread": "MainThread",
            "task_id": f"c0a8f6b2-1f7e-4a43-9d4e-5b5c1f0e8e{i:02d}",
            **({"queued": True} if i == 2 else {}),
        },
        3_600_000 * (i + 1) + 123_456,
    )
    for i, (account, suffix) in enumerate(
        [(1234567, "x2k9p"), (7654321, "q8w7e"), (1111111, "m3n4b"), (98765432, "z1y2x")]
    )
]
STATS = {
    name: StatsUpdate(
        key="",
        max_key="",
        counters={
            "acquired": 12_345,
            "contended": 2_345,
            "failed": 123,
            "released": 12_300,
            "lost": 12,
            "force_released": 3,
            "skipped": 40,
            "deduplicated": 7,
            # Histogram buckets (seconds): waits mostly <= 5 ms, holds spread over minutes.
            "wait_le_0.005": 10_000,
            "wait_le_1": 2_000,
            "wait_le_300": 300,
            "wait_le_inf": 45,
            "hold_le_1": 300,
            "hold_le_60": 4_000,
            "hold_le_300": 6_000,
            "hold_le_1800": 2_000,
        },
        totals={"wait_total": 12_345 * 75.5, "hold_total": 12_300 * 754.0},
        maxima={"wait": 7_384.0, "hold": 200_000.0},
    )
    for name, _, _ in REALISTIC_LOCKS
}


@pytest.fixture
def realistic_data(redis_client):
    """Locks (one queued, one unreadable, one without TTL) and statistics worth minutes/hours."""
    keys = keyspace()
    for i, (name, meta, ttl_ms) in enumerate(REALISTIC_LOCKS):
        record = {"o": f"owner-{i}", "n": 1, "t": 1795548632468931 + i, "at": NOW_MS, "m": meta}
        redis_client.set(keys.lock(name), json.dumps(record), px=ttl_ms if i else None)
    redis_client.set(keys.lock("legacy-cron-lock"), b"\xff\xfe written by an old cron script")
    minute = int(time.time() // 60)
    updates = []
    for i, (n, u) in enumerate(STATS.items()):
        # Acquisitions over the last hour: every fifth minute busy, some with failures.
        series: dict[str, dict[str, int]] = {}
        for m in range(minute - 50, minute + 1, 5):
            hour = series.setdefault(keys.stats_minutes(n, m // 60), {})
            hour.update({f"a:{m}": 5 + (m % 7) * i, f"f:{m}": m % 3})
        updates.append(
            StatsUpdate(keys.stats(n), keys.stats_max(n), u.counters, u.totals, u.maxima, series)
        )
    write_stats(get_client(), updates, now=time.time(), ttl=3600)
    assert Lock("short", timeout=30, auto_renew=False).acquire()


def open_page(browser, live_server, user, width: int, path: str):
    """A logged-in page at ``width`` x 800 (logged in by session cookie, not by the form)."""
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(live_server.url + path)
    return page


GEOMETRY_JS = """
(selector) => {
  const rect = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  // Where a header is painted: its text glyphs (and a checkbox), not its padded box.
  const ink = (th) => {
    const rects = [];
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      if (!walker.currentNode.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(walker.currentNode);
      rects.push(...range.getClientRects());
    }
    th.querySelectorAll('input').forEach((i) => rects.push(i.getBoundingClientRect()));
    return {left: Math.min(...rects.map((r) => r.left)),
            right: Math.max(...rects.map((r) => r.right)),
            top: Math.min(...rects.map((r) => r.top)),
            bottom: Math.max(...rects.map((r) => r.bottom))};
  };
  const table = document.querySelector(selector);
  const box = table.closest('.results');
  const headers = [...table.querySelectorAll('thead th')].map((th) => (
    {text: th.innerText.trim(), cell: rect(th.getBoundingClientRect()), ink: ink(th)}));
  return {
    headers,
    box: {...rect(box.getBoundingClientRect()), scrollWidth: box.scrollWidth,
          clientWidth: box.clientWidth, overflowX: getComputedStyle(box).overflowX},
    page: {scrollWidth: document.documentElement.scrollWidth,
           clientWidth: document.documentElement.clientWidth},
    sidebarOpen: !!document.querySelector('.main.shifted #nav-sidebar'),
  };
}
"""

PAGES = {
    "list": ("/admin/django_redislock/lock/", "#result_list", "Expires in"),
    "statistics": ("/admin/django_redislock/lock/statistics/", "#stats-list", "Force-released"),
    # The statistics of one name under its lock (no change list around it: issue 29).
    "detail": (
        f"/admin/django_redislock/lock/{REALISTIC_LOCKS[1][0]}/change/",
        "#stats-list",
        "Force-released",
    ),
}


def header_strip(page, geometry: dict[str, Any], name: str) -> tuple[Any, int, int]:
    """Screenshot of the visible part of the header row: ``(image, x offset, y offset)``."""
    inks = [h["ink"] for h in geometry["headers"]]
    box = geometry["box"]
    left = max(int(box["left"]), 0)
    right = min(int(box["right"]), page.viewport_size["width"])
    top = int(min(i["top"] for i in inks)) - 2
    bottom = int(max(i["bottom"] for i in inks)) + 2
    path = ARTIFACTS / f"{name}-headers.png"
    page.screenshot(
        path=str(path), clip={"x": left, "y": top, "width": right - left, "height": bottom - top}
    )
    return read_png(path), left, top


def assert_headers_painted_apart(image, x0: int, geometry: dict[str, Any], gap: int) -> None:
    """Each header's text has ink inside the screenshot, with >= ``gap`` px of background between
    it and the next header's text."""
    inked = image.inked_columns(0, image.width, 1, image.height - 1)
    headers = geometry["headers"]
    for header in headers:
        left, right = int(header["ink"]["left"]) - x0, int(header["ink"]["right"]) - x0
        assert any(inked[max(left, 0) : max(right, 0)]), f"{header['text']!r} is not painted"
    for this, following in itertools.pairwise(headers):
        start, end = int(this["ink"]["right"]) - x0 + 1, int(following["ink"]["left"]) - x0 - 1
        assert end - start >= gap and not any(inked[start:end]), (
            f"headers {this['text']!r} and {following['text']!r} run together on screen"
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page_name", list(PAGES))
def test_every_column_fits_next_to_the_open_sidebar_at_1280px(
    live_server, browser, operator, realistic_data, page_name
):
    path, selector, last = PAGES[page_name]
    page = open_page(browser, live_server, operator, 1280, path)
    page.locator(selector).scroll_into_view_if_needed()  # the detail page has it below the lock
    page.screenshot(path=str(ARTIFACTS / f"admin-layout-{page_name}-1280.png"))
    geometry = page.evaluate(GEOMETRY_JS, selector)
    assert geometry["sidebarOpen"]
    assert geometry["page"]["scrollWidth"] <= geometry["page"]["clientWidth"]
    box = geometry["box"]
    assert box["right"] <= 1280
    assert box["scrollWidth"] <= box["clientWidth"], "the table is wider than its box"
    assert geometry["headers"][-1]["text"].lower() == last.lower()
    for header in geometry["headers"]:
        cell = header["cell"]
        assert box["left"] - 0.5 <= cell["left"] and cell["right"] <= box["right"] + 0.5, header
    image, x0, _ = header_strip(page, geometry, f"admin-layout-{page_name}-1280")
    assert_headers_painted_apart(image, x0, geometry, gap=8)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page_name", list(PAGES))
def test_on_a_phone_the_table_scrolls_in_its_box_not_the_page(
    live_server, browser, operator, realistic_data, page_name
):
    path, selector, last = PAGES[page_name]
    page = open_page(browser, live_server, operator, 390, path)
    page.locator(selector).scroll_into_view_if_needed()  # the detail page has it below the lock
    page.screenshot(path=str(ARTIFACTS / f"admin-layout-{page_name}-390.png"))
    geometry = page.evaluate(GEOMETRY_JS, selector)
    assert geometry["page"]["scrollWidth"] <= geometry["page"]["clientWidth"], "page scrolls"
    box = geometry["box"]
    assert box["left"] >= 0 and box["right"] <= 390
    assert box["overflowX"] in ("auto", "scroll")
    for header in geometry["headers"]:  # every column is inside the box's scrollable width
        assert header["cell"]["right"] - box["left"] <= box["scrollWidth"] + 0.5, header
    # Scrolled to its end, the box shows the last column whole, inside the screen.
    page.eval_on_selector(
        selector, "(t) => { const b = t.closest('.results'); b.scrollLeft = b.scrollWidth; }"
    )
    scrolled = page.evaluate(GEOMETRY_JS, selector)
    final = scrolled["headers"][-1]
    assert final["text"].lower() == last.lower()
    assert scrolled["box"]["left"] - 0.5 <= final["cell"]["left"]
    assert final["cell"]["right"] <= min(scrolled["box"]["right"], 390) + 0.5
    page.screenshot(path=str(ARTIFACTS / f"admin-layout-{page_name}-390-scrolled.png"))
    image, x0, _ = header_strip(page, scrolled, f"admin-layout-{page_name}-390-scrolled")
    visible = [h for h in scrolled["headers"] if h["cell"]["left"] >= scrolled["box"]["left"]]
    assert_headers_painted_apart(image, x0, {"headers": visible}, gap=8)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 390])
def test_detail_pages_never_scroll_sideways(live_server, browser, operator, realistic_data, width):
    for name in (REALISTIC_LOCKS[2][0], "legacy-cron-lock"):
        page = open_page(
            browser, live_server, operator, width, f"/admin/django_redislock/lock/{name}/change/"
        )
        assert page.locator("#lock-detail").is_visible()
        page.screenshot(path=str(ARTIFACTS / f"admin-layout-detail-{name[:12]}-{width}.png"))
        overflow = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert overflow[0] <= overflow[1], (name, overflow)


# -- statistics charts ---------------------------------------------------------------------------

CHARTS_JS = """
() => {
  const rect = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                        width: r.width, height: r.height});
  // The drawing on screen: a wide chart's compact drawing is in the page too, not displayed.
  const shown = [...document.querySelectorAll('#redislock-charts svg.chart')].filter(
    (svg) => getComputedStyle(svg).display !== 'none');
  const charts = shown.map((svg) => {
    const scroll = svg.closest('.chart-scroll');
    // Text size on screen: the font size times the SVG's scale (viewBox units to CSS px).
    const scale = svg.getScreenCTM().a;
    return {
      figure: svg.closest('figure').className,
      drawing: svg.getAttribute('class'),
      box: rect(svg.getBoundingClientRect()),
      scroll: {...rect(scroll.getBoundingClientRect()), scrollWidth: scroll.scrollWidth,
               clientWidth: scroll.clientWidth, scrollLeft: scroll.scrollLeft},
      bars: [...svg.querySelectorAll('rect.bar')].map((r) => ({
        box: rect(r.getBoundingClientRect()), title: r.querySelector('title').textContent})),
      texts: [...svg.querySelectorAll('text')].map((t) => ({
        box: rect(t.getBoundingClientRect()), text: t.textContent,
        px: parseFloat(getComputedStyle(t).fontSize) * scale})),
    };
  });
  return {
    charts,
    cards: [...document.querySelectorAll('#chart-distributions .chart-card')].map((card) => ({
      name: card.querySelector('h3').textContent.trim(),
      kinds: [...card.querySelectorAll('figure')].map((f) => f.className.split(' ').pop())})),
    page: {scrollWidth: document.documentElement.scrollWidth,
           clientWidth: document.documentElement.clientWidth},
    skipped: Object.fromEntries([...document.querySelectorAll('#stats-list tbody tr')].map(
      (tr) => [tr.querySelector('.field-name').textContent.trim(),
               tr.querySelector('.field-skipped').textContent.trim()])),
  };
}
"""


def overlap(a: dict[str, float], b: dict[str, float], slack: float = 0.5) -> bool:
    return (
        a["left"] < b["right"] - slack
        and b["left"] < a["right"] - slack
        and a["top"] < b["bottom"] - slack
        and b["top"] < a["bottom"] - slack
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 390])
def test_statistics_charts_are_drawn_legibly_and_fit(
    live_server, browser, operator, realistic_data, width
):
    page = open_page(browser, live_server, operator, width, PAGES["statistics"][0])
    shot = ARTIFACTS / f"admin-charts-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    found = page.evaluate(CHARTS_JS)
    assert found["page"]["scrollWidth"] <= found["page"]["clientWidth"], "page scrolls sideways"
    # (Figures of other names may show up too: this process's "short" lock, flushed whenever the
    # background flusher runs.)
    for name in STATS:
        assert found["skipped"][name] == "40\xa0/ 7"  # the skipped / deduplicated column
    kinds = [c["figure"].split()[-1] for c in found["charts"]]
    # Acquisitions over time (the series exists), current holders, then wait + hold per template.
    assert kinds[:2] == ["chart-timeline", "chart-holders"]
    cards = {card["name"]: card["kinds"] for card in found["cards"]}
    for name in STATS:
        assert cards[name] == ["chart-wait", "chart-hold"]
    for chart in found["charts"]:
        assert chart["bars"], f"{chart['figure']} has no bars"
        assert all(b["box"]["width"] > 0 and b["box"]["height"] > 0 for b in chart["bars"])
        # Inside the screen, or scrolling inside its own box (phones), never the page.
        scroll = chart["scroll"]
        assert scroll["left"] >= -0.5 and scroll["right"] <= width + 0.5, chart["figure"]
        assert chart["box"]["width"] <= scroll["scrollWidth"] + 0.5
        # Text is legible (never under 11 px on screen: a narrow box gets the compact drawing,
        # not shrunken text) and never drawn over other text or over a bar.
        svg = chart["box"]
        for text in chart["texts"]:
            assert text["px"] >= 10.95, (chart["figure"], text)
            assert text["box"]["height"] >= 12, (chart["figure"], text)
            inside = svg["left"] - 0.5 <= text["box"]["left"] <= text["box"]["right"]
            assert inside and text["box"]["right"] <= svg["right"] + 0.5, (chart["figure"], text)
        for one, other in itertools.combinations(chart["texts"], 2):
            assert not overlap(one["box"], other["box"]), (chart["figure"], one, other)
        for text in chart["texts"]:
            for bar in chart["bars"]:
                assert not overlap(text["box"], bar["box"]), (chart["figure"], text, bar)
    timeline, holders = found["charts"][0], found["charts"][1]
    # The wide drawings beside the sidebar; on a phone the compact ones (labels above the bars).
    drawing = "chart chart-wide" if width >= 1000 else "chart chart-compact"
    assert (timeline["drawing"], holders["drawing"]) == (drawing, drawing)
    assert len(timeline["bars"]) > 11  # 11 busy minutes, some with failures stacked on top
    assert any("failed" in b["title"] for b in timeline["bars"])
    # Longest held first: the locks of REALISTIC_LOCKS were acquired "now" in the record, so
    # each holder has a bar; the tooltip names who holds it.
    assert len(holders["bars"]) == len(REALISTIC_LOCKS) + 1  # + "short" (the unreadable: none)
    assert any("fencing token" in b["title"] for b in holders["bars"])
    # What a person sees: the timeline's bars are painted (pixels, not only DOM).
    image = read_png(shot)
    box = timeline["box"]
    scroll_y = page.evaluate("window.scrollY")
    inked = image.inked_columns(
        int(box["left"]),
        int(box["right"]),
        int(box["top"] + scroll_y),
        int(box["bottom"] + scroll_y),
    )
    assert sum(inked) > len(inked) // 3, "the timeline chart is not painted"


# -- issue 29: names, the timeline's scroll and ticks ----------------------------------------------

#: Names as Celery's task names make them: dotted paths with underscores.
DOTTED_NAMES = ["reports.tasks.build_report", "reports.tasks.sync_inventory"]


@pytest.fixture
def dotted_stats(realistic_data):
    keys = keyspace()
    figures = next(iter(STATS.values()))
    write_stats(
        get_client(),
        [
            StatsUpdate(
                keys.stats(n), keys.stats_max(n), figures.counters, figures.totals, figures.maxima
            )
            for n in DOTTED_NAMES
        ],
        now=time.time(),
        ttl=3600,
    )


NAME_LINES_JS = """
(selector) => [...document.querySelectorAll(selector)].map((cell) => {
  // The text of each line the cell is painted on, from the position of every character.
  const lines = [];
  let top = null, line = '';
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const r = range.getClientRects()[0];
      if (!r) continue;
      if (top !== null && r.top > top + r.height / 2) { lines.push(line); line = ''; }
      if (top === null || r.top > top + r.height / 2) top = r.top;
      line += node.data[i];
    }
  }
  lines.push(line);
  return {name: cell.textContent, lines};
})
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("page_name", ["statistics", "detail"])
def test_statistics_names_wrap_between_their_parts_never_inside_a_word(
    live_server, browser, operator, dotted_stats, page_name, width
):
    """``reports.tasks.build_repor|t`` was a reviewer's 1280 px view: a name wraps after a dot,
    an underscore or a hyphen, or not at all."""
    page = open_page(browser, live_server, operator, width, PAGES[page_name][0])
    page.screenshot(path=str(ARTIFACTS / f"admin-names-{page_name}-{width}.png"), full_page=True)
    # The table's names, and the headings of the statistics page's wait and hold cards.
    cells = page.evaluate(NAME_LINES_JS, "#stats-list tbody .field-name, .chart-card h3")
    names = {cell["name"] for cell in cells}
    assert REALISTIC_LOCKS[1][0] in names
    if page_name == "statistics":
        assert set(DOTTED_NAMES) <= names
        assert page.locator(".chart-card h3").count() >= 6  # 4 + 2 templates' cards checked too
    for cell in cells:
        assert "".join(cell["lines"]) == cell["name"], cell
        for line in cell["lines"][:-1]:
            assert line[-1] in "._-", f"{cell['name']!r} breaks inside a word: {cell['lines']}"
    # The long names do wrap (the check above is not vacuous), between whole parts.
    wrapped = [cell for cell in cells if len(cell["lines"]) > 1]
    assert wrapped, cells


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [1280, 390, 320])
def test_the_timeline_opens_on_its_latest_minute_with_round_ticks(
    live_server, browser, operator, realistic_data, width
):
    """On a phone the timeline is drawn narrower and fits; narrower still it scrolls, and opens
    scrolled to its right end ("now"), never to the oldest minute. Ticks are round minutes."""
    page = open_page(browser, live_server, operator, width, PAGES["statistics"][0])
    page.locator("#chart-activity").screenshot(path=str(ARTIFACTS / f"admin-timeline-{width}.png"))
    timeline = page.evaluate(CHARTS_JS)["charts"][0]
    assert "chart-timeline" in timeline["figure"]
    scroll = timeline["scroll"]
    visible = (scroll["left"] - 0.5, scroll["right"] + 0.5)
    latest = [b for b in timeline["bars"] if b["title"].startswith("0 min ago")]
    assert latest, "the latest minute has a bar (realistic_data)"
    for bar in latest:
        assert visible[0] <= bar["box"]["left"] and bar["box"]["right"] <= visible[1], bar
    [now] = [t for t in timeline["texts"] if t["text"] == "now"]
    assert visible[0] <= now["box"]["left"] and now["box"]["right"] <= visible[1], now
    if width >= 390:  # the whole hour fits
        assert scroll["scrollWidth"] <= scroll["clientWidth"]
        for bar in timeline["bars"]:
            assert visible[0] <= bar["box"]["left"] and bar["box"]["right"] <= visible[1], bar
    else:  # it scrolls inside its box, and opened at its end
        assert scroll["scrollWidth"] > scroll["clientWidth"]
    ticks = [t["text"] for t in timeline["texts"] if re.fullmatch(r"-\d+ min", t["text"])]
    assert len(ticks) >= 3, timeline["texts"]
    minutes = [int(tick[1:].split()[0]) for tick in ticks]
    assert all(m % 5 == 0 for m in minutes), ticks
    assert minutes == sorted(minutes, reverse=True)  # oldest at the left
