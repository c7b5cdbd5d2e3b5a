"""``SingleFlightTask`` with a real worker consuming from a real Redis broker (no eager mode).

Workers here run in this process (``start_worker``, threads pool) so signals can be observed; the
crash cases (prefork children killed, worker SIGKILLed/SIGTERMed) are in
``tests/faults/test_celery_worker_crash.py``. Tasks are in ``tests/testapp/tasks.py`` and report
what they saw to Redis (``tasks.events()``, ``overlaps``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import _state as celery_state
from celery import chain, group, shared_task
from celery.contrib.testing.worker import start_worker
from django.db import transaction

from django_redislock import Lock, force_release, get_lock_info, list_locks
from django_redislock import stats as stats_module
from django_redislock.celery import (
    SKIPPED,
    DuplicateTaskError,
    SingleFlightTask,
    task_deduplicated,
    task_skipped,
)
from django_redislock.celery.headers import HEADER_HOLDS, HEADER_KEY, HEADER_TOKEN
from django_redislock.stats import get_stats
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.testapp import tasks
from tests.testapp.celery_app import app

BROKER_DB = 1
RESULT_DB = 2


def broker() -> redis.Redis:
    return redis.Redis.from_url(app.conf.broker_url)


@pytest.fixture(scope="module", autouse=True)
def _clean_broker() -> Iterator[None]:
    app.finalize()
    for db in (BROKER_DB, RESULT_DB):
        client = redis.Redis.from_url(app.conf.broker_url.rsplit("/", 1)[0] + f"/{db}")
        client.flushdb()
        client.close()
    yield


@pytest.fixture(scope="module")
def worker() -> Iterator[Any]:
    """One in-process worker (4 threads) for the module, consuming the default queue only."""
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=["celery"],
        shutdown_timeout=30,
    ) as w:
        yield w


@pytest.fixture
def captured() -> Iterator[dict[str, list[dict[str, Any]]]]:
    seen: dict[str, list[dict[str, Any]]] = {"skipped": [], "deduplicated": []}

    def on_skipped(sender: Any, **kwargs: Any) -> None:
        seen["skipped"].append(kwargs)

    def on_dedup(sender: Any, **kwargs: Any) -> None:
        seen["deduplicated"].append(kwargs)

    task_skipped.connect(on_skipped, weak=False, dispatch_uid="test-skipped")
    task_deduplicated.connect(on_dedup, weak=False, dispatch_uid="test-dedup")
    yield seen
    task_skipped.disconnect(dispatch_uid="test-skipped")
    task_deduplicated.disconnect(dispatch_uid="test-dedup")


def unconsumed_messages() -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in broker().lrange("unconsumed", 0, -1)]


@pytest.fixture
def empty_unconsumed_queue() -> Iterator[None]:
    broker().delete("unconsumed")
    yield
    broker().delete("unconsumed")


def no_overlaps() -> bool:
    return tasks.observer().llen("overlaps") == 0


# -- wiring --------------------------------------------------------------------------------------
def test_importing_the_celery_integration_connects_nothing():
    """Receivers are connected by ``AppConfig.ready()``, not as a side effect of the import."""
    code = (
        "import json, django; from django.conf import settings; "
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes']); django.setup(); "
        "import django_redislock.celery; from django_redislock import signals; "
        "from django_redislock.runtime import runtime; "
        "from celery.signals import task_revoked; "
        "uids = [str(r[0]) for r in task_revoked.receivers + signals.lock_lost.receivers]; "
        "print(json.dumps({'providers': len(runtime.task_id_providers), "
        "'ours': [u for u in uids if 'django_redislock' in u]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={k: v for k, v in subprocess_env().items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"providers": 0, "ours": []}


def test_the_app_connects_the_celery_receivers_when_ready():
    from celery.signals import task_revoked

    from django_redislock import signals as lock_signals
    from django_redislock.celery import receivers
    from django_redislock.runtime import runtime

    assert receivers.celery_task_id in runtime.task_id_providers
    assert any("django_redislock.celery" in str(r[0]) for r in task_revoked.receivers)
    assert any("django_redislock.celery" in str(r[0]) for r in lock_signals.lock_lost.receivers)

    def ours() -> int:
        return sum("django_redislock.celery" in str(r[0]) for r in task_revoked.receivers)

    connected = ours()
    receivers.connect()  # idempotent: a second ready() (tests, autoreload) adds nothing
    assert runtime.task_id_providers.count(receivers.celery_task_id) == 1
    assert ours() == connected


# -- keys --------------------------------------------------------------------------------------
def test_positional_keyword_and_default_arguments_share_a_key():
    task = tasks.unconsumed_keyed
    assert task.lock_name((1,)) == task.lock_name((), {"x": 1}) == task.lock_name()
    assert task.lock_name((2,)) != task.lock_name((1,))
    assert task.lock_name().startswith("tests.testapp.tasks.unconsumed_keyed:")


def test_keyword_and_dict_key_order_do_not_change_the_key():
    task = tasks.unconsumed_keyed
    a = task.lock_name((), {"x": 1, "options": {"a": 1, "b": [1, 2]}, "z": 3, "y": 2})
    b = task.lock_name((), {"y": 2, "z": 3, "options": {"b": [1, 2], "a": 1}, "x": 1})
    assert a == b
    assert a != task.lock_name((), {"x": 1, "options": {"a": 1, "b": [2, 1]}, "z": 3, "y": 2})


@pytest.mark.slow
def test_uuid_decimal_and_datetime_arguments_hash_stably():
    task = tasks.unconsumed_keyed
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    same_instant = when.astimezone(dt.timezone(dt.timedelta(hours=2)))
    key = task.lock_name((1, {"id": ident, "amount": decimal.Decimal("1.50"), "at": when}))
    assert key == task.lock_name(
        (1, {"at": same_instant, "amount": decimal.Decimal("1.5"), "id": ident})
    )
    # What the worker decodes from a JSON message hashes like what the caller passed.
    assert key == task.lock_name((1, {"id": str(ident), "amount": "1.5", "at": when.isoformat()}))
    assert key != task.lock_name(
        (1, {"id": uuid.uuid4(), "amount": decimal.Decimal("1.5"), "at": when})
    )
    # And it is the same in another process (no hash randomisation involved).
    code = (
        "import django; django.setup(); import datetime as dt, decimal, uuid; "
        "from tests.testapp.celery_app import app; from tests.testapp import tasks; "
        "when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc); "
        "print(tasks.unconsumed_keyed.lock_name((1, {'id': uuid.UUID("
        "'12345678-1234-5678-1234-567812345678'), 'amount': decimal.Decimal('1.50'), "
        "'at': when})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == key


def test_self_of_a_bound_task_is_not_part_of_the_key():
    task = tasks.unconsumed_bound
    assert task.lock_name((5,)) == task.lock_name((), {"x": 5})
    assert task.lock_name() == task.lock_name((1,))


def test_template_and_callable_keys_use_the_bound_arguments():
    assert tasks.work.lock_name(("a",)) == "work:a" == tasks.work.lock_name((), {"name": "a"})
    assert tasks.unconsumed_callable_key.lock_name(({"id": 7},), {"full": True}) == "acct:7"


@pytest.fixture
def restore_finalizers() -> Iterator[None]:
    # Private to Celery: not in celery-types' stubs.
    before = set(celery_state._on_app_finalizers)  # type: ignore[attr-defined]
    yield
    celery_state._on_app_finalizers.intersection_update(before)  # type: ignore[attr-defined]


def test_template_naming_an_unknown_parameter_fails_when_the_task_is_defined(restore_finalizers):
    app.finalize()

    def broken(account_id: int) -> None: ...

    with pytest.raises(ValueError, match="accountid"):
        shared_task(
            base=SingleFlightTask, lock_key="sync:{accountid}", name="tests.broken_template"
        )(broken)
    assert "tests.broken_template" not in app.tasks


@pytest.mark.parametrize(
    "options",
    [
        {"lock_on_duplicate": "ignore"},
        {"lock_timeout": 0},
        {"lock_queue_timeout": -1},
        {"lock_key": 42},
    ],
)
def test_bad_task_options_fail_when_the_task_is_defined(restore_finalizers, options):
    def task_body(x: int) -> None: ...

    with pytest.raises((ValueError, TypeError)):
        shared_task(base=SingleFlightTask, name="tests.bad_options", **options)(task_body)


def test_an_argument_without_a_stable_form_is_a_clear_error_and_takes_nothing():
    with pytest.raises(TypeError, match="lock_key"):
        tasks.unconsumed_keyed.delay(object())
    assert list(list_locks()) == []


# -- publish -----------------------------------------------------------------------------------
def test_duplicate_publish_returns_the_queued_task_and_publishes_nothing(
    empty_unconsumed_queue, captured
):
    first = tasks.unconsumed_race.delay(1)
    again = tasks.unconsumed_race.apply_async(kwargs={"x": 1})
    assert again.id == first.id
    assert [m["headers"]["id"] for m in unconsumed_messages()] == [first.id]
    assert captured["deduplicated"][0]["existing_task_id"] == first.id
    info = get_lock_info("race:1")
    assert info is not None and info.task_id == first.id
    assert [i.task_id for i in list_locks(match="race:*")] == [first.id]


def test_a_queued_task_shows_its_publisher_labelled_queued(empty_unconsumed_queue):
    result = tasks.unconsumed_race.delay(13)
    info = get_lock_info("race:13")
    assert info is not None and info.queued is True
    assert (info.task_id, info.owner) == (result.id, result.id)
    assert (info.host, info.pid) == (socket.gethostname(), os.getpid())
    assert info.thread == threading.current_thread().name
    [listed] = list_locks(match="race:13")
    assert dataclasses.replace(listed, expires_in=0) == dataclasses.replace(info, expires_in=0)
    assert listed.as_dict()["queued"] is True


def test_concurrent_publishes_from_threads_send_exactly_one_message(empty_unconsumed_queue):
    barrier = threading.Barrier(16)
    ids: list[str] = []

    def publish() -> None:
        barrier.wait()
        ids.append(tasks.unconsumed_race.delay(2).id)

    threads = [threading.Thread(target=publish) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 16 and len(set(ids)) == 1
    assert [m["headers"]["id"] for m in unconsumed_messages()] == ids[:1]


@pytest.mark.slow
def test_concurrent_publishes_from_processes_send_exactly_one_message(empty_unconsumed_queue):
    go = f"go:{uuid.uuid4().hex}"
    code = (
        "import django; django.setup(); from tests.testapp.celery_app import app; "
        "from tests.testapp import tasks; app.finalize(); "
        "tasks.unconsumed_race.lock_name((3,)); tasks.unconsumed_race.delay; "
        "print('ready', flush=True); "
        f"tasks.observer().blpop({go!r}, 60); "
        "print(tasks.unconsumed_race.delay(3).id, flush=True)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        # Every process imported everything and waits on the barrier: release them at once.
        # stdout=PIPE: never None, which typeshed's Popen cannot tell.
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 4  # type: ignore[union-attr]
        tasks.observer().rpush(go, *["go"] * 4)
        ids = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert all(p.returncode == 0 for p in procs)
    assert len(set(ids)) == 1, ids
    assert [m["headers"]["id"] for m in unconsumed_messages()] == ids[:1]


def test_duplicate_raises_a_picklable_error_naming_the_queued_task(empty_unconsumed_queue):
    first = tasks.unconsumed_race.delay(4)
    with pytest.raises(DuplicateTaskError) as caught:
        tasks.unconsumed_race_raise.delay(4)
    assert caught.value.task_id == first.id
    copy = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(copy, DuplicateTaskError)
    assert (copy.task_id, copy.name, str(copy)) == (first.id, "race:4", str(caught.value))
    # As a task failure stored by the JSON result backend and read back by a client:
    stored = app.backend.prepare_exception(caught.value, "json")
    back = app.backend.exception_to_python(stored)
    assert isinstance(back, DuplicateTaskError) and back.task_id == first.id
    assert len(unconsumed_messages()) == 1


def test_a_failed_publish_releases_the_key_before_the_error_propagates(empty_unconsumed_queue):
    with pytest.raises(Exception, match=r"(?i)serializ"):
        tasks.unconsumed_race.apply_async((5,), serializer="no-such-serializer")
    assert get_lock_info("race:5") is None
    assert unconsumed_messages() == []
    published = tasks.unconsumed_race.delay(5).id  # before the lock is read, as it was
    current = get_lock_info("race:5")
    assert current is not None and published == current.task_id


def test_a_countdown_extends_the_queued_lease_by_the_delay(empty_unconsumed_queue):
    tasks.unconsumed_race.apply_async((6,), countdown=20)
    info = get_lock_info("race:6")
    assert info is not None and 48 < info.expires_in <= 50  # lock_timeout 30 + countdown 20
    tasks.unconsumed_race.apply_async(
        (7,), eta=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=10)
    )
    current = get_lock_info("race:7")
    assert current is not None and 38 < current.expires_in <= 40


def test_lock_queue_timeout_sets_the_queued_lease(empty_unconsumed_queue):
    tasks.unconsumed_backlog.delay(1)
    current = get_lock_info("backlog:1")
    assert current is not None and 295 < current.expires_in <= 300
    tasks.unconsumed_backlog.apply_async((2,), countdown=20)
    current = get_lock_info("backlog:2")
    assert current is not None and 315 < current.expires_in <= 320


def test_a_running_task_holds_the_running_lease_not_the_queued_one(worker):
    tasks.backlog_run.delay("b")
    [event] = wait_for(lambda: tasks.events("lease"))
    assert 0 < event["expires_in"] <= 1.0
    wait_for(lambda: get_lock_info("backlog-run:b") is None)


@pytest.mark.parametrize("canvas", ["link", "link_error", "chain", "group"])
def test_a_duplicate_in_a_canvas_raises_instead_of_dropping_callbacks(
    empty_unconsumed_queue, canvas
):
    first = tasks.unconsumed_race.delay(8)
    sig = tasks.unconsumed_race.s(8)
    with pytest.raises(DuplicateTaskError) as caught:
        if canvas == "link":
            sig.apply_async(link=tasks.plain.s())
        elif canvas == "link_error":
            sig.apply_async(link_error=tasks.plain.s())
        elif canvas == "chain":
            chain(sig, tasks.plain.s()).apply_async()
        else:
            group(sig, tasks.plain.s(1)).apply_async()
    assert caught.value.task_id == first.id
    assert [m["headers"]["id"] for m in unconsumed_messages()] == [first.id]


def test_a_duplicate_with_its_own_task_id_raises(empty_unconsumed_queue):
    first = tasks.unconsumed_race.delay(9)
    with pytest.raises(DuplicateTaskError):
        tasks.unconsumed_race.apply_async((9,), task_id="my-own-id")
    # The same id again is the same task: its result, nothing new.
    assert tasks.unconsumed_race.apply_async((9,), task_id=first.id).id == first.id
    current = get_lock_info("race:9")
    assert current is not None and current.hold_count == 1
    assert len(unconsumed_messages()) == 1


def test_a_key_held_by_non_task_code_raises(empty_unconsumed_queue):
    with Lock("race:10"), pytest.raises(DuplicateTaskError) as caught:
        tasks.unconsumed_race.delay(10)
    assert caught.value.task_id is None
    assert unconsumed_messages() == []


@pytest.mark.django_db(transaction=True)
def test_delay_on_commit_takes_the_key_at_commit_and_nothing_after_rollback(empty_unconsumed_queue):
    with transaction.atomic():
        tasks.unconsumed_race.delay_on_commit(11)
        assert get_lock_info("race:11") is None
    info = get_lock_info("race:11")
    assert info is not None
    assert [m["headers"]["id"] for m in unconsumed_messages()] == [info.task_id]

    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.unconsumed_race.apply_async_on_commit((12,))
        raise RuntimeError("roll back")
    assert get_lock_info("race:12") is None
    assert len(unconsumed_messages()) == 1


# -- run -----------------------------------------------------------------------------------------
def test_success_releases_the_key_and_records_the_task_id(worker):
    result = tasks.work.delay("ok", 0.5)
    start = wait_for(lambda: tasks.events("start"))[0]
    assert start["holder"] == result.id  # list_locks/get_lock_info show which task holds it
    assert start["holds"] == 2  # the queued hold and the run's
    assert result.get(timeout=10) == "done ok"
    wait_for(lambda: get_lock_info("work:ok") is None, 2)


def test_a_plain_lock_in_a_worker_task_records_the_task_id(worker):
    """No single flight, no ``task_id=``: the Celery task-id provider names the running task."""
    result = tasks.plain_lock_holder.delay("plain-in-worker")
    seen = result.get(timeout=10)
    assert seen == {"task_id": result.id, "request_id": result.id}


def test_a_running_task_shows_the_worker_thread_not_the_publisher(worker):
    publisher = threading.current_thread().name
    result = tasks.work.delay("who", 0.5)
    [start] = wait_for(lambda: tasks.events("start"))
    # Seen from inside the body, so not racing its end: the worker re-entered the hold.
    assert start["holder"] == result.id and start["queued"] is False
    assert start["holder_thread"] == start["thread"] != publisher
    assert (start["holder_host"], start["holder_pid"]) == (socket.gethostname(), os.getpid())
    assert result.get(timeout=10) == "done who"


def test_failure_releases_the_key(worker):
    result = tasks.work.delay("bad", 0.0, True)
    with pytest.raises(ValueError):
        result.get(timeout=10)
    assert get_lock_info("work:bad") is None


@pytest.mark.parametrize("task", [tasks.ignoring, tasks.rejecting], ids=["ignore", "reject"])
def test_ignore_and_reject_release_the_key(worker, task):
    task.delay("x")
    wait_for(lambda: tasks.events("end"))
    wait_for(lambda: get_lock_info("exit:x") is None, 2)


def test_replace_releases_the_key_or_hands_it_to_a_same_key_replacement(worker):
    result = tasks.replacing.delay("other", False)
    assert result.get(timeout=10) == "other"
    assert get_lock_info("work:other") is None

    result = tasks.replacing.delay("same", True)
    starts = wait_for(lambda: [e for e in tasks.events("start") if e["key"] == "work:same"][1:])
    # The replacement runs under the same task id, with the key handed over, never released.
    assert starts[0]["task_id"] == result.id and starts[0]["holder"] == result.id
    assert tasks.work.delay("same").id == result.id
    assert result.get(timeout=10) == "done same"
    assert no_overlaps()
    wait_for(lambda: get_lock_info("work:same") is None, 2)


def test_retry_keeps_the_key_until_the_final_attempt_ends(worker):
    result = tasks.retrying.delay("r", 2, 0.5)
    # Between two attempts: the retry is queued with a countdown, and still holds the key.
    info = wait_for(lambda: (i := get_lock_info("retry:r")) is not None and i.queued and i)
    assert info.task_id == result.id
    assert tasks.retrying.delay("r", 2, 0.5).id == result.id  # no second publish
    assert result.get(timeout=15) == 2
    starts = tasks.events("start")
    assert [s["retries"] for s in starts] == [0, 1, 2]
    assert {s["holder"] for s in starts} == {result.id}
    assert no_overlaps()
    wait_for(lambda: get_lock_info("retry:r") is None, 2)


def test_a_duplicate_while_running_returns_the_running_task(worker, captured):
    result = tasks.work.delay("busy", 1.0)
    wait_for(lambda: tasks.events("start"))
    assert tasks.work.delay("busy", 1.0).id == result.id
    with pytest.raises(DuplicateTaskError) as caught:
        tasks.work_raise.delay("busy")
    assert caught.value.task_id == result.id
    result.get(timeout=10)
    assert len(tasks.events("start")) == 1


def test_a_send_task_delivery_while_running_is_skipped_not_run(worker, captured, caplog):
    running = tasks.work.delay("st", 1.5)
    wait_for(lambda: tasks.events("start"))
    with caplog.at_level(logging.WARNING, logger="django_redislock.celery"):
        other = app.send_task("tests.testapp.tasks.work", args=["st", 0.0])
        wait_for(lambda: other.state == SKIPPED)
    assert other.info == {"key": "work:st", "holder": running.id, "reason": "busy"}
    assert captured["skipped"][0]["task_id"] == other.id
    assert captured["skipped"][0]["holder"] == running.id
    assert "skipped" in caplog.text
    running.get(timeout=10)
    assert len(tasks.events("start")) == 1 and no_overlaps()
    assert get_lock_info("work:st") is None


def test_a_redelivered_message_of_a_running_task_is_skipped(worker, captured):
    running = tasks.work.delay("rd", 1.5)
    wait_for(lambda: tasks.events("start"))
    info = get_lock_info("work:rd")
    assert info is not None
    # The broker hands out the same message again (same id, same headers) while it runs.
    app.send_task(
        "tests.testapp.tasks.work",
        args=["rd", 0.0],
        task_id=running.id,
        headers={HEADER_KEY: "work:rd", HEADER_TOKEN: info.fencing_token, HEADER_HOLDS: 1},
    )
    wait_for(lambda: captured["skipped"])
    assert captured["skipped"][0]["reason"] == "already-running"
    current = get_lock_info("work:rd")
    assert current is not None and current.hold_count == 2  # the running attempt's holds are intact
    assert running.get(timeout=10) == "done rd"
    assert len(tasks.events("start")) == 1 and no_overlaps()
    wait_for(lambda: get_lock_info("work:rd") is None, 2)


@pytest.mark.slow
def test_the_lease_is_renewed_while_the_body_runs_five_lock_timeouts(worker):
    running = tasks.short_lease.delay("long", 5.5)  # lock_timeout=1
    assert running.get(timeout=15) == "done long"
    [start], [end] = tasks.events("start"), tasks.events("end")
    # Had the lease lapsed even once, the next renewal would have found the key gone (lost), and
    # the hold seen at the end would not be the one taken at the start.
    assert end["lock_lost"] is False
    assert end["at"] - start["at"] >= 5.5
    assert (end["holder"], end["token"]) == (running.id, start["token"])


def test_a_lock_lost_mid_run_is_known_to_the_task_and_logged(worker, caplog):
    with caplog.at_level(logging.ERROR, logger="django_redislock.celery"):
        assert tasks.lose_lock.delay("l").get(timeout=10) is True
    assert "lost its lock 'lose:l'" in caplog.text


def test_statistics_rows_of_a_task_are_named_after_its_lock_key_template(worker):
    """As for ``@distributed_lock``: one row per template, not one per task name or per key."""
    stats_module.flush()
    assert tasks.work.delay("row-a").get(timeout=10) == "done row-a"
    assert tasks.work.delay("row-b").get(timeout=10) == "done row-b"
    stats_module.flush()
    row = get_stats("work:{name}")
    assert row is not None and row.acquired == 2 and row.released == 2, row
    assert get_stats(tasks.work.name) is None and get_stats("work:row-a") is None


def test_a_force_release_of_a_running_task_is_counted_once_on_its_row(worker, caplog):
    """The operator's force release and the task's loss of the lock land on one row, the key
    template's, each counted once; the worker says so in words users know (task, lock)."""
    stats_module.flush()
    running = tasks.slow_lease.delay("forced", 2.0)
    wait_for(lambda: tasks.events("start"), 10, what="the task to start")
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        assert force_release("slow:forced") is True
        assert running.get(timeout=15) == "done forced"
    stats_module.flush()
    row = get_stats("slow:{name}")
    assert row is not None, list(stats_module.iter_stats())
    assert (row.force_released, row.lost, row.acquired) == (1, 1, 1), row
    assert get_stats("slow:forced") is None and get_stats(tasks.slow_lease.name) is None
    assert f"Task {running.id} ended without holding its lock 'slow:forced'" in caplog.text
    assert "Flight" not in caplog.text


