"""The neutral mode semantics (``django_redislock.singleflight``) called directly, as a task
framework's integration calls them: publish (:func:`reserve`), run start (:func:`begin`), run end
(:func:`end`), the next attempt (:func:`hand_over`) and clean-up by another process
(:func:`abandon`). Real Redis; the frameworks' own tests run real workers."""

from __future__ import annotations

import json
import time
from typing import cast

import pytest

from django_redislock import get_lock_info, stats
from django_redislock.operations import lock_holders
from django_redislock.singleflight import (
    COALESCE,
    DEBOUNCE,
    MODES,
    UNTIL_EXECUTED,
    UNTIL_EXECUTING,
    UNTIL_EXPIRED,
    WHILE_EXECUTING,
    Busy,
    Deferred,
    Duplicate,
    FlightRules,
    Stale,
    Ticket,
    abandon,
    begin,
    cancel_burst,
    drop_burst,
    end,
    gather,
    hand_over,
    permit_name,
    rescue_overdue,
    reserve,
    run_key,
)


def rules(mode: str, **options: object) -> FlightRules:
    options.setdefault("stats_name", "flight")
    return FlightRules.validated("tests.flight", mode=mode, timeout=5, **options)


def holder(name: str) -> str | None:
    info = get_lock_info(name)
    return info.task_id if info is not None else None


@pytest.mark.parametrize("mode", MODES)
def test_publish_run_and_end_of_one_flight(mode):
    r = rules(mode)
    ticket = reserve(r, "k", "a")
    assert isinstance(ticket, Ticket)
    assert holder("k") == (None if mode == WHILE_EXECUTING else "a")
    flight = begin(r, "k", "a", ticket)
    held_while_running = {
        UNTIL_EXECUTED: ("k", "a"),
        UNTIL_EXECUTING: ("k", None),
        WHILE_EXECUTING: ("k", "a"),
        COALESCE: (run_key("k"), "a"),
        UNTIL_EXPIRED: ("k", "a"),
    }[mode]
    assert holder(held_while_running[0]) == held_while_running[1]
    if mode == COALESCE:
        assert holder("k") is None  # the follow-up slot is free while it runs
    assert end(flight) is True
    assert holder("k") == ("a" if mode == UNTIL_EXPIRED else None)
    assert holder(run_key("k")) is None


@pytest.mark.parametrize("mode", [m for m in MODES if m != WHILE_EXECUTING])
def test_a_second_publish_is_a_duplicate_naming_the_holder(mode):
    r = rules(mode)
    assert isinstance(reserve(r, "k", "a"), Ticket)
    assert reserve(r, "k", "b") == Duplicate("k", "a")
    assert reserve(r, "k", "a") == Duplicate("k", "a", same=True)  # the same id twice
    current = get_lock_info("k")
    assert current is not None and current.hold_count == 1


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (UNTIL_EXECUTED, "busy"),
        (WHILE_EXECUTING, "busy"),
        (COALESCE, "queued"),
        (UNTIL_EXPIRED, "busy"),
    ],
)
def test_a_delivery_without_a_hold_is_busy_while_another_flight_holds_the_key(mode, reason):
    r = rules(mode)
    first = begin(r, "k", "a", cast(Ticket, reserve(r, "k", "a")))
    if mode == COALESCE:
        # Running: the follow-up slot is free, so a delivery without a hold queues as the
        # follow-up; the one after it is the duplicate of that follow-up.
        assert isinstance(reserve(r, "k", "b"), Ticket)
    with pytest.raises(Busy) as caught:
        begin(r, "k", "c", Ticket("k"))
    assert (caught.value.holder, caught.value.reason) == ("b" if mode == COALESCE else "a", reason)
    end(first)


def test_a_second_delivery_of_the_same_message_is_already_running():
    r = rules(UNTIL_EXECUTED)
    ticket = cast(Ticket, reserve(r, "k", "a"))
    flight = begin(r, "k", "a", ticket)
    with pytest.raises(Busy) as caught:
        begin(r, "k", "a", ticket)
    assert caught.value.reason == "already-running"
    current = get_lock_info("k")
    assert current is not None and current.hold_count == 2  # the running attempt's holds are intact
    end(flight)
    assert holder("k") is None


