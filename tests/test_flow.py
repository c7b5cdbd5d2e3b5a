"""The acquisition protocol without I/O: the flow driven by hand with canned replies and a
clock of the test's own (no Redis, no sleeping). What the flow asks for, and what it concludes
from each answer, is the whole protocol; the drivers only carry it out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from django_redislock import LockBackendError, LockNotAcquiredError, flow, redlock
from django_redislock.keys import KeySpace
from django_redislock.kinds import LockKind, SemaphoreKind
from django_redislock.transport import NoReply


@dataclass
class FakeTarget:
    """What a plan reads of its target: keys, wake arguments, replicas, quorum members."""

    keys: KeySpace = field(default_factory=lambda: KeySpace("ns", shared_fence=True))
    replicas: int = 0
    replicas_timeout_ms: int = 0
    members: tuple[Any, ...] = ()
    subscribe_timeout: float = 3.0

    @property
    def quorum(self) -> bool:
        return bool(self.members)

    def wait_fields(self) -> dict[str, int]:
        return {"replicas": self.replicas, "replicas_timeout_ms": self.replicas_timeout_ms}

    def wake_args(self, name: str, lease: float) -> list[Any]:
        return ["ns:wake:", "0", "1", 0 if self.members else 2000]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plan(*, kind: Any = None, blocking: bool = True, queue: bool = True, wait: float = 10.0,
         target: FakeTarget | None = None, clock: Clock | None = None) -> flow.Plan:  # fmt: skip
    clock = clock or Clock()
    return flow.Plan(
        kind=kind or LockKind(),
        target=target or FakeTarget(),
        name="job",
        owner="p-1",
        attempt="p.7",
        meta="{}",
        lease=30.0,
        blocking=blocking,
        started=clock.now,
        deadline=clock.now + wait,
        queue=queue,
        known="-",
        clock=clock,
    )


def as_call(op: Any) -> flow.Call:
    """``op``, which must be a call (the flow's next step is a script to run)."""
    assert isinstance(op, flow.Call), op
    return op


def run(gen: flow.Flow, *replies: Any) -> tuple[list[Any], Any]:
    """Feed ``replies`` (an exception is thrown in) and collect what the flow yields; returns
    (operations, result). Raises what the flow raises."""
    ops = [next(gen)]
    for reply in replies:
        try:
            if isinstance(reply, BaseException):
                ops.append(gen.throw(reply))
            else:
                ops.append(gen.send(reply))
        except StopIteration as stop:
            return ops, stop.value
    raise AssertionError(f"the flow wants more: {ops[-1]!r}")


def test_a_free_lock_is_taken_with_one_call():
    ops, result = run(flow.acquire(plan()), [1, 42, 1])
    assert result == flow.Acquired(42, 1, False)
    call = ops[0]
    assert isinstance(call, flow.Call) and call.script.filename == "acquire.lua"
    assert call.args[3] == "p.7"  # the attempt id: a resend is recognised by it
    assert call.keys[-1] == "ns:void:{job}:p.7"


def test_busy_without_blocking_is_not_acquired_and_queues_nothing():
    ops, result = run(flow.acquire(plan(blocking=False, queue=False)), [0, 500, 0])
    assert result == flow.NotAcquired(True)
    assert ops[0].args[4] == "0"  # no queue entry asked for


def test_a_first_waiter_subscribes_then_queues_then_is_handed_the_lock_outright():
    clock = Clock()
    gen = flow.acquire(plan(queue=False, clock=clock))
    ops, result = run(gen, [0, 500, 0], True, [0, 500, 1], flow.Woken(True, 77))
    subscribe, queued, wait = ops[1], ops[2], ops[3]
    assert isinstance(subscribe, flow.Subscribe)
    assert queued.args[4] == "1"  # now it queues
    assert isinstance(wait, flow.Wait)
    assert wait.recheck_at == pytest.approx(clock.now + 0.5)  # the holder's lease end
    assert wait.until == clock.now + 10.0
    assert result == flow.Acquired(77, 1, True)


def test_a_reserved_hand_off_is_claimed_by_the_waiters_next_call():
    _, result = run(flow.acquire(plan()), [0, 30_000, 1], flow.Woken(True, None), [1, 78, 1])
    assert result == flow.Acquired(78, 1, True)


def test_at_the_deadline_the_waiter_leaves_and_keeps_a_hand_off_that_raced_it():
    clock = Clock()
    gen = flow.acquire(plan(clock=clock, wait=2.0))
    ops = [next(gen), gen.send([0, 30_000, 1])]
    clock.now += 2.5  # the wait ran out
    cancel = as_call(gen.send(flow.Woken(False)))
    assert cancel.script.filename == "cancel.lua" and cancel.args[2] == "1"  # take a hand-off
    with pytest.raises(StopIteration) as stop:
        gen.send(-1)  # nothing was handed over
    assert stop.value.value == flow.NotAcquired(True)

    gen = flow.acquire(plan(clock=clock, wait=2.0))
    next(gen)
    gen.send([0, 30_000, 1])
    clock.now += 2.5
    gen.send(flow.Woken(False))
    with pytest.raises(StopIteration) as stop:
        gen.send([1, 80, 1])  # handed over just before the deadline
    assert stop.value.value == flow.Acquired(80, 1, True)
    assert ops


def test_an_unacknowledged_acquisition_is_undone_before_the_error():
    gen = flow.acquire(plan(target=FakeTarget(replicas=1, replicas_timeout_ms=100)))
    call = as_call(next(gen))
    assert call.replicas == 1
    undo = as_call(gen.throw(flow.NotReplicated("acquire", [1, 5, 1], 0, 1, 100)))
    assert undo.script.filename == "cancel.lua" and undo.args[2] == "0"
    with pytest.raises(flow.NotReplicated):
        gen.send(0)


def test_refused_reentry_and_a_void_attempt_are_errors():
    with pytest.raises(LockNotAcquiredError, match="reentrant=False"):
        run(flow.acquire(plan()), [2, 5, 1])
    with pytest.raises(LockBackendError, match="cancelled before its call"):
        run(flow.acquire(plan()), [3])


def test_no_reply_is_not_resent():
    """A call whose reply never came is the face's to clean up: the flow does not try again."""
    gen = flow.acquire(plan())
    next(gen)
    with pytest.raises(NoReply):
        gen.throw(NoReply("no reply"))


def test_a_semaphore_is_the_same_protocol_with_its_own_script():
    ops, result = run(flow.acquire(plan(kind=SemaphoreKind(permits=3))), [1, 9, 1])
    assert ops[0].script.filename == "sem_acquire.lua" and ops[0].args[6] == 3
    assert result == flow.Acquired(9, 1, False)


# -- the quorum's protocol (Redlock) --------------------------------------------------------


def quorum_plan(**kwargs: Any) -> flow.Plan:
    return plan(target=FakeTarget(members=(1, 2, 3)), **kwargs)


def test_a_majority_takes_the_lock_with_the_highest_token():
    ops, result = run(redlock.acquire(quorum_plan()), [[1, 5, 1], [1, 7, 1], [0, 100, 0]])
    assert ops[0].each is True
    assert result == flow.Acquired(7, 1, False)


def test_a_minority_is_given_back_everywhere():
    ops, result = run(
        redlock.acquire(quorum_plan(blocking=False, queue=False)),
        [[1, 5, 1], [0, 100, 0], [0, 100, 0]],
        [0, -1, -1],  # the give-back's replies
    )
    assert ops[1].script.filename == "cancel.lua" and ops[1].each
    assert result == flow.NotAcquired(True)


def test_too_few_masters_answering_gives_back_what_it_took_then_says_so():
    down = LockBackendError("down")
    gen = redlock.acquire(quorum_plan())
    next(gen)
    give_back = as_call(gen.send([[1, 5, 1], down, down]))
    assert give_back.script.filename == "cancel.lua" and give_back.each
    with pytest.raises(NoReply, match="majority"):
        gen.send([0, down, down])
