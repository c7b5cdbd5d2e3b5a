"""The history checker (``tests/history.py``) on hand-made histories: it must flag every kind of
violation, and only violations. No Redis needed: these run in ``make test-fast``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import redis

from django_redislock import LockOutcomeUnknown
from tests.history import (
    KINDS,
    HistoryRecorder,
    Leftover,
    check_history,
    classify_error,
    load_history,
)

LEASE = 3.0


class History:
    """Builds events as the worker writes them; every process exits cleanly unless killed."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.pids: set[int] = set()
        self.killed: set[int] = set()

    def call(
        self,
        op: str,
        name: str,
        owner: str,
        start: float,
        end: float,
        outcome: str,
        *,
        pid: int = 1,
        **fields: Any,
    ) -> dict[str, Any]:
        self.pids.add(pid)
        event = {
            "ev": "call",
            "pid": pid,
            "client": f"w{pid}",
            "t": end,
            "op": op,
            "name": name,
            "owner": owner,
            "thread": owner,
            "via": "test",
            "lease": LEASE,
            "start": start,
            "end": end,
            "outcome": outcome,
            **fields,
        }
        self.events.append(event)
        return event

    def hold(
        self,
        name: str,
        owner: str,
        acquired: float,
        released: float,
        token: int,
        *,
        pid: int = 1,
        release: str = "released",
        hold_count: int = 1,
        attempt_start: float | None = None,
        **release_fields: Any,
    ) -> None:
        start = acquired - 0.001 if attempt_start is None else attempt_start
        self.call(
            "acquire",
            name,
            owner,
            start,
            acquired,
            "acquired",
            pid=pid,
            token=token,
            hold_count=hold_count,
        )
        self.call(
            "release", name, owner, released, released + 0.001, release, pid=pid, **release_fields
        )

    def kill(self, pid: int, at: float) -> None:
        self.killed.add(pid)
        self.events.append({"ev": "killed", "pid": 0, "client": "test", "t": at, "victim": pid})

    def check(self, **kwargs: Any):
        exits = [
            {"ev": "exit", "pid": pid, "client": f"w{pid}", "t": 99.0}
            for pid in sorted(self.pids - self.killed)
        ]
        kwargs.setdefault("checked_at", 100.0)
        return check_history(self.events + exits, **kwargs)


def only(report, kind: str) -> list[str]:
    kinds = {v.kind for v in report.violations}
    assert kinds == {kind}, str(report)
    return [v.message for v in report.violations]


def test_a_correct_history_has_no_violation() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.1, 10)
    h.hold("a", "p2-t1", 1.2, 1.3, 11, pid=2)  # after the first: a new, higher token
    h.hold("b", "p2-t1", 1.25, 1.35, 5, pid=2)  # another name: its own order
    h.hold("a", "p1-t2", 1.31, 1.4, 12)
    h.call("acquire", "a", "p1-t1", 1.32, 1.33, "not-acquired")
    report = h.check()
    assert report.ok, report
    assert (report.processes, report.histories, report.holds) == (2, 3, 4)
    assert report.counts() == dict.fromkeys(KINDS, 0)


def test_two_owners_holding_one_name_at_once_is_an_overlap() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.5, 10)
    h.hold("a", "p2-t1", 1.4, 1.6, 11, pid=2)
    (message,) = only(h.check(), "overlap")
    assert "'a'" in message and "100.0 ms" in message


def test_holds_that_only_touch_do_not_overlap() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.5, 10)
    h.hold("a", "p2-t1", 1.5, 1.6, 11, pid=2)
    assert h.check().ok


def test_a_lost_hold_is_left_out_of_the_exclusion_check() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.5, 10, release="lost")
    h.hold("a", "p2-t1", 1.4, 1.6, 11, pid=2)
    h.hold("b", "p1-t1", 2.0, 2.5, 20, lost=True)  # the watchdog said so before release
    h.hold("b", "p2-t1", 2.4, 2.6, 21, pid=2)
    assert h.check().ok