def test_skips_and_deduplications_are_not_failed_acquisitions():
    r = rules(UNTIL_EXECUTED, stats_name="counted-flight")
    flight = begin(r, "k", "a", cast(Ticket, reserve(r, "k", "a")))
    assert isinstance(reserve(r, "k", "b"), Duplicate)
    with pytest.raises(Busy):
        begin(r, "k", "c", Ticket("k"))
    end(flight)
    stats.flush()
    figures = stats.get_stats("counted-flight")
    assert figures is not None and figures.failed == 0 and figures.released == 1, figures


def test_until_executed_hands_its_holds_to_the_next_attempt():
    r = rules(UNTIL_EXECUTED)
    flight = begin(r, "k", "a", cast(Ticket, reserve(r, "k", "a")))
    ticket = hand_over(flight)
    assert (ticket.holds, ticket.attempt) == (3, 1) and flight.handed_over  # publish, run, next
    end(flight)  # the end of a handed-over attempt releases nothing
    current = get_lock_info("k")
    assert current is not None and current.queued is True
    nxt = begin(r, "k", "a", ticket, attempt=ticket.attempt)
    end(nxt)
    assert holder("k") is None


@pytest.mark.parametrize("mode", [UNTIL_EXECUTING, COALESCE])
def test_modes_free_between_runs_take_the_key_for_the_next_attempt_if_free(mode):
    r = rules(mode)
    flight = begin(r, "k", "a", cast(Ticket, reserve(r, "k", "a")))
    ticket = hand_over(flight)
    assert (ticket.holds, holder("k")) == (1, "a")
    end(flight)
    # Taken meanwhile by another message: the next attempt carries no hold, and is its duplicate.
    flight = begin(r, "k", "a", ticket, attempt=1)
    assert isinstance(reserve(r, "k", "b"), Ticket)
    following = hand_over(flight)
    assert following.holds == 0
    end(flight)
    with pytest.raises(Busy):
        begin(r, "k", "a", following, attempt=2)


def test_a_retry_waits_for_its_previous_attempt_not_a_redelivery():
    r = rules(WHILE_EXECUTING)
    first = begin(r, "k", "a", Ticket("k"))
    with pytest.raises(Busy) as caught:  # same attempt again: a redelivery
        begin(r, "k", "a", Ticket("k"))
    assert caught.value.reason == "already-running"
    import threading

    threading.Timer(0.3, end, (first,)).start()
    retry = begin(r, "k", "a", hand_over(first), attempt=1)  # waits for attempt 0's release
    assert holder("k") == "a" and retry.run_lock is not None
    end(retry)


def test_while_executing_with_permits_runs_that_many_flights():
    r = rules(WHILE_EXECUTING, permits=2)
    a, _ = begin(r, "k", "a", Ticket("k")), begin(r, "k", "b", Ticket("k"))
    with pytest.raises(Busy):
        begin(r, "k", "c", Ticket("k"))
    assert abandon(r, "k", "b") is True  # another process's permit: freed by its token
    c = begin(r, "k", "c", Ticket("k"))
    for flight in (a, c):
        end(flight)
    assert get_lock_info("k") is None


def test_abandon_keeps_the_until_expired_window_and_frees_the_others():
    for mode in MODES:
        r = rules(mode)
        name = f"k-{mode}"
        flight = begin(r, name, "a", cast(Ticket, reserve(r, name, "a")))
        released = abandon(r, name, "a")
        assert released is (mode not in (UNTIL_EXPIRED, UNTIL_EXECUTING)), mode
        assert holder(name) == ("a" if mode == UNTIL_EXPIRED else None)
        assert holder(run_key(name)) is None
        flight.run_lock = None  # abandoned: the process that ran it is gone


# -- flow control -----------------------------------------------------------------------------
def permits_held(r: FlightRules) -> list[str | None]:
    return [info.task_id for info in lock_holders(permit_name(r))]


