"""Celery app of section 12c (``benchmarks/_rate.py``): the ``celery worker`` processes run it.

Configured from the environment the section sets: ``REDISLOCK_BENCH_RATE_URL`` (the run's private
Redis: locks in db 0, broker in db 1), ``REDISLOCK_BENCH_RATE_PER_S`` (the limit) and
``REDISLOCK_BENCH_RATE_WORKERS`` (worker processes: a ``lock_permits`` each). Two tasks with the
same body, pushing their end time to a Redis list: one under Celery's own ``rate_limit`` (per
worker), one under ``SingleFlightTask``'s ``lock_rate`` (one limiter for every worker) where this
checkout has that option.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from celery.signals import before_task_publish, worker_init

from benchmarks import _common as c

URL = os.environ["REDISLOCK_BENCH_RATE_URL"]
RATE = int(os.environ.get("REDISLOCK_BENCH_RATE_PER_S", "20"))
WORKERS = int(os.environ.get("REDISLOCK_BENCH_RATE_WORKERS", "4"))
QUEUE = "bench-rate"
DONE_KEY = "bench:rate-celery:done"
REPUBLISHED_KEY = "bench:rate-celery:republished"

c.configure_django(URL)

app = Celery("bench_rate", broker=f"{URL}/1", set_as_current=True)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_IN_WORKER = {"yes": False}


@worker_init.connect(weak=False)
def _mark_worker(**kwargs: Any) -> None:
    _IN_WORKER["yes"] = True  # the pool child inherits it (forked after worker_init)


@before_task_publish.connect(weak=False)
def _count_republish(**kwargs: Any) -> None:
    """A publish from inside a worker is a throttled run sent back with a countdown."""
    if _IN_WORKER["yes"]:
        c.client().incr(REPUBLISHED_KEY)


def _done(i: int) -> None:
    c.client().rpush(DONE_KEY, repr(time.time()))


@app.task(name="bench.rate.celery_rate_limit", rate_limit=f"{RATE}/s")
def celery_rate_limited(i: int) -> None:
    _done(i)


def _ours() -> Any:
    from django_redislock.celery import SingleFlightTask

    if not hasattr(SingleFlightTask, "lock_rate"):
        return None

    @app.task(
        name="bench.rate.lock_rate",
        base=SingleFlightTask,
        lock_key="bench:rate-celery",
        lock_mode="while_executing",
        lock_permits=WORKERS,
        lock_rate=f"{RATE}/s",
    )
    def lock_rate_limited(i: int) -> None:
        _done(i)

    return lock_rate_limited


lock_rate_limited = _ours()


def task_of(ours: bool) -> Any:
    if ours:
        if lock_rate_limited is None:
            raise RuntimeError("SingleFlightTask has no lock_rate option in this checkout")
        return lock_rate_limited
    return celery_rate_limited
