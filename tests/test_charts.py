"""The admin's SVG charts as geometry: what is drawn for given figures (no browser, no Redis)."""

from __future__ import annotations

from datetime import datetime, timezone

from django_redislock import charts, stats
from django_redislock.stats import LockStats, Minute


def buckets(**at: int) -> tuple[int, ...]:
    counts = [0] * (len(stats.BUCKETS) + 1)
    for index, count in at.items():
        counts[int(index[1:])] = count
    return tuple(counts)


def test_percentiles_name_the_bucket_they_fall_in():
    counts = buckets(i1=50, i4=45, i13=5)  # <= 5 ms, <= 100 ms, > 30 min
    assert charts.quantile_label(counts, 0.5) == "≤ 5 ms"
    assert charts.quantile_label(counts, 0.95) == "≤ 100 ms"
    assert charts.quantile_label(counts, 0.99) == "> 30 min"
    assert charts.quantile_label(buckets(), 0.5) is None


def test_a_distribution_has_one_bar_per_non_empty_bucket_scaled_to_the_peak():
    chart = charts.distribution_chart(
        LockStats("job:{id}", wait_buckets=buckets(i0=10, i6=5)), "wait"
    )
    first, second = chart.bars
    assert first.x < second.x and first.height == 2 * second.height
    assert first.title == "≤ 1 ms: 10 waits (66.7%)"
    assert chart.caption == "p50 ≤ 1 ms · p95 ≤ 1 s · p99 ≤ 1 s · n = 15"
    assert charts.distribution_chart(LockStats("idle"), "hold").empty


def test_the_timeline_sums_templates_and_stacks_failures_on_acquisitions():
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    a = LockStats("a", per_minute=(Minute(start, 2, 0), Minute(start, 0, 0)))
    b = LockStats("b", per_minute=(Minute(start, 2, 1), Minute(start, 0, 0)))
    chart = charts.timeline_chart([a, b])
    acquired, failed = chart.bars
    assert (acquired.kind, failed.kind) == ("acquired", "failed")
    assert failed.y + failed.height == acquired.y  # on top of the acquisitions' bar
    assert acquired.height == 4 * failed.height
    assert chart.legend == ["acquired", "failed"]
    assert charts.timeline_chart([LockStats("quiet")]).empty


def test_long_names_keep_both_ends():
    chart = charts.outcome_chart(
        [LockStats("billing.tasks.reconcile_ledger_entries_for_customer_account:1234567", 1)]
    )
    label = chart.labels[0].text
    assert len(label) == 36 and label.startswith("billing.") and label.endswith(":1234567")
