"""The Lua scripts in ``lua/``, loaded once per server and run with ``EVALSHA``.

Each script is sent as its source only the first time a server sees it: the SHA1 is computed
locally, ``EVALSHA`` is tried first, and a ``NOSCRIPT`` reply (Redis restarted, failed over, or
``SCRIPT FLUSH``) loads the source and retries once. Steady state is one round trip per call.

The shared functions of ``lua/_library.lua`` are prepended to every script *on its first line*
(comments stripped, joined with spaces; the script's own first line is a comment), so line
numbers in Redis error messages are the line numbers of the script's own file, and the errors
name that file instead of Redis's ``user_script``. Only the definitions a script uses (directly
or through another definition) are prepended: Lua creates a closure for every ``local
function`` each time a script runs, so the whole library would cost every call its ~20 closures.

A script whose common case returns early (a free lock taken, the last hold released with nobody
queued) marks the line after that return with a comment starting ``-- cold``. Definitions used
only below the mark are put on that line instead of the first, so Lua creates their closures
only for a call that gets there: the fast path of ``acquire.lua`` and ``release.lua`` runs with
4 and 1 of the 13 definitions they use. Line numbers stay those of the file either way.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

from redis.exceptions import ClusterError, NoScriptError, ResponseError, TryAgainError

__all__ = [
    "ACQUIRE",
    "CANCEL",
    "FORCE_RELEASE",
    "RELEASE",
    "RENEW",
    "RENEW_BATCH",
    "RENEW_MANY",
    "SEM_ACQUIRE",
    "SEM_CANCEL",
    "SEM_FORCE_RELEASE",
    "SEM_INSPECT",
    "SEM_RELEASE",
    "SEM_RENEW",
    "Script",
    "call_and_wait",
    "node_client",
    "renew_many",
    "run_pipeline",
]

_LIBRARY = "_library.lua"
_COMMENT = re.compile(r"(^|\s)--.*$")


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text(encoding="utf-8")


def _one_line(source: str) -> str:
    """Lua source without comments, on one line (Lua needs no line breaks between statements)."""
    lines = (_COMMENT.sub("", line).strip() for line in source.splitlines())
    code = " ".join(line for line in lines if line)
    if "--" in code or "[[" in code:  # a comment marker inside a string would end the line
        raise ValueError(f"{_LIBRARY} must not contain '--' or long strings outside comments")
    return code


_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")


@functools.cache
def _definitions(source: str) -> list[tuple[str, str]]:
    """The library's top-level definitions in order: (name, code on one line).

    Every top-level line of ``_library.lua`` is a comment, a ``local`` definition starting at
    column 0, or part of the definition above it.
    """
    found: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        match = _DEFINITION.match(line)
        if match:
            found.append((match.group(1), [line]))
        elif found:
            found[-1][1].append(line)
    return [(name, _one_line("\n".join(lines))) for name, lines in found]


def _needed(text: str) -> set[str]:
    """The names of the library definitions ``text`` uses, transitively."""
    definitions = _definitions(_read(_LIBRARY))
    needed: set[str] = set()
    pending = [_one_line_code(text)]
    while pending:
        code = pending.pop()
        for name, body in definitions:
            if name not in needed and re.search(rf"\b{name}\b", code):
                needed.add(name)
                pending.append(body)
    return needed


def _prelude(names: set[str]) -> str:
    """The code of the library definitions ``names``, in the library's order."""
    return " ".join(body for name, body in _definitions(_read(_LIBRARY)) if name in names)


#: A script's line starting with this gets the definitions used only below it (module docstring).
COLD_MARK = "-- cold"


def _compose(text: str) -> str:
    """A script's source: its library definitions on its first line, or split at its cold mark."""
    lines = text.split("\n")
    marks = [i for i, line in enumerate(lines) if line.startswith(COLD_MARK)]
    if len(marks) > 1:
        raise ValueError(f"a script has at most one {COLD_MARK!r} line")
    if not marks:
        return _prelude(_needed(text)) + " " + text
    cut = marks[0]
    hot = _needed("\n".join(lines[:cut]))
    cold = _needed("\n".join(lines[cut + 1 :])) - hot
    lines[cut] = _prelude(cold) + " " + lines[cut]
    return _prelude(hot) + " " + "\n".join(lines)