def test_an_unconfirmed_hold_counts_only_inside_its_first_lease() -> None:
    h = History()
    # Release outcome unknown, but still inside the lease that the acquisition started.
    h.hold("a", "p1-t1", 1.0, 2.0, 10, release="error")
    h.hold("a", "p2-t1", 1.9, 2.1, 11, pid=2)
    assert len(only(h.check(), "overlap")) == 1
    h = History()
    # Past the lease: the lock may have expired unnoticed; no overlap can be claimed.
    h.hold("a", "p1-t1", 1.0, 1.0 + LEASE + 1, 10, release="error")
    h.hold("a", "p2-t1", 1.0 + LEASE, 1.0 + LEASE + 0.5, 11, pid=2)
    assert h.check().ok


def test_overlaps_across_a_failover_are_exempt_only_when_asked() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.5, 10)
    h.hold("a", "p2-t1", 1.4, 1.6, 11, pid=2)
    assert len(only(h.check(failovers=[1.2]), "overlap")) == 1
    report = h.check(failovers=[1.2], exclusion_across_failovers=False)
    assert report.ok and report.exempt_overlaps == 1
    # Both acquired after the same failover: still a violation.
    report = h.check(failovers=[0.5], exclusion_across_failovers=False)
    assert len(only(report, "overlap")) == 1


def test_a_token_not_above_an_earlier_acquisition_is_flagged() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.1, 10)
    h.hold("a", "p2-t1", 1.2, 1.3, 10, pid=2)  # equal
    h.hold("a", "p1-t1", 1.4, 1.5, 9)  # lower
    messages = only(h.check(), "token")
    assert len(messages) == 2
    assert "token 10" in messages[0] and "token 9" in messages[1]


def test_tokens_of_a_lost_hold_still_count_when_the_order_is_certain() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.1, 10, release="lost")
    h.hold("a", "p2-t1", 1.2, 1.3, 7, pid=2, attempt_start=1.05)  # called after 1.0
    assert len(only(h.check(), "token")) == 1


def test_a_waiter_handed_the_lock_is_ordered_by_the_holds() -> None:
    h = History()
    # p2 started waiting before p1 acquired; the hand-off then gave it a *lower* token.
    h.hold("a", "p1-t1", 1.0, 1.1, 10, attempt_start=0.99)
    h.hold("a", "p2-t1", 1.2, 1.3, 8, pid=2, attempt_start=0.5)
    assert len(only(h.check(), "token")) == 1
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.1, 10, attempt_start=0.99)
    h.hold("a", "p2-t1", 1.2, 1.3, 11, pid=2, attempt_start=0.5)
    assert h.check().ok


def test_concurrent_calls_with_unknown_order_are_not_compared() -> None:
    h = History()
    # Both lost their holds: exclusion says nothing, and the calls overlap in time.
    h.hold("a", "p1-t1", 1.0, 1.1, 10, attempt_start=0.9, release="lost")
    h.hold("a", "p2-t1", 1.05, 1.2, 9, pid=2, attempt_start=0.95, release="lost")
    assert h.check().ok


def test_nested_acquisitions_keep_the_outer_token() -> None:
    h = History()
    h.call("acquire", "a", "p1-t1", 1.0, 1.01, "acquired", token=10, hold_count=1)
    h.call("acquire", "a", "p1-t1", 1.02, 1.03, "acquired", token=10, hold_count=2)
    h.call("release", "a", "p1-t1", 1.04, 1.05, "released")
    h.call("release", "a", "p1-t1", 1.06, 1.07, "released")
    h.hold("a", "p2-t1", 1.08, 1.09, 11, pid=2)  # after the *outer* release: no overlap
    assert h.check().ok
    h.call("acquire", "b", "p1-t1", 2.0, 2.01, "acquired", token=20, hold_count=1)
    h.call("acquire", "b", "p1-t1", 2.02, 2.03, "acquired", token=21, hold_count=2)
    h.call("release", "b", "p1-t1", 2.04, 2.05, "released")
    h.call("release", "b", "p1-t1", 2.06, 2.07, "released")
    assert "nested" in only(h.check(), "token")[0]


