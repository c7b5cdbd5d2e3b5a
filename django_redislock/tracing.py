"""OpenTelemetry spans of lock acquisitions and holds (optional: needs ``opentelemetry-api``).

::

    pip install 'django-redislock[otel]'   # opentelemetry-api; configure an SDK as usual

With ``opentelemetry-api`` importable, every acquisition and every hold that statistics count
(see :func:`django_redislock.stats.record`) becomes a span of the tracer ``django_redislock``,
a child of whatever span is current in the thread that took or released the lock:

- ``redislock.acquire``: from the start of ``acquire()`` to its outcome (``acquired``, or
  ``failed``: timed out, or busy without waiting);
- ``redislock.hold``: from the acquisition to the release of the last hold (``released``), or to
  the moment the holder found the lock gone (``lost``; span status ERROR).

Attributes: ``redislock.key_template`` (the statistics name: a ``distributed_lock`` key template,
a task name, or the shape of a plain name such as ``invoice:{n}``), ``redislock.lock_name``,
``redislock.outcome``, ``redislock.contended`` (bool) and ``redislock.waited`` (seconds) on
acquisitions, ``redislock.held`` (seconds) on holds, and ``redislock.fencing_token`` when known.

Spans are created *after the fact* with an explicit ``start_time`` (now minus the measured wait
or hold), so a held lock keeps no span or context object alive, and nothing is done at all
while the lock is held. Quiet locks (single-flight publish holds) and re-entrant acquisitions make
no spans, exactly as they make no statistics.

Cost: whether ``opentelemetry`` can be imported is decided once, when this module is imported;
without it :data:`emit` is ``None`` and the engine's hot path pays one ``is None`` check. With the
API but no SDK configured (no global tracer provider set yet), no span is built either: each
event costs one look at the global provider until one is set. :func:`use_tracer_provider` points
the spans at a provider of your own instead of the global one (tests do this with the SDK's
``InMemorySpanExporter``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["ACQUIRE_SPAN", "HOLD_SPAN", "available", "emit", "use_tracer_provider"]

ACQUIRE_SPAN = "redislock.acquire"
HOLD_SPAN = "redislock.hold"

#: ``emit(event, stats_name, lock_name, seconds, contended, token)`` — or ``None`` when
#: ``opentelemetry`` cannot be imported (the caller checks for ``None`` and does nothing else).
emit: Callable[[str, str, str | None, float, bool, int | None], None] | None = None

try:
    from opentelemetry import trace as _trace_api
except ImportError:  # not installed, or blocked (``sys.modules["opentelemetry"] = None``)
    _trace_api = None  # type: ignore[assignment]


def available() -> bool:
    """Whether spans are made (``opentelemetry-api`` was importable when this module loaded)."""
    return emit is not None


if _trace_api is not None:
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Status, StatusCode

    _SCOPE = "django_redislock"
    _tracer: Any = _trace_api.get_tracer(_SCOPE)  # a proxy: follows the global provider
    _ERROR = Status(StatusCode.ERROR, "lock lost (expired or force-released) while held")
    #: A real provider is known to be in use (the global one cannot be replaced once set).
    _live = False

    def use_tracer_provider(provider: Any = None) -> None:
        """Make spans with ``provider`` (an OpenTelemetry ``TracerProvider``); ``None`` goes
        back to the global provider (``opentelemetry.trace.set_tracer_provider``)."""
        global _tracer, _live
        source = _trace_api if provider is None else provider
        _tracer = source.get_tracer(_SCOPE)
        _live = provider is not None

    def _recording() -> bool:
        """Whether spans can go anywhere: with no SDK configured (yet) no span is built at all,
        which is much cheaper than OpenTelemetry's own no-op spans. Once a real provider is
        set it stays (the global provider cannot be replaced), so it is asked until then."""
        global _live
        if _live:
            return True
        if isinstance(_trace_api.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider)):
            return False
        _live = True
        return True

    def _emit(
        event: str,
        stats_name: str,
        lock_name: str | None,
        seconds: float,
        contended: bool,
        token: int | None,
    ) -> None:
        if not _live and not _recording():
            return
        if event == "acquired" or event == "failed":
            span_name, measured = ACQUIRE_SPAN, "redislock.waited"
        elif event == "released" or event == "lost":
            span_name, measured = HOLD_SPAN, "redislock.held"
        else:  # counted events that are not a lock's own acquisition or hold
            return
        end = time.time_ns()
        start = end - int(max(seconds, 0.0) * 1e9)
        attributes: dict[str, Any] = {
            "redislock.key_template": stats_name,
            "redislock.outcome": event,
            measured: float(seconds),
        }
        if lock_name is not None:
            attributes["redislock.lock_name"] = lock_name
        if token is not None:
            attributes["redislock.fencing_token"] = int(token)
        if span_name == ACQUIRE_SPAN:
            attributes["redislock.contended"] = bool(contended)
        span = _tracer.start_span(span_name, start_time=start, attributes=attributes)
        if event == "lost":
            span.set_status(_ERROR)
        span.end(end_time=end)

    emit = _emit

else:

    def use_tracer_provider(provider: Any = None) -> None:
        """Without ``opentelemetry`` there is nothing to point anywhere: a no-op."""
