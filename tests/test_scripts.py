"""``scripts``: each Lua script carries exactly the library definitions it uses, and loads."""

from __future__ import annotations

import re

import pytest

from django_redislock import scripts

ALL = [getattr(scripts, name) for name in scripts.__all__]
SCRIPTS = [s for s in ALL if isinstance(s, scripts.Script) and s.command is None]
#: Scripts of one key of their own (rate limiters), which share nothing with the lock scripts.
#: Scripts that need nothing from the library (a rate decision, a latch read).
SELF_CONTAINED = {scripts.RATE, scripts.RATE_RESET, scripts.LATCH_INSPECT}
LIBRARY = scripts._definitions()


def _defined_on(line: str) -> set[str]:
    return set(re.findall(r"local (?:function )?([A-Za-z_]\w*)", line)) & {
        name for name, _ in LIBRARY
    }


def _defined(script: scripts.Script) -> set[str]:
    """Library definitions on the first line (the script's own lines follow unchanged)."""
    return _defined_on(script.source.split("\n")[0])


def _used(code: str) -> set[str]:
    return {name for name, _ in LIBRARY if re.search(rf"\b{name}\b", code)}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.filename)
def test_a_script_carries_what_it_uses_and_nothing_else(script):
    own = scripts._code(scripts._read(script.filename))
    needed = _used(own)
    while True:  # close over the definitions' own uses
        more = needed | {u for name, body in LIBRARY if name in needed for u in _used(body)}
        if more == needed:
            break
        needed = more
    assert _defined(script) == needed
    assert needed or script in SELF_CONTAINED  # every lock script uses the library


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


def test_a_script_error_names_the_file_and_line(redis_client):
    """The library on the first line keeps Redis's line numbers those of the script's file."""
    from django_redislock.transport import RedisPyTransport

    keys = ["{t}:lock", "{t}:fence", "{t}:queue", "{t}:waiters", "{t}:void"]
    redis_client.set("{t}:queue", "not a list")
    args = ["o", 1000, "{}", "p.1", "0", 2000, "0", "ns:", "1", "1"]
    with pytest.raises(Exception, match=r"acquire\.lua:\d+") as caught:
        RedisPyTransport(redis_client).run(scripts.ACQUIRE, keys, args, "test")
    found = re.search(r"acquire\.lua:(\d+)", str(caught.value))
    assert found is not None
    # The line of the file that calls LLEN on the queue (the first command to meet the string).
    lines = scripts._read("acquire.lua").split("\n")
    llen = next(i for i, line in enumerate(lines, 1) if "redis.call('LLEN', KEYS[3])" in line)
    assert int(found.group(1)) == llen
    assert "Redis answered an error while trying to test" in str(caught.value)
