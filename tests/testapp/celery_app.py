"""Celery app of the test project: the suite's Redis as broker (db 1) and result backend (db 2).

Used in-process by ``tests/test_celery.py`` (``start_worker``) and as
``-A tests.testapp.celery_app`` by the worker and beat subprocesses.
``REDISLOCK_TEST_BEAT_INTERVAL`` (seconds) adds a beat entry for ``tests.testapp.tasks.beat_tick``.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django
from django.apps import apps

if not apps.ready:
    django.setup()

import celery
from celery import Celery
from celery.result import AsyncResult

if tuple(int(p) for p in celery.__version__.split(".")[:2]) < (5, 7):
    # celery#10477, fixed in Celery 5.7: an AsyncResult garbage-collected while the Redis result
    # backend subscribes (its __del__ unsubscribes on the same pub/sub connection) deadlocks the
    # process. The suite publishes many results it drops; on older Celery, keep them pending
    # instead of letting __del__ run into the deadlock (the test process is short-lived).
    AsyncResult.__del__ = lambda self: None  # type: ignore[method-assign,assignment]

app = Celery("tests.testapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    task_track_started=True,
    # Tasks only the race tests publish: no worker consumes this queue.
    task_routes={"tests.testapp.tasks.unconsumed_*": {"queue": "unconsumed"}},
    include=["tests.testapp.tasks"],
)

_beat_interval = os.environ.get("REDISLOCK_TEST_BEAT_INTERVAL")
if _beat_interval:
    import logging

    from celery.signals import beat_init

    from django_redislock import stats

    stats.connect_receivers()  # idempotent; count the ticks beat could not publish

    @beat_init.connect(weak=False)
    def _show_deduplicated_ticks(**kwargs: object) -> None:
        # After Django/Celery configured logging (which resets child logger levels).
        logging.getLogger("django_redislock.celery").setLevel(logging.INFO)

    app.conf.beat_schedule = {
        "tick": {"task": "tests.testapp.tasks.beat_tick", "schedule": float(_beat_interval)},
    }
    app.conf.beat_max_loop_interval = 0.2
