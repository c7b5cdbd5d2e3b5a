"""Debounce records: the pending burst of publishes of one lock key (``lock_mode="debounce"``).

The task faces reach this module through :mod:`django_redislock.singleflight`; it owns only the
Redis side. One record per (task, lock key), a hash written by ``lua/debounce_gather.lua``:

- ``id``: the flight id of the burst — made by its first publish, returned by every publish of
  the burst, the id the run will have;
- ``first`` / ``last``: server epoch ms of the burst's first and latest publish;
- ``n``: how many publishes joined; ``args``: the latest publish's arguments (JSON text, never
  pickle); ``route``: where the first publish sent its message (JSON text), for the rescue.

The run is *due* at ``min(last + quiet, first + most)``; the task's index (a sorted set, lock
key -> due ms) lets a worker find runs that were due a while ago and never claimed — their
message was lost with a worker — and publish them again (:func:`overdue`, :func:`rescue`). A
claim (``lua/debounce_claim.lua``) deletes the record atomically, so however many messages of
one burst are delivered, one of them runs it. Records and index expire ``keep`` seconds after
the run was due, so a task nobody runs any more leaves nothing behind for ever.

Every key of a task's records carries the task name as its hash tag (see
:meth:`~django_redislock.keys.KeySpace.debounce`): one script touches one Cluster slot. A quorum
of independent masters (Redlock) cannot hold a record: debounced tasks need one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_redislock import scripts
from django_redislock.runtime import runtime

__all__ = ["Burst", "Rescue", "claim", "drop", "gather", "overdue", "peek", "postpone", "rescue"]


@dataclass(frozen=True)
class Burst:
    """What one publish of a debounced key learnt."""

    #: The burst's flight id: the id the run will have.
    flight_id: str
    #: This publish started the burst (it sends the message; later ones send nothing).
    first: bool
    #: Seconds until the run is due (server clock).
    delay: float


@dataclass(frozen=True)
class Rescue:
    """An overdue burst this process publishes again."""

    key: str
    flight_id: str
    #: The latest publish's arguments (JSON text) and where the first one was sent (JSON text).
    payload: str
    route: str


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _target(using: str | None) -> Any:
    target = runtime.target(using)
    if target.quorum:
        raise ImproperlyConfigured(
            "lock_mode='debounce' needs one Redis (single, Sentinel or Cluster): "
            "REDISLOCK['CACHE'] lists independent masters (Redlock). Set lock_using=<one alias>."
        )
    return target


def _run(
    using: str | None, script: scripts.Script, keys: list[str], args: list[Any], what: str
) -> Any:
    target = _target(using)
    return target.transport.run(script, keys, args, what)


def _keys(using: str | None, task: str, key: str) -> list[str]:
    space = _target(using).keys
    return [space.debounce(task, key), space.debounce_index(task)]


def gather(
    using: str | None,
    task: str,
    key: str,
    candidate: str,
    payload: str,
    *,
    quiet: float,
    most: float | None,
    keep: float,
    route: str = "{}",
) -> Burst:
    """Join the pending burst of ``key`` with this publish's arguments, or start one with the
    flight id ``candidate`` (one round trip)."""
    reply = _run(
        using,
        scripts.DEBOUNCE_GATHER,
        _keys(using, task, key),
        [candidate, payload, _ms(quiet), _ms(most) if most else 0, _ms(keep), key, route],
        f"debounce a publish of {key!r}",
    )
    flight_id = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    return Burst(flight_id, bool(int(reply[1])), int(reply[2]) / 1000)


def _claim(
    using: str | None,
    task: str,
    key: str,
    flight_id: str,
    quiet: float,
    most: float | None,
    how: str,
) -> list[Any]:
    reply: list[Any] = _run(
        using,
        scripts.DEBOUNCE_CLAIM,
        _keys(using, task, key),
        [flight_id, _ms(quiet), _ms(most) if most else 0, how, key],
        f"{how} the debounced run of {key!r}",
    )
    return reply


def peek(
    using: str | None, task: str, key: str, flight_id: str, *, quiet: float, most: float | None
) -> float | None:
    """Seconds until the run of burst ``flight_id`` is due (0.0: due now); ``None`` when no
    burst of that id is pending (already claimed, expired, or a stale message). Read-only."""
    reply = _claim(using, task, key, flight_id, quiet, most, "peek")
    ms = int(reply[0])
    return None if ms < 0 else ms / 1000


def claim(
    using: str | None, task: str, key: str, flight_id: str, *, quiet: float, most: float | None
) -> str | float | None:
    """Take the burst's latest arguments (JSON text) and end the burst, when its run is due.

    Returns the arguments, or the seconds until due (a publish came since :func:`peek`), or
    ``None`` when no burst of that id is pending."""
    reply = _claim(using, task, key, flight_id, quiet, most, "claim")
    ms = int(reply[0])
    if ms < 0:
        return None
    if ms > 0:
        return ms / 1000
    raw = reply[1]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def postpone(
    using: str | None, task: str, key: str, flight_id: str, *, delay: float, keep: float
) -> bool:
    """The due run of ``flight_id`` is delivered again in ``delay`` seconds: say so in the index
    (the rescue leaves it alone until then). False when no burst of that id is pending."""
    reply = _run(
        using,
        scripts.DEBOUNCE_POSTPONE,
        _keys(using, task, key),
        [flight_id, _ms(delay), _ms(keep), key, "move"],
        f"postpone the debounced run of {key!r}",
    )
    return bool(int(reply))


def drop(using: str | None, task: str, key: str, flight_id: str, *, always: bool = False) -> bool:
    """Delete the burst ``flight_id``: ``always`` (it was revoked), else only when no other
    publish joined it (its message could not be sent; otherwise the rescue publishes it).
    Returns whether it was deleted."""
    reply = _run(
        using,
        scripts.DEBOUNCE_POSTPONE,
        _keys(using, task, key),
        [flight_id, 1, 1, key, "cancel" if always else "drop"],
        f"drop the debounced burst of {key!r}",
    )
    return bool(int(reply))


def overdue(using: str | None, task: str, *, grace: float, limit: int = 100) -> list[str]:
    """Lock keys of ``task`` whose run was due more than ``grace`` seconds ago, unclaimed."""
    index = _target(using).keys.debounce_index(task)
    reply = _run(
        using,
        scripts.DEBOUNCE_OVERDUE,
        [index],
        [_ms(grace), int(limit)],
        f"look for overdue debounced runs of {task!r}",
    )
    return [k.decode() if isinstance(k, bytes) else str(k) for k in reply]


def rescue(using: str | None, task: str, key: str, *, grace: float) -> Rescue | None:
    """Take the right to publish the overdue run of ``key`` again (for ``grace`` seconds: one
    rescuer at a time); ``None`` when it is no longer overdue or its record is gone."""
    reply = _run(
        using,
        scripts.DEBOUNCE_RESCUE,
        _keys(using, task, key),
        [_ms(grace), key],
        f"rescue the debounced run of {key!r}",
    )
    if not reply:
        return None
    text = [v.decode() if isinstance(v, bytes) else str(v) for v in reply]
    return Rescue(key, text[0], text[1], text[2])