def test_a_hold_count_above_one_out_of_nowhere_is_an_orphan() -> None:
    h = History()
    h.call("acquire", "j", "p1-t1", 1.0, 2.0, "unknown", error="TimeoutError")
    h.hold("j", "p1-t1", 2.1, 2.2, 10, hold_count=2)
    report = h.check()
    assert {v.kind for v in report.violations} == {"orphan", "unresolved"}
    assert "hold_count 2" in next(v.message for v in report.violations if v.kind == "orphan")


def test_an_orphan_re_entered_again_and_again_is_one_violation() -> None:
    h = History()
    h.call("acquire", "j", "p1-a1", 1.0, 1.001, "cancelled")
    for i in range(5):
        h.hold("j", "p1-a1", 2.0 + i, 2.5 + i, 10, hold_count=2)
    h.hold("j", "p1-a2", 8.0, 8.1, 11, hold_count=2)  # another owner's orphan
    messages = only(h.check(), "orphan")
    assert len(messages) == 2
    assert "re-entered 5 times" in messages[0] and "re-entered" not in messages[1]


def test_an_unknown_outcome_needs_a_resolution() -> None:
    h = History()
    h.call("acquire", "a", "p1-t1", 1.0, 1.5, "unknown", error="reset")
    h.call("release", "b", "p1-t1", 2.0, 2.5, "unknown", error="timeout")
    assert len(only(h.check(), "unresolved")) == 2
    # Resolved by name and action after the call started (no attempt id), once each.
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 1.7, "name": "a", "attempt": None, "action": "acquire"}
    )
    messages = only(h.check(), "unresolved")
    assert len(messages) == 1 and "'b': release" in messages[0]
    # A resolution sent before the call started is someone else's.
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 1.9, "name": "b", "attempt": None, "action": "release"}
    )
    assert len(only(h.check(), "unresolved")) == 1
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 2.6, "name": "b", "attempt": None, "action": "release"}
    )
    report = h.check()
    assert report.ok and (report.unknown, report.resolved) == (2, 2)


def test_unknown_outcomes_with_an_attempt_id_match_only_that_attempt() -> None:
    h = History()
    h.call("acquire", "a", "p1-t1", 1.0, 1.5, "unknown", attempt="x1", action="acquire")
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 2.0, "name": "a", "attempt": "x2", "action": "acquire"}
    )
    assert len(only(h.check(), "unresolved")) == 1
    h.events.append(
        {"ev": "resolved", "pid": 2, "t": 2.0, "name": "a", "attempt": "x1", "action": "acquire"}
    )
    assert len(only(h.check(), "unresolved")) == 1  # another process's attempt x1
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 2.0, "name": "a", "attempt": "x1", "action": "acquire"}
    )
    assert h.check().ok


def test_a_cancelled_call_is_counted_but_needs_no_resolution() -> None:
    h = History()
    h.call("acquire", "a", "p1-a1", 1.0, 1.001, "cancelled")
    h.call("acquire", "a", "p1-a2", 1.0, 1.001, "cancelled")
    h.events.append(
        {"ev": "resolved", "pid": 1, "t": 1.1, "name": "a", "attempt": None, "action": "acquire"}
    )
    report = h.check()
    assert report.ok and (report.cancelled, report.cancelled_resolved) == (2, 1)


def test_keys_left_by_clients_that_exited_cleanly_are_leftovers() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.1, 10)
    lock = Leftover("redislock:lock:{a}", "lock", 2500, frozenset({1}), '{"o": "p1-t1"}')
    queue = Leftover("redislock:queue:{a}", "queue", -1, frozenset(), "1 entries")
    messages = only(h.check(leftovers=[lock, queue]), "leftover")
    assert "exited cleanly" in messages[0] and "expires in 2.5 s" in messages[0]
    assert "no holder named" in messages[1] and "never expires" in messages[1]


