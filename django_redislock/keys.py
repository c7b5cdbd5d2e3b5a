"""The key layout: every Redis key the package writes, built in one place.

Every key of one lock carries the lock name as its Redis Cluster hash tag (``{name}``), so each
script touches a single slot (on a single Redis the fencing counter is one key per namespace
instead, see :attr:`KeySpace.shared_fence`).

Redis takes the hash tag from the first ``{`` to the first ``}`` after it, so a name containing
braces would break the tag: the tag is the name with ``%``, ``{`` and ``}`` percent-encoded
(``a{b}`` -> ``{a%7Bb%7D}``). The encoding is reversible, so listings show the name as given, and
plain names (the usual case) appear in keys unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django_redislock.conf import get_settings

__all__ = ["KeySpace", "escape_glob", "namespace_of", "tag_of"]

_GLOB_SPECIALS = "\\*?[]"
_TAG_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}


def escape_glob(text: str) -> str:
    """Escape Redis glob characters so ``text`` only ever matches itself."""
    return "".join("\\" + c if c in _GLOB_SPECIALS else c for c in text)


def tag_of(name: str) -> str:
    """The hash tag of a lock name: the name with ``%``, ``{`` and ``}`` percent-encoded."""
    if "%" not in name and "{" not in name and "}" not in name:
        return name
    return "".join(_TAG_ESCAPES.get(c, c) for c in name)


#: The kinds of holder keys :meth:`KeySpace.kind_of` tells apart, and their type segments.
_SEGMENTS = {
    "lock": "lock",
    "semaphore": "sem",
    "rate": "rate",
    "rwlock": "rw",
    # A read-write lock's readers: listed as kind "rwlock" too (LockInfo.mode "read").
    "rwlock-readers": "rwr",
    "latch": "latch",
    "barrier": "barrier",
}

_TAG_UNESCAPE = re.compile("%(25|7B|7D)")
_TAG_UNESCAPES = {"25": "%", "7B": "{", "7D": "}"}


def name_of_tag(tag: str) -> str:
    """Inverse of :func:`tag_of`."""
    if "%" not in tag:
        return tag
    return _TAG_UNESCAPE.sub(lambda m: _TAG_UNESCAPES[m.group(1)], tag)


@dataclass(frozen=True)
class KeySpace:
    """Key names of one namespace.

    The type segment (``lock``, ``fence`` ...) comes *before* the hash tag so it cannot change the
    slot; the namespace is validated to contain no braces (check E005).
    """

    namespace: str
    #: One fencing counter for the whole namespace instead of one per name. Tokens then increase
    #: across all names, so also per name (the guarantee), and a held lock or a name used once
    #: costs no counter key of its own. Only where a script may touch keys of several slots: on
    #: a Redis Cluster every key of a script must share the lock's slot, so there the counter is
    #: per name (``<ns>:fence:{name}``). Chosen by :func:`keyspace` from the alias's client.
    shared_fence: bool = False

    def lock(self, name: str) -> str:
        return f"{self.namespace}:lock:{{{tag_of(name)}}}"

    def fence(self, name: str) -> str:
        if self.shared_fence:
            return f"{self.namespace}:fence"
        return f"{self.namespace}:fence:{{{tag_of(name)}}}"

    def queue(self, name: str) -> str:
        return f"{self.namespace}:queue:{{{tag_of(name)}}}"

    def semaphore(self, name: str) -> str:
        return f"{self.namespace}:sem:{{{tag_of(name)}}}"

    def semaphore_records(self, name: str) -> str:
        return f"{self.namespace}:semrec:{{{tag_of(name)}}}"

    def semaphore_queue(self, name: str) -> str:
        return f"{self.namespace}:semq:{{{tag_of(name)}}}"

    def rw_write(self, name: str) -> str:
        """A read-write lock's writer record (the holder key of its write side)."""
        return f"{self.namespace}:rw:{{{tag_of(name)}}}"

    def rw_readers(self, name: str) -> str:
        """A read-write lock's readers: owner -> the end of that reader's lease."""
        return f"{self.namespace}:rwr:{{{tag_of(name)}}}"

    def rw_records(self, name: str) -> str:
        return f"{self.namespace}:rwrec:{{{tag_of(name)}}}"

    def rw_queue(self, name: str) -> str:
        return f"{self.namespace}:rwq:{{{tag_of(name)}}}"

    def rw_waiters(self, name: str) -> str:
        return f"{self.namespace}:rwwait:{{{tag_of(name)}}}"

    def rate(self, name: str) -> str:
        """A rate limiter's state (GCRA's theoretical arrival time), expiring when rested."""
        return f"{self.namespace}:rate:{{{tag_of(name)}}}"

    def rate_schedule(self, name: str) -> str:
        """Where the runs a rate limiter turned away are spaced out (see
        :meth:`django_redislock.ratelimit.RateLimiter.schedule`); not listed."""
        return f"{self.namespace}:ratesched:{{{tag_of(name)}}}"

    def waiters(self, name: str) -> str:
        """Hash of a lock's queue entries (waiter id -> expiry, owner, lease, metadata)."""
        return f"{self.namespace}:waiters:{{{tag_of(name)}}}"

    def semaphore_waiters(self, name: str) -> str:
        return f"{self.namespace}:semw:{{{tag_of(name)}}}"

    def void(self, name: str, attempt: str) -> str:
        """Marks an attempt cancelled for a while: its delayed request changes nothing."""
        return f"{self.namespace}:void:{{{tag_of(name)}}}:{attempt}"

    def debounce(self, task: str, key: str) -> str:
        """Hash of the pending burst of a debounced task's lock key (``lock_mode="debounce"``).

        Tagged by the *task* name, not the lock key, so a task's bursts and their index
        (:meth:`debounce_index`) share one Cluster slot and one script can touch both."""
        return f"{self.namespace}:debounce:{{{tag_of(task)}}}:{key}"

    def debounce_index(self, task: str) -> str:
        """Sorted set of a debounced task's pending bursts: lock key -> when its run is due."""
        return f"{self.namespace}:debounce-due:{{{tag_of(task)}}}"

    @property
    def wake_channel_prefix(self) -> str:
        """Channels (not keys) a waiter's process listens on: this + its process token."""
        return f"{self.namespace}:wake:"

    def shard_wake_prefix(self, name: str) -> str:
        """On a Cluster with sharded Pub/Sub, the shard channels of ``name``'s waiters: this +
        the process token. The name's hash tag puts them in the slot of its keys, the only
        shard channels a script on those keys may ``SPUBLISH`` to."""
        return f"{self.namespace}:wake:{{{tag_of(name)}}}:"

    def beat_state(self, lease_name: str) -> str:
        """Hash of the last run of each schedule entry of the beats sharing a leader lease."""
        return f"{self.namespace}:beat:{{{tag_of(lease_name)}}}"

    def stats(self, stats_name: str) -> str:
        return f"{self.namespace}:stats:{stats_name}"

    def stats_max(self, stats_name: str) -> str:
        # Not "<ns>:stats:..." so that a SCAN for stats hashes never meets it.
        return f"{self.namespace}:stats-max:{stats_name}"

    def stats_minutes(self, stats_name: str, hour: int) -> str:
        """Per-minute counts of one clock hour (``hour`` = epoch seconds // 3600)."""
        return f"{self.namespace}:stats-minutes:{hour}:{stats_name}"

    def lock_pattern(self, match: str | None = None) -> str:
        """SCAN pattern for lock keys; ``match`` is a glob on the lock *name* only.

        The namespace is escaped, so neither it nor the user's glob can reach keys outside
        ``<namespace>:lock:{...}``. Braces and ``%`` in the glob are encoded like names are.
        """
        glob = "*" if not match else "".join(_TAG_ESCAPES.get(c, c) for c in match)
        return f"{escape_glob(self.namespace)}:lock:{{{glob}}}"

    def holder_pattern(self, match: str | None = None) -> str:
        """SCAN pattern for the keys of every kind (``lock:``, ``sem:``, ``rate:``, ``rw:``,
        ``rwr:``, ``latch:``, ``barrier:``; it also matches ``semrec:``, ``rwq:``, ``beat:`` and
        the like, which :meth:`kind_of` sorts out)."""
        glob = "*" if not match else "".join(_TAG_ESCAPES.get(c, c) for c in match)
        return f"{escape_glob(self.namespace)}:[blrs][oeaw]*:{{{glob}}}"

    @property
    def namespace_pattern(self) -> str:
        """SCAN pattern for every key of this namespace (locks, fences, queues, semaphores,
        statistics, beat state), and nothing outside it: the namespace is escaped."""
        return f"{escape_glob(self.namespace)}:*"

    def kind_of(self, key: str) -> str | None:
        """``"lock"``, ``"semaphore"``, ``"rate"``, ``"rwlock"`` (the writer),
        ``"rwlock-readers"``, ``"latch"`` or ``"barrier"`` for such a key of this namespace,
        else ``None``."""
        for kind, segment in _SEGMENTS.items():
            if key.startswith(f"{self.namespace}:{segment}:{{") and key.endswith("}"):
                return kind
        return None

    def name_of(self, key: str) -> str:
        """The lock name of a lock or semaphore key of this namespace (``ValueError`` else)."""
        kind = self.kind_of(key)
        if kind is None:
            raise ValueError(f"{key!r} is not a lock key of namespace {self.namespace!r}")
        head = f"{self.namespace}:{_SEGMENTS[kind]}:{{"
        return name_of_tag(key[len(head) : -1])


def cache_key_prefix(alias: str) -> str:
    """The ``KEY_PREFIX`` of a ``CACHES`` entry ("" when unset)."""
    from django.conf import settings

    caches: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {})
    config = caches.get(alias) or {}
    return str(config.get("KEY_PREFIX") or "")


def namespace_of(alias: str) -> str:
    """The namespace of an alias: ``<cache KEY_PREFIX>:<REDISLOCK KEY_PREFIX>`` (or the latter
    alone): two sites sharing one Redis database with different cache prefixes never see each
    other's locks."""
    own = get_settings().key_prefix
    site = cache_key_prefix(alias)
    return f"{site}:{own}" if site else own
