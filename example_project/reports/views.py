"""The demo page: buttons that enqueue duplicate jobs, and a live count of what really ran.

Plus one ``async def`` view, :func:`counter`, that guards a read-modify-write with ``AsyncLock``
(the demo is served by uvicorn, ``demo/asgi.py``, so it runs on the server's event loop).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from django_redislock import AsyncLock, LockNotAcquiredError, list_locks

from . import tasks
from .models import Execution

MAX_COPIES = 20


def _int(request: HttpRequest, field: str, default: int, low: int = 1, high: int = 10**6) -> int:
    try:
        value = int(request.POST.get(field, default))
    except (TypeError, ValueError):
        value = default
    return max(low, min(high, value))


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    # manage.py in another terminal finds this demo's Redis by its port (demo/settings.py).
    port = str(settings.DEMO_PORT)
    context = {
        "max_copies": MAX_COPIES,
        "demo_port": port,
        "manage": f"{'' if port == '8000' else f'DEMO_PORT={port} '}"
        ".venv/bin/python example_project/manage.py",
    }
    return render(request, "reports/index.html", context)


@require_POST
def enqueue_report(request: HttpRequest) -> HttpResponse:
    """Publish the same report job ``copies`` times, as impatient double-clicks would."""
    account_id = _int(request, "account_id", 1)
    copies = _int(request, "copies", 5, high=MAX_COPIES)
    task_ids = [tasks.build_report.delay(account_id).id for _ in range(copies)]
    distinct = len(set(task_ids))
    messages.info(
        request,
        f"Report for account {account_id} requested {copies} times: {distinct} task published "
        f"(id {task_ids[0]}), {copies - distinct} duplicates folded into it.",
    )
    return redirect("index")


@require_POST
def enqueue_invoice(request: HttpRequest) -> HttpResponse:
    """Two workers recalculate the same invoice at the same moment: they take turns."""
    invoice_id = _int(request, "invoice_id", 42)
    for _ in range(2):
        tasks.recalculate_invoice_later.delay(invoice_id)
    messages.info(request, f"Invoice {invoice_id}: two recalculation tasks published.")
    return redirect("index")


@require_POST
def enqueue_import(request: HttpRequest) -> HttpResponse:
    """Start an import that fails twice and retries; a second click while it retries is a no-op."""
    batch_id = _int(request, "batch_id", 1)
    first = tasks.flaky_import.delay(batch_id).id
    second = tasks.flaky_import.delay(batch_id).id
    messages.info(
        request,
        f"Import of batch {batch_id} published as {first}; the duplicate returned "
        f"{'the same task' if first == second else 'another task (!)'}.",
    )
    return redirect("index")


def _overlaps(rows: list[Execution]) -> dict[str, int]:
    """For each lock name, how many runs started while the previous one was still running."""
    by_name: dict[str, list[Execution]] = defaultdict(list)
    for row in rows:
        by_name[row.lock_name].append(row)
    result: dict[str, int] = {}
    for name, runs in by_name.items():
        runs.sort(key=lambda r: r.started_at)
        result[name] = sum(
            1
            for prev, cur in pairwise(runs)
            if prev.finished_at is None or cur.started_at < prev.finished_at
        )
    return result


@require_GET
def status(request: HttpRequest) -> JsonResponse:
    rows = list(Execution.objects.all()[:500])
    # A retried job counts once: its failed attempts are not separate runs.
    runs: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.outcome != Execution.Outcome.RETRYING:
            runs[row.lock_name] += 1
    data: dict[str, Any] = {
        "runs": runs,
        "overlaps": _overlaps(rows),
        "executions": [
            {
                "job": r.job,
                "lock_name": r.lock_name,
                "outcome": r.outcome,
                "attempt": r.attempt,
                "pid": r.pid,
                "task_id": r.task_id,
                "fencing_token": r.fencing_token,
                "started_at": r.started_at.isoformat(),
                "finished_at": r.finished_at.isoformat() if r.finished_at else None,
            }
            for r in rows[:30]
        ],
        "locks": [
            {
                "name": info.name,
                "task_id": info.task_id,
                "pid": info.pid,
                "host": info.host,
                "fencing_token": info.fencing_token,
                "expires_in": round(info.expires_in, 1),
            }
            for info in list_locks()
        ],
    }
    if request.GET.get("ping"):
        from demo.celery import app

        data["workers"] = len(app.control.ping(timeout=1.0) or [])
    return JsonResponse(data)


#: How long the counter's read-modify-write keeps the value in hand: long enough that, without
#: the lock, concurrent requests would read the same value and lose increments.
COUNTER_HOLD_SECONDS = 0.01
#: The longest a request waits for the counter's lock (``?patience=`` asks for less).
COUNTER_MAX_PATIENCE = 30.0


def _counter_key(name: str) -> str:
    return f"async-counter:{name}"


def _patience(request: HttpRequest) -> float:
    try:
        value = float(request.GET.get("patience", COUNTER_MAX_PATIENCE))
    except ValueError:
        return COUNTER_MAX_PATIENCE
    if not math.isfinite(value):
        return COUNTER_MAX_PATIENCE
    return max(0.0, min(COUNTER_MAX_PATIENCE, value))


# A JSON endpoint for scripts (curl, the demo's traffic generator): no form, so no CSRF token.
@csrf_exempt
async def counter(request: HttpRequest, name: str) -> HttpResponse:
    """``GET``: the counter's value. ``POST``: add one to it under ``AsyncLock``.

    The increment is a read, an ``await`` and a write through the cache — the classic lost-update
    race between concurrent requests. ``AsyncLock(f"counter:{name}")`` makes them take turns
    (waiters are woken by the release, the event loop serves other requests meanwhile), so the
    counter counts every POST. The response carries the new value and the lock's fencing token:
    ordered by value, the tokens only grow. ``?patience=S`` waits at most S seconds for the lock
    (409 when it is still busy then).
    """
    key = _counter_key(name)
    if request.method == "GET":
        return JsonResponse({"name": name, "value": await cache.aget(key, 0)})
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    patience = _patience(request)
    asked = time.monotonic()
    try:
        async with AsyncLock(f"counter:{name}", blocking_timeout=patience) as lock:
            waited = time.monotonic() - asked
            value = int(await cache.aget(key, 0)) + 1
            await asyncio.sleep(COUNTER_HOLD_SECONDS)  # other requests run meanwhile
            await cache.aset(key, value, timeout=None)
    except LockNotAcquiredError:
        return JsonResponse(
            {"name": name, "error": f"lock 'counter:{name}' still busy after {patience:g} s"},
            status=409,
        )
    return JsonResponse(
        {
            "name": name,
            "value": value,
            "fencing_token": lock.fencing_token,
            "waited": round(waited, 4),
        }
    )
