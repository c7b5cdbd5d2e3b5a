"""Prometheus export of lock statistics (optional: needs ``pip install prometheus_client``).

::

    from django_redislock.prometheus import register_collector
    register_collector()          # e.g. in AppConfig.ready() of the process serving /metrics

The collector reads :mod:`django_redislock.stats` from Redis at scrape time, so the figures are
already summed over every process and machine: export them from ONE scrape target (or use
``max by (name)`` in queries), not from every web worker. Series, labelled ``name`` (a lock name,
or the key template of a decorated function / task):

- counters ``redislock_acquisitions_total``, ``redislock_contended_acquisitions_total``,
  ``redislock_failed_acquisitions_total``, ``redislock_releases_total``,
  ``redislock_losses_total``, ``redislock_force_releases_total``,
  ``redislock_wait_seconds_total``, ``redislock_hold_seconds_total``;
- gauges ``redislock_wait_seconds_max``, ``redislock_hold_seconds_max``.

A name unused for 24 hours disappears (its Redis figures expire); counters restart from zero if it
comes back, which Prometheus treats as an ordinary counter reset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from django_redislock import stats

__all__ = ["LockStatsCollector", "register_collector"]

_COUNTERS = (
    ("redislock_acquisitions", "Lock acquisitions.", "acquired"),
    (
        "redislock_contended_acquisitions",
        "Acquisitions that found the lock busy at first.",
        "contended",
    ),
    (
        "redislock_failed_acquisitions",
        "Acquisition attempts that timed out or found the lock busy without waiting.",
        "failed",
    ),
    ("redislock_releases", "Releases of the last hold of a lock.", "released"),
    ("redislock_losses", "Locks found lost (expired or force-released) by their holder.", "lost"),
    ("redislock_force_releases", "Locks force-released by an operator.", "force_released"),
    ("redislock_wait_seconds", "Seconds spent waiting in successful acquisitions.", "wait_total"),
    ("redislock_hold_seconds", "Seconds locks were held, up to their release.", "hold_total"),
)
_GAUGES = (
    ("redislock_wait_seconds_max", "Longest wait of a successful acquisition.", "wait_max"),
    ("redislock_hold_seconds_max", "Longest hold up to a release.", "hold_max"),
)


class LockStatsCollector:
    """A ``prometheus_client`` custom collector over :func:`stats.iter_stats`."""

    def __init__(self, using: str | None = None, *, limit: int = 1000) -> None:
        self.using = using
        self.limit = limit

    def describe(self) -> list[Any]:
        # Declared empty so registering does not read Redis (prometheus_client would otherwise
        # call collect() once to learn the metric names).
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counters: list[tuple[Any, str]] = [
            (CounterMetricFamily(name, doc, labels=["name"]), field)
            for name, doc, field in _COUNTERS
        ]
        gauges: list[tuple[Any, str]] = [
            (GaugeMetricFamily(name, doc, labels=["name"]), field) for name, doc, field in _GAUGES
        ]
        for figures in itertools.islice(stats.iter_stats(using=self.using), self.limit):
            for family, field in (*counters, *gauges):
                family.add_metric([figures.name], float(getattr(figures, field)))
        for family, _field in (*counters, *gauges):
            yield family


def register_collector(registry: Any = None, using: str | None = None) -> LockStatsCollector:
    """Register a :class:`LockStatsCollector` (on the default registry unless one is given)."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = LockStatsCollector(using)
    registry.register(collector)
    return collector
