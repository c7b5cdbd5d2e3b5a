"""``SingleFlightTask`` under ``task_always_eager`` (``CELERY_TASK_ALWAYS_EAGER``) and ``apply()``.

Eager runs take and release the same locks as a worker would, in the caller's thread: the key is
held while the body runs (by the task's id), freed when it returns or raises, a duplicate publish
from inside the body is folded into the running task, and a delivery whose key is busy is
``SKIPPED``; what would wait for (or be rescheduled behind) a run further up the same thread runs
right after it instead of deadlocking. No worker, no broker: fast tests against the suite's real
Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import shared_task

from django_redislock import Lock
from django_redislock.celery import SKIPPED, DuplicateTaskError, SingleFlightTask
from django_redislock.singleflight import run_key
from django_redislock.testing import assert_locked, assert_not_locked, held_by
from tests.testapp.celery_app import app

#: What the bodies saw, in order (reset by the ``eager`` fixture).
SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def eager() -> Iterator[None]:
    """``CELERY_TASK_ALWAYS_EAGER = True`` for the test (exceptions propagate, as most projects
    configure it), undone afterwards."""
    app.finalize()
    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    SEEN.clear()
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved


@shared_task(bind=True, base=SingleFlightTask, lock_key="eager:{name}", lock_timeout=10)
def checked(self: Any, name: str, fail: bool = False) -> str:
    """Records whether its key was held, and by whom, while the body ran."""
    info = assert_locked(f"eager:{name}", by=self.request.id)
    SEEN.append(info.task_id)
    if fail:
        raise RuntimeError("body failed")
    return str(self.request.id)


@shared_task(bind=True, base=SingleFlightTask, lock_key="eager:{name}", lock_timeout=10)
def republishing(self: Any, name: str) -> str:
    """Publishes itself (same key) from its own body, as a double-click handler might."""
    SEEN.append(republishing.delay(name).id)
    return str(self.request.id)


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager:{name}",
    lock_timeout=10,
    lock_on_duplicate="raise",
)
def republishing_raise(self: Any, name: str) -> None:
    republishing_raise.delay(name)


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager:{name}",
    lock_timeout=10,
    lock_mode="while_executing",
)
def while_executing(self: Any, name: str) -> str:
    SEEN.append(self.request.id)
    return "ran"


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager:{name}",
    lock_timeout=10,
    lock_mode="coalesce",
)
def coalescing(self: Any, name: str, follow_ups: int = 0) -> str:
    SEEN.append(("start", self.request.id))
    assert_locked(run_key(f"eager:{name}"), by=f"{self.request.id}#0")
    for _ in range(follow_ups):
        coalescing.delay(name)
    SEEN.append(("end", self.request.id))
    return str(self.request.id)


@shared_task(
    bind=True, base=SingleFlightTask, lock_key="eager:{name}", lock_timeout=10, max_retries=3
)
def retrying(self: Any, name: str, fail_times: int) -> int:
    attempt = self.request.retries
    SEEN.append((attempt, held_by(f"eager:{name}") is not None))
    if attempt < fail_times:
        raise self.retry(countdown=0, exc=RuntimeError("try again"))
    return int(attempt)


def test_the_key_is_held_by_the_task_while_the_eager_body_runs_and_freed_after():
    result = checked.delay("a")
    assert result.get() == result.id
    assert [result.id] == SEEN  # held by this task's id during the body
    assert_not_locked("eager:a")


def test_the_key_is_freed_when_the_eager_body_raises():
    with pytest.raises(RuntimeError, match="body failed"):
        checked.delay("b", fail=True)
    assert len(SEEN) == 1
    assert_not_locked("eager:b")


def test_the_key_is_freed_when_the_error_is_stored_instead_of_raised():
    app.conf.task_eager_propagates = False
    result = checked.delay("c", fail=True)
    assert result.failed()
    assert_not_locked("eager:c")


def test_apply_takes_the_lock_without_always_eager():
    app.conf.task_always_eager = False
    result = checked.apply(("d",))
    assert result.successful() and [result.id] == SEEN
    assert_not_locked("eager:d")


def test_eager_runs_one_after_another_each_take_the_key():
    first, second = checked.delay("e"), checked.delay("e")
    assert first.id != second.id
    assert [first.id, second.id] == SEEN


def test_a_duplicate_published_from_the_running_body_is_folded_into_it():
    result = republishing.delay("f")
    assert [result.id] == SEEN  # the inner delay() returned the running task's result
    assert_not_locked("eager:f")


def test_a_duplicate_with_lock_on_duplicate_raise_raises_with_the_running_task_id():
    with pytest.raises(DuplicateTaskError) as raised:
        republishing_raise.delay("g")
    assert raised.value.task_id is not None
    assert_not_locked("eager:g")


def test_a_publish_while_another_holder_has_the_key_publishes_nothing():
    with Lock("eager:h", timeout=10), pytest.raises(DuplicateTaskError) as raised:
        checked.delay("h")
    assert raised.value.task_id is None  # the holder is not a task
    assert SEEN == []


def test_an_eager_delivery_whose_key_is_busy_is_skipped_not_run():
    with Lock("eager:i", timeout=10) as lock:
        result = while_executing.delay("i")
        assert result.state == SKIPPED
        assert result.info["key"] == "eager:i" and result.info["reason"] == "busy"
        assert_locked("eager:i", by=lock)  # the holder's lock is untouched
    assert SEEN == []
    assert while_executing.delay("i").get() == "ran"
    assert_not_locked("eager:i")


def test_coalesce_follow_ups_published_by_the_body_run_once_after_it():
    result = coalescing.delay("j", follow_ups=3)
    starts = [task_id for event, task_id in SEEN if event == "start"]
    assert starts[0] == result.id
    assert len(starts) == 2  # the running one and one follow-up (the others were folded into it)
    first_end = SEEN.index(("end", result.id))
    assert SEEN.index(("start", starts[1])) > first_end  # never overlapping
    assert_not_locked("eager:j")
    assert_not_locked(run_key("eager:j"))


def test_an_eager_retry_runs_again_with_the_key_and_frees_it_at_the_end():
    app.conf.task_eager_propagates = False  # else Celery raises Retry out of the eager call
    result = retrying.delay("k", fail_times=2)
    assert result.get() == 2
    assert SEEN == [(0, True), (1, True), (2, True)]
    assert_not_locked("eager:k")


def test_an_eager_retry_that_celery_propagates_still_frees_the_key():
    from celery.exceptions import Retry

    with pytest.raises(Retry):
        retrying.delay("m", fail_times=1)
    assert_not_locked("eager:m")


def test_calling_the_task_directly_takes_no_lock():
    assert checked.run is not None
    with Lock("eager:l", timeout=10):
        assert while_executing("l") == "ran"  # a plain function call, as documented


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager:{name}",
    lock_timeout=10,
    lock_mode="while_executing",
    lock_on_busy="reschedule",
)
def rescheduling(self: Any, name: str, again: bool = False) -> str:
    SEEN.append(("start", self.request.id))
    if again:
        # A delivery of the same key while this one runs (a second publisher, a send_task): a
        # worker would publish it again after the countdown; eager runs it right after this run.
        SEEN.append(("inner", rescheduling.apply((name,)).id))
    SEEN.append(("end", self.request.id))
    return str(self.request.id)


def test_a_reschedule_behind_another_holder_is_skipped_in_eager_mode():
    with Lock("eager:n", timeout=10, owner="worker-2"):
        result = rescheduling.apply(("n",))
    assert result.state == SKIPPED
    assert result.info["holder"] is None or result.info["holder"] != result.id
    assert SEEN == []


def test_a_reschedule_behind_a_run_of_this_thread_runs_after_it():
    result = rescheduling.delay("o", again=True)
    inner = next(task_id for event, task_id in SEEN if event == "inner")
    assert [event for event, _ in SEEN] == ["start", "inner", "end", "start", "end"]
    assert SEEN[3] == ("start", inner) and inner != result.id
    assert_not_locked("eager:o")


def test_a_plain_lock_inside_a_task_records_the_task_id_and_outside_none():
    """The task-id provider answers inside a task (eager here: same signals as a worker) and
    answers ``None`` — cheaply, without Celery's task stack — once no task runs."""
    from django_redislock import get_lock_info
    from django_redislock.celery import receivers
    from tests.testapp.tasks import plain_lock_holder

    seen = plain_lock_holder.delay("eager:plain").get()
    assert seen["task_id"] == seen["request_id"] is not None
    assert not receivers._running  # every started task was counted as finished
    with Lock("eager:plain", timeout=10):
        info = get_lock_info("eager:plain")
        assert info is not None and info.task_id is None


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager-permit:{name}",
    task_permits=1,
    lock_timeout=10,
)
def one_at_a_time(self: Any, name: str, inner: str | None = None) -> Any:
    """One body of the task at a time; ``inner`` publishes another key from inside the body."""
    SEEN.append(name)
    return one_at_a_time.delay(inner) if inner else name


@shared_task(
    bind=True,
    base=SingleFlightTask,
    lock_key="eager-debounce:{name}",
    lock_mode="debounce",
    lock_debounce=30,
    lock_timeout=10,
)
def debounced_eagerly(self: Any, name: str, value: int) -> int:
    assert_locked(f"eager-debounce:{name}", by=self.request.id)
    SEEN.append(value)
    return value


def test_an_eager_run_over_a_limit_is_skipped_and_holds_nothing():
    outer = one_at_a_time.delay("a", inner="b")
    inner = outer.get()
    assert inner.state == SKIPPED and inner.info["reason"] == "task_permits"
    assert SEEN == ["a"]  # never run early
    assert_not_locked("eager-permit:b")
    assert one_at_a_time.delay("b").get() == "b"  # the permit came back with the outer run


def test_an_eager_debounced_publish_runs_at_once_under_its_key():
    assert [debounced_eagerly.delay("k", v).get() for v in (1, 2)] == [1, 2]
    assert SEEN == [1, 2]
    assert_not_locked("eager-debounce:k")
