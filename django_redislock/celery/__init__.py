"""Single-flight Celery tasks: one queued-or-running instance per lock key.

```python
from celery import shared_task
from django_redislock.celery import SingleFlightTask

@shared_task(base=SingleFlightTask, lock_key="sync:{account_id}", lock_timeout=60)
def sync(account_id, full=False): ...
```

How the key is held, end to end, in the default ``lock_mode="until_executed"`` (the README has the
long version; every mode's publish/run start/run end is tabled in
:mod:`django_redislock.singleflight`, of which this package is the Celery client):

1. **Publish** (``apply_async``/``delay``, beat, ``delay_on_commit``): the task id is generated
   first, then the key is taken with ``owner=<task id>`` and a lease of ``lock_queue_timeout``
   plus any ``countdown``/``eta``. One round trip. Busy key: nothing is published; the caller
   gets the in-flight task's ``AsyncResult`` (or :class:`DuplicateTaskError`). The message
   carries the key, the fencing token, the hold count and the attempt number in its headers
   (:mod:`.headers`).
2. **Run**: the worker re-enters the same lock (same owner = task id) with ``auto_renew``, so the
   watchdog keeps it while the body runs. A delivery that did not come through step 1
   (``send_task``, another beat, a broker redelivery of a message that is still running) finds the
   key held by someone else, or held *more often than its headers say*, and ends as ``SKIPPED``
   (or is rescheduled, ``lock_on_busy="reschedule"``) without running the body.
3. **End**: every exit releases all holds of the task id in one round trip — except ``retry()`` and
   a ``replace()`` by the same key, which hand the holds over to the message they publish (same task
   id), so the key stays taken until the final attempt ends.
4. **Crashes**: the worker's main process releases the key when a pool child dies or is terminated
   (``WorkerLostError``, ``revoke(terminate=True)``, hard time limit) and when it discards a revoked
   or expired message; a SIGKILLed worker's key expires within one ``lock_timeout``.

Other modes: ``"until_executing"`` (released at run start), ``"while_executing"`` (nothing at
publish; a lock, or a semaphore of ``lock_permits``, while the body runs), ``"coalesce"`` (one
running + one queued follow-up) and ``"until_expired"`` (held ``lock_timeout`` from publish);
``"debounce"`` collapses a burst of publishes into one run with the last arguments. Flow control
(``lock_rate``, ``task_rate``, ``task_permits``) re-publishes a run over a limit for later.

Modules: :mod:`.keys` (task lock keys), :mod:`.task` (publish and run), :mod:`.worker` (the worker
main process), :mod:`.runs` (attempts running in this process), :mod:`.headers` (what travels in
the message), :mod:`.signals` (signals we send), :mod:`.receivers` (what ``AppConfig.ready``
connects), :mod:`.exceptions`.
"""

from django_redislock.celery.exceptions import DuplicateTaskError
from django_redislock.celery.signals import (
    task_deduplicated,
    task_rescheduled,
    task_skipped,
    task_throttled,
)
from django_redislock.celery.task import SKIPPED, SingleFlightTask
from django_redislock.celery.worker import SingleFlightRequest
from django_redislock.naming import argument_digest
from django_redislock.singleflight import LOCK_MODES, MODES, TaskOptionError

__all__ = [
    "LOCK_MODES",
    "MODES",
    "SKIPPED",
    "DuplicateTaskError",
    "SingleFlightRequest",
    "SingleFlightTask",
    "TaskOptionError",
    "argument_digest",
    "task_deduplicated",
    "task_rescheduled",
    "task_skipped",
    "task_throttled",
]
