"""The message headers that carry a task's hold from the publisher to the worker.

``apply_async`` takes the key and writes what it took into the message; the worker compares that
with what Redis says when it re-enters the lock, which is how it tells the message that was
published from a second delivery of it. Celery copies custom headers into a ``retry()``, and
:meth:`SingleFlightTask._hand_over` rewrites them for the attempt it publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HEADERS", "HEADER_HOLDS", "HEADER_KEY", "HEADER_TOKEN", "HEADER_USING", "headers_of"]

#: The lock key the publisher took (the worker need not recompute it).
HEADER_KEY = "redislock_key"
#: Fencing token of the publisher's hold (``None`` when the message carries no hold).
HEADER_TOKEN = "redislock_token"
#: How many holds of the task id the message accounts for (0: none).
HEADER_HOLDS = "redislock_holds"
#: ``CACHES`` alias of the lock (``None``: the default).
HEADER_USING = "redislock_using"

HEADERS = (HEADER_KEY, HEADER_TOKEN, HEADER_HOLDS, HEADER_USING)


def headers_of(request: Any) -> Mapping[str, Any]:
    """Our message headers from a raw header dict, a worker ``Request`` or a task ``Context``."""
    if isinstance(request, Mapping):
        return request
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping) and HEADER_KEY in headers:
        return headers
    # Protocol 2 also sets custom headers as attributes of the request.
    return {name: getattr(request, name, None) for name in HEADERS}
