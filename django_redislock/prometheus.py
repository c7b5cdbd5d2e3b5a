"""Prometheus export of lock statistics (optional: needs ``pip install prometheus_client``).

::

    from django_redislock.prometheus import register_collector
    register_collector()          # e.g. in AppConfig.ready() of the process serving /metrics

The collector reads :mod:`django_redislock.stats` from Redis at scrape time, so the figures are
already summed over every process and machine: export them from ONE scrape target (or use
``max by (name)`` in queries), not from every web worker. Series, labelled ``name`` (a lock name's
shape, or the key template of a decorated function, or a task name):

- histograms ``redislock_wait_seconds`` (waits of successful acquisitions) and
  ``redislock_hold_seconds`` (holds up to their release): ``_bucket{le=...}`` (cumulative, the
  bounds of :data:`django_redislock.stats.BUCKETS` and ``+Inf``), ``_sum`` and ``_count``;
- counters ``redislock_acquisitions_total``, ``redislock_contended_acquisitions_total``,
  ``redislock_failed_acquisitions_total``, ``redislock_releases_total``,
  ``redislock_losses_total``, ``redislock_force_releases_total``, ``redislock_skipped_total``
  (calls and task deliveries skipped or rescheduled because their key was busy, as intended) and
  ``redislock_deduplicated_total`` (single-flight publishes folded into a queued/running one);
- gauges ``redislock_wait_seconds_max``, ``redislock_hold_seconds_max``.

Decision: the wait and hold totals are the histograms' ``_sum`` series. The counters
``redislock_wait_seconds_total`` and ``redislock_hold_seconds_total`` of earlier versions are
gone: a counter family ``redislock_wait_seconds`` and a histogram family of the same name cannot
both be exposed (one name, two types), and keeping the total under another name would only
duplicate ``redislock_wait_seconds_sum``. Replace ``rate(redislock_wait_seconds_total[5m])`` with
``rate(redislock_wait_seconds_sum[5m])``. The histograms' ``_count`` counts the waits/holds in the
buckets, which equals ``redislock_acquisitions_total``/``redislock_releases_total`` except for
figures recorded before the histograms existed (they expire within a day).

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
    ("redislock_rate_allowed", "Requests a rate limiter allowed.", "allowed"),
    ("redislock_rate_limited", "Requests a rate limiter refused.", "limited"),
    (
        "redislock_throttled",
        "Task runs re-published because a rate limit or a concurrency cap was reached.",
        "throttled",
    ),
    (
        "redislock_skipped",
        "Calls or task deliveries skipped or rescheduled because their lock was busy (by design).",
        "skipped",
    ),
    (
        "redislock_deduplicated",
        "Single-flight publishes folded into the queued or running task of the same key.",
        "deduplicated",
    ),
)
_HISTOGRAMS = (
    (
        "redislock_wait_seconds",
        "Seconds waited by successful acquisitions.",
        "wait_buckets",
        "wait_total",
    ),
    (
        "redislock_hold_seconds",
        "Seconds locks were held, up to their release.",
        "hold_buckets",
        "hold_total",
    ),
)
_GAUGES = (
    ("redislock_wait_seconds_max", "Longest wait of a successful acquisition.", "wait_max"),
    ("redislock_hold_seconds_max", "Longest hold up to a release.", "hold_max"),
)
#: ``le`` label values, as prometheus_client writes them (``0.005``, ``1.0``, ``+Inf``).
_LE = (*(repr(float(bound)) for bound in stats.BUCKETS), "+Inf")


def cumulative_buckets(counts: tuple[int, ...]) -> list[tuple[str, float]]:
    """``[(le, count of values <= le)]`` from per-bucket counts of :data:`stats.BUCKETS`."""
    return list(zip(_LE, map(float, itertools.accumulate(counts)), strict=True))


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
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        histograms: list[tuple[Any, str, str]] = [
            (HistogramMetricFamily(name, doc, labels=["name"]), buckets, total)
            for name, doc, buckets, total in _HISTOGRAMS
        ]
        scalars: list[tuple[Any, str]] = [
            *((CounterMetricFamily(n, doc, labels=["name"]), f) for n, doc, f in _COUNTERS),
            *((GaugeMetricFamily(n, doc, labels=["name"]), f) for n, doc, f in _GAUGES),
        ]
        for figures in itertools.islice(stats.iter_stats(using=self.using), self.limit):
            for histogram, buckets, total in histograms:
                histogram.add_metric(
                    [figures.name],
                    cumulative_buckets(getattr(figures, buckets)),
                    float(getattr(figures, total)),
                )
            for family, field in scalars:
                family.add_metric([figures.name], float(getattr(figures, field)))
        for histogram, _buckets, _total in histograms:
            yield histogram
        for family, _field in scalars:
            yield family


def register_collector(registry: Any = None, using: str | None = None) -> LockStatsCollector:
    """Register a :class:`LockStatsCollector` (on the default registry unless one is given)."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = LockStatsCollector(using)
    registry.register(collector)
    return collector
