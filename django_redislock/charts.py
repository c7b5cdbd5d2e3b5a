"""Server-rendered SVG charts of the admin's statistics page: no JavaScript, no external assets.

Each function turns figures into a :class:`Chart` — plain geometry in the chart's own coordinates
(``viewBox``) — which ``django_redislock/admin/chart.html`` draws as inline SVG (autoescaped like
any template, coloured by the admin's CSS variables, so the dark theme works). The SVG scales to
its container's width but never below its drawn size, so its text is never smaller than 11 px;
the wide charts (timeline, outcomes, holders) carry a :attr:`Chart.compact` drawing of the same
figures, 320 units wide, that the template shows in boxes narrower than the wide one (phones), and
a box narrower still scrolls the chart inside itself (the timeline opens at its latest minute),
never the page. Every bar has a ``<title>`` tooltip with its exact figure.

- :func:`distribution_chart`: a wait or hold histogram of one key template (the buckets of
  :data:`django_redislock.stats.BUCKETS`), with estimated percentiles;
- :func:`timeline_chart`: acquisitions and failed attempts per minute over the last hour, summed
  over key templates;
- :func:`outcome_chart`: acquired / failed / skipped / deduplicated per key template (when no
  minute of the last hour has data);
- :func:`holders_chart`: the current holders held longest, and for how long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.translation import gettext as _

from django_redislock.operations import HOLDS_NOTHING, LockInfo
from django_redislock.stats import BUCKETS, LockStats, Minute

__all__ = [
    "Bar",
    "Chart",
    "Label",
    "bucket_label",
    "distribution_chart",
    "holders_chart",
    "outcome_chart",
    "quantile_label",
    "timeline_chart",
]

#: Width of the charts' coordinate space; the SVG itself scales to its container.
WIDE = 560
NARROW = 320
_FONT = 11  # text size in chart units (CSS in base.html sets the same)
_ROW = 20  # height of one bar row of the horizontal charts


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    #: CSS class suffix: ``acquired``, ``failed``, ``skipped``, ``deduplicated``, ``wait``,
    #: ``hold``, ``holder``.
    kind: str
    #: Tooltip: the exact figure.
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    #: SVG ``text-anchor``: ``start``, ``middle`` or ``end``.
    anchor: str = "middle"


@dataclass(frozen=True)
class Chart:
    """One chart: bars and labels in a ``width`` x ``height`` coordinate space."""

    #: Identifies the chart for CSS and tests (``wait``, ``hold``, ``timeline`` ...).
    kind: str
    title: str
    #: What the chart shows, in words (the SVG's accessible name).
    summary: str
    width: int
    height: int
    bars: tuple[Bar, ...]
    labels: tuple[Label, ...]
    #: Axis line: ``(x1, y1, x2, y2)``.
    axis: tuple[float, float, float, float]
    #: A line of figures under the chart (percentiles, totals).
    caption: str = ""
    #: The same figures drawn :data:`NARROW` units wide, for boxes narrower than :attr:`width`.
    compact: Chart | None = None

    @property
    def min_width(self) -> int:
        """Narrowest CSS width drawn (narrower boxes scroll): text never shrinks below its size."""
        return self.width

    @property
    def max_width(self) -> int:
        """Widest CSS width drawn: text grows to at most 6/5 of its size."""
        return self.width * 6 // 5

    @property
    def empty(self) -> bool:
        return not self.bars

    @property
    def legend(self) -> list[str]:
        """Bar kinds drawn, in first-drawn order (the template shows a key for each)."""
        return list(dict.fromkeys(bar.kind for bar in self.bars))


def _short(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds < 60:
        return f"{seconds:g} s"
    return f"{seconds / 60:g} min"


def bucket_label(index: int) -> str:
    """``≤ 5 ms`` for bucket ``index`` of :data:`BUCKETS`, ``> 30 min`` for the last one."""
    if index < len(BUCKETS):
        return f"≤ {_short(BUCKETS[index])}"
    return f"> {_short(BUCKETS[-1])}"


def quantile_label(counts: Sequence[int], q: float) -> str | None:
    """The bucket holding quantile ``q`` of a histogram, as ``≤ 50 ms`` (``None`` if empty).

    Buckets only bound a value, so that is what the label says (Prometheus'
    ``histogram_quantile`` would interpolate inside the bucket instead).
    """
    total = sum(counts)
    if not total:
        return None
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= q * total:
            return bucket_label(index)
    return bucket_label(len(counts) - 1)  # pragma: no cover - running reaches total


def distribution_chart(figures: LockStats, what: str) -> Chart:
    """The ``what`` (``"wait"`` or ``"hold"``) histogram of one key template."""
    counts = figures.wait_buckets if what == "wait" else figures.hold_buckets
    noun = _("waits") if what == "wait" else _("holds")
    title = _("Wait time") if what == "wait" else _("Hold time")
    width, height, left, top, bottom = NARROW, 130, 8, 16, 22
    total = sum(counts)
    peak = max(counts, default=0)
    slot = (width - 2 * left) / len(counts)
    base = height - bottom
    bars = []
    for index, count in enumerate(counts):
        if not count:
            continue
        tall = max((base - top) * count / peak, 1.0)
        bars.append(
            Bar(
                x=round(left + index * slot + 1, 2),
                y=round(base - tall, 2),
                width=round(slot - 2, 2),
                height=round(tall, 2),
                kind=what,
                title=f"{bucket_label(index)}: {count} {noun} ({count / total:.1%})",
            )
        )
    labels = [
        Label(left + (index + 0.5) * slot, height - 8, _short(BUCKETS[index]))
        for index in range(0, len(BUCKETS), 3)
    ]
    labels.append(Label(width - left, top - 5, _("peak %(count)d") % {"count": peak}, "end"))
    parts = [
        f"{name} {value}"
        for name, value in (
            ("p50", quantile_label(counts, 0.5)),
            ("p95", quantile_label(counts, 0.95)),
            ("p99", quantile_label(counts, 0.99)),
        )
        if value is not None
    ]
    caption = " · ".join([*parts, f"n = {total}"]) if total else _("nothing recorded")
    return Chart(
        kind=what,
        title=title,
        summary=_("%(title)s of %(name)s: %(total)d %(noun)s, %(caption)s")
        % {"title": title, "name": figures.name, "total": total, "noun": noun, "caption": caption},
        width=width,
        height=height,
        bars=tuple(bars),
        labels=tuple(labels),
        axis=(left, base, width - left, base),
        caption=caption,
    )


def _rate_row(figures: LockStats) -> bool:
    """A rate limiter's statistics row: decisions, and no lock acquisition."""
    return bool(figures.allowed or figures.limited) and not (figures.acquired or figures.failed)


