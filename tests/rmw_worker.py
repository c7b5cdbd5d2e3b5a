"""Child process for the multi-process tests: read-modify-write a file under one lock.

``python -m tests.rmw_worker NAME COUNTER_FILE ITERATIONS LOG_FILE`` appends one JSON line per
hold to LOG_FILE: ``[start, end, token]`` (``time.perf_counter``, system-wide on Linux).
"""

from __future__ import annotations

import json
import os
import sys
import time

import django


def main() -> None:
    name, counter, iterations, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django_redislock import Lock

    lock = Lock(name, timeout=5)
    holds = []
    for _ in range(iterations):
        with lock:
            start = time.perf_counter()
            with open(counter) as f:
                value = int(f.read() or 0)
            with open(counter, "w") as f:
                f.write(str(value + 1))
            holds.append([start, time.perf_counter(), lock.fencing_token])
    with open(log, "a") as f:
        f.write(json.dumps(holds) + "\n")


if __name__ == "__main__":
    main()