def test_a_killed_client_may_leave_keys_for_one_lease() -> None:
    h = History()
    h.call("acquire", "a", "p2-t1", 1.0, 1.1, "acquired", pid=2, token=10, hold_count=1)
    h.kill(2, at=50.0)
    lock = Leftover("redislock:lock:{a}", "lock", 2000, frozenset({2}))
    queue = Leftover("redislock:queue:{a}", "queue", 4000, frozenset({2}))
    report = h.check(leftovers=[lock, queue], checked_at=50.5)  # expire by 52.5 / 54.5
    assert report.ok, report
    assert report.leftovers_allowed == 2
    # The same lock expiring later than one lease after the kill: stuck.
    late = Leftover("redislock:lock:{a}", "lock", 9000, frozenset({2}))
    assert "killed at" in only(h.check(leftovers=[late], checked_at=50.5), "leftover")[0]
    # A killed client's hold ends at the kill: a later holder does not overlap it.
    h.hold("a", "p1-t1", 51.0, 51.1, 11)
    assert h.check(checked_at=60.0).ok


def test_a_history_that_cannot_be_trusted_is_incomplete() -> None:
    h = History()
    h.call("acquire", "a", "p1-t1", 1.0, 1.1, "acquired", token=10, hold_count=1)
    assert "never called release()" in only(h.check(), "incomplete")[0]
    report = check_history(h.events, checked_at=5.0)  # and no exit event
    assert {v.kind for v in report.violations} == {"incomplete"}
    assert any("neither exited" in v.message for v in report.violations)
    h = History()
    h.events.append({"ev": "crash", "pid": 1, "client": "w1", "thread": "t", "t": 1, "error": "X"})
    assert "crashed" in only(h.check(), "incomplete")[0]


def test_every_kind_is_reported_readably() -> None:
    h = History()
    h.hold("a", "p1-t1", 1.0, 1.5, 10)
    h.hold("a", "p2-t1", 1.4, 1.6, 9, pid=2)
    h.call("acquire", "b", "p1-t1", 2.0, 2.5, "unknown", error="reset")
    report = h.check()
    assert report.counts() == {
        "overlap": 1,
        "token": 1,
        "over_limit": 0,
        "leftover": 0,
        "unresolved": 1,
        "orphan": 0,
        "incomplete": 0,
    }
    text = str(report)
    assert "violations: 3" in text and "[overlap]" in text and "[unresolved]" in text


# -- the recorder and the error classification -------------------------------------------------


class _Named:
    """What the recorder reads from a lock: name, owner, timeout, token, hold count."""

    def __init__(self, name: str) -> None:
        self.name, self.owner, self.timeout = name, f"{os.getpid()}-me", 2.0
        self.fencing_token, self.hold_count = 42, 1


def test_the_recorder_writes_lines_that_load_back(tmp_path) -> None:
    path = tmp_path / "w0.jsonl"
    with HistoryRecorder(path, client="w0") as rec:
        lock = _Named("a")
        call = rec.call("acquire", lock, via="blocking")
        call.acquired(lock)
        with pytest.raises(RuntimeError):
            call.done("acquired")  # one line per call
        rec.call("release", lock, via="blocking", lost=False).done("released")
        rec.call("acquire", lock).failed(
            LockOutcomeUnknown(
                "TimeoutError: no reply",
                name="a",
                action="acquire",
                attempt="p.1",
                lease_ends_by=None,
            )
        )
        rec.write("exit", clean=True)
    with open(path, "a") as f:
        f.write('{"ev": "call", "pid"')  # a torn last line
    events = load_history(tmp_path)
    assert [e["ev"] for e in events] == ["call", "call", "call", "exit", "torn"]
    acquire = events[0]
    assert acquire["token"] == 42 and acquire["hold_count"] == 1 and acquire["client"] == "w0"
    assert acquire["start"] <= acquire["end"]
    assert events[2]["outcome"] == "unknown" and "TimeoutError" in events[2]["error"]
    assert events[2]["attempt"] == "p.1"
    report = check_history(events)
    assert report.counts()["incomplete"] == 1 and report.counts()["unresolved"] == 1
    assert "torn line" in report.details()
    assert report.holds == 1 and report.unknown == 1
    json.dumps(events)