def _one_line_code(text: str) -> str:
    """A script's code without its comments (names in comments are not uses)."""
    return " ".join(_COMMENT.sub("", line) for line in text.splitlines())


class Script:
    """One Lua script from ``lua/``, with the library definitions it uses on its first line."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        text = _read(filename)
        if not text.startswith("--"):
            raise ValueError(f"lua/{filename} must start with its comment header")
        self.source = _compose(text)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.filename} {self.sha[:8]}>"

    def _named(self, exc: ResponseError) -> ResponseError:
        message = str(exc).replace("user_script", self.filename)
        return type(exc)(message)

    def _call(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # execute_command directly: redis-py's evalsha() wrapper (argument deprecation checks)
        # costs a few microseconds per call on the hot path, for the same command.
        try:
            try:
                return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            except NoScriptError:
                client.script_load(self.source)
                return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if isinstance(exc, _MIGRATING):
                raise
            raise self._named(exc) from exc

    async def _acall(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            try:
                return await client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            except NoScriptError:
                await client.script_load(self.source)
                return await client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if isinstance(exc, _MIGRATING):
                raise
            raise self._named(exc) from exc

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script; on a Cluster, retried while its slot is being migrated."""
        try:
            return self._call(client, keys, args)
        except _MIGRATING:
            pass
        for pause in _migration_pauses():
            try:
                return self._call(client, keys, args)
            except _MIGRATING:
                if pause is None:
                    raise
                time.sleep(pause)
        raise AssertionError("unreachable")

    async def acall(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """:meth:`__call__` for a ``redis.asyncio`` client."""
        try:
            return await self._acall(client, keys, args)
        except _MIGRATING:
            pass
        for pause in _migration_pauses():
            try:
                return await self._acall(client, keys, args)
            except _MIGRATING:
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")


#: Answers of a Cluster whose slot is being migrated or failed over (``TRYAGAIN`` for a script
#: whose keys are split between the two nodes, redirect loops, ``CLUSTERDOWN``): they end by
#: themselves within moments, so they are retried rather than reported.
_MIGRATING: tuple[type[Exception], ...] = (TryAgainError, ClusterError)
#: Seconds a script keeps being retried through a slot migration or failover.
MIGRATION_RETRY_BUDGET = 5.0


def _migration_pauses() -> Iterator[float | None]:
    """Pauses between attempts (growing), then ``None``: give up."""
    spent, pause = 0.0, 0.01
    while spent < MIGRATION_RETRY_BUDGET:
        yield pause
        spent += pause
        pause = min(pause * 2, 0.25)
    yield None


def node_client(client: Any, key: str) -> Any:
    """``WAIT`` counts the writes of one connection: on a Cluster, that of the key's node."""
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is None:
        return client
    return client.get_redis_connection(get_node(key))


def _waiting_pipeline(
    node: Any,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Any],
    replicas: int,
    timeout_ms: int,
) -> Any:
    pipe = node.pipeline(transaction=False)
    pipe.evalsha(script.sha, len(keys), *keys, *args)
    pipe.execute_command("WAIT", replicas, timeout_ms)
    return pipe


def _waited(script: Script, values: Sequence[Any]) -> tuple[Any, int]:
    reply, acked = values
    if isinstance(reply, ResponseError):
        raise script._named(reply) from reply
    if isinstance(acked, Exception):
        raise acked
    return reply, int(acked)


