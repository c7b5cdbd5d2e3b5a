"""OpenTelemetry spans of real locks on real Redis, collected by the SDK's in-memory exporter;
and a process without ``opentelemetry`` at all, where nothing changes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from django_redislock import Lock, LockNotOwnedError, distributed_lock, force_release, tracing
from tests.conftest import ROOT, subprocess_env


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    tracing.use_tracer_provider(provider)
    yield provider
    tracing.use_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def seconds(ns: int) -> float:
    return ns / 1e9


def test_an_acquisition_and_its_hold_are_two_spans(spans):
    @distributed_lock("invoice:{pk}")
    def charge(pk: int) -> int | None:
        time.sleep(0.1)
        return Lock(f"invoice:{pk}").fencing_token

    token = charge(7)
    acquire, hold = spans.get_finished_spans()
    assert (acquire.name, hold.name) == ("redislock.acquire", "redislock.hold")
    assert dict(acquire.attributes) == {
        "redislock.key_template": "invoice:{pk}",
        "redislock.lock_name": "invoice:7",
        "redislock.outcome": "acquired",
        "redislock.contended": False,
        "redislock.waited": pytest.approx(seconds(acquire.end_time - acquire.start_time), abs=1e-6),
        "redislock.fencing_token": token,
    }
    assert hold.attributes["redislock.outcome"] == "released"
    assert hold.attributes["redislock.fencing_token"] == token
    assert hold.attributes["redislock.key_template"] == "invoice:{pk}"
    assert 0.1 <= hold.attributes["redislock.held"] < 5
    assert seconds(hold.end_time - hold.start_time) == pytest.approx(
        hold.attributes["redislock.held"], abs=1e-6
    )
    # The hold starts where the acquisition ended (both measured, not guessed).
    assert abs(seconds(hold.start_time - acquire.end_time)) < 0.05


def test_a_contended_acquisition_span_covers_the_wait(spans):
    holder = Lock("shared", auto_renew=False, owner="elsewhere")
    holder.acquire()
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    with Lock("shared", blocking_timeout=10):
        pass
    timer.join()
    [acquire] = [
        s
        for s in spans.get_finished_spans()
        if s.name == "redislock.acquire" and s.attributes["redislock.contended"]
    ]
    assert acquire.attributes["redislock.outcome"] == "acquired"
    assert 0.2 <= acquire.attributes["redislock.waited"] < 5
    assert seconds(acquire.end_time - acquire.start_time) >= 0.2


def test_a_failed_acquisition_is_an_acquire_span_without_a_hold(spans):
    holder = Lock("taken", owner="elsewhere")
    holder.acquire()
    spans.clear()
    assert Lock("taken").acquire(blocking_timeout=0.1) is False
    [acquire] = spans.get_finished_spans()
    assert acquire.name == "redislock.acquire"
    assert acquire.attributes["redislock.outcome"] == "failed"
    assert "redislock.fencing_token" not in acquire.attributes
    assert acquire.attributes["redislock.waited"] >= 0.1
    holder.release()


def test_a_lost_lock_ends_its_hold_span_with_an_error(spans):
    lock = Lock("victim", auto_renew=False)
    lock.acquire()
    token = lock.fencing_token
    force_release("victim")
    with pytest.raises(LockNotOwnedError):
        lock.release()
    hold = spans.get_finished_spans()[-1]
    assert (hold.name, hold.attributes["redislock.outcome"]) == ("redislock.hold", "lost")
    assert hold.attributes["redislock.fencing_token"] == token
    assert hold.status.status_code is StatusCode.ERROR


def test_spans_are_children_of_the_current_span(provider, spans):
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("request") as request, Lock("nested"):
        pass
    by_name = {s.name: s for s in spans.get_finished_spans()}
    for name in ("redislock.acquire", "redislock.hold"):
        assert by_name[name].parent.span_id == request.get_span_context().span_id
        assert by_name[name].context.trace_id == request.get_span_context().trace_id


def test_reentrant_and_quiet_acquisitions_make_no_spans(spans):
    with Lock("outer") as lock, lock:
        pass
    with Lock("publish-hold", quiet=True):
        pass
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["redislock.acquire", "redislock.hold"]


def test_tracing_does_not_depend_on_statistics(spans):
    with override_settings(REDISLOCK={"STATS": False}), Lock("untallied"):
        pass
    assert len(spans.get_finished_spans()) == 2


def test_without_opentelemetry_nothing_changes():
    code = (
        "import sys, json\n"
        "sys.modules['opentelemetry'] = None  # as if not installed: every import fails\n"
        "import django; django.setup()\n"
        "from django_redislock import Lock, stats, tracing\n"
        "with Lock('no-otel'):\n"
        "    pass\n"
        "stats.flush()\n"
        "found = stats.get_stats('no-otel')\n"
        "print(json.dumps({'available': tracing.available(), 'emit': tracing.emit is None,\n"
        "    'hook': stats._emit_span is None, 'acquired': found.acquired,\n"
        "    'otel': [m for m in sys.modules if m.startswith('opentelemetry')]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        check=True,
        timeout=30,
        capture_output=True,
        text=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "available": False,
        "emit": True,
        "hook": True,
        "acquired": 1,
        "otel": ["opentelemetry"],  # only the blocking None entry itself
    }


def test_with_opentelemetry_spans_are_available():
    assert tracing.available()
