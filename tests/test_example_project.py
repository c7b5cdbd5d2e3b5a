"""``example_project/run_demo.py`` end to end: what a visitor of ``make demo`` sees.

The supervisor runs as a real subprocess on free ports with its own embedded redis-server, a
prefork Celery worker, two beats (one leader, one standby), uvicorn and the traffic generator.
The test clicks "Build report" five times through the page (with CSRF, over HTTP), sees one task
published and one execution, sees the lock on the admin Locks page after logging in with the
printed credentials, sees exactly one beat lead and beat runs that never overlap, the async view
under ``AsyncLock`` count concurrent requests, the traffic's lock on the statistics page, and a
guarded management command refuse to run twice, then presses Ctrl-C (SIGINT) and checks that
every process the demo started is gone. A second run with ``REDIS_URL`` set uses that server
(and leaves it running on exit). Two demos from one checkout run side by side, as the "port in
use" hint promises, and a supervisor started on a running demo's folder is refused. (Those tests
use ``demo_factory``, which ``conftest.py`` counts as slow.)

The example project's own tests (``example_project/reports/tests/``, written as a project would
write them, with django-redislock's pytest plugin) run here too, in a pytest of their own: a
second or so, no demo needed.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from tests.conftest import wait_for
from tests.redis_server import RedisServer, free_port

# The demo as a user runs it: a CI step of its own (`make test-packaging`), not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.packaging]

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "example_project"
T = TypeVar("T")


class Browser:
    """urllib with a cookie jar: enough to submit Django forms with their CSRF token."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> str:
        with self.opener.open(self.base_url + path.lstrip("/"), timeout=10) as resp:
            return str(resp.read().decode())

    def post_json(self, path: str) -> Any:
        request = urllib.request.Request(self.base_url + path.lstrip("/"), data=b"")
        with self.opener.open(request, timeout=30) as resp:
            return json.load(resp)

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def submit(self, page: str, action: str, fields: dict[str, str]) -> str:
        """GET ``page`` for its CSRF token, POST ``fields`` to ``action``, follow the redirect."""
        html = self.get(page)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
        assert token, f"no CSRF token on {page}"
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), **fields}).encode()
        request = urllib.request.Request(self.base_url + action.lstrip("/"), data=data)
        with self.opener.open(request, timeout=10) as resp:
            return str(resp.read().decode())


class Demo:
    def __init__(
        self, proc: subprocess.Popen[bytes], log: Path, port: int, var_dir: Path, python: Path
    ) -> None:
        self.python = str(python)  # the demo venv's: manage.py in "another terminal" uses it
        self.proc = proc
        self.log = log
        self.port = port
        self.var_dir = var_dir
        self.base_url = f"http://127.0.0.1:{port}/"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self) -> dict[int, float]:
        """Every live descendant of the supervisor: pid -> create time (to tell PID reuse)."""
        found = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                found[child.pid] = child.create_time()
        return found


DemoFactory = Callable[..., Demo]


DEVELOPER_TOOLS = {"pytest", "pytest-django", "ruff", "mypy", "tox", "playwright", "build"}


