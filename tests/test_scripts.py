"""``scripts``: each Lua script carries exactly the library definitions it uses, and loads."""

from __future__ import annotations

import re

import pytest

from django_redislock import scripts

ALL = [getattr(scripts, name) for name in scripts.__all__]
SCRIPTS = [s for s in ALL if isinstance(s, scripts.Script)]
LIBRARY = scripts._definitions(scripts._read(scripts._LIBRARY))


def _defined_on(line: str) -> set[str]:
    return set(re.findall(r"local (?:function )?([A-Za-z_]\w*)", line)) & {
        name for name, _ in LIBRARY
    }


def _defined(script: scripts.Script) -> set[str]:
    """Library definitions on the first line and on the cold mark's line."""
    lines = script.source.split("\n")
    marks = [line for line in lines if scripts.COLD_MARK in line]
    return _defined_on(lines[0]).union(*(_defined_on(line) for line in marks))


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


def _closed(names: set[str]) -> set[str]:
    while True:
        more = names | {u for name, body in LIBRARY if name in names for u in _used(body)}
        if more == names:
            return names
        names = more


@pytest.mark.parametrize("script", [scripts.ACQUIRE, scripts.RELEASE], ids=lambda s: s.filename)
def test_the_fast_path_creates_only_the_closures_it_uses(script):
    """Above the cold mark: the definitions the fast path uses; the rest on the mark's line."""
    text = scripts._read(script.filename)
    lines = text.split("\n")
    cut = next(i for i, line in enumerate(lines) if line.startswith(scripts.COLD_MARK))
    hot = _closed(_used(scripts._one_line_code("\n".join(lines[:cut]))))
    source_lines = script.source.split("\n")
    assert len(source_lines) == len(lines)  # line numbers in errors stay the file's
    assert _defined_on(source_lines[0]) == hot
    assert _defined_on(source_lines[cut]) == _defined(script) - hot
    functions = {name for name in hot if not name.isupper()}  # constants create no closure
    assert len(functions) <= 4 < len(_defined(script)) - len(hot)


def test_at_most_one_cold_mark():
    with pytest.raises(ValueError, match="at most one"):
        scripts._compose("-- x\n-- cold: a\nreturn 1\n-- cold: b\nreturn 2")


def test_a_fast_path_error_names_the_file_and_line(redis_client):
    """The library split over two lines keeps Redis's line numbers those of the script's file."""
    keys = ["{t}:lock", "{t}:fence", "{t}:queue"]
    redis_client.set("{t}:queue", "not a list")
    with pytest.raises(Exception, match=r"acquire\.lua:\d+") as caught:
        scripts.ACQUIRE(redis_client, keys, ["o", 1000, "{}", "", 2000, "", "0", "ns:", "1", "1"])
    found = re.search(r"acquire\.lua:(\d+)", str(caught.value))
    assert found is not None
    # The line of the file that calls LLEN on the queue (the first command to meet the string).
    lines = scripts._read("acquire.lua").split("\n")
    llen = next(i for i, line in enumerate(lines, 1) if "redis.call('LLEN', KEYS[3])" in line)
    assert int(found.group(1)) == llen
