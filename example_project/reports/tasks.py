"""The demo's Celery tasks, one per feature of django-redislock.

Every job body writes an ``Execution`` row, so the page can count how often a body really ran.
"""

from __future__ import annotations

import logging
import os
import time

from celery import shared_task
from django.conf import settings
from django_redislock import distributed_lock
from django_redislock.celery import SingleFlightTask

from .models import Execution

logger = logging.getLogger(__name__)


def _fencing_token(lock_name: str) -> int | None:
    """The token of the lock we hold, to show on the page (tokens only ever grow)."""
    from django_redislock import list_locks

    for info in list_locks(match=lock_name):
        if info.name == lock_name:
            return info.fencing_token
    return None


def _start(job: str, lock_name: str, task_id: str | None, attempt: int = 0) -> Execution:
    return Execution.objects.create(
        job=job,
        lock_name=lock_name,
        task_id=task_id or "",
        attempt=attempt,
        pid=os.getpid(),
        fencing_token=_fencing_token(lock_name),
    )


# 1. Single-flight: however often "Build report" is clicked while a report for that account is
#    queued or running, one task is published and its body runs once. The lock is taken when the
#    task is published and released when it finishes.
@shared_task(base=SingleFlightTask, lock_key="report:{account_id}", lock_timeout=30)
def build_report(account_id: int) -> int:
    run = _start("report", f"report:{account_id}", build_report.request.id)
    time.sleep(settings.DEMO_REPORT_SECONDS)
    run.finish()
    logger.info("report for account %s built (execution %s)", account_id, run.pk)
    return run.pk


# 2. Beat: scheduled more often than it takes to run. A tick that finds the previous sync still
#    queued or running publishes nothing, so two syncs never overlap.
@shared_task(base=SingleFlightTask, lock_key="inventory-sync", lock_timeout=15)
def sync_inventory() -> int:
    run = _start("inventory-sync", "inventory-sync", sync_inventory.request.id)
    time.sleep(settings.DEMO_SYNC_SECONDS)
    run.finish()
    return run.pk


# 3. Retries: the retry is published while the key stays locked, so a duplicate enqueued between
#    two attempts is folded into the retrying task instead of starting a parallel import.
@shared_task(base=SingleFlightTask, lock_key="import:{batch_id}", lock_timeout=30, max_retries=5)
def flaky_import(batch_id: int, fail_times: int = 2) -> int:
    attempt = flaky_import.request.retries
    run = _start("import", f"import:{batch_id}", flaky_import.request.id, attempt=attempt)
    time.sleep(1)
    if attempt < fail_times:
        run.finish(Execution.Outcome.RETRYING)
        raise flaky_import.retry(countdown=1, exc=RuntimeError("upstream timed out"))
    run.finish()
    return run.pk


# 4. A plain function guarded by a templated key: two workers recalculating the same invoice run
#    one after the other, never interleaved, whoever calls the function. The second caller waits
#    for the lock (woken by the release, no polling) for up to 30 s.
@distributed_lock("invoice:{invoice_id}", blocking_timeout=30)
def recalculate_invoice(invoice_id: int, *, task_id: str = "") -> int:
    run = _start("invoice", f"invoice:{invoice_id}", task_id)
    time.sleep(2)
    run.finish()
    return run.pk


@shared_task
def recalculate_invoice_later(invoice_id: int) -> int:
    return recalculate_invoice(invoice_id, task_id=recalculate_invoice_later.request.id or "")
