"""The lock record: what the Lua scripts store under a lock key, read back in Python.

The scripts (``lua/_library.lua``) write one JSON object per lock, always with the same layout::

    {"o": owner, "n": hold count, "t": fencing token, "at": acquired-at (epoch ms), "m": {metadata}}

Anything else found under a lock key (written by another program, a different version, or
corrupted) is *unreadable*: it is reported as such instead of raising from a listing, so one bad
value can never break the admin page or ``manage.py redislock list``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LockRecord", "parse_record"]


@dataclass(frozen=True)
class LockRecord:
    """A lock's stored value plus its remaining lease (what ``GET`` + ``PTTL`` return)."""

    key: str
    owner: str
    count: int
    token: int
    acquired_at_ms: int
    meta: dict[str, Any]
    pttl_ms: int
    #: The stored value is not a record of this layout; the other fields are empty.
    unreadable: bool = False
    #: A short excerpt of an unreadable value, for operators.
    raw_excerpt: str = field(default="", compare=False)


def parse_record(key: str, raw: bytes | str, pttl_ms: int) -> LockRecord:
    """Parse a stored value; never raises (an unreadable value gives ``unreadable=True``)."""
    try:
        data = json.loads(raw)
        meta = data.get("m") or {}
        if not isinstance(meta, dict):
            raise TypeError("metadata is not an object")
        return LockRecord(
            key=key,
            owner=str(data["o"]),
            count=int(data["n"]),
            token=int(data["t"]),
            acquired_at_ms=int(data["at"]),
            meta=meta,
            pttl_ms=int(pttl_ms),
        )
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return LockRecord(
            key=key,
            owner="",
            count=0,
            token=0,
            acquired_at_ms=0,
            meta={},
            pttl_ms=int(pttl_ms),
            unreadable=True,
            raw_excerpt=text[:80],
        )
