"""Single-flight Django tasks (``django_redislock.django_tasks``) run by the backport's real
``db_worker`` in ``tests/test_django_tasks.py``.

Like the Celery tasks of ``tests/testapp/tasks.py``, every body records its start and end in Redis
(``tasks.events()``, ``overlaps``). One task per ``lock_mode``, key ``"dt-<mode>:{name}"``; the
task result id comes from the context.
"""

from __future__ import annotations

import time
from typing import Any

from django_redislock.django_tasks import single_flight_task
from tests.testapp.tasks import observed_run

LOCK_TIMEOUT = 2.0
EXPIRED_WINDOW = 4.0


def _work(mode: str, context: Any, name: str, seconds: float, fail: bool) -> str:
    with observed_run(f"dt-{mode}:{name}", str(context.task_result.id)):
        time.sleep(seconds)
        if fail:
            raise ValueError(f"dt-{mode}:{name} failed on purpose")
    return f"done {name}"


@single_flight_task(takes_context=True, lock_key="dt-until_executed:{name}", lock_timeout=2.0)
def mode_until_executed(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("until_executed", context, name, seconds, fail)


@single_flight_task(
    takes_context=True,
    lock_key="dt-until_executing:{name}",
    lock_timeout=2.0,
    lock_mode="until_executing",
)
def mode_until_executing(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("until_executing", context, name, seconds, fail)


@single_flight_task(
    takes_context=True,
    lock_key="dt-while_executing:{name}",
    lock_timeout=2.0,
    lock_mode="while_executing",
)
def mode_while_executing(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("while_executing", context, name, seconds, fail)


@single_flight_task(
    takes_context=True, lock_key="dt-coalesce:{name}", lock_timeout=2.0, lock_mode="coalesce"
)
def mode_coalesce(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("coalesce", context, name, seconds, fail)


@single_flight_task(
    takes_context=True,
    lock_key="dt-until_expired:{name}",
    lock_timeout=EXPIRED_WINDOW,
    lock_mode="until_expired",
)
def mode_until_expired(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("until_expired", context, name, seconds, fail)


@single_flight_task(
    takes_context=True,
    lock_key="dt-while_executing:{name}",
    lock_timeout=2.0,
    lock_mode="while_executing",
    lock_on_busy="reschedule",
    lock_reschedule_countdown=0.5,
)
def rescheduling(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    return _work("while_executing", context, name, seconds, fail)


@single_flight_task(lock_key="dt-plain:{x}", lock_timeout=2.0)
def without_context(x: int) -> int:
    """Key from the arguments of a task that takes no context."""
    return x


@single_flight_task(
    takes_context=True,
    lock_key="dt-rated:{name}",
    lock_timeout=2.0,
    lock_mode="while_executing",
    lock_permits=10,
    lock_rate="2/s",
)
def rated(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    """At most two runs a second per key, whichever worker runs them."""
    with observed_run(f"dt-rated:{name}", str(context.task_result.id)):
        pass
    return f"done {name}"


@single_flight_task(
    takes_context=True, lock_key="dt-capped:{name}", lock_timeout=2.0, task_permits=1
)
def capped(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> str:
    """One body of the task at a time, all keys together."""
    with observed_run("dt-capped", str(context.task_result.id)):
        time.sleep(seconds)
    return f"done {name}"


MODE_TASKS = {
    "until_executed": mode_until_executed,
    "until_executing": mode_until_executing,
    "while_executing": mode_while_executing,
    "coalesce": mode_coalesce,
    "until_expired": mode_until_expired,
}
