"""The per-process state of the package, in one object: :data:`runtime`.

Who "we" are (the process token every owner and attempt id starts with), the one client,
transport and :class:`~django_redislock.targets.Target` per alias, the one wake-up listener per
server, the waiters, the holds and the watchdog. Everything is created on first use under one
mutex, so threads that start together share one client, one pool and one subscription.

Two events reset it: a fork (the child forgets everything of its parent's: its holds, sockets
and threads are not the child's, and it gets a process token of its own) and a change of the
``REDISLOCK`` or ``CACHES`` settings (clients and targets are rebuilt; holds stay). Modules with
per-process state of their own (statistics) register a hook with :meth:`Runtime.on_fork`; this
module is the one place that calls ``os.register_at_fork``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from django.core.signals import setting_changed

from django_redislock import connection, targets
from django_redislock.conf import get_settings
from django_redislock.holds import HoldTable
from django_redislock.keys import KeySpace, namespace_of
from django_redislock.transport import LeanTransport, RedisPyTransport, Transport
from django_redislock.wakeups import Listener, ShardedListener, WaiterRegistry
from django_redislock.watchdog import Watchdog, install_exit_handler

__all__ = [
    "Runtime",
    "get_client",
    "keyspace",
    "register_task_id_provider",
    "runtime",
]

_HOST = socket.gethostname()


class Runtime:
    """Everything this process keeps; see the module docstring."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex[:12]
        self.pid = os.getpid()
        #: Bumped whenever targets are forgotten (fork, settings): faces re-resolve theirs.
        self.generation = 0
        self.holds = HoldTable()
        self.waiters = WaiterRegistry()
        self.watchdog = Watchdog(self.holds)
        self._mutex = threading.RLock()
        self._clients: dict[str, Any] = {}
        self._transports: dict[str, Transport] = {}
        self._keyspaces: dict[str, KeySpace] = {}
        self._targets: dict[str, targets.Target] = {}
        self._listeners: dict[tuple[Any, ...], Listener | ShardedListener] = {}
        self._attempts = itertools.count()
        self._task_numbers: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._task_seq = itertools.count(1)
        self._thread_owners: dict[int, str] = {}
        self._meta: dict[tuple[str, str | None, bool, str | None], str] = {}
        #: Callables returning the id of the task this thread runs (the Celery integration).
        self.task_id_providers: list[Callable[[], str | None]] = []
        self._fork_hooks: list[Callable[[], None]] = []

    # -- identity ------------------------------------------------------------------------------
    def thread_owner(self) -> str:
        """The default owner of the calling (process, thread) pair."""
        ident = threading.get_ident()
        owner = self._thread_owners.get(ident)
        if owner is None:
            if len(self._thread_owners) > 4096:  # threads come and go: keep it bounded
                self._thread_owners.clear()
            owner = self._thread_owners[ident] = f"{self.token}-{ident}"
        return owner

    def task_owner(self, task: asyncio.Task[Any] | None) -> str:
        """The owner of a (process, asyncio task) pair (tasks numbered in a weak map, not by
        ``id()``, which a later task may reuse); the thread's outside a task."""
        if task is None:
            return self.thread_owner()
        number = self._task_numbers.get(task)
        if number is None:
            number = self._task_numbers[task] = next(self._task_seq)
        return f"{self.token}-a{number}"

    def new_attempt_id(self) -> str:
        """An acquisition attempt's id, also its waiter id: ``<process token>.<n>`` (the process
        token names the wake-up channel its process listens on)."""
        return f"{self.token}.{next(self._attempts)}"

    def metadata(
        self, task_id: str | None = None, *, queued: bool = False, stats: str | None = None
    ) -> str:
        """The holder metadata of the caller as compact JSON (cached per thread/task name).

        ``stats``: the statistics row of the lock when it is not the shape of its name (a key
        template), so that a force release by anyone is counted on the holder's row.
        """
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop in this thread
            task = None
        label = f"task:{task.get_name()}" if task is not None else threading.current_thread().name
        ident = (label, task_id or self._current_task_id(), queued, stats)
        meta = self._meta.get(ident)
        if meta is None:
            if len(self._meta) > 1024:
                self._meta.clear()
            fields: dict[str, object] = {
                "host": _HOST,
                "pid": self.pid,
                "thread": ident[0],
                "task_id": ident[1],
            }
            if queued:
                fields["queued"] = True
            if stats is not None:
                fields["stats"] = stats
            meta = self._meta[ident] = json.dumps(fields, separators=(",", ":"))
        return meta

    def _current_task_id(self) -> str | None:
        for provider in self.task_id_providers:
            task_id = provider()
            if task_id:
                return task_id
        return None

    # -- clients and targets -------------------------------------------------------------------
    def client(self, using: str | None = None) -> Any:
        """The redis-py client of an alias: one per process, built on first use."""
        alias = connection.resolve_alias(using)
        client = self._clients.get(alias)
        if client is None:
            with self._mutex:
                client = self._clients.get(alias)
                if client is None:
                    client = self._clients[alias] = connection.build_client(alias)
        return client

    def transport(self, using: str | None = None) -> Transport:
        alias = connection.resolve_alias(using)
        found = self._transports.get(alias)
        if found is None:
            with self._mutex:
                found = self._transports.get(alias)
                if found is None:
                    settings = get_settings()
                    kind = LeanTransport if settings.transport == "lean" else RedisPyTransport
                    found = self._transports[alias] = kind(
                        self.client(alias), functions=settings.functions
                    )
        return found

    def keyspace(self, using: str | None = None) -> KeySpace:
        """Key names of an alias: ``<cache KEY_PREFIX>:<REDISLOCK KEY_PREFIX>`` (or the latter
        alone), with a shared fencing counter off a Cluster."""
        alias = connection.resolve_alias(using)
        space = self._keyspaces.get(alias)
        if space is None:
            namespace = namespace_of(alias)
            try:
                shared = not connection.is_cluster(self.client(alias))
            except Exception:  # not a usable Redis alias: names only (the first use says why)
                return KeySpace(namespace)
            with self._mutex:
                space = self._keyspaces[alias] = KeySpace(namespace, shared_fence=shared)
        return space

    def target(self, using: str | None = None) -> targets.Target:
        """Where a lock of ``using`` lives (``None``: ``REDISLOCK["CACHE"]``, several aliases of
        which make a quorum of independent masters), rebuilt when the settings change."""
        settings = get_settings()
        alias = connection.resolve_alias(using)
        quorum = using is None and not settings.client and len(settings.caches) > 1
        key = "redlock:" + ",".join(settings.caches) if quorum else alias
        found = self._targets.get(key)
        if found is not None and found.settings is settings:
            return found
        with self._mutex:
            found = self._targets.get(key)
            if found is None or found.settings is not settings:
                if quorum:
                    members = [self._single(a, settings) for a in settings.caches]
                    found = targets.quorum_target(key, settings, members)
                else:
                    found = self._single(alias, settings)
                self._targets[key] = found
        return found

    def _single(self, alias: str, settings: Any) -> targets.Target:
        transport = self.transport(alias)
        keys = self.keyspace(alias)
        listener = self._listener(transport, keys.wake_channel_prefix)
        return targets.single_target(alias, settings, transport, keys, listener, self.waiters)

    def _listener(self, transport: Transport, prefix: str) -> Listener | ShardedListener:
        """One listener per process, server and channel prefix, whatever aliases lead there: on
        a Cluster with sharded Pub/Sub, one for its shard channels (a connection per shard)."""
        key = (targets.server_of(transport.client), prefix)
        found = self._listeners.get(key)
        if found is None:
            with self._mutex:
                found = self._listeners.get(key)
                if found is None:
                    timeout = connection.socket_timeout(transport.client)
                    if transport.sharded:
                        found = ShardedListener(transport, self.token, timeout, self.waiters)
                    else:
                        found = Listener(transport, prefix + self.token, timeout, self.waiters)
                    self._listeners[key] = found
        return found

    def listeners(self) -> list[Listener | ShardedListener]:
        """The wake-up listeners of this process (one per server and namespace)."""
        with self._mutex:
            return list(self._listeners.values())

    # -- resets --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget clients, transports and targets (the settings changed); holds stay."""
        with self._mutex:
            self.generation += 1
            for transport in self._transports.values():
                transport.close()
            self._clients = {}
            self._transports = {}
            self._keyspaces = {}
            self._targets = {}

    def on_fork(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` in a forked child, after the runtime reset itself."""
        if hook not in self._fork_hooks:
            self._fork_hooks.append(hook)

    def after_fork(self) -> None:
        self.token = uuid.uuid4().hex[:12]
        self.pid = os.getpid()
        self.generation += 1
        self._mutex = threading.RLock()
        self.holds.clear()
        self.waiters.clear()
        self.watchdog.clear()
        self._clients = {}
        self._transports = {}
        self._keyspaces = {}
        self._targets = {}
        self._listeners = {}
        self._thread_owners = {}
        self._meta = {}
        for hook in self._fork_hooks:
            hook()


runtime = Runtime()
install_exit_handler(runtime.watchdog)

if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=runtime.after_fork)


def _on_setting_changed(*, setting: str, **kwargs: object) -> None:
    if setting in ("REDISLOCK", "CACHES"):
        runtime.reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_redislock.runtime.reset")


def get_client(using: str | None = None) -> Any:
    """The redis-py client the locks of ``using`` use (one per process)."""
    return runtime.client(using)


def keyspace(using: str | None = None) -> KeySpace:
    """The key names of ``using``'s namespace."""
    return runtime.keyspace(using)


def register_task_id_provider(provider: Callable[[], str | None]) -> None:
    """Let locks taken inside a task record its id (shown by ``list_locks`` and the admin)."""
    if provider not in runtime.task_id_providers:
        runtime.task_id_providers.append(provider)
