"""Cost of ``SingleFlightTask`` over a plain Celery task: publish path and run path.

Usage: ``python benchmarks/celery_publish.py [--n 2000] [--block 100]``

Starts its own ``redis-server`` (broker db 1, results db 2, locks db 0), then measures in one run:

- **publish**: ``apply_async`` of a plain task vs a single-flight task (a distinct key per call, so
  every call really publishes), in alternating blocks so both see the same machine state; once with
  results ignored (the leanest baseline) and once with the Redis result backend.
- **run**: the messages just published are executed with Celery's own tracer (what a worker runs
  for each message, minus the broker fetch), plain vs single-flight.

Two counts per call. ``server cmds``: the ``INFO commandstats`` diff around the timed phase, which
also counts the commands a Lua script runs inside Redis (an acquire is EVALSHA + GET + SET...).
``round trips``: top-level commands only, counted with ``MONITOR`` (which tags script-internal
commands as ``lua``) in a separate, untimed pass; nothing on these paths pipelines, so each
top-level command is one round trip. Lock statistics are turned off (``REDISLOCK["STATS"] =
False``) so their background flushes do not blur the counts.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_redislock.testing import RedisServer  # noqa: E402


def setup(url: str) -> tuple[Any, dict[str, Any]]:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislock"],
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{url}/0"}},
        REDISLOCK={"STATS": False},
        USE_TZ=True,
    )
    django.setup()
    from celery import Celery

    from django_redislock.celery import SingleFlightTask

    app = Celery("bench", broker=f"{url}/1", backend=f"{url}/2", set_as_current=True)
    app.conf.update(task_default_queue="bench", result_expires=600)

    def body(i: int) -> int:
        return i

    tasks = {
        "plain": app.task(name="bench.plain", ignore_result=True)(body),
        "single": app.task(
            name="bench.single",
            base=SingleFlightTask,
            lock_key="bench:{i}",
            lock_timeout=60,
            ignore_result=True,
        )(body),
        "plain+results": app.task(name="bench.plain_r")(body),
        "single+results": app.task(
            name="bench.single_r", base=SingleFlightTask, lock_key="bench-r:{i}", lock_timeout=60
        )(body),
    }
    app.finalize()
    return app, tasks


def commandstats(client: Any) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in stats.items()
            if name != "cmdstat_info"
        }
    )


class TopLevelCommands:
    """Count the top-level commands the server receives while the block runs (``MONITOR``)."""

    STOP = "bench-monitor-stop"

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.counts: Counter[str] = Counter()

    def run(self, block: Callable[[], None]) -> Counter[str]:
        ready = threading.Event()

        def watch() -> None:
            with self.server.client().monitor() as monitor:
                ready.set()
                for entry in monitor.listen():
                    command = entry["command"]
                    if self.STOP in command:
                        return
                    if entry["client_type"] != "lua":
                        self.counts[command.split(" ", 1)[0].lower()] += 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ready.wait(5)
        time.sleep(0.1)
        block()
        time.sleep(0.2)  # let the background result consumer settle
        self.server.client().get(self.STOP)
        watcher.join(10)
        self.counts.pop("hello", None)  # connection set-up of the monitor's own stop client
        return self.counts


def publish(task: Any, start: int, count: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + count):
        task.apply_async((i,))
    return time.perf_counter() - began


def measure_publish(
    server: RedisServer, tasks: dict[str, Any], pair: tuple[str, str], n: int, block: int
) -> dict[str, dict[str, Any]]:
    client = server.client()
    out: dict[str, dict[str, Any]] = {name: {"times": [], "calls": Counter()} for name in pair}
    offset = {name: 10_000_000 * k for k, name in enumerate(pair)}
    for name in pair:  # warm up: connections, script load, result subscriptions
        publish(tasks[name], offset[name], 20)
        offset[name] += 20
    sample = 100
    for name in pair:
        out[name]["trips"] = TopLevelCommands(server).run(
            lambda t=tasks[name], s=offset[name]: publish(t, s, sample) and None
        )
        out[name]["sample"] = sample
        offset[name] += sample
    for _ in range(n // block):
        for name in pair:
            before = commandstats(client)
            elapsed = publish(tasks[name], offset[name], block)
            out[name]["calls"] += commandstats(client) - before
            out[name]["times"].append(elapsed / block)
            offset[name] += block
    return out


def queued_messages(server: RedisServer, name: str) -> list[dict[str, Any]]:
    broker = server.client(1)
    found = []
    for raw in broker.lrange("bench", 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == name:
            found.append(message)
    return found


def measure_run(
    server: RedisServer, app: Any, tasks: dict[str, Any], pair: tuple[str, str], n: int
) -> dict[str, dict[str, Any]]:
    """Run published messages through Celery's tracer, as the worker's pool would."""
    from celery.app.trace import build_tracer

    client = server.client()
    out: dict[str, dict[str, Any]] = {}
    for name in pair:
        task = tasks[name]
        messages = queued_messages(server, task.name)[: n + 120]
        tracer = build_tracer(task.name, task, app=app, eager=False, propagate=True)
        requests = []
        for message in messages:
            args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
            request = dict(
                message["headers"],
                is_eager=False,
                hostname="bench@localhost",
                delivery_info={"routing_key": "bench", "exchange": ""},
                reply_to=message["properties"].get("reply_to"),
                correlation_id=message["headers"]["id"],
                **(embed or {}),
            )
            requests.append((message["headers"]["id"], args, kwargs, request))
        for task_id, args, kwargs, request in requests[:20]:  # warm up
            tracer(task_id, args, kwargs, request)
        sample, timed = requests[20:120], requests[120:]

        def run_sample(batch: list[Any] = sample, trace: Any = tracer) -> None:
            for task_id, args, kwargs, request in batch:
                trace(task_id, args, kwargs, request)

        trips = TopLevelCommands(server).run(run_sample)
        before = commandstats(client)
        began = time.perf_counter()
        for task_id, args, kwargs, request in timed:
            _retval, info, _, _ = tracer(task_id, args, kwargs, request)
            if info is not None:
                raise RuntimeError(f"{name} did not succeed: {info!r}")
        elapsed = time.perf_counter() - began
        out[name] = {
            "time": elapsed / len(timed),
            "calls": commandstats(client) - before,
            "count": len(timed),
            "trips": trips,
            "sample": len(sample),
        }
    return out


def fmt_calls(calls: Counter[str], count: int) -> str:
    return ", ".join(f"{cmd} {calls[cmd] / count:g}" for cmd in sorted(calls) if calls[cmd])


def ping_us(server: RedisServer, count: int = 2000) -> float:
    client = server.client()
    client.ping()
    began = time.perf_counter()
    for _ in range(count):
        client.ping()
    return (time.perf_counter() - began) / count * 1e6


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="publishes per task (default 2000)")
    parser.add_argument("--block", type=int, default=100, help="publishes per timed block")
    opts = parser.parse_args()
    n = opts.n - opts.n % opts.block
    with RedisServer() as server:
        os.environ["REDISLOCK_TEST_REDIS_URL"] = server.url
        app, tasks = setup(server.url)
        print(
            f"redis-server {server.client().info('server')['redis_version']} on {server.url}; "
            f"{n} publishes per task, blocks of {opts.block}; one PING round trip: "
            f"{ping_us(server):.0f} us\n"
        )
        print("PUBLISH (apply_async)")
        print(
            f"{'task':<16}{'median us/call':>15}{'p90 us/call':>13}{'round trips':>13}"
            f"{'server cmds':>13}  server commands per call"
        )
        ratios = []
        for pair in (("plain", "single"), ("plain+results", "single+results")):
            res = measure_publish(server, tasks, pair, n, opts.block)
            for name in pair:
                times = sorted(res[name]["times"])
                calls = res[name]["calls"]
                trips = sum(res[name]["trips"].values()) / res[name]["sample"]
                print(
                    f"{name:<16}{statistics.median(times) * 1e6:>15.1f}"
                    f"{times[int(len(times) * 0.9) - 1] * 1e6:>13.1f}{trips:>13.2f}"
                    f"{sum(calls.values()) / n:>13.2f}  {fmt_calls(calls, n)}"
                )
            base, single = (res[p] for p in pair)
            ratios.append(
                (
                    pair[1],
                    statistics.median(single["times"]) / statistics.median(base["times"]),
                    sum(single["trips"].values()) / single["sample"]
                    - sum(base["trips"].values()) / base["sample"],
                    fmt_calls(single["trips"], single["sample"]),
                )
            )
        print()
        print("RUN (Celery tracer on the published messages; results ignored)")
        print(
            f"{'task':<16}{'mean us/task':>15}{'round trips':>13}{'server cmds':>13}"
            "  server commands per task"
        )
        run = measure_run(server, app, tasks, ("plain", "single"), n)
        for name in ("plain", "single"):
            r = run[name]
            print(
                f"{name:<16}{r['time'] * 1e6:>15.1f}"
                f"{sum(r['trips'].values()) / r['sample']:>13.2f}"
                f"{sum(r['calls'].values()) / r['count']:>13.2f}"
                f"  {fmt_calls(r['calls'], r['count']) or '-'}"
            )
        leftover = server.client().dbsize()
        print()
        print("RATIOS (targets: publish <= 1.3x and <= 1 extra round trip; run <= 2 round trips)")
        for name, ratio, extra, trips in ratios:
            print(
                f"  {name:<16} publish time x{ratio:.2f} {verdict(ratio <= 1.3)}, extra round "
                f"trips {extra:+.2f} {verdict(extra <= 1)} (top-level per call: {trips})"
            )
        single, plain = run["single"], run["plain"]
        run_trips = (
            sum(single["trips"].values()) / single["sample"]
            - sum(plain["trips"].values()) / plain["sample"]
        )
        print(
            f"  {'single':<16} run extra round trips {run_trips:+.2f} {verdict(run_trips <= 2)} "
            f"({fmt_calls(single['trips'], single['sample'])}), "
            f"run time +{(single['time'] - plain['time']) * 1e6:.0f} us/task"
        )
        print(
            f"  keys left in db 0: {leftover} (queued holds of the '+results' publishes, which "
            "are not run, plus the namespace's fencing counter and statistics)"
        )


if __name__ == "__main__":
    main()