def timeline_chart(rows: Sequence[LockStats]) -> Chart:
    """Acquisitions (and failed attempts, stacked on top) per minute, summed over ``rows``.

    Drawn :data:`WIDE` units wide with a tick every 10 minutes, and :attr:`Chart.compact`
    :data:`NARROW` units wide with a tick every 15 minutes. A rate limiter's row (its series
    counts decisions, not acquisitions) is left out: its page shows its own minutes.
    """
    minutes: list[Minute] = []
    for figures in rows:
        if _rate_row(figures):
            continue
        for index, minute in enumerate(figures.per_minute):
            if index == len(minutes):
                minutes.append(minute)
            else:
                seen = minutes[index]
                minutes[index] = Minute(
                    seen.start, seen.acquired + minute.acquired, seen.failed + minute.failed
                )
    compact = _timeline(minutes, NARROW, every=15)
    return _timeline(minutes, WIDE, every=10, compact=compact)


def _minute_ticks(count: int, every: int) -> list[int]:
    """Minutes ago to label on an axis of ``count`` minutes: ``now`` and every ``every`` minutes
    (round values, ``-50 min`` rather than ``-59 min``), oldest first."""
    return sorted(range(0, count, every), reverse=True) if count else []


def _timeline(
    minutes: Sequence[Minute], width: int, *, every: int, compact: Chart | None = None
) -> Chart:
    height, left, top, bottom = 150, 8, 16, 22
    peak = max((m.acquired + m.failed for m in minutes), default=0)
    count = len(minutes)
    slot = (width - 2 * left) / max(count, 1)
    base = height - bottom
    bars: list[Bar] = []
    for index, minute in enumerate(minutes):
        y = float(base)
        for kind, value in (("acquired", minute.acquired), ("failed", minute.failed)):
            if not value:
                continue
            tall = max((base - top) * value / peak, 1.0)
            y -= tall
            ago = count - 1 - index
            bars.append(
                Bar(
                    x=round(left + index * slot + 0.5, 2),
                    y=round(y, 2),
                    width=round(max(slot - 1, 0.5), 2),
                    height=round(tall, 2),
                    kind=kind,
                    title=_("%(ago)d min ago (%(start)s UTC): %(value)d %(kind)s")
                    % {
                        "ago": ago,
                        "start": minute.start.strftime("%H:%M"),
                        "value": value,
                        "kind": _("acquired") if kind == "acquired" else _("failed"),
                    },
                )
            )
    labels = []
    for ago in _minute_ticks(count, every):
        text = _("now") if ago == 0 else _("-%(ago)d min") % {"ago": ago}
        middle = left + (count - 1 - ago + 0.5) * slot
        half = len(text) * _FONT * 0.35  # about half the text's width
        # Labels at the chart's edges are anchored there, so they are never cut off.
        if ago == 0 or middle + half > width - left:
            labels.append(Label(width - left, height - 8, text, "end"))
        elif middle - half < left:
            labels.append(Label(left, height - 8, text, "start"))
        else:
            labels.append(Label(round(middle, 2), height - 8, text))
    labels.append(Label(width - left, top - 5, _("peak %(count)d / min") % {"count": peak}, "end"))
    acquired = sum(m.acquired for m in minutes)
    failed = sum(m.failed for m in minutes)
    caption = _("%(acquired)d acquired, %(failed)d failed in the last %(minutes)d minutes") % {
        "acquired": acquired,
        "failed": failed,
        "minutes": count,
    }
    return Chart(
        kind="timeline",
        title=_("Acquisitions per minute"),
        summary=caption,
        width=width,
        height=height,
        bars=tuple(bars) if peak else (),
        labels=tuple(labels),
        axis=(left, base, width - left, base),
        caption=caption,
        compact=compact,
    )


