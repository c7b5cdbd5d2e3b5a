"""``scripts``: each Lua script carries exactly the library definitions it uses, and loads."""

from __future__ import annotations

import re

import pytest

from django_redislock import scripts

ALL = [getattr(scripts, name) for name in scripts.__all__]
SCRIPTS = [s for s in ALL if isinstance(s, scripts.Script)]
LIBRARY = scripts._definitions(scripts._read(scripts._LIBRARY))


def _defined(script: scripts.Script) -> set[str]:
    first_line = script.source.split("\n", 1)[0]
    return set(re.findall(r"local (?:function )?([A-Za-z_]\w*)", first_line)) & {
        name for name, _ in LIBRARY
    }


def _used(code: str) -> set[str]:
    return {name for name, _ in LIBRARY if re.search(rf"\b{name}\b", code)}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.filename)
def test_a_script_carries_what_it_uses_and_nothing_else(script):
    own = scripts._one_line_code(scripts._read(script.filename))
    needed = _used(own)
    while True:  # close over the definitions' own uses
        more = needed | {u for name, body in LIBRARY if name in needed for u in _used(body)}
        if more == needed:
            break
        needed = more
    assert _defined(script) == needed
    assert needed  # every script uses the library


def test_the_renewal_script_is_small():
    """The watchdog runs RENEW for every held lock: it must not pay for the whole library."""
    assert len(_defined(scripts.RENEW)) < len(LIBRARY) // 4


def test_the_library_is_split_into_every_definition():
    names = [name for name, _ in LIBRARY]
    assert len(names) == len(set(names)) > 10
    text = scripts._read(scripts._LIBRARY)
    assert len(re.findall(r"^local ", text, flags=re.M)) == len(names)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.filename)
def test_every_script_compiles_on_a_real_redis_with_its_sha(redis_client, script):
    assert redis_client.script_load(script.source) == script.sha
