"""The demo page: buttons that enqueue duplicate jobs, and a live count of what really ran."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from django_redislock import list_locks

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
    return render(request, "reports/index.html", {"max_copies": MAX_COPIES})


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
