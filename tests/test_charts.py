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


def minutes(count: int) -> tuple[Minute, ...]:
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    return tuple(Minute(start, 1, 0) for _ in range(count))


def test_timeline_ticks_are_round_minutes_and_now():
    chart = charts.timeline_chart([LockStats("a", per_minute=minutes(60))])
    ticks = [label.text for label in chart.labels if not label.text.startswith("peak")]
    assert ticks == ["-50 min", "-40 min", "-30 min", "-20 min", "-10 min", "now"]
    assert chart.compact is not None
    compact = [label.text for label in chart.compact.labels if not label.text.startswith("peak")]
    assert compact == ["-45 min", "-30 min", "-15 min", "now"]
    # "now" sits at the right edge; a tick at the left edge is anchored there (never cut off).
    assert chart.labels[-2].anchor == "end" and chart.labels[-2].x == chart.width - 8
    edge = charts.timeline_chart([LockStats("a", per_minute=minutes(61))])
    assert (edge.labels[0].text, edge.labels[0].anchor, edge.labels[0].x) == ("-60 min", "start", 8)


def test_wide_charts_have_a_compact_drawing_that_never_shrinks_text():
    timeline = charts.timeline_chart([LockStats("a", per_minute=minutes(60))])
    assert timeline.compact is not None
    assert (timeline.width, timeline.compact.width) == (charts.WIDE, charts.NARROW)
    assert len(timeline.compact.bars) == len(timeline.bars)
    for chart in (timeline, timeline.compact):
        assert chart.min_width == chart.width  # drawn at least at 1:1: 11 px text stays 11 px
    histogram = charts.distribution_chart(LockStats("a", wait_buckets=buckets(i0=1)), "wait")
    assert histogram.compact is None and histogram.width == charts.NARROW


def test_compact_rows_put_each_label_above_its_bar():
    name = "billing.tasks.reconcile_ledger_entries_for_customer_account:1234567"
    chart = charts.outcome_chart([LockStats(name, 3), LockStats("short", 1)])
    compact = chart.compact
    assert compact is not None and compact.width == charts.NARROW
    names = [label for label in compact.labels if label.anchor == "start" and label.x == 0]
    assert [label.text[:8] for label in names] == ["billing.", "short"]
    assert len(names[0].text) == 44 and names[0].text.endswith(":1234567")  # both ends kept
    for label, bar in zip(names, compact.bars, strict=True):
        assert label.y < bar.y  # the label's baseline is above its bar
        assert bar.x + bar.width <= compact.width


def test_rate_limiters_and_throttled_tasks_show_in_the_outcome_chart():
    limiter = LockStats("api:{n}", allowed=30, limited=12)
    task = LockStats("report:{id}", acquired=5, throttled=4)
    idle = LockStats("idle")
    chart = charts.outcome_chart([limiter, task, idle])
    texts = [label.text for label in chart.labels]
    assert [t for t in texts if not t.isdigit()] == ["api:{n}", "report:{id}"]  # busiest first
    assert "42" in texts and "9" in texts  # the totals count the new outcomes
    assert set(chart.legend) == {"acquired", "allowed", "limited", "throttled"}


def test_rate_limiter_rows_stay_out_of_the_acquisitions_timeline():
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    lock = LockStats("lock", acquired=2, per_minute=(Minute(start, 2, 0),))
    limiter = LockStats("api", allowed=500, limited=90, per_minute=(Minute(start, 500, 90),))
    assert charts.timeline_chart([lock, limiter]) == charts.timeline_chart([lock])
