"""How long the admin Locks page takes with many active locks (a benchmark, not a test).

    .venv/bin/python benchmarks/admin_list.py [--locks 100000] [--runs 15]

Starts a private redis-server (django_redislock.testing), writes N lock records (and the
namespace's fencing counter, as real locks on a single Redis leave them) straight into Redis, then
times full admin requests through Django's test client — view, SCAN paging, template rendering —
as a logged-in superuser:

- first page (SCAN order, cursor paging): the target is < 300 ms with 100,000 locks;
- second page (following the page's "next" cursor);
- a search that matches a small subset;
- a sorted view (held for, longest first), which has to read every lock.

Prints the median and worst time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def populate(client, namespace: str, count: int) -> None:  # type: ignore[no-untyped-def]
    now_ms = int(time.time() * 1000)
    batch = 5000
    for start in range(0, count, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + batch, count)):
            name = f"job:{i % 97}:{i}"
            token = i + 1
            meta = {
                "host": f"worker-{i % 12}",
                "pid": 1000 + i % 5000,
                "thread": "MainThread",
                "task_id": None,
            }
            value = json.dumps(
                {
                    "o": f"owner-{i}",
                    "n": 1,
                    "t": token,
                    "at": now_ms - (i % 3600) * 1000,
                    "m": meta,
                },
                separators=(",", ":"),
            )
            pipe.set(f"{namespace}:lock:{{{name}}}", value, px=3_600_000 + i)
        # A single Redis keeps one fencing counter per namespace (keys.KeySpace.shared_fence).
        pipe.set(f"{namespace}:fence", count)
        pipe.execute()


def timed(client, url: str, runs: int) -> tuple[list[float], str]:  # type: ignore[no-untyped-def]
    times = []
    html = ""
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
        html = response.content.decode()
    return times, html


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--sorted-runs", type=int, default=3)
    opts = parser.parse_args()

    from django_redislock.testing import RedisServer

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ["REDISLOCK_TEST_REDIS_URL"] = server.url
        os.environ["REDISLOCK_TEST_DB"] = str(Path(tmp) / "bench.sqlite3")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment
        from django.urls import reverse

        from django_redislock.runtime import get_client, keyspace

        setup_test_environment()
        call_command("migrate", verbosity=0)
        user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
        client = Client()
        client.force_login(user)

        redis = get_client()
        started = time.perf_counter()
        populate(redis, keyspace().namespace, opts.locks)
        print(
            f"wrote {opts.locks} locks (+ the fencing counter, dbsize {redis.dbsize()}) "
            f"in {time.perf_counter() - started:.1f} s"
        )

        url = reverse("admin:django_redislock_lock_changelist")
        rows = re.compile(r'<tr>\s*<td class="action-checkbox">')
        first, html = timed(client, url, opts.runs)
        report("first page", first, len(rows.findall(html)))
        nxt = re.search(r'<a href="(\?[^"]*)" class="showall">', html)
        if nxt:
            second, html2 = timed(client, url + nxt.group(1).replace("&amp;", "&"), opts.runs)
            report("next page", second, len(rows.findall(html2)))
        search, html3 = timed(client, url + "?q=job:5:*", opts.runs)
        report("search job:5:* (first page)", search, len(rows.findall(html3)))
        ordered, html4 = timed(client, url + "?o=-held", opts.sorted_runs)
        report("sorted by held for (reads every lock)", ordered, len(rows.findall(html4)))


def report(label: str, times: list[float], rows: int) -> None:
    print(
        f"{label:40s} median {statistics.median(times) * 1000:7.1f} ms   "
        f"max {max(times) * 1000:7.1f} ms   ({len(times)} runs, {rows} rows)"
    )


if __name__ == "__main__":
    main()