@pytest.fixture(scope="module")
def demo_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a venv made by ``make demo-venv``, the first step of ``make demo``.

    The demo runs from it, so whatever the demo needs and that target does not install fails
    here; and it must not bring the developer tools (tests, lint, types, benchmarks).
    """
    venv = tmp_path_factory.mktemp("demo-venv") / "venv"
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    proc = subprocess.run(
        ["make", "--no-print-directory", "demo-venv", f"VENV={venv}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python = venv / "bin" / "python"
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"django-redislock", "celery", "django-redis"} <= names, names
    assert not names & DEVELOPER_TOOLS, f"make demo installed {sorted(names & DEVELOPER_TOOLS)}"
    return python


@pytest.fixture
def demo_factory(tmp_path: Path, demo_python: Path) -> Iterator[DemoFactory]:
    """Start ``run_demo.py`` on a free port; whatever a failed test leaves running is stopped."""
    started: list[Demo] = []

    def start(
        *args: str, port: int | None = None, var_root: Path | None = None, **extra_env: str
    ) -> Demo:
        """Without ``var_root`` the demo gets a folder of its own (``--var-dir``); with it, the
        demo picks its folder itself, as ``make demo`` does in a checkout (``var/<port>/``)."""
        port = port or free_port()
        workdir = tmp_path / f"demo{len(started)}"
        workdir.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"REDIS_URL", "DJANGO_SETTINGS_MODULE"} and not k.startswith("DEMO_")
        }
        # Short jobs and a fast beat keep the test well under a minute.
        env.update(DEMO_REPORT_SECONDS="3", DEMO_SYNC_SECONDS="1.5", DEMO_SYNC_INTERVAL="1")
        env.update(extra_env)
        log = workdir / "demo.log"
        command = [str(demo_python), str(DEMO / "run_demo.py"), "--port", str(port)]
        if var_root is None:
            var_dir = workdir / "var"
            command += ["--var-dir", str(var_dir)]
        else:
            var_dir = var_root / str(port)
            env["DEMO_VAR_ROOT"] = str(var_root)
        command += ["--concurrency", "2", "--grace", "10", *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        demo = Demo(proc, log, port, var_dir, demo_python)
        started.append(demo)
        return demo

    yield start
    for demo in started:
        proc = demo.proc
        if proc.poll() is None:  # the test failed half-way: stop it the polite way, then not
            leftovers = demo.processes()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            for pid in leftovers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
        print(demo.output()[-5000:])  # captured: pytest shows it only when the test failed


def beat_roles(demo: Demo) -> dict[str, str] | None:
    """``{"beat-1": "leader", "beat-2": "standby"}`` from the supervisor's output, once both
    beats said which they are (a beat that said both is reported as such)."""
    roles: dict[str, set[str]] = {"beat-1": set(), "beat-2": set()}
    for line in demo.output().splitlines():
        tag, _, message = line.partition(" | ")
        if tag.strip() in roles:
            if "beat: leader (lease 'celery-beat:demo'" in message:
                roles[tag.strip()].add("leader")
            elif "beat: standing by: leader lease 'celery-beat:demo'" in message:
                roles[tag.strip()].add("standby")
    if not all(roles.values()):
        return None
    return {beat: "+".join(sorted(said)) for beat, said in roles.items()}


def wait_until_ready(demo: Demo) -> tuple[str, str]:
    """Wait for the "ready" banner; return the printed admin credentials."""
    wait_for(
        lambda: "ready: " in demo.output() or demo.proc.poll() is not None,
        60,
        0.2,
        what="the demo to print 'ready'",
    )
    assert demo.proc.poll() is None, demo.output()
    assert f"ready: {demo.base_url}" in demo.output()
    creds = re.search(r'login "([^"]+)" password "([^"]+)"', demo.output())
    assert creds, demo.output()
    return creds.group(1), creds.group(2)


def stop(demo: Demo) -> None:
    """Ctrl-C, as in the terminal: a clean exit and the "stopped" line."""
    demo.proc.send_signal(signal.SIGINT)
    assert demo.proc.wait(40) == 0, demo.output()
    assert "stopped" in demo.output()


def gone(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_example_projects_own_tests_pass_with_the_pytest_plugin() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "REDIS_URL"}}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=DEMO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b5 passed\b", proc.stdout), proc.stdout


def test_demo_single_flight_admin_and_clean_shutdown(demo_factory: DemoFactory) -> None:
    demo = demo_factory()
    username, password = wait_until_ready(demo)
    started = demo.processes()
    cmdlines = " ".join(" ".join(psutil.Process(p).cmdline()) for p in started)
    for part in ("redis-server", "worker -P prefork", "beat", "uvicorn demo.asgi", "lock_traffic"):
        assert part in cmdlines, f"{part!r} not among the demo's processes: {cmdlines}"
    assert cmdlines.count(" beat ") == 2, cmdlines
    redis_url = (demo.var_dir / "redis.url").read_text().strip()
    assert f"lock statistics: {demo.base_url}admin/django_redislock/lock/statistics/" in (
        demo.output()
    )

    # Two beats with the leader scheduler: one leads, the other stands by.
    roles = wait_for(lambda: beat_roles(demo), 20, 0.2, what="both beats to report their role")
    assert sorted(roles.values()) == ["leader", "standby"], roles

    browser = Browser(demo.base_url)

    # Log into the admin with the printed credentials; the index links the Locks page.
    admin_index = browser.submit(
        "admin/login/?next=/admin/",
        "admin/login/?next=/admin/",
        {"username": username, "password": password, "next": "/admin/"},
    )
    locks_link = re.search(r'href="([^"]*/django_redislock/lock/)"[^>]*>\s*Locks\s*<', admin_index)
    assert locks_link, "no Locks entry on the admin index after logging in"

    # Five clicks on "Build report" for account 7: one task published, the rest folded into it.
    page = browser.submit("", "enqueue/report/", {"account_id": "7", "copies": "5"})
    assert "requested 5 times: 1 task published" in page, page

    # Two workers recalculate invoice 42 at once through the @distributed_lock function.
    browser.submit("", "enqueue/invoice/", {"invoice_id": "42"})

    # The lock shows on the admin Locks page while the job is queued or running.
    wait_for(
        lambda: "report:7" in browser.get(locks_link.group(1)),
        10,
        0.2,
        what="report:7 in the admin",
    )

    # The async view under AsyncLock, served by uvicorn: concurrent increments all count, and
    # in the order they happened each holder had a newer fencing token.
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: browser.post_json("counter/e2e/"), range(10)))
    answers.sort(key=lambda answer: answer["value"])
    assert [a["value"] for a in answers] == list(range(1, 11)), answers
    assert all(a["fencing_token"] < b["fencing_token"] for a, b in pairwise(answers)), answers
    assert browser.json("counter/e2e/")["value"] == 10

    # The traffic generator's contended lock shows on the admin's statistics page.
    wait_for(
        lambda: "counter:traffic" in browser.get("admin/django_redislock/lock/statistics/"),
        20,
        0.5,
        what="counter:traffic on the statistics page",
    )

    # The guarded management command, run twice at once: the second refuses (exit status 1).
    command_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "demo.settings",
        "DEMO_VAR_DIR": str(demo.var_dir),
    }
    command_env.pop("REDIS_URL", None)  # found through var/redis.url, as in a second terminal
    manage = [demo.python, "manage.py", "rebuild_search_index"]
    first = subprocess.Popen(
        [*manage, "--seconds", "4"],
        cwd=DEMO,
        env=command_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for(
        lambda: any(
            lock["name"] == "command:rebuild_search_index"
            for lock in browser.json("status.json")["locks"]
        ),
        15,
        0.2,
        what="the first rebuild_search_index to take its lock",
    )
    second = subprocess.run(
        [*manage, "--seconds", "0"],
        cwd=DEMO,
        env=command_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "rebuild_search_index" in second.stderr
    first_out, _ = first.communicate(timeout=30)
    assert first.returncode == 0, first_out
    assert "search index rebuilt" in first_out

    # The report body ran exactly once, and its lock is gone once it finished.
    def report_finished() -> dict[str, Any] | None:
        status = browser.json("status.json")
        runs = [e for e in status["executions"] if e["lock_name"] == "report:7"]
        done = runs and all(e["outcome"] == "done" for e in runs)
        held = any(lock["name"] == "report:7" for lock in status["locks"])
        return status if done and not held else None

    wait_for(report_finished, 20, 0.2, what="the report to finish and release its lock")
    time.sleep(1)
    status = browser.json("status.json")
    assert status["runs"]["report:7"] == 1, status["executions"]
    # Beat fires every second, each sync takes 1.5 s: several runs, none overlapping.
    assert status["runs"].get("inventory-sync", 0) >= 2, status["executions"]
    assert status["overlaps"]["inventory-sync"] == 0, status["executions"]
    # Both invoice recalculations ran, one after the other.
    status = wait_for(
        lambda: (
            (s := browser.json("status.json"))["runs"].get("invoice:42") == 2
            and all(e["finished_at"] for e in s["executions"] if e["lock_name"] == "invoice:42")
            and s
        ),
        15,
        0.2,
        what="both invoice recalculations to finish",
    )
    assert status["overlaps"]["invoice:42"] == 0, status["executions"]
    started.update(demo.processes())

    # Ctrl-C: everything stops, nothing is left behind.
    stop(demo)
    left = [pid for pid, created in started.items() if not gone(pid, created)]
    assert not left, f"processes left behind: {left}\n{demo.output()[-3000:]}"
    assert not (demo.var_dir / "redis.url").exists()
    port = int(redis_url.rsplit(":", 1)[1])
    for listening in (port, demo.port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", listening), 1).close()


def test_demo_uses_redis_url_and_leaves_that_server_running(
    demo_factory: DemoFactory, redis_factory: type[RedisServer]
) -> None:
    external = redis_factory().start()
    demo = demo_factory("--no-beat", "--no-traffic", REDIS_URL=external.url)
    wait_until_ready(demo)
    commands = [" ".join(psutil.Process(pid).cmdline()) for pid in demo.processes()]
    assert not any("redis-server" in c for c in commands), commands
    assert not (demo.var_dir / "redis.url").exists()

    page = Browser(demo.base_url).submit("", "enqueue/report/", {"account_id": "3", "copies": "2"})
    assert "requested 2 times: 1 task published" in page, page
    # The Celery broker and the locks live in the given server (databases 1 and 3: locks have
    # a cache alias and a database of their own, see demo/settings.py).
    assert any(b"report:3" in key for key in external.client(3).keys("*")), "no lock in db 3"
    assert not any(b"report:3" in key for key in external.client(0).keys("*")), "lock in db 0"
    assert external.client(1).exists("_kombu.binding.celery")

    stop(demo)
    assert external.client().ping(), "the demo stopped a Redis server it did not start"


def manage_py(demo: Demo, var_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``DEMO_PORT=<port> manage.py ...`` in another terminal of the same checkout."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("DEMO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="demo.settings",
        DEMO_VAR_ROOT=str(var_root),
        DEMO_PORT=str(demo.port),
    )
    return subprocess.run(
        [demo.python, "manage.py", *args],
        cwd=DEMO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def beat_runs(demo: Demo) -> int:
    return int(Browser(demo.base_url).json("status.json")["runs"].get("inventory-sync", 0))


def test_a_second_demo_from_the_same_checkout_runs_beside_the_first(
    demo_factory: DemoFactory, tmp_path: Path
) -> None:
    root = tmp_path / "checkout-var"  # example_project/var/ of one checkout
    first = demo_factory("--no-traffic", var_root=root)
    wait_until_ready(first)
    first_redis = (first.var_dir / "redis.url").read_text().strip()

    # `make demo` again on the same port: refused at once with a hint, nothing touched.
    clash = demo_factory("--no-traffic", var_root=root, port=first.port)
    assert clash.proc.wait(30) == 1, clash.output()
    hint = re.search(r"port \d+ is in use: try `make demo PORT=(\d+)`", clash.output())
    assert hint, clash.output()
    assert (first.var_dir / "redis.url").read_text().strip() == first_redis

    # Following the hint starts a second demo beside the first: own folder, own Redis, own beat.
    second = demo_factory("--no-traffic", var_root=root, port=int(hint.group(1)))
    wait_until_ready(second)
    assert second.var_dir == root / str(second.port) != first.var_dir
    second_redis = (second.var_dir / "redis.url").read_text().strip()
    assert second_redis != first_redis
    for demo in (first, second):
        assert demo.proc.poll() is None, demo.output()
        assert (demo.var_dir / "celerybeat-1.pid").exists()
        assert (demo.var_dir / "celerybeat-2.pid").exists()
        wait_for(lambda d=demo: beat_runs(d) >= 1, 20, 0.3, what=f"beat runs on {demo.port}")

    # A supervisor pointed at the first demo's folder is refused before it touches anything.
    intruder = demo_factory("--no-traffic", "--var-dir", str(first.var_dir))
    assert intruder.proc.wait(30) == 1, intruder.output()
    assert f"another demo (pid {first.proc.pid}) is running with {first.var_dir}" in (
        intruder.output()
    )
    assert (first.var_dir / "redis.url").read_text().strip() == first_redis

    # A report enqueued on the second demo is a lock in the second's Redis only; manage.py in
    # another terminal finds each demo's Redis through DEMO_PORT.
    Browser(second.base_url).submit("", "enqueue/report/", {"account_id": "9", "copies": "2"})
    listed = manage_py(second, root, "redislock", "list", "--match", "report:*")
    assert listed.returncode == 0, listed.stderr
    assert "report:9" in listed.stdout
    listed = manage_py(first, root, "redislock", "list", "--match", "report:*")
    assert listed.returncode == 0, listed.stderr
    assert "report:9" not in listed.stdout

    # Stopping the second leaves the first running: its Redis, beat and workers carry on.
    stop(second)
    assert not (second.var_dir / "redis.url").exists()
    assert (first.var_dir / "redis.url").read_text().strip() == first_redis
    runs = beat_runs(first)
    wait_for(lambda: beat_runs(first) > runs, 20, 0.3, what="the first demo's beat to go on")
    page = Browser(first.base_url).submit("", "enqueue/report/", {"account_id": "8", "copies": "3"})
    assert "requested 3 times: 1 task published" in page, page
    listed = manage_py(first, root, "redislock", "list", "--match", "report:*")
    assert listed.returncode == 0 and "report:8" in listed.stdout, listed.stdout + listed.stderr
    stop(first)

    # With no demo running, manage.py says so instead of guessing 127.0.0.1:6379.
    orphan = manage_py(first, root, "redislock", "list")
    assert orphan.returncode != 0
    assert f"No demo is running with {first.var_dir}" in orphan.stderr


#: What status.json answers in a busy production-like demo: long dotted names, task ids, tokens.
LONG_NAME = "billing.tasks.reconcile_ledger_entries_for_customer_account:1234567"
BUSY_STATUS = {
    "runs": {"report:7": 1, "inventory-sync": 12, "invoice:42": 2},
    "overlaps": {"inventory-sync": 0, "invoice:42": 0},
    "locks": [
        {
            "name": LONG_NAME,
            "task_id": "c0a8f6b2-1f7e-4a43-9d4e-5b5c1f0e8e01",
            "pid": 41234,
            "host": "celery-worker-billing-7d9f8b6c5d-x2k9p.prod.eu-west-1.internal",
            "fencing_token": 1795874490323683,
            "expires_in": 13.9,
        }
    ],
    "executions": [
        {
            "job": "reconcile",
            "lock_name": LONG_NAME,
            "outcome": "done",
            "attempt": 0,
            "pid": 41234 + i,
            "task_id": "c0a8f6b2-1f7e-4a43-9d4e-5b5c1f0e8e01",
            "fencing_token": 1795874490323683 + i,
            "started_at": "2026-01-01T14:01:30.345000+00:00",
            "finished_at": "2026-01-01T14:01:36.442000+00:00",
        }
        for i in range(5)
    ],
}

HOME_LAYOUT_JS = """
() => ({
  page: {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth},
  tables: [...document.querySelectorAll('section table')].map((table) => {
    const box = table.closest('.table-scroll'), card = table.closest('section');
    const r = (e) => e.getBoundingClientRect();
    return {rows: table.tBodies[0].rows.length, card: {left: r(card).left, right: r(card).right},
            box: box && {left: r(box).left, right: r(box).right, scrollWidth: box.scrollWidth,
                         clientWidth: box.clientWidth, overflowX: getComputedStyle(box).overflowX},
            width: r(table).width};
  }),
  step5: (() => {
    const card = [...document.querySelectorAll('section')].find(
      (s) => s.textContent.includes('Guarded management command'));
    const codes = [...card.querySelectorAll('code')].map((c) => c.innerText);
    return {text: card.innerText, codes};
  })(),
})
"""


def test_demo_home_page_fits_a_phone_and_shows_commands_that_run(
    demo_factory: DemoFactory, tmp_path: Path
) -> None:
    """Issue 29: at 390 px the home page was 813 px wide (its tables pushed out of their cards),
    and step 5 said ``python example_project/manage.py``, which the system Python cannot run."""
    from playwright.sync_api import sync_playwright

    from tests.test_admin_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    root = tmp_path / "checkout-var"  # example_project/var/ of a checkout, as `make demo` uses
    demo = demo_factory("--no-traffic", var_root=root)
    wait_until_ready(demo)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for width in (1280, 390):
                page = chromium.new_page(viewport={"width": width, "height": 844})
                page.route("**/status.json", lambda route: route.fulfill(json=BUSY_STATUS))
                page.goto(demo.base_url)
                page.wait_for_function("document.querySelectorAll('#executions tr').length === 5")
                page.screenshot(path=str(ARTIFACTS / f"demo-home-{width}.png"), full_page=True)
                found = page.evaluate(HOME_LAYOUT_JS)
                assert found["page"]["scrollWidth"] <= found["page"]["innerWidth"], found["page"]
                for table in found["tables"]:
                    box, card = table["box"], table["card"]
                    assert table["rows"] and box is not None, table
                    # Inside its card; what does not fit scrolls inside the box, not the page.
                    assert card["left"] <= box["left"] and box["right"] <= card["right"], table
                    assert box["overflowX"] == "auto"
                    assert box["scrollWidth"] >= table["width"] - 0.5
                if width == 390:  # the executions table does not fit a phone: it scrolls
                    boxes = [table["box"] for table in found["tables"]]
                    assert any(box["scrollWidth"] > box["clientWidth"] for box in boxes)
                step5 = found["step5"]
                page.close()
        finally:
            chromium.close()

    # Step 5 names the venv's Python and this demo's port, and its commands run as shown (from
    # the checkout, with the demo venv's python where the page says .venv/bin/python).
    commands = [code for code in step5["codes"] if "manage.py" in code]
    assert len(commands) == 2, step5
    assert all(c.startswith(f"DEMO_PORT={demo.port} .venv/bin/python ") for c in commands), step5
    assert "rebuild_search_index --seconds 20" in commands[0]
    assert "DEMO_PORT" in step5["codes"][len(commands) :]  # and says what DEMO_PORT is
    listed = commands[-1].split()
    assert listed[2:] == ["example_project/manage.py", "redislock", "list"], commands
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("DEMO_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(DEMO_VAR_ROOT=str(root), DEMO_PORT=listed[0].partition("=")[2])
    run = subprocess.run(
        [demo.python, *listed[2:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    stop(demo)
