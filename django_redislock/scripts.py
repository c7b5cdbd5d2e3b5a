"""The Lua scripts in ``lua/``: their sources as Redis runs them, their SHA1s, and the Redis
Functions library that holds them all.

They are run by :mod:`django_redislock.transport`: as functions of one library (``FCALL``;
``FUNCTION LOAD`` after "Function not found") where the server has Functions (Redis 7.0+,
Valkey), else with ``EVALSHA`` (loading the source after a ``NOSCRIPT``). A library is part of
the data set (persisted and replicated), so a restarted server or a promoted replica answers
the first call; the script cache is not, and is empty after either.

The shared functions of ``lua/_library.lua`` are prepended to every script *on its first line*
(comments stripped, joined with spaces; each script's own first line is a comment),
so line numbers in Redis error messages are those of the script's own file, and the errors name
that file instead of Redis's ``user_script``. Only the definitions a script uses (directly or
through another definition) are prepended.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources

from redis.exceptions import ResponseError

__all__ = [
    "ACQUIRE",
    "BARRIER_INSPECT",
    "BARRIER_WAIT",
    "CANCEL",
    "DEBOUNCE_CLAIM",
    "DEBOUNCE_GATHER",
    "DEBOUNCE_OVERDUE",
    "DEBOUNCE_POSTPONE",
    "DEBOUNCE_RESCUE",
    "FORCE_RELEASE",
    "INSPECT",
    "LATCH_COUNT_DOWN",
    "LATCH_INSPECT",
    "LATCH_WAIT",
    "LIBRARY",
    "NATIVE_GCRA",
    "RATE",
    "RATE_RESET",
    "RELEASE",
    "RENEW",
    "RENEW_MANY",
    "RW_ACQUIRE",
    "RW_CANCEL",
    "RW_FORCE_RELEASE",
    "RW_INSPECT",
    "RW_RELEASE",
    "RW_RENEW",
    "SEM_ACQUIRE",
    "SEM_CANCEL",
    "SEM_FORCE_RELEASE",
    "SEM_INSPECT",
    "SEM_RELEASE",
    "SEM_RENEW",
    "Command",
    "Library",
    "Script",
]

_LIBRARY = "_library.lua"
_COMMENT = re.compile(r"(^|\s)--.*$")
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text(encoding="utf-8")


def _one_line(source: str) -> str:
    """Lua source without comments, on one line (Lua needs no line breaks between statements)."""
    lines = (_COMMENT.sub("", line).strip() for line in source.splitlines())
    code = " ".join(line for line in lines if line)
    if "--" in code or "[[" in code:  # a comment marker inside a string would end the line
        raise ValueError(f"{_LIBRARY} must not contain '--' or long strings outside comments")
    return code


@functools.cache
def _definitions() -> list[tuple[str, str]]:
    """The library's top-level definitions in order: (name, code on one line).

    Every top-level line of ``_library.lua`` is a comment, a ``local`` definition starting at
    column 0, or part of the definition above it.
    """
    found: list[tuple[str, list[str]]] = []
    for line in _read(_LIBRARY).splitlines():
        match = _DEFINITION.match(line)
        if match:
            found.append((match.group(1), [line]))
        elif found:
            found[-1][1].append(line)
    return [(name, _one_line("\n".join(lines))) for name, lines in found]


def _code(text: str) -> str:
    """A script's code without its comments (names in comments are not uses)."""
    return " ".join(_COMMENT.sub("", line) for line in text.splitlines())


def _needed(text: str) -> set[str]:
    """The names of the library definitions ``text`` uses, transitively."""
    needed: set[str] = set()
    pending = [_code(text)]
    while pending:
        code = pending.pop()
        for name, body in _definitions():
            if name not in needed and re.search(rf"\b{name}\b", code):
                needed.add(name)
                pending.append(body)
    return needed


def compose(text: str) -> str:
    """A script's source as sent to Redis: the library definitions it uses, in the library's
    order, on its first line."""
    needed = _needed(text)
    prelude = " ".join(body for name, body in _definitions() if name in needed)
    return prelude + " " + text


