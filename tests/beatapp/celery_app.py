"""Celery app of the beat test project (``-A tests.beatapp.celery_app``).

Environment:

- ``REDISLOCK_TEST_BEAT_SCHEDULE``: ``beat_schedule`` as JSON (numbers are seconds);
- ``REDISLOCK_TEST_BEAT_LEASE``: the leader lease in seconds (default 3);
- ``REDISLOCK_TEST_SENDS_KEY``: a list in the suite's Redis that gets one JSON object per message
  this process publishes: ``{"pid", "at" (epoch s), "id", "task", "single_flight"}``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.beatapp.settings")

import django
from django.apps import apps

if not apps.ready:
    django.setup()

import redis
from celery import Celery
from celery.signals import after_task_publish, beat_init
from django.conf import settings

app = Celery("tests.beatapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    include=["tests.beatapp.tasks"],
    beat_max_loop_interval=1.0,
    redislock_beat_timeout=float(os.environ.get("REDISLOCK_TEST_BEAT_LEASE", "3")),
    beat_schedule=json.loads(os.environ.get("REDISLOCK_TEST_BEAT_SCHEDULE", "{}")),
)

_sends_key = os.environ.get("REDISLOCK_TEST_SENDS_KEY")
_recorder: redis.Redis | None = None


@after_task_publish.connect(weak=False)
def _record_send(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
    global _recorder
    if not _sends_key:
        return
    if _recorder is None:
        _recorder = redis.Redis.from_url(settings.RECORD_URL)
    headers = headers or {}
    _recorder.rpush(
        _sends_key,
        json.dumps(
            {
                "pid": os.getpid(),
                "at": time.time(),
                "id": headers.get("id"),
                "task": sender,
                "single_flight": headers.get("redislock_single_flight"),
            }
        ),
    )


@beat_init.connect(weak=False)
def _show_leader_changes(**kwargs: Any) -> None:
    # After Celery configured logging (which resets the levels of child loggers).
    logging.getLogger("django_redislock").setLevel(logging.INFO)
