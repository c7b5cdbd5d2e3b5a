"""Cost of ``stats.record()``, the statistics call on the hot path of every acquire and release.

    .venv/bin/python benchmarks/record_cost.py [--number N]

No Redis is needed: ``record()`` only appends the event to an in-process list (the background
flusher, which would fold the events into tallies and write them to Redis, is kept from
starting, so the recording thread folds every ``4 * stats.MAX_EVENTS`` events itself and the
figures include that folding). Prints the best of five ``timeit`` runs per event,
in microseconds per call, with statistics on and off, and says whether OpenTelemetry was
importable (with the API but no SDK configured, each event also looks at the global provider).
Compare with an uncontended acquire + release cycle (~200 µs, ``bench_locks.py uncontended``):
the statistics budget is 2 % of it, a few µs.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per timeit run")
    number = parser.parse_args().number

    import django
    from django.conf import settings
    from django.test.utils import override_settings

    settings.configure(
        SECRET_KEY="bench",
        INSTALLED_APPS=["django_redislock"],
        CACHES={
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": "redis://127.0.0.1:1/0",  # never contacted
            }
        },
    )
    django.setup()
    from django_redislock import stats, tracing

    stats._flusher = object()  # type: ignore[assignment]  # "already running": no thread, no I/O
    record = stats.record
    events = {
        "acquired": lambda: record(None, "job:{id}", "acquired", 0.0003, False, "job:1", 17),
        "released": lambda: record(None, "job:{id}", "released", 0.012, False, "job:1", 17),
        "failed": lambda: record(None, "job:{id}", "failed", 0.1, False, "job:1"),
        "skipped": lambda: record(None, "job:{id}", "skipped"),
    }
    print(f"opentelemetry importable: {tracing.available()}")
    for label, overrides in (("STATS on", {}), ("STATS off", {"STATS": False})):
        with override_settings(REDISLOCK=overrides):
            for event, call in events.items():
                best = min(timeit.repeat(call, number=number, repeat=5)) / number
                print(f"{label:9}  {event:9}  {best * 1e6:6.2f} µs/call")
    stats._pending.clear()
    stats._events.clear()


if __name__ == "__main__":
    main()