@pytest.mark.parametrize("mode", MODES)
def test_a_run_over_task_permits_is_deferred_with_what_its_queued_message_holds(mode):
    r = rules(mode, task_permits=1)
    first = begin(r, "k1", "a", cast(Ticket, reserve(r, "k1", "a")))
    assert permits_held(r) == ["a"]
    ticket = cast(Ticket, reserve(r, "k2", "b"))
    with pytest.raises(Deferred) as caught:
        begin(r, "k2", "b", ticket)
    deferred = caught.value
    assert (deferred.reason, deferred.throttled) == ("task_permits", True)
    assert 1.0 <= deferred.countdown <= 1.25  # PERMIT_BACKOFF and its jitter
    carried = deferred.ticket
    assert isinstance(carried, Ticket) and carried.attempt == ticket.attempt
    # What a queued message of the mode holds: the key stays the flight's while it waits.
    if mode == WHILE_EXECUTING:
        assert holder("k2") is None and carried.holds == 0
    else:
        info = get_lock_info("k2")
        assert info is not None and info.task_id == "b"
        if mode == UNTIL_EXECUTED:  # never dropped: the same hold, queued again
            assert (carried.token, carried.holds, info.hold_count) == (ticket.token, 2, 2)
            assert info.queued is True
    assert permits_held(r) == ["a"]
    end(first)
    assert permits_held(r) == []
    # Delivered again with what it carries: it runs (not "already running", not busy).
    again = begin(r, "k2", "b", carried, attempt=carried.attempt)
    assert permits_held(r) == ["b"]
    end(again)
    assert permits_held(r) == []


def test_task_permits_cap_every_key_together_and_lock_permits_each_key():
    r = rules(WHILE_EXECUTING, permits=2, task_permits=3)
    running = [begin(r, k, f"{k}{i}", Ticket(k)) for k, i in (("a", 1), ("a", 2), ("b", 1))]
    with pytest.raises(Busy):  # the key's two permits
        begin(r, "a", "a3", Ticket("a"))
    with pytest.raises(Deferred) as caught:  # the task's three
        begin(r, "b", "b2", Ticket("b"))
    assert caught.value.reason == "task_permits"
    assert len(permits_held(r)) == 3 and holder("b") == "b1"  # b2's key permit was given back
    for flight in running:
        end(flight)
    assert permits_held(r) == []


def test_abandon_frees_the_task_permit_of_a_dead_process():
    r = rules(UNTIL_EXECUTED, task_permits=2)
    flight = begin(r, "k", "a", cast(Ticket, reserve(r, "k", "a")))
    assert permits_held(r) == ["a"]
    assert abandon(r, "k", "a") is True
    assert permits_held(r) == [] and holder("k") is None
    flight.run_lock = flight.permit = None  # abandoned: the process that ran it is gone


def test_a_run_over_lock_rate_is_deferred_for_the_rates_retry_after():
    r = rules(WHILE_EXECUTING, permits=5, rate="2/s", stats_name="rated-flight")
    end(begin(r, "k", "a", Ticket("k")))
    end(begin(r, "other", "b", Ticket("other")))  # a rate per key
    with pytest.raises(Deferred) as caught:
        begin(r, "k", "c", Ticket("k"))
    assert caught.value.reason == "lock_rate"
    assert 0.3 < caught.value.countdown <= 0.5  # one run per 0.5 s
    assert holder("k") is None  # the run lock was given back
    time.sleep(caught.value.countdown)
    end(begin(r, "k", "c", Ticket("k")))


def test_task_rate_counts_every_key_and_is_checked_after_the_key_rate():
    r = rules(WHILE_EXECUTING, rate="100/s", task_rate="1/m")
    end(begin(r, "k1", "a", Ticket("k1")))
    with pytest.raises(Deferred) as caught:
        begin(r, "k2", "b", Ticket("k2"))
    assert caught.value.reason == "task_rate" and 59 < caught.value.countdown <= 60


def test_a_throttled_delivery_is_not_run_without_holds_when_not_requeued():
    """django.tasks enqueues a new flight instead: every hold of the old one is given back."""
    r = rules(UNTIL_EXECUTED, task_permits=1)
    first = begin(r, "k1", "a", cast(Ticket, reserve(r, "k1", "a")))
    with pytest.raises(Deferred) as caught:
        begin(r, "k2", "b", cast(Ticket, reserve(r, "k2", "b")), requeue=False)
    assert caught.value.ticket is None and holder("k2") is None
    end(first)