class Script:
    """One Lua script from ``lua/``, with the library definitions it uses on its first line."""

    #: Not a script: the name of a server command run in its place (see :class:`Command`).
    command: str | None = None

    #: The script's function in :data:`LIBRARY` (set when the library is built); "": not in the
    #: library, so it always runs with ``EVALSHA``.
    function: str = ""
    #: Whether the script expires hash fields where the server can (``expire_fields`` in
    #: ``_library.lua``): the transport then appends ``"ttl:1"`` or ``"ttl:0"`` to its arguments.
    field_ttl: bool = False

    def __init__(self, filename: str) -> None:
        self.filename = filename
        text = _read(filename)
        if not text.startswith("--"):
            raise ValueError(f"lua/{filename} must start with its comment header")
        self.source = compose(text)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()
        self.field_ttl = "expire_fields" in _needed(text)

    def __repr__(self) -> str:
        return f"<Script {self.filename} {self.sha[:8]}>"

    def named(self, exc: ResponseError) -> ResponseError:
        """``exc`` with Redis's ``user_script`` (or the library's ``user_function`` and its line
        there) replaced by this script's file name and line."""
        text = str(exc).replace("user_script", self.filename)
        return type(exc)(_FUNCTION_LINE.sub(lambda m: LIBRARY.where(int(m.group(1))), text))


class Command(Script):
    """A server command that takes a script's place where the server has it (``GCRA``): run by
    the same transport, with the same keys-then-arguments call, so it goes through the same
    seam (timeouts, Cluster routing, error naming) as the scripts."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.filename = command
        self.source = ""
        self.sha = ""

    def __repr__(self) -> str:
        return f"<Command {self.command}>"


_FUNCTION_LINE = re.compile(r"user_function:(\d+)")


class Library:
    """Every script as a function of one Redis Functions library (``#!lua name=...``).

    The library's name is ``redislock_`` and a digest of its scripts, and each function is
    named ``<library>_<script file stem>``, so two releases with different scripts load side by
    side on one server (a rolling deploy) and neither replaces the other's functions; an
    unchanged release loads nothing new. Each function's body is its script's source as sent to
    ``EVAL``, starting on the line of its ``register_function`` call, so :meth:`where` maps an
    error's library line back to the script's file and line.
    """

    def __init__(self, scripts: list[Script]) -> None:
        digest = hashlib.sha1("".join(s.sha for s in scripts).encode("ascii")).hexdigest()
        self.name = f"redislock_{digest[:12]}"
        lines = [f"#!lua name={self.name}"]
        self._starts: list[tuple[int, Script]] = []
        for script in scripts:
            script.function = f"{self.name}_{script.filename.removesuffix('.lua')}"
            self._starts.append((len(lines) + 1, script))
            body = script.source.rstrip("\n").split("\n")
            body[0] = f"redis.register_function('{script.function}', function(KEYS, ARGV) {body[0]}"
            lines += [*body, "end)"]
        self.source = "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"<Library {self.name}>"

    def where(self, line: int) -> str:
        """``<file>:<line>`` of the library's line ``line``."""
        found = f"user_function:{line}"
        for start, script in self._starts:
            if start <= line:
                found = f"{script.filename}:{line - start + 1}"
        return found


ACQUIRE = Script("acquire.lua")
RELEASE = Script("release.lua")
CANCEL = Script("cancel.lua")
RENEW = Script("renew.lua")
RENEW_MANY = Script("renew_many.lua")
FORCE_RELEASE = Script("force_release.lua")
INSPECT = Script("inspect.lua")
SEM_ACQUIRE = Script("sem_acquire.lua")
SEM_RELEASE = Script("sem_release.lua")
SEM_CANCEL = Script("sem_cancel.lua")
SEM_RENEW = Script("sem_renew.lua")
SEM_FORCE_RELEASE = Script("sem_force_release.lua")
SEM_INSPECT = Script("sem_inspect.lua")
DEBOUNCE_GATHER = Script("debounce_gather.lua")
DEBOUNCE_CLAIM = Script("debounce_claim.lua")
DEBOUNCE_POSTPONE = Script("debounce_postpone.lua")
DEBOUNCE_OVERDUE = Script("debounce_overdue.lua")
DEBOUNCE_RESCUE = Script("debounce_rescue.lua")
RW_ACQUIRE = Script("rw_acquire.lua")
RW_RELEASE = Script("rw_release.lua")
RW_CANCEL = Script("rw_cancel.lua")
RW_RENEW = Script("rw_renew.lua")
RW_INSPECT = Script("rw_inspect.lua")
RW_FORCE_RELEASE = Script("rw_force_release.lua")
LATCH_COUNT_DOWN = Script("latch_count_down.lua")
LATCH_WAIT = Script("latch_wait.lua")
LATCH_INSPECT = Script("latch_inspect.lua")
BARRIER_WAIT = Script("barrier_wait.lua")
BARRIER_INSPECT = Script("barrier_inspect.lua")
RATE = Script("rate.lua")
RATE_RESET = Script("rate_reset.lua")
#: Redis's own GCRA (where the server has it; see :mod:`django_redislock.ratelimit`).
NATIVE_GCRA = Command("GCRA")

#: Every script above, as one Functions library.
LIBRARY = Library([s for s in globals().values() if type(s) is Script])