def _wrapped(cause: BaseException) -> BaseException:
    from django_redislock import LockBackendError

    try:
        try:
            raise cause
        except Exception as exc:
            raise LockBackendError("Redis is unreachable") from exc
    except LockBackendError as err:
        return err


@pytest.mark.parametrize(
    ("cause", "outcome"),
    [
        (redis.TimeoutError("Timeout reading from 127.0.0.1:6379"), "unknown"),
        (redis.ConnectionError("Connection closed by server."), "unknown"),
        (ConnectionResetError(104, "Connection reset by peer"), "unknown"),
        (
            redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
            "error",
        ),
        (redis.TimeoutError("Timeout connecting to server"), "error"),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), "error"),
    ],
)
def test_without_lock_outcome_unknown_errors_that_may_have_reached_redis_are_unknown(
    cause, outcome
) -> None:
    assert classify_error(_wrapped(cause), unknown_cls=None)[0] == outcome


def test_with_lock_outcome_unknown_only_it_is_unknown() -> None:
    from django_redislock import LockBackendError

    class OutcomeUnknown(LockBackendError):  # the fixed engine's class, as API'd in issue 27
        name, action, attempt, lease_ends_by = "a", "acquire", "p1.7", 1234.5

    outcome, fields = classify_error(OutcomeUnknown("lost reply"), unknown_cls=OutcomeUnknown)
    assert outcome == "unknown"
    assert (fields["attempt"], fields["action"], fields["lease_ends_by"]) == (
        "p1.7",
        "acquire",
        1234.5,
    )
    timeout = _wrapped(redis.TimeoutError("Timeout reading from socket"))
    assert classify_error(timeout, unknown_cls=OutcomeUnknown)[0] == "error"


def test_an_unknown_outcome_of_a_client_killed_before_it_could_settle_it_is_no_violation():
    """A SIGKILLed client may die before Redis answers again; its lease ends what the call may
    have taken (the leftover check bounds its keys). A client that exits cleanly must settle."""
    unknown = {
        "ev": "call", "pid": 7, "client": "w", "thread": "t", "owner": "7-t", "name": "a",
        "op": "acquire", "via": "blocking", "lease": 2.0, "start": 1.0, "end": 1.1,
        "outcome": "unknown", "attempt": "x.1", "t": 1.1,
    }  # fmt: skip
    killed_soon = {"ev": "killed", "pid": 1, "victim": 7, "at": 1.5, "t": 1.5}
    report = check_history([unknown, killed_soon])
    assert report.counts()["unresolved"] == 0 and report.unknown_of_killed == 1
    exited = {"ev": "exit", "pid": 7, "client": "w", "clean": True, "t": 3.0}
    assert check_history([unknown, exited]).counts()["unresolved"] == 1


# -- over_limit (rate limiters, issue 30) ---------------------------------------------------------


def decide(
    name: str, start: float, end: float, outcome: str = "allowed", pid: int = 1
) -> dict[str, Any]:
    return {
        "ev": "call",
        "op": "decide",
        "name": name,
        "owner": f"rate/{pid}",
        "thread": "t",
        "pid": pid,
        "client": "w",
        "start": start,
        "end": end,
        "outcome": outcome,
        "t": end,
    }


def exits(*pids: int) -> list[dict[str, Any]]:
    return [{"ev": "exit", "pid": p, "client": "w", "t": 100.0, "clean": True} for p in pids]


