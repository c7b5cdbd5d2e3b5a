"""The Prometheus collector scraped through a real ``prometheus_client`` registry: histograms of
wait and hold time, counters, and expositions that Prometheus' own parsers accept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from django_redislock import Lock, LockNotOwnedError, force_release, stats
from django_redislock.prometheus import register_collector


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    stats.flush()
    yield
    stats.flush()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    register_collector(registry)
    return registry


def scrape(registry: CollectorRegistry) -> dict[str, object]:
    """``{sample line without value: value}`` of the text exposition, as Prometheus reads it."""
    found: dict[str, object] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def test_wait_and_hold_are_histograms_with_cumulative_buckets(registry):
    for seconds in (0.003, 0.003, 0.2, 7.0, 5000.0):
        stats.record(None, "job:{id}", "acquired", seconds)
    for seconds in (0.04, 12.0):
        stats.record(None, "job:{id}", "released", seconds)
    stats.flush()
    samples = scrape(registry)

    def wait(le: str) -> object:
        return samples[f'redislock_wait_seconds_bucket{{le="{le}",name="job:{{id}}"}}']

    assert [wait(le) for le in ("0.001", "0.005", "0.1", "0.5", "5.0", "10.0", "1800.0")] == [
        0.0,
        2.0,
        2.0,
        3.0,
        3.0,
        4.0,
        4.0,
    ]
    assert wait("+Inf") == 5.0
    assert samples['redislock_wait_seconds_count{name="job:{id}"}'] == 5.0
    assert samples['redislock_wait_seconds_sum{name="job:{id}"}'] == pytest.approx(5007.206)
    hold = 'redislock_hold_seconds_bucket{{le="{}",name="job:{{id}}"}}'
    assert (samples[hold.format("0.01")], samples[hold.format("0.05")]) == (0.0, 1.0)
    assert (samples[hold.format("10.0")], samples[hold.format("30.0")]) == (1.0, 2.0)
    assert samples['redislock_hold_seconds_count{name="job:{id}"}'] == 2.0


def test_family_types_and_no_clashing_names(registry):
    with Lock("typed"):
        pass
    stats.flush()
    families = {
        f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert families["redislock_wait_seconds"] == "histogram"
    assert families["redislock_hold_seconds"] == "histogram"
    assert families["redislock_acquisitions"] == "counter"
    assert families["redislock_skipped"] == "counter"
    assert families["redislock_wait_seconds_max"] == "gauge"
    text = generate_latest(registry).decode()
    assert "redislock_wait_seconds_total" not in text  # replaced by redislock_wait_seconds_sum
    assert text.count("# TYPE redislock_wait_seconds ") == 1


def test_the_openmetrics_exposition_is_valid(registry):
    """The OpenMetrics parser checks what Prometheus relies on: buckets never decrease, ``+Inf``
    equals ``_count``, one type per family."""
    for _ in range(3):
        with Lock("om"):
            pass
    stats.flush()
    families = {f.name: f for f in parse_om(generate_openmetrics(registry).decode())}
    histogram = families["redislock_hold_seconds"]
    assert histogram.type == "histogram"
    count = [s for s in histogram.samples if s.name.endswith("_count")]
    assert [s.value for s in count] == [3.0]


def test_contention_loss_skip_and_deduplication_counters(registry):
    stats.record(None, "flow", "acquired", 0.5, contended=True)
    stats.record(None, "flow", "acquired", 0.0)
    stats.record(None, "flow", "skipped")
    stats.record(None, "flow", "deduplicated")
    stats.record(None, "flow", "deduplicated")
    lock = Lock("flow", stats_name="flow", auto_renew=False)
    lock.acquire()
    force_release("flow")
    with pytest.raises(LockNotOwnedError):
        lock.release()  # the holder finds out: lost
    stats.flush()
    samples = scrape(registry)
    assert samples['redislock_contended_acquisitions_total{name="flow"}'] == 1.0
    assert samples['redislock_skipped_total{name="flow"}'] == 1.0
    assert samples['redislock_deduplicated_total{name="flow"}'] == 2.0
    assert samples['redislock_force_releases_total{name="flow"}'] == 1.0
    assert samples['redislock_losses_total{name="flow"}'] == 1.0
    assert samples['redislock_failed_acquisitions_total{name="flow"}'] == 0.0


def test_rate_limiter_decisions_and_throttled_runs_are_counters(registry):
    from django_redislock import RateLimiter

    limiter = RateLimiter("scraped", "1/m", burst=2)
    for _ in range(5):
        limiter.try_acquire()
    stats.record(None, "task:{n}", "throttled")
    stats.flush()
    samples = scrape(registry)
    assert samples['redislock_rate_allowed_total{name="scraped"}'] == 2.0
    assert samples['redislock_rate_limited_total{name="scraped"}'] == 3.0
    assert samples['redislock_throttled_total{name="task:{n}"}'] == 1.0
