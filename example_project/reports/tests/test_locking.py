"""The demo's jobs take the locks they promise: tests written the way a project would write them.

Every test asks for the ``redislock`` fixture (django-redislock's pytest plugin, enabled in
``conftest.py``): the ``locks`` cache alias points at a private ``redis-server`` for the test, its
lock namespace starts empty, and the fixture has ``assert_locked`` / ``assert_not_locked`` /
``held_by``. Celery runs eagerly (``demo/test_settings.py``): ``delay()`` runs the task here, with
its single-flight lock taken before the body and released after it.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django_redislock import Lock
from django_redislock.celery import SKIPPED
from django_redislock.testing import assert_locked

from reports import tasks
from reports.models import Execution

pytestmark = pytest.mark.django_db


def test_build_report_holds_its_lock_while_it_runs_and_releases_it(redislock):
    result = tasks.build_report.delay(7)

    run = Execution.objects.get(pk=result.get())
    assert run.lock_name == "report:7" and run.task_id == result.id
    assert run.fencing_token is not None  # the body found its lock held (by itself)
    redislock.assert_not_locked("report:7")


def test_a_report_requested_while_one_is_in_flight_runs_no_second_body(redislock, monkeypatch):
    def body_requests_it_again(account_id):
        # What a second click does while the first report is still running: folded into it.
        assert tasks.build_report.delay(account_id).id == tasks.build_report.request.id
        assert_locked(f"report:{account_id}", by=tasks.build_report.request.id)
        return 0

    monkeypatch.setattr(tasks.build_report, "run", body_requests_it_again)
    tasks.build_report.delay(8)
    redislock.assert_not_locked("report:8")


def test_beat_ticks_while_a_sync_runs_are_skipped(redislock):
    with Lock("inventory-sync", owner="worker-2"):  # another worker is syncing
        redislock.assert_locked("inventory-sync")
        result = tasks.sync_inventory.apply()  # what a worker does with a tick that got through
    assert result.state == SKIPPED
    assert not Execution.objects.filter(lock_name="inventory-sync").exists()


def test_the_search_index_rebuild_refuses_to_run_twice(redislock):
    # Another host runs it (a Lock in this thread would be re-entered: same owner).
    with (
        Lock("command:rebuild_search_index", owner="cron-host-2"),
        pytest.raises(CommandError, match="command:rebuild_search_index"),
    ):
        call_command("rebuild_search_index", seconds=0)
    call_command("rebuild_search_index", seconds=0)
    redislock.assert_not_locked("command:rebuild_search_index")


def test_the_status_page_lists_the_held_locks(redislock, client):
    with Lock("invoice:42") as lock:
        locks = client.get("/status.json").json()["locks"]
    assert [(info["name"], info["fencing_token"]) for info in locks] == [
        ("invoice:42", lock.fencing_token)
    ]
