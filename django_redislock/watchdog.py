"""One renewal thread per process for every held lock, of every face.

A held lock with ``auto_renew`` is registered here after it is acquired and unregistered *before*
it is released, so the watchdog never renews a lock after release or after an interrupted acquire.
Renewals that fall due close together are sent as one pipeline per Redis client (one round trip
for hundreds of locks). Async locks are renewed here too, with the sync client of the same
server, so a held lock stays renewed while its event loop is busy with CPU-bound work.

A renewal that finds the lock gone marks the hold lost (:func:`django_redislock.holds.mark_lost`:
``lost`` flag, WARNING, ``lock_lost``). A renewal that fails because Redis is unreachable is
retried within :data:`RETRY_AFTER` seconds; the lock is declared lost only when Redis says so.

The thread starts lazily on the first registration and is recreated in a forked child (Celery
prefork, gunicorn), where the parent's holds are not the child's and are forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from redis import exceptions as redis_errors

from django_redislock import connection, holds, scripts
from django_redislock.holds import Hold

__all__ = ["RETRY_AFTER", "Watchdog", "watchdog"]

logger = logging.getLogger("django_redislock")

#: A renewal retried after a connection error waits this long (capped by a third of the lease).
RETRY_AFTER = 1.0


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds: set[Hold] = set()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        self._idle_wait = 10.0  # shortest renewal interval seen, see _due()

    def register(self, hold: Hold) -> None:
        """Start renewing ``hold`` (a third of its lease from now, then every third).

        On every acquisition, so it takes no lock unless it must: the set update is atomic, and
        the thread is only notified when this hold falls due before its planned wake-up
        (``_due`` marks a scan in progress with an infinite wake-up, so a hold added during a
        scan the thread may have missed always notifies).
        """
        interval = hold.lease / 3
        hold.next_renewal = time.monotonic() + interval
        hold.registered = True
        if interval < self._idle_wait:
            self._idle_wait = max(0.5, interval)
        self._holds.add(hold)
        if self._thread is None:
            with self._cond:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="django-redislock-watchdog", daemon=True
                    )
                    self._thread.start()
        elif hold.next_renewal < self._wake_at:
            with self._cond:
                self._cond.notify()

    def unregister(self, hold: Hold) -> None:
        hold.registered = False
        self._holds.discard(hold)

    def __len__(self) -> int:
        return len(self._holds)

    def _due(self) -> list[Hold]:
        """Wait until some renewal is due; return every hold due now or soon (batched)."""
        with self._cond:
            while True:
                self._wake_at = float("inf")  # scanning: see register()
                now = time.monotonic()
                held = tuple(self._holds)  # one atomic copy; registrations go on meanwhile
                if held:
                    first = min(h.next_renewal for h in held)
                    if first <= now:
                        # Renew early whatever falls due within the next sixth of its lease, so
                        # renewals of many locks coalesce into few round trips.
                        return [h for h in held if h.next_renewal - h.lease / 6 <= now]
                    self._wake_at = first
                    self._cond.wait(first - now)
                else:
                    # Idle: plan a wake-up no later than any new hold's first renewal, so that
                    # register() need not notify (a lock taken and released in a loop would
                    # otherwise wake this thread, and take the GIL, on every acquisition).
                    self._wake_at = now + self._idle_wait
                    self._cond.wait(self._idle_wait)

    def _run(self) -> None:
        while True:
            try:
                self.renew_now(self._due())
            except Exception:  # never let the thread die: held locks depend on it
                logger.exception("django_redislock watchdog: unexpected error")
                time.sleep(RETRY_AFTER)

    def renew_now(self, due: list[Hold]) -> None:
        """Renew ``due`` with one pipeline per connection and script; mark the ones found gone
        as lost (locks and semaphore permits renew with different scripts).

        On a Redis Cluster a pipeline goes to the node of each key (cluster pipelines refuse
        scripts); a renewal that meets a redirect or a failed node is retried at once as a
        single call through the cluster client, which follows ``MOVED``/``ASK`` and failovers.
        """
        by_client: dict[tuple[int, str], tuple[Any, list[Hold]]] = {}
        cluster: dict[int, bool] = {}  # is_cluster() per client, asked once per round
        for hold in due:
            renew = hold.renew
            client = renew[0]
            per_node = cluster.get(id(client))
            if per_node is None:
                per_node = cluster[id(client)] = connection.is_cluster(client)
            if per_node or hold.replicas[0]:
                client = scripts.node_client(client, renew[2][0])
            by_client.setdefault((id(client), renew[1].sha), (client, []))[1].append(hold)
        for client, group in by_client.values():
            results: list[Any]
            try:
                if _batchable(group):
                    # One script per few hundred locks (RENEW_MANY) instead of one per lock.
                    results = scripts.renew_many(
                        client, [(h.renew[2][0], h.renew[3][0], h.renew[3][1]) for h in group]
                    )
                else:
                    calls = [(h.renew[2], h.renew[3]) for h in group]
                    results = scripts.run_pipeline(
                        client, group[0].renew[1], calls, wait_replicas=group[0].replicas
                    )
            except redis_errors.RedisError as exc:
                results = [exc] * len(group)
            now = time.monotonic()
            for hold, result in zip(group, results, strict=True):
                if result == 1:  # renewed: the common case, settled inline
                    hold.next_renewal = now + hold.lease / 3
                    continue
                if isinstance(result, Exception) and connection.is_cluster(hold.client):
                    result = self._renew_alone(hold)
                self._settle(hold, result)

    @staticmethod
    def _renew_alone(hold: Hold) -> Any:
        client, script, keys, args = hold.renew
        try:
            if hold.replicas[0]:
                reply, acked = scripts.call_and_wait(script, client, keys, args, *hold.replicas)
                if acked < hold.replicas[0]:
                    return redis_errors.ResponseError("not acknowledged by enough replicas")
                return reply
            return script(client, keys, args)
        except redis_errors.RedisError as exc:
            return exc

    @staticmethod
    def _settle(hold: Hold, result: Any) -> None:
        now = time.monotonic()
        if isinstance(result, Exception):
            # Unknown outcome: keep the hold and try again soon, before the lease runs out.
            logger.warning("django_redislock: could not renew %r: %s", hold.name, result)
            hold.next_renewal = now + min(RETRY_AFTER, hold.lease / 3)
        elif int(result) == 1:
            hold.next_renewal = now + hold.lease / 3
        elif hold.registered:
            holds.mark_lost(hold)

    def _after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds = set()
        self._thread = None
        self._wake_at = float("inf")


def _batchable(group: list[Hold]) -> bool:
    """Lock leases reset on one standalone Redis without replica acknowledgement: RENEW_MANY.

    Semaphore permits (another script), a Cluster (one slot per script), ``REPLICAS``
    (acknowledged per renewal) and Redlock's renewer (a majority per renewal) keep one script
    call per hold.
    """
    first = group[0]  # a group shares its client and script; a hold's renewal always resets
    return (  # the lease (mode "set": see LockBase._acquired), which RENEW_MANY does
        first.renew[1] is scripts.RENEW
        and getattr(first.client, "batch_renewals", True)
        and not first.replicas[0]
        and not connection.is_cluster(first.client)
    )


watchdog = Watchdog()
holds.on_fork(watchdog._after_fork)
holds.on_drop(watchdog.unregister)
