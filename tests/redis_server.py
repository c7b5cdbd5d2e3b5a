"""The test-suite's Redis: ``django_redislock.testing`` plus the one suite-wide server.

``RedisServer``, ``find_redis_server`` and ``free_port`` live in ``django_redislock.testing``
(the demo and the benchmarks use them too); they are re-exported here so that tests keep
importing them from one familiar place.
"""

from __future__ import annotations

import atexit
import os

from django_redislock.testing import RedisServer, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port", "session_server"]

_SESSION: RedisServer | None = None


def session_server() -> str:
    """Return ``redis://host:port`` of the suite-wide server, starting it on first use.

    The URL is exported as ``REDISLOCK_TEST_REDIS_URL`` so that subprocesses (Celery workers,
    ``manage.py`` runs, lock holders) talk to the same server; a URL already in the environment
    (set by a parent test process or by hand) is used as is.
    """
    global _SESSION
    url = os.environ.get("REDISLOCK_TEST_REDIS_URL")
    if url:
        return url
    _SESSION = RedisServer().start()
    atexit.register(_SESSION.close)
    os.environ["REDISLOCK_TEST_REDIS_URL"] = _SESSION.url
    return _SESSION.url
