"""Tasks of the beat test project: plain ``@shared_task``s, no django-redislock code in them."""

from __future__ import annotations

import json
import os
import time

import redis
from celery import shared_task
from django.conf import settings


@shared_task(name="tests.beatapp.tasks.tick")
def tick() -> None:
    """What the leader-election tests schedule (sent to a queue nobody consumes)."""


@shared_task(name="tests.beatapp.tasks.report", bind=True)
def report(self: object, runs_key: str, seconds: float) -> None:
    """A periodic job longer than its interval: records its start and end in ``runs_key``."""
    client = redis.Redis.from_url(settings.RECORD_URL)
    task_id = self.request.id  # type: ignore[attr-defined]
    client.rpush(runs_key, json.dumps({"event": "start", "id": task_id, "at": time.time()}))
    time.sleep(seconds)
    client.rpush(
        runs_key,
        json.dumps({"event": "end", "id": task_id, "at": time.time(), "pid": os.getpid()}),
    )