def test_a_rate_held_to_is_no_violation() -> None:
    # 10/s, burst 2: two at once, then one every 0.1 s, from two processes.
    times = [0.0, 0.0, *(0.1 * i for i in range(1, 30))]
    events = [decide("r", t, t + 0.002, pid=1 + i % 2) for i, t in enumerate(times)]
    events += [decide("r", t + 0.05, t + 0.051, "refused") for t in times]
    report = check_history(events + exits(1, 2), rates={"r": (10, 1.0, 2)})
    assert report.ok, report.details()
    assert (report.decisions, report.allowed) == (2 * len(times), len(times))


def test_more_allowed_within_one_period_than_burst_plus_rate_is_over_limit() -> None:
    events = [decide("r", 1.0 + 0.01 * i, 1.0 + 0.01 * i + 0.001) for i in range(13)]
    report = check_history(events + exits(1), rates={"r": (10, 1.0, 2)})
    assert [v.kind for v in report.violations] == ["over_limit"]
    assert "allowed 13 requests within 1 s" in report.violations[0].message


def test_calls_that_may_have_been_decided_outside_the_window_are_not_counted() -> None:
    # 13 allowances, but three of the calls span 1.5 s: they may have been decided apart.
    events = [decide("r", 1.0 + 0.01 * i, 1.0 + 0.01 * i + 0.001) for i in range(10)]
    events += [decide("r", 0.0, 1.5) for _ in range(3)]
    report = check_history(events + exits(1), rates={"r": (10, 1.0, 2)})
    assert report.ok, report.details()


def test_errors_are_not_allowances_and_failovers_may_be_exempt() -> None:
    events = [decide("r", 1.0 + 0.01 * i, 1.0 + 0.01 * i + 0.001) for i in range(13)]
    events += [decide("r", 1.2, 1.3, "error") for _ in range(20)]
    exempt = check_history(
        events + exits(1),
        rates={"r": (10, 1.0, 2)},
        failovers=[1.05],
        exclusion_across_failovers=False,
    )
    assert exempt.ok and exempt.exempt_over_limit == 1
    strict = check_history(events + exits(1), rates={"r": (10, 1.0, 2)}, failovers=[1.05])
    assert [v.kind for v in strict.violations] == ["over_limit"]


# -- read-write locks (issue 31) ------------------------------------------------------------------


def rw_hold(
    h: History, mode: str, owner: str, acquired: float, released: float, token: int
) -> None:
    h.call("acquire", "rw", owner, acquired - 0.001, acquired, "acquired", token=token,
           hold_count=1, mode=mode)  # fmt: skip
    h.call("release", "rw", owner, released, released + 0.001, "released", mode=mode)


def test_readers_of_a_read_write_lock_may_overlap() -> None:
    h = History()
    rw_hold(h, "read", "p1-t1", 1.0, 1.5, 10)
    rw_hold(h, "read", "p1-t2", 1.1, 1.6, 11)
    rw_hold(h, "write", "p1-t3", 1.7, 1.8, 12)
    report = h.check()
    assert report.ok, report


def test_a_writer_overlapping_a_reader_or_a_writer_is_an_overlap() -> None:
    h = History()
    rw_hold(h, "read", "p1-t1", 1.0, 1.5, 10)
    rw_hold(h, "write", "p1-t2", 1.2, 1.3, 11)
    rw_hold(h, "write", "p1-t3", 1.25, 1.4, 12)
    assert len(only(h.check(), "overlap")) == 3


def test_one_owner_may_hold_both_sides() -> None:
    h = History()
    h.call("acquire", "rw", "p1-t1", 0.9, 1.0, "acquired", token=10, hold_count=1, mode="write")
    h.call("acquire", "rw", "p1-t1", 1.0, 1.1, "acquired", token=11, hold_count=1, mode="read")
    h.call("release", "rw", "p1-t1", 1.2, 1.21, "released", mode="write")
    h.call("release", "rw", "p1-t1", 1.3, 1.31, "released", mode="read")
    report = h.check()
    assert report.ok, report
    assert report.holds == 2