# -- debounce ---------------------------------------------------------------------------------
def debounced(quiet: float = 0.3, most: float | None = None) -> FlightRules:
    return rules(DEBOUNCE, debounce=quiet, debounce_max=most)


def publish(r: FlightRules, key: str, value: int, candidate: str) -> tuple[str, bool]:
    burst = gather(r, key, candidate, json.dumps({"args": [value], "kwargs": {}}))
    return burst.flight_id, burst.first


def test_publishes_of_a_burst_share_the_first_ones_id_and_the_run_gets_the_last_arguments():
    r = debounced(quiet=0.3)
    assert [publish(r, "k", v, f"id{v}") for v in (1, 2, 3)] == [
        ("id1", True),
        ("id1", False),
        ("id1", False),
    ]
    with pytest.raises(Deferred) as caught:  # delivered before the quiet period ended
        begin(r, "k", "id1", Ticket("k"))
    assert caught.value.reason == "debounce" and 0.1 < caught.value.countdown <= 0.3
    assert not caught.value.throttled
    time.sleep(caught.value.countdown)
    flight = begin(r, "k", "id1", Ticket("k"))
    assert flight.payload is not None and json.loads(flight.payload)["args"] == [3]
    assert holder("k") == "id1"  # the run holds the key as a lock
    with pytest.raises(Stale):  # another message of the same id: the burst was claimed
        begin(r, "k", "id1", Ticket("k"))
    end(flight)
    assert publish(r, "k", 4, "id4") == ("id4", True)  # the next burst


def test_a_burst_that_keeps_going_is_due_lock_debounce_max_after_its_first_publish():
    r = debounced(quiet=0.3, most=0.5)
    publish(r, "k", 1, "a")
    for value in range(2, 6):
        time.sleep(0.15)
        publish(r, "k", value, "x")
    # 0.6 s after the first publish: not quiet for 0.3 s, but past the 0.5 s maximum.
    flight = begin(r, "k", "a", Ticket("k"))
    assert flight.payload is not None and json.loads(flight.payload)["args"] == [5]
    end(flight)


def test_a_due_run_whose_key_runs_waits_and_is_not_rescued_meanwhile():
    r = debounced(quiet=0.1)
    publish(r, "k", 1, "a")
    time.sleep(0.15)
    running = begin(r, "k", "a", Ticket("k"))
    publish(r, "k", 2, "b")
    time.sleep(0.15)
    with pytest.raises(Deferred) as caught:
        begin(r, "k", "b", Ticket("k"))
    assert caught.value.reason == "busy" and caught.value.countdown == pytest.approx(0.1)
    assert rescue_overdue(r, grace=0.05) == []  # postponed: not overdue
    end(running)


def test_an_overdue_burst_is_rescued_once_per_grace_period_with_its_last_arguments():
    r = debounced(quiet=0.1)
    publish(r, "k", 1, "a")
    publish(r, "k", 2, "x")
    time.sleep(0.35)
    [rescued] = rescue_overdue(r, grace=0.2)
    assert (rescued.key, rescued.flight_id) == ("k", "a")
    assert json.loads(rescued.payload)["args"] == [2]
    assert rescue_overdue(r, grace=0.2) == []  # taken by this rescuer for a grace period
    flight = begin(r, "k", "a", Ticket("k"))  # the rescued message runs it
    end(flight)
    time.sleep(0.25)
    assert rescue_overdue(r, grace=0.2) == []  # claimed: nothing left to rescue


def test_a_burst_whose_message_was_not_sent_is_dropped_unless_joined_and_revoke_cancels_it():
    r = debounced(quiet=5)
    publish(r, "k", 1, "a")
    assert drop_burst(r, "k", "a") is True
    assert publish(r, "k", 2, "b") == ("b", True)
    publish(r, "k", 3, "x")
    assert drop_burst(r, "k", "b") is False  # joined: the rescue will publish it
    assert cancel_burst(r, "k", "b") is True  # revoked: forgotten
    with pytest.raises(Stale):
        begin(r, "k", "b", Ticket("k"))