@pytest.mark.slow
def test_revoking_a_queued_task_releases_its_key_when_the_worker_discards_it(worker):
    result = tasks.slow_lease.apply_async(("rv",), countdown=1.5)  # queued lease: 21.5 s
    current = get_lock_info("slow:rv")
    assert current is not None and current.task_id == result.id
    result.revoke()
    wait_for(lambda: get_lock_info("slow:rv") is None, 8)  # discarded at its eta
    assert result.state == "REVOKED"
    assert tasks.events() == []


@pytest.mark.slow
def test_a_periodic_task_longer_than_its_interval_never_overlaps(worker, tmp_path):
    """Real ``celery beat`` (1 s schedule), 2.5 s task: ticks are skipped, never doubled."""
    env = subprocess_env(REDISLOCK_TEST_BEAT_INTERVAL="1.0")
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.testapp.celery_app",
            "beat",
            "--schedule",
            str(tmp_path / "beat-schedule"),
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: len(tasks.events("start")) >= 3, 30, 0.1)
    finally:
        beat.terminate()
        output = beat.communicate(timeout=20)[0]
    # Let the last tick finish here, not after the suite (its lock's Redis would be gone).
    wait_for(lambda: len(tasks.events("end")) >= len(tasks.events("start")), 10, 0.1)
    sent = output.count("Sending due task tick")
    starts = tasks.events("start")
    assert no_overlaps()
    assert sent >= len(starts) + 3, output  # many ticks, few runs: the rest were deduplicated
    assert "not published: lock 'beat:tick' is held by task" in output  # skipped ticks are logged
    # ... and are deduplications, not failed acquisitions (flushed at beat's exit): a periodic
    # task working exactly as intended keeps a 100 % success rate.
    # The worker flushes its share every FLUSH_INTERVAL (5 s): wait for the last run's.
    wait_for(
        lambda: (s := get_stats("beat:tick")) is not None and s.acquired >= len(starts),
        stats_module.FLUSH_INTERVAL + 5,
        0.2,
    )
    stats = get_stats("beat:tick")
    assert stats is not None and stats.acquired >= len(starts) and stats.failed == 0, stats
