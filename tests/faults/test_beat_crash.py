"""One beat across the fleet, when a beat dies or loses Redis: real ``celery beat`` processes
(``tests/test_beat.py`` has the fleet and the property checked), SIGKILLed or cut off by a Redis
stop and restart. A fault step of CI (``make test-faults``): each test waits out leases."""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_for
from tests.test_beat import (  # noqa: F401  (fleet: a fixture used by name)
    DATABASE,
    INTERVAL,
    LEASE,
    PERSISTENT,
    Fleet,
    _count_after,
    assert_one_sender_per_slot,
    first_send_after,
    fleet,
    migrate,
)


@pytest.mark.slow
def test_standby_takes_over_within_the_lease_after_the_leader_is_sigkilled(
    fleet: Fleet,  # noqa: F811
) -> None:
    fleet.schedule(tick=INTERVAL)
    a = fleet.start("a")
    wait_for(lambda: len(fleet.sends_by(a)) >= 2, 30, 0.05, what="the first beat to send")
    b = fleet.start("b")
    wait_for(lambda: "standing by" in b.output(), 30, 0.05, what="the second beat to stand by")
    sent_by_a = len(fleet.sends_by(a))
    wait_for(lambda: len(fleet.sends_by(a)) >= sent_by_a + 2, 10, 0.05, what="more sends of a")
    assert fleet.sends_by(b) == []  # a standby sends nothing

    killed_at = time.time()
    a.kill()
    first = wait_for(first_send_after(fleet, killed_at), LEASE + INTERVAL + 10, 0.02)
    takeover = first["at"] - killed_at
    assert first["pid"] == b.pid
    assert takeover <= LEASE + INTERVAL + 1.0, f"took over after {takeover:.2f}s"
    assert "took over as the leader" in b.output()

    # A graceful stop hands the lease over at once: the next standby sends within one interval.
    c = fleet.start("c")
    wait_for(lambda: "standing by" in c.output(), 30, 0.05, what="the third beat to stand by")
    stopped_at = time.time()
    assert b.terminate() == 0
    first = wait_for(first_send_after(fleet, stopped_at), LEASE + INTERVAL + 10, 0.02)
    handover = first["at"] - stopped_at
    assert first["pid"] == c.pid
    assert handover <= INTERVAL + 1.0, f"handed over after {handover:.2f}s"
    assert "released the leader lease" in b.output()
    wait_for(lambda: len(fleet.sends_by(c)) >= 2, 10, 0.05, what="the third beat to keep sending")

    c.kill()
    sends = fleet.sends()
    assert {s["pid"] for s in sends} == {a.pid, b.pid, c.pid}, fleet.logs()
    assert_one_sender_per_slot(sends, INTERVAL)
    print(f"\ntakeover after SIGKILL: {takeover:.2f}s; after graceful stop: {handover:.2f}s")


@pytest.mark.slow
def test_a_beat_that_loses_redis_stops_sending_says_so_and_one_resumes_after_restart(
    fleet: Fleet,  # noqa: F811
) -> None:
    fleet.schedule(tick=INTERVAL)
    a = fleet.start("a")
    wait_for(lambda: len(fleet.sends_by(a)) >= 2, 30, 0.05, what="the first beat to send")
    b = fleet.start("b")
    wait_for(lambda: "standing by" in b.output(), 30, 0.05, what="the second beat to stand by")

    stopped_at = time.time()
    fleet.lock_server.stop()  # the broker (another server) stays up
    wait_for(lambda: "beat: stopped scheduling" in a.output(), 10, 0.05, what="a to say so")
    detected_at = time.time()
    assert "Redis is unreachable" in a.output()
    time.sleep(LEASE)  # the outage lasts longer than the lease: nobody may send meanwhile
    assert "beat: not scheduling" in b.output(), fleet.logs()  # the standby says so too
    late = [s for s in fleet.sends() if s["at"] > stopped_at + 0.5]  # one proven just before
    assert late == [], late

    restarted_at = time.time()
    fleet.lock_server.start()  # same port, empty: the old lease is gone
    first = wait_for(first_send_after(fleet, restarted_at), LEASE + INTERVAL + 10, 0.02)
    resumed = first["at"] - restarted_at
    assert first["pid"] in {a.pid, b.pid}
    assert resumed <= INTERVAL + 2.0, f"resumed after {resumed:.2f}s"
    wait_for(lambda: _count_after(fleet, restarted_at) >= 3, 10, 0.05, what="more sends")

    fleet.stop_all()
    assert_one_sender_per_slot(fleet.sends(), INTERVAL)
    print(
        f"\nstop detected after {detected_at - stopped_at:.2f}s; "
        f"resumed {resumed:.2f}s after Redis came back"
    )


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", [PERSISTENT, DATABASE], ids=["persistent", "database"])
def test_a_new_leader_does_not_resend_a_slot_the_dead_leader_already_sent(
    fleet: Fleet,  # noqa: F811
    scheduler: str,
) -> None:
    """The standby's own schedule state is older than the leader's last send; without the shared
    state it would send at once on takeover, a second send of the slot the leader just sent."""
    every = 4.0  # longer than the lease, so a takeover falls inside one interval
    fleet.schedule(slow=every)
    if scheduler == DATABASE:
        fleet.use_database()
        migrate(fleet)
    a = fleet.start("a", scheduler)
    b = fleet.start("b", scheduler)
    wait_for(lambda: fleet.sends(), 30, 0.02, what="the first send")
    leader, standby = (a, b) if fleet.sends()[0]["pid"] == a.pid else (b, a)
    wait_for(lambda: "standing by" in standby.output(), 30, 0.05, what="the standby")
    count = len(fleet.sends())
    wait_for(lambda: len(fleet.sends()) > count, every + 5, 0.01, what="the next send")
    leader.kill()  # right after a send: its slot is done, the next one is `every` away
    last = fleet.sends()[-1]
    assert last["pid"] == leader.pid

    first = wait_for(first_send_after(fleet, last["at"]), every + LEASE + 10, 0.02)
    assert first["pid"] == standby.pid
    assert "took over as the leader" in standby.output()
    gap = first["at"] - last["at"]
    assert every - 0.3 <= gap <= every + 1.5, f"{gap:.2f}s after the dead leader's last send"
