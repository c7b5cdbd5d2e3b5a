"""The demo's ``async def`` view under ``AsyncLock``, served by a real uvicorn.

uvicorn runs ``example_project/demo/asgi.py`` as a subprocess on a free port against a private
redis-server, as ``make demo`` serves it. Fifty concurrent POSTs to the counter view (a read, an
``await`` and a write through the cache, inside ``async with AsyncLock(...)``) must all count,
and ordered by the value each one wrote — the order in which their critical sections ran — the
fencing tokens must strictly increase: the lock excluded. The lock cache is the demo's own entry
(django-redis with socket timeouts) and the bare entries new users write (django-redis without
``OPTIONS``, Django's own ``RedisCache``). A ``Lock`` held by another process (this test) keeps
the view waiting, and hands the lock over to it on release.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_redislock import Lock
from tests.conftest import ROOT, wait_for
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.slow  # uvicorn and a redis-server as subprocesses

DEMO = ROOT / "example_project"
REQUESTS = 50


class AsgiDemo:
    def __init__(self, base_url: str, redis: RedisServer, log: Path) -> None:
        self.base_url = base_url
        self.redis = redis
        self.log = log

    def post(self, name: str, patience: float | None = None) -> tuple[int, dict[str, Any]]:
        query = f"?patience={patience:g}" if patience is not None else ""
        request = urllib.request.Request(
            f"{self.base_url}counter/{name}/{query}", data=b"", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def value(self, name: str) -> int:
        with urllib.request.urlopen(f"{self.base_url}counter/{name}/", timeout=10) as resp:
            return int(json.load(resp)["value"])


@pytest.fixture(scope="module", params=["demo", "bare", "builtin"])
def asgi_demo(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AsgiDemo]:
    """``python -m uvicorn demo.asgi:application`` on a free port, its own Redis; stopped by PID."""
    workdir = tmp_path_factory.mktemp(f"asgi-{request.param}")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"REDIS_URL", "DJANGO_SETTINGS_MODULE"} and not k.startswith("DEMO_")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(DEMO), str(ROOT), env.get("PYTHONPATH", "")])
    env["DEMO_VAR_DIR"] = str(workdir / "var")
    env["DJANGO_SETTINGS_MODULE"] = "demo.settings"
    if request.param != "demo":
        env["DJANGO_SETTINGS_MODULE"] = "tests.demo_lock_cache_settings"
        env["DEMO_TEST_LOCK_CACHE"] = request.param
    port = free_port()
    log = workdir / "uvicorn.log"
    with RedisServer() as redis, log.open("wb") as out:
        env["REDIS_URL"] = redis.url
        proc = subprocess.Popen(
            [
                *[sys.executable, "-m", "uvicorn", "demo.asgi:application"],
                *["--host", "127.0.0.1", "--port", str(port), "--lifespan", "off"],
            ],
            cwd=DEMO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        demo = AsgiDemo(f"http://127.0.0.1:{port}/", redis, log)
        try:

            def answers() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    return demo.value("ready") == 0
                except OSError:
                    return False

            wait_for(answers, 30, 0.1, what="uvicorn to answer")
            yield demo
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            print(log.read_text()[-3000:])  # shown only when a test failed


def test_concurrent_requests_take_turns_and_every_increment_counts(asgi_demo: AsgiDemo) -> None:
    start = threading.Barrier(REQUESTS)

    def increment() -> tuple[int, dict[str, Any]]:
        start.wait(10)
        return asgi_demo.post("race")

    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = list(pool.map(lambda _: increment(), range(REQUESTS)))

    assert [status for status, _ in answers] == [200] * REQUESTS, answers
    results = sorted((body for _, body in answers), key=lambda body: body["value"])
    # Every request wrote its own value: no two read the same counter (no lost update).
    assert [body["value"] for body in results] == list(range(1, REQUESTS + 1))
    assert asgi_demo.value("race") == REQUESTS
    # In the order the critical sections ran, each holder had a newer token than the last.
    tokens = [body["fencing_token"] for body in results]
    assert all(isinstance(token, int) for token in tokens), tokens
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    # They really were concurrent: most of them queued for the lock.
    assert sum(body["waited"] > 0.005 for body in results) >= REQUESTS // 2, results


def test_a_lock_held_by_another_process_keeps_the_view_waiting(asgi_demo: AsgiDemo) -> None:
    locks = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{asgi_demo.redis.url}/3"}
    with override_settings(
        CACHES={**settings.CACHES, "demo-locks": locks},
        REDISLOCK={"CACHE": "demo-locks", "STATS": False},
    ):
        held = Lock("counter:shared", timeout=10)
        assert held.acquire(blocking=False)
        try:
            status, body = asgi_demo.post("shared", patience=0.2)
            assert status == 409, body
            assert "still busy after 0.2 s" in body["error"]

            with ThreadPoolExecutor(1) as pool:
                waiting: Future[tuple[int, dict[str, Any]]] = pool.submit(
                    asgi_demo.post, "shared", 20
                )
                time.sleep(0.5)
                assert not waiting.done(), waiting.result()
                released_at = time.monotonic()
                held.release()
                status, body = waiting.result(10)
                handed_over_in = time.monotonic() - released_at
        finally:
            if held.owned():
                held.release()
    assert status == 200, body
    assert body["value"] == 1
    assert held.fencing_token is not None and body["fencing_token"] > held.fencing_token
    assert body["waited"] >= 0.4  # from when uvicorn handed it the request
    assert handed_over_in < 2.0  # woken by the release, not by the lease running out
