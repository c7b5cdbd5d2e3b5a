"""The neutral mode semantics (``django_redislock.singleflight``) called directly, as a task
framework's integration calls them: publish (:func:`reserve`), run start (:func:`begin`), run end
(:func:`end`), the next attempt (:func:`hand_over`) and clean-up by another process
(:func:`abandon`). Real Redis; the frameworks' own tests run real workers."""

from __future__ import annotations

from typing import cast

import pytest

from django_redislock import get_lock_info, stats
from django_redislock.singleflight import (
    COALESCE,
    MODES,
    UNTIL_EXECUTED,
    UNTIL_EXECUTING,
    UNTIL_EXPIRED,
    WHILE_EXECUTING,
    Busy,
    Duplicate,
    FlightRules,
    Ticket,
    abandon,
    begin,
    end,
    hand_over,
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
