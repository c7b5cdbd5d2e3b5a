"""The message headers that carry a task's hold from the publisher to the worker.

``apply_async`` takes the key and writes what it took into the message; the worker compares that
with what Redis says when it re-enters the lock, which is how it tells the message that was
published from a second delivery of it. Celery copies custom headers into a ``retry()``, and
:func:`django_redislock.singleflight.hand_over` rewrites them for the attempt it publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_redislock.singleflight import Ticket

__all__ = [
    "HEADERS",
    "HEADER_ATTEMPT",
    "HEADER_HOLDS",
    "HEADER_KEY",
    "HEADER_SCHEDULED",
    "HEADER_TOKEN",
    "HEADER_USING",
    "headers_of",
    "ticket_headers",
    "ticket_of",
]

#: The lock key the publisher took (the worker need not recompute it).
HEADER_KEY = "redislock_key"
#: Fencing token of the publisher's hold (``None`` when the message carries no hold).
HEADER_TOKEN = "redislock_token"
#: How many holds of the task id the message accounts for (0: none).
HEADER_HOLDS = "redislock_holds"
#: ``CACHES`` alias of the lock (``None``: the default).
HEADER_USING = "redislock_using"
#: Attempt number of the task id (retries, replacements, reschedules): run-time locks are owned
#: per attempt (see :mod:`django_redislock.singleflight`).
HEADER_ATTEMPT = "redislock_attempt"

#: The message was put off by a rate and spread on its schedule (``Ticket.scheduled``).
HEADER_SCHEDULED = "redislock_scheduled"

HEADERS = (
    HEADER_KEY,
    HEADER_TOKEN,
    HEADER_HOLDS,
    HEADER_USING,
    HEADER_ATTEMPT,
    HEADER_SCHEDULED,
)


def headers_of(request: Any) -> Mapping[str, Any]:
    """Our message headers from a raw header dict, a worker ``Request`` or a task ``Context``."""
    if isinstance(request, Mapping):
        return request
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping) and HEADER_KEY in headers:
        return headers
    # Protocol 2 also sets custom headers as attributes of the request.
    return {name: getattr(request, name, None) for name in HEADERS}


def ticket_headers(ticket: Ticket, using: str | None) -> dict[str, Any]:
    """The headers that carry ``ticket`` in a message."""
    return {
        HEADER_KEY: ticket.key,
        HEADER_TOKEN: ticket.token,
        HEADER_HOLDS: ticket.holds,
        HEADER_USING: using,
        HEADER_ATTEMPT: ticket.attempt,
        HEADER_SCHEDULED: ticket.scheduled,
    }


def ticket_of(headers: Mapping[str, Any], key: str) -> Ticket:
    """The ticket a delivered message carries (none of our headers: no hold, attempt 0)."""
    return Ticket(
        headers.get(HEADER_KEY) or key,
        headers.get(HEADER_TOKEN),
        headers.get(HEADER_HOLDS) or 0,
        headers.get(HEADER_ATTEMPT) or 0,
        bool(headers.get(HEADER_SCHEDULED)),
    )