def _clip(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters in the middle: names of one template differ at the
    end (``billing.tasks.reco…account:1234567``), so both ends are kept."""
    if len(text) <= most:
        return text
    tail = (most - 1) * 3 // 5
    return f"{text[: most - 1 - tail]}…{text[-tail:]}"


def _rows_chart(
    kind: str,
    title: str,
    summary: str,
    items: Sequence[tuple[str, Sequence[tuple[str, float, str]], str]],
    caption: str = "",
) -> Chart:
    """Horizontal bars, one row per item: ``(label, [(kind, value, tooltip)], value text)``.

    :data:`WIDE`: the label left of its bar. The :attr:`Chart.compact` drawing, :data:`NARROW`
    units wide, puts each label on a line of its own above its bar (so it keeps 44 characters).
    """
    compact = _rows(kind, title, summary, items, caption, NARROW, stacked=True)
    return _rows(kind, title, summary, items, caption, WIDE, stacked=False, compact=compact)


def _rows(
    kind: str,
    title: str,
    summary: str,
    items: Sequence[tuple[str, Sequence[tuple[str, float, str]], str]],
    caption: str,
    width: int,
    *,
    stacked: bool,
    compact: Chart | None = None,
) -> Chart:
    value_width = 80 if not stacked else 70
    label_width = 0 if stacked else 230
    row_height = _ROW + 14 if stacked else _ROW
    scale_width = width - label_width - value_width - 8
    peak = max((sum(part[1] for part in item[1]) for item in items), default=0.0)
    bars: list[Bar] = []
    labels: list[Label] = []
    for row, (label, parts, value_text) in enumerate(items):
        top = row * row_height
        if stacked:
            labels.append(Label(0, top + 12, _clip(label, 44), "start"))
            y = top + 16  # the bar's row, under its label
        else:
            labels.append(Label(label_width - 6, top + _ROW * 0.7, _clip(label, 36), "end"))
            y = top
        x = float(label_width)
        for part_kind, value, tooltip in parts:
            if value <= 0 or peak <= 0:
                continue
            long = max(scale_width * value / peak, 1.0)
            bars.append(
                Bar(round(x, 2), y + 3, round(long, 2), _ROW - 6, part_kind, f"{label}: {tooltip}")
            )
            x += long
        labels.append(Label(round(x + 4, 2), y + _ROW * 0.7, value_text, "start"))
    height = max(len(items), 1) * row_height
    return Chart(
        kind=kind,
        title=title,
        summary=summary,
        width=width,
        height=height,
        bars=tuple(bars),
        labels=tuple(labels),
        axis=(label_width, 0, label_width, height),
        caption=caption,
        compact=compact,
    )


def outcome_chart(rows: Sequence[LockStats], *, limit: int = 15) -> Chart:
    """Acquired / failed / skipped / deduplicated per key template, busiest first; a rate
    limiter's row adds its allowed / limited decisions, a task's its throttled runs."""

    def busy(figures: LockStats) -> int:
        return (
            figures.acquired
            + figures.failed
            + figures.skipped
            + figures.deduplicated
            + figures.allowed
            + figures.limited
            + figures.throttled
        )

    shown = sorted((f for f in rows if busy(f)), key=lambda f: (-busy(f), f.name))[:limit]
    names: dict[str, Callable[[LockStats], int]] = {
        "acquired": lambda f: f.acquired,
        "failed": lambda f: f.failed,
        "skipped": lambda f: f.skipped,
        "deduplicated": lambda f: f.deduplicated,
        "allowed": lambda f: f.allowed,
        "limited": lambda f: f.limited,
        "throttled": lambda f: f.throttled,
    }
    words = {
        "acquired": _("acquired"),
        "failed": _("failed"),
        "skipped": _("skipped"),
        "deduplicated": _("deduplicated"),
        "allowed": _("allowed"),
        "limited": _("limited"),
        "throttled": _("throttled"),
    }
    items = [
        (
            figures.name,
            [
                (kind, float(get(figures)), f"{get(figures)} {words[kind]}")
                for kind, get in names.items()
            ],
            str(busy(figures)),
        )
        for figures in shown
    ]
    return _rows_chart(
        "outcomes",
        _("Outcomes per key template"),
        _(
            "Acquired, failed, skipped and deduplicated (rate limiters: allowed and limited; "
            "tasks: throttled) per key template, busiest %(count)d"
        )
        % {"count": len(shown)},
        items,
    )


def holders_chart(
    holders: Sequence[LockInfo], duration: Callable[[float], str], *, limit: int = 15
) -> Chart:
    """The ``limit`` current holders held longest: one bar per holder, as long as its hold."""
    holding = (h for h in holders if not h.unreadable and h.kind not in HOLDS_NOTHING)
    shown = sorted(holding, key=lambda h: (-h.held_for, h.name))[:limit]
    items = []
    for info in shown:
        held = duration(info.held_for)
        who = f"{info.host} · {info.pid} · {info.thread}"
        tooltip = _("held for %(held)s by %(who)s, fencing token %(token)d") % {
            "held": held,
            "who": who,
            "token": info.fencing_token,
        }
        items.append((info.name, [("holder", info.held_for, tooltip)], held))
    return _rows_chart(
        "holders",
        _("Current holders, longest held first"),
        _("How long each of the %(count)d longest-held locks has been held")
        % {"count": len(shown)},
        items,
    )