def call_and_wait(
    script: Script,
    client: Any,
    keys: Sequence[str],
    args: Sequence[Any],
    replicas: int,
    timeout_ms: int,
) -> tuple[Any, int]:
    """Run ``script`` and ``WAIT replicas timeout_ms`` on the same connection (one round trip):
    ``(reply, replicas that acknowledged the write)``."""
    node = node_client(client, keys[0])
    pipe = _waiting_pipeline(node, script, keys, args, replicas, timeout_ms)
    values = pipe.execute(raise_on_error=False)
    if isinstance(values[0], NoScriptError):
        node.script_load(script.source)
        pipe = _waiting_pipeline(node, script, keys, args, replicas, timeout_ms)
        values = pipe.execute(raise_on_error=False)
    return _waited(script, values)


def run_pipeline(
    client: Any,
    script: Script,
    calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
    *,
    wait_replicas: tuple[int, int] = (0, 0),
) -> list[Any]:
    """Run many calls of one script in a single round trip.

    Results are returned in order; a failed call's result is its exception (never raised here, so
    one bad key cannot hide the others). A ``NOSCRIPT`` answer reloads the script and retries once.
    With ``wait_replicas=(n, timeout_ms)`` a ``WAIT`` ends the pipeline; if fewer than ``n``
    replicas acknowledged, every result becomes a :class:`ResponseError` saying so (the writes
    happened on the primary, but do not count).
    """
    replicas, timeout_ms = wait_replicas
    results: list[Any] = []
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        if replicas:
            pipe.execute_command("WAIT", replicas, timeout_ms)
        results = pipe.execute(raise_on_error=False)
        if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
            client.script_load(script.source)
            continue
        break
    if replicas:
        acked = results.pop()
        if isinstance(acked, Exception) or int(acked) < replicas:
            error = ResponseError(f"only {acked} of {replicas} replicas acknowledged in time")
            results = [r if isinstance(r, Exception) else error for r in results]
    return results


#: Locks per ``RENEW_MANY`` call: a script blocks Redis while it runs (~0.3 µs per lock), so a
#: watchdog renewing 10,000 locks sends 20 calls of a few hundred µs each, in one round trip.
RENEW_BATCH = 500


def renew_many(client: Any, calls: Sequence[tuple[str, str, int]]) -> list[Any]:
    """Reset the leases of many locks of one standalone Redis in one round trip (the watchdog).

    ``calls`` are ``(lock key, owner, milliseconds)``. Results in order: ``1`` renewed, ``0`` no
    longer held by that owner, or the exception of the batch it was in. A script per lock in a
    pipeline costs the client its packing and parsing per lock; one script per batch costs a
    fraction. A batch shares one lease (sent once), so calls are batched per lease: most
    processes use one. Not for a Cluster (one script may touch one slot only).
    """
    by_lease: dict[int, list[int]] = {}  # lease -> indexes into calls
    for index, (_, _, ms) in enumerate(calls):
        by_lease.setdefault(ms, []).append(index)
    batches = [
        (ms, indexes[i : i + RENEW_BATCH])
        for ms, indexes in by_lease.items()
        for i in range(0, len(indexes), RENEW_BATCH)
    ]
    replies = run_pipeline(
        client,
        RENEW_MANY,
        [
            ([calls[i][0] for i in batch], [ms, *[calls[i][1] for i in batch]])
            for ms, batch in batches
        ],
    )
    results: list[Any] = [None] * len(calls)
    for (_, batch), reply in zip(batches, replies, strict=True):
        failed = isinstance(reply, Exception)
        for position, index in enumerate(batch):
            results[index] = reply if failed else reply[position]
    return results


ACQUIRE = Script("acquire.lua")
RELEASE = Script("release.lua")
RENEW = Script("renew.lua")
RENEW_MANY = Script("renew_many.lua")
CANCEL = Script("cancel.lua")
FORCE_RELEASE = Script("force_release.lua")
SEM_ACQUIRE = Script("sem_acquire.lua")
SEM_RELEASE = Script("sem_release.lua")
SEM_RENEW = Script("sem_renew.lua")
SEM_CANCEL = Script("sem_cancel.lua")
SEM_FORCE_RELEASE = Script("sem_force_release.lua")
SEM_INSPECT = Script("sem_inspect.lua")
