"""The Lua scripts in ``lua/``, loaded once per process and run with ``EVALSHA``.

Each script is sent as its source only the first time a server sees it: the SHA1 is computed
locally, ``EVALSHA`` is tried first, and a ``NOSCRIPT`` reply (Redis restarted, failed over, or
``SCRIPT FLUSH``) loads the source and retries once. Steady state is one round trip per call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError

__all__ = ["ACQUIRE", "CANCEL", "FORCE_RELEASE", "RELEASE", "RENEW", "Script"]

_PRELUDE = "_record.lua"


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text(encoding="utf-8")


class Script:
    """One Lua script from ``lua/``, with the shared helpers of ``_record.lua`` prepended."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.source = _read(_PRELUDE) + "\n" + _read(filename)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.filename} {self.sha[:8]}>"

    def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Pipeline, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add a call to a pipeline; see :func:`run_pipeline` for the NOSCRIPT retry."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def load(self, client: Redis) -> None:
        client.script_load(self.source)


def run_pipeline(
    client: Redis, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """Run many calls of one script in a single round trip.

    Results are returned in order; a failed call's result is its exception (never raised here, so
    one bad key cannot hide the others). A ``NOSCRIPT`` answer reloads the script and retries once.
    """
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            script.queue(pipe, keys, args)
        results: list[Any] = pipe.execute(raise_on_error=False)
        if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
            script.load(client)
            continue
        return results
    raise AssertionError("unreachable")


ACQUIRE = Script("acquire.lua")
RELEASE = Script("release.lua")
RENEW = Script("renew.lua")
CANCEL = Script("cancel.lua")
FORCE_RELEASE = Script("force_release.lua")
