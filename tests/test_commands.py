"""``manage.py redislock`` and ``LockedCommand``, run in-process AND as real subprocesses."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from io import StringIO
from typing import TypedDict

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redislock import Lock, force_release, get_lock_info, operations, stats
from django_redislock.management.base import LockedCommand
from django_redislock.management.commands import redislock as redislock_command
from django_redislock.runtime import keyspace
from tests.conftest import ROOT, hold, subprocess_env, wait_for
from tests.redis_server import free_port

GARBAGE = b"\xff\xfe garbage"


def manage(*args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGS --settings tests.settings`` in a fresh process, same Redis."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings", "tests.settings"],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_manage(*args: str, **env: str) -> subprocess.Popen[str]:
    """``manage`` without waiting: the caller reads its output as it comes."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args, "--settings", "tests.settings"],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class DeadRedisEnv(TypedDict):
    REDISLOCK_TEST_REDIS_URL: str


def dead_redis() -> DeadRedisEnv:  # a TypedDict: `manage(**env)` cannot pass `timeout`
    """Environment for a child whose Redis is a closed loopback port."""
    return {"REDISLOCK_TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}"}


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command reported; fails on a traceback or a zero exit.

    Anything else on stderr must be a log record of the package (tests/settings.py logs WARNING
    to the console), e.g. the watchdog saying it could not renew.
    """
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("CommandError: ")]
    assert len(errors) == 1, result.stderr
    assert all(line in errors or line.startswith("django_redislock") for line in lines), lines
    return errors[0]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


# -- list ---------------------------------------------------------------------------------------


def test_list_shows_a_lock_held_by_another_process(holders):
    info = hold(holders, "report:daily")
    out = run("redislock", "list")
    [line] = out.splitlines()
    assert line.startswith("report:daily\t")
    assert f"token={info['token']}" in line
    assert f":{info['pid']}:" in line


def test_list_json_is_one_object_per_line_with_the_lockinfo_fields(holders):
    first = hold(holders, "sync:1")
    hold(holders, "sync:2")
    lines = run("redislock", "list", "--json").splitlines()
    objects = {o["name"]: o for o in map(json.loads, lines)}
    assert set(objects) == {"sync:1", "sync:2"}
    one = objects["sync:1"]
    assert one["fencing_token"] == first["token"]
    assert one["pid"] == first["pid"]
    assert one["hold_count"] == 1
    assert one["task_id"] is None
    assert 0 < one["expires_in"] <= 10
    assert set(one) >= {"owner", "host", "thread", "acquired_at"}


def test_list_match_is_a_glob_on_the_name(holders):
    with Lock("invoice:1"), Lock("invoice:2"), Lock("report:1"):
        out = run("redislock", "list", "--match", "invoice:*")
    assert sorted(line.split("\t")[0] for line in out.splitlines()) == ["invoice:1", "invoice:2"]


def test_list_of_nothing_says_so_in_text_and_prints_nothing_in_json():
    assert run("redislock", "list") == "No lock is held.\n"
    assert run("redislock", "list", "--match", "job:*") == "No lock matching 'job:*' is held.\n"
    assert run("redislock", "list", "--json") == ""


def test_list_sorted(holders):
    for name, timeout in (("b", 30), ("a", 10), ("c", 20)):
        assert Lock(name, timeout=timeout, auto_renew=False).acquire(blocking=False)
    names = {
        sort: [
            line.split("\t")[0] for line in run("redislock", "list", f"--sort={sort}").splitlines()
        ]
        for sort in ("name", "-name", "expires")
    }
    assert names == {"name": ["a", "b", "c"], "-name": ["c", "b", "a"], "expires": ["a", "c", "b"]}


def test_list_pages_through_many_locks(redis_client):
    pipe = redis_client.pipeline()
    for i in range(1234):
        pipe.set(keyspace().lock(f"bulk:{i}"), '{"o":"x","n":1,"t":1,"at":0,"m":{}}', px=60_000)
    pipe.execute()
    lines = run("redislock", "list", "--json").splitlines()
    assert sorted(json.loads(line)["name"] for line in lines) == sorted(
        f"bulk:{i}" for i in range(1234)
    )


def test_list_shows_the_worker_and_task_or_who_queued_it():
    Lock("run", timeout=30, auto_renew=False, task_id="task-run").acquire()
    Lock("wait", timeout=30, auto_renew=False, task_id="task-wait", queued=True).acquire()
    run_info, wait_info = get_lock_info("run"), get_lock_info("wait")
    assert run_info is not None and wait_info is not None
    lines = {line.split("\t")[0]: line for line in run("redislock", "list").splitlines()}
    assert lines["run"].endswith(
        f"owner={run_info.host}:{run_info.pid}:{run_info.thread} task=task-run"
    )
    assert lines["wait"].endswith(
        f"owner=queued, published by {wait_info.host}:{wait_info.pid} task=task-wait"
    )
    queued = {
        json.loads(line)["name"]: json.loads(line)["queued"]
        for line in run("redislock", "list", "--json").splitlines()
    }
    assert queued == {"run": False, "wait": True}


@pytest.mark.slow
@pytest.mark.parametrize("ttl_ms", [60_000, None], ids=["with-ttl", "without-ttl"])
@pytest.mark.slow
def test_list_shows_an_unreadable_value_in_text_and_json(redis_client, ttl_ms):
    Lock("fine", timeout=30, auto_renew=False).acquire()
    redis_client.set(keyspace().lock("broken"), GARBAGE, px=ttl_ms)
    text = manage("redislock", "list")
    assert text.returncode == 0, text.stderr
    lines = {line.split("\t")[0]: line for line in text.stdout.splitlines()}
    assert set(lines) == {"fine", "broken"}
    expires = "never" if ttl_ms is None else "5"  # 59.x s
    assert lines["broken"].startswith(f"broken\tunreadable\texpires_in={expires}")
    assert lines["broken"].endswith("\tvalue='\ufffd\ufffd garbage'")
    as_json = manage("redislock", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    broken = next(o for o in map(json.loads, as_json.stdout.splitlines()) if o["name"] == "broken")
    assert broken["unreadable"] is True and broken["raw_excerpt"] == "\ufffd\ufffd garbage"
    assert broken["fencing_token"] == 0 and broken["owner"] == ""
    assert (broken["expires_in"] is None) == (ttl_ms is None)


@pytest.mark.slow
def test_list_in_a_subprocess_sees_the_holders_lock(holders):
    info = hold(holders, "nightly")
    result = manage("redislock", "list", "--json")
    assert result.returncode == 0, result.stderr
    [obj] = [json.loads(line) for line in result.stdout.splitlines()]
    assert (obj["name"], obj["fencing_token"], obj["pid"]) == (
        "nightly",
        info["token"],
        info["pid"],
    )


def test_list_follows_using(holders):
    with Lock("on-default"), Lock("on-site2", using="site2"):
        out = run("redislock", "list", "--using", "site2")
    assert [line.split("\t")[0] for line in out.splitlines()] == ["on-site2"]


def test_unknown_cache_alias_is_a_clear_error():
    with pytest.raises(CommandError, match="no alias 'nope'"):
        run("redislock", "list", "--using", "nope")


# -- release ------------------------------------------------------------------------------------


def test_release_frees_a_lock_held_by_another_process(holders):
    info = hold(holders, "stuck")
    out = run("redislock", "release", "stuck")
    assert out.startswith("Released lock 'stuck' (was held by ")
    assert f" pid {info['pid']} thread MainThread, fencing token {info['token']})." in out
    assert get_lock_info("stuck") is None


def test_release_reports_the_holder_it_released_even_when_the_lock_changes_hands(monkeypatch):
    first = Lock("job", owner="first", timeout=30, auto_renew=False)
    second = Lock("job", owner="second", timeout=30, auto_renew=False)
    assert first.acquire()
    real = operations.get_lock_info

    def read_then_hand_over(name, **kwargs):  # another holder gets in right after any read
        info = real(name, **kwargs)
        if first.owned():
            first.release()
            assert second.acquire(blocking=False)
        return info

    monkeypatch.setattr(operations, "get_lock_info", read_then_hand_over)
    monkeypatch.setattr(redislock_command, "get_lock_info", read_then_hand_over, raising=False)
    out = run("redislock", "release", "job")
    assert get_lock_info("job") is None
    released = second if second.fencing_token is not None else first
    assert f"fencing token {released.fencing_token})." in out


@pytest.mark.slow
@pytest.mark.slow
def test_release_of_an_unreadable_value_in_a_subprocess(redis_client):
    redis_client.set(keyspace().lock("broken"), GARBAGE)
    result = manage("redislock", "release", "broken")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "Released lock 'broken' (was held by nobody: the value is not a lock record"
    )
    assert not redis_client.exists(keyspace().lock("broken"))


def test_release_with_the_current_token_frees_the_lock(holders):
    info = hold(holders, "stuck")
    run("redislock", "release", "stuck", "--token", str(info["token"]))
    assert get_lock_info("stuck") is None


def test_release_with_a_stale_token_changes_nothing_and_fails(holders):
    info = hold(holders, "stuck")
    stale = int(info["token"]) + 1  # type: ignore[call-overload]
    with pytest.raises(CommandError, match="changed hands"):
        run("redislock", "release", "stuck", "--token", str(stale))
    current = get_lock_info("stuck")
    assert current is not None and current.fencing_token == info["token"]


def test_release_of_a_free_lock_fails():
    with pytest.raises(CommandError, match="no lock named 'ghost'"):
        run("redislock", "release", "ghost")


@pytest.mark.slow
def test_release_exit_codes_in_a_subprocess(holders):
    info = hold(holders, "stuck")
    missing = manage("redislock", "release", "ghost")
    assert missing.returncode == 1
    assert "Nothing released" in missing.stderr
    done = manage("redislock", "release", "stuck", "--token", str(info["token"]))
    assert done.returncode == 0, done.stderr
    assert "Released lock 'stuck'" in done.stdout
    assert get_lock_info("stuck") is None


@pytest.mark.parametrize("token", ["abc", "0", "-3"])
def test_release_rejects_a_bad_token(token):
    with pytest.raises(CommandError, match="--token"):
        run("redislock", "release", "x", f"--token={token}")


@pytest.mark.slow
def test_bad_token_in_a_subprocess_is_a_usage_error(holders):
    hold(holders, "stuck")
    result = manage("redislock", "release", "stuck", "--token", "abc")
    assert result.returncode == 2
    assert "--token" in result.stderr and "abc" in result.stderr
    assert get_lock_info("stuck") is not None


def test_missing_subcommand_is_a_usage_error():
    with pytest.raises(CommandError):
        run("redislock")


# -- stats --------------------------------------------------------------------------------------


def test_stats_json_reports_recorded_figures():
    stats.connect_receivers()
    for _ in range(3):
        with Lock("stats-cmd"):
            pass
    out = run("redislock", "stats", "stats-cmd", "--json")
    [obj] = [json.loads(line) for line in out.splitlines()]
    assert obj["name"] == "stats-cmd"
    assert obj["acquired"] == 3 and obj["released"] == 3
    assert obj["success_rate"] == 1.0


def test_stats_for_an_unknown_name_fails():
    with pytest.raises(CommandError, match="No statistics"):
        run("redislock", "stats", "never-used")


# -- LockedCommand ------------------------------------------------------------------------------


@pytest.fixture
def running_guarded() -> Iterator[subprocess.Popen[str]]:
    """``manage.py slow_guarded --seconds 20`` in a subprocess, once it holds its lock."""
    proc = start_manage("slow_guarded", "--seconds", "20")
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "started", proc.stderr.read() if proc.stderr else ""
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def test_locked_command_runs_and_releases_its_lock():
    assert run("slow_guarded").splitlines() == ["started", "done"]
    assert get_lock_info("command:slow_guarded") is None


@pytest.mark.slow
def test_second_run_of_a_locked_command_is_refused(running_guarded):
    with pytest.raises(CommandError, match="already running") as excinfo:
        run("slow_guarded")
    assert excinfo.value.returncode == 1
    assert f"pid {running_guarded.pid}" in str(excinfo.value)


@pytest.mark.slow
def test_skip_if_locked_says_why_and_exits_zero(running_guarded):
    out = run("slow_guarded", "--skip-if-locked")
    assert out.startswith(
        "Skipped: slow_guarded is already running: lock 'command:slow_guarded' is busy (held by "
    )
    assert f" pid {running_guarded.pid} thread MainThread, fencing token " in out
    assert "started" not in out
    assert run("slow_guarded", "--skip-if-locked", "--verbosity", "0") == ""


def test_a_busy_guard_escapes_the_holder_it_names():
    """A thread name or task id with control characters cannot forge lines in the message."""
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with Lock("command:slow_guarded", timeout=10):
            held.set()
            done.wait(10)

    thread = threading.Thread(target=holder, name="evil\nSkipped: forged\tline")
    thread.start()
    try:
        assert held.wait(10)
        out = run("quiet_guarded")
    finally:
        done.set()
        thread.join(10)
    assert out.count("\n") <= 1 and "\t" not in out
    assert "thread evil\\nSkipped: forged\\tline, fencing token " in out


@pytest.mark.slow
def test_lock_on_busy_skip_says_why_without_the_flag(running_guarded):
    out = run("quiet_guarded")
    assert out.startswith("Skipped: quiet_guarded is already running: lock 'command:slow_guarded'")
    assert "ran" not in out.split()
    assert run("quiet_guarded", "-v", "0") == ""


@pytest.mark.slow
def test_second_run_in_a_subprocess_exits_non_zero_then_zero_with_skip(running_guarded):
    refused = manage("slow_guarded")
    assert refused.returncode == 1
    assert "already running" in refused.stderr
    assert "started" not in refused.stdout
    skipped = manage("slow_guarded", "--skip-if-locked")
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.startswith("Skipped: slow_guarded is already running")
    assert skipped.stderr == ""
    silent = manage("quiet_guarded", "-v", "0")
    assert (silent.returncode, silent.stdout, silent.stderr) == (0, "", "")


@pytest.mark.slow
@pytest.mark.slow
def test_lock_is_free_again_once_the_first_run_ends():
    proc = start_manage("slow_guarded", "--seconds", "0.5")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.split() == ["started", "done"]
    assert get_lock_info("command:slow_guarded") is None  # released before the process exited
    assert run("slow_guarded").split() == ["started", "done"]


def test_lock_key_template_over_options(holders):
    hold(holders, "import:a")
    with pytest.raises(CommandError, match="'import:a' is busy"):
        run("guarded_import", "a")
    assert run("guarded_import", "b").startswith("imported b under token ")


def test_a_bad_lock_key_template_fails_when_the_class_is_defined():
    with pytest.raises(ValueError, match="nope"):

        class Command(LockedCommand):
            lock_key = "x:{nope}"

            def handle(self, *args, **options):
                return None


@pytest.mark.parametrize(
    "args, message",
    [
        (("release",), "needs the NAME"),
        (("list", "x"), "does not take NAME"),
        (("list", "--token", "3"), "does not take --token"),
        (("release", "x", "--match", "a*"), "does not take --match"),
    ],
)
def test_misplaced_arguments_are_usage_errors(args, message):
    with pytest.raises(CommandError, match=message) as excinfo:
        run("redislock", *args)
    assert excinfo.value.returncode == 2


# -- failures end in one line, never a traceback ---------------------------------------------------


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "started":
        proc.kill()
        raise AssertionError(f"did not start: {line!r} {proc.communicate()[1]}")


@pytest.mark.slow
def test_a_lock_lost_while_a_locked_command_runs_is_one_line_and_exit_1():
    proc = start_manage("slow_guarded", "--seconds", "1")
    try:
        started(proc)
        assert force_release("command:slow_guarded")
        result = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    line = error_line(result)
    assert line.startswith(
        "CommandError: slow_guarded: Lock 'command:slow_guarded' was lost while the protected "
        "block ran: its key expired unrenewed, was force-released, or was deleted with its "
        "database (cache.clear() or FLUSHDB"
    )
    assert line.endswith("Check the work this run did before trusting it.")
    assert "done" in result.stdout  # the body ran to its end; only its outcome is suspect


@pytest.mark.slow
@pytest.mark.slow
def test_redis_down_before_a_locked_command_starts_is_one_line_and_exit_1():
    env = dead_redis()
    result = manage("slow_guarded", **env)
    line = error_line(result)
    assert line.startswith(
        "CommandError: slow_guarded: Redis is unreachable (cache 'default' at "
        f"{env['REDISLOCK_TEST_REDIS_URL']}/0): "
    )
    assert line.endswith(
        "Check that the Redis server is running and reachable from this machine, "
        "and CACHES['default']['LOCATION']."
    )
    assert "started" not in result.stdout  # never runs without the lock
    assert result.stderr.strip() == line  # nothing else on stderr


@pytest.mark.slow
@pytest.mark.slow
def test_redis_going_down_while_a_locked_command_runs_is_one_line_and_exit_1(redis_factory):
    server = redis_factory().start()
    proc = start_manage("slow_guarded", "--seconds", "1", REDISLOCK_TEST_REDIS_URL=server.url)
    try:
        started(proc)
        server.stop()
        result = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    line = error_line(result)
    assert line.startswith(
        f"CommandError: slow_guarded: Redis is unreachable (cache 'default' at {server.url}/0): "
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [("list",), ("list", "--json"), ("release", "job"), ("stats",)], ids=" ".join
)
@pytest.mark.slow
def test_redislock_with_redis_down_is_one_line_and_exit_1(args):
    env = dead_redis()
    result = manage("redislock", *args, **env)
    line = error_line(result)
    url = env["REDISLOCK_TEST_REDIS_URL"]
    assert line.startswith(f"CommandError: Redis is unreachable (cache 'default' at {url}/0)")
    assert result.stderr.strip() == line
    assert result.stdout == ""


def test_a_locked_command_with_two_permits_runs_twice_at_once_not_thrice():
    from django_redislock import list_locks

    outputs: list[str] = []

    def run() -> None:
        out = io.StringIO()
        call_command("pair_guarded", "--seconds", "1.5", stdout=out)
        outputs.append(out.getvalue())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(list(list_locks(match="command:pair_guarded"))) == 2)
    with pytest.raises(CommandError, match="already running"):
        call_command("pair_guarded", stdout=io.StringIO(), stderr=io.StringIO())
    for thread in threads:
        thread.join(10)
    assert [o.count("started") for o in outputs] == [1, 1]


# -- hostile text: control characters in names and holder fields --------------------------------

EVIL_NAME = "evil\nforged:1\ttoken=9\r\x07\\end"
EVIL_THREAD = "worker\tforged\nline"
EVIL_TASK = "task\n2"


def hold_in_named_thread(name: str, thread_name: str, task_id: str | None = None) -> Lock:
    """Take ``name`` from a thread called ``thread_name`` (the holder's ``thread`` field)."""
    lock = Lock(name, timeout=30, auto_renew=False, owner="evil-owner", task_id=task_id)
    taken = threading.Thread(target=lock.acquire, name=thread_name)
    taken.start()
    taken.join(10)
    assert lock.locked()
    return lock


def test_list_escapes_control_characters_in_names_threads_and_task_ids():
    hold_in_named_thread(EVIL_NAME, EVIL_THREAD, task_id=EVIL_TASK)
    with Lock("plain"):
        out = run("redislock", "list", "--sort", "name")
    lines = out.splitlines()
    assert len(lines) == 2, lines  # one line per lock: no forged line
    [evil] = [line for line in lines if line.startswith("evil")]
    [plain] = [line for line in lines if line.startswith("plain\t")]
    columns = evil.split("\t")
    assert len(columns) == len(plain.split("\t")) == 5  # no forged column
    assert columns[0] == "evil\\nforged:1\\ttoken=9\\r\\x07\\\\end"
    assert columns[4].endswith(":worker\\tforged\\nline task=task\\n2")


def test_escaped_text_is_unambiguous_and_printable_text_is_left_alone():
    """A backslash is escaped too: a name spelling ``\\n`` never prints like a newline."""
    for name in ("a\\nb", "a\nb", "caf\u00e9 \u6f22", "rtl\u202eexe.txt", "sep\u2028x"):
        Lock(name, timeout=30, auto_renew=False).acquire()
    names = [line.split("\t")[0] for line in run("redislock", "list").splitlines()]
    assert sorted(names) == [
        "a\\\\nb",
        "a\\nb",
        "caf\u00e9 \u6f22",
        "rtl\\u202eexe.txt",
        "sep\\u2028x",
    ]


def test_list_json_keeps_hostile_text_exact():
    hold_in_named_thread(EVIL_NAME, EVIL_THREAD, task_id=EVIL_TASK)
    [line] = run("redislock", "list", "--json").splitlines()
    obj = json.loads(line)
    assert (obj["name"], obj["thread"], obj["task_id"]) == (EVIL_NAME, EVIL_THREAD, EVIL_TASK)


def test_list_json_is_one_line_per_lock_for_every_line_splitter():
    """``str.splitlines`` also breaks at U+0085, U+2028 and U+2029, which JSON may leave raw."""
    name = "sep\u2028a\u2029b\x85c"
    Lock(name, timeout=30, auto_renew=False).acquire()
    [line] = run("redislock", "list", "--json").splitlines()
    assert json.loads(line)["name"] == name


def test_release_escapes_the_holder_it_reports():
    hold_in_named_thread(EVIL_NAME, EVIL_THREAD)
    out = run("redislock", "release", EVIL_NAME)
    [line] = out.splitlines()
    assert line.startswith(f"Released lock {EVIL_NAME!r} (was held by ")
    assert " thread worker\\tforged\\nline, fencing token " in line
    assert get_lock_info(EVIL_NAME) is None


def test_stats_text_escapes_control_characters_in_names():
    stats.connect_receivers()
    with Lock("stats\nforged\tline", stats_name="stats\nforged\tline"):
        pass
    out = run("redislock", "stats")
    [line] = [row for row in out.splitlines() if row.startswith("stats\\nforged")]
    assert line.startswith("stats\\nforged\\tline\tacquired=1\t")
    [obj] = [
        o
        for o in map(json.loads, run("redislock", "stats", "--json").splitlines())
        if o["name"].startswith("stats\n")
    ]
    assert obj["name"] == "stats\nforged\tline"


def test_run_skip_escapes_the_holder_it_reports():
    hold_in_named_thread("cron\nforged", EVIL_THREAD)
    out = run(
        "redislock", "run", "--name", "cron\nforged", "--skip", "--", sys.executable, "-c", ""
    )
    [line] = out.splitlines()
    assert line.startswith("Skipped: lock 'cron\\nforged' is busy (held by ")
    assert " thread worker\\tforged\\nline, " in line


# -- rate limiters (issue 30) ----------------------------------------------------------------------


def test_list_shows_rate_limiters_as_such_in_text_and_json():
    from django_redislock import RateLimiter

    RateLimiter("geo\tcoder", "1/m").try_acquire()
    with Lock("a-lock", timeout=30):
        text = run("redislock", "list", "--sort", "name")
        lines = [json.loads(line) for line in run("redislock", "list", "--json").splitlines()]
    assert text.splitlines()[1].startswith("geo\\tcoder\trate limiter\trested_in=")
    assert sorted((d["name"], d["kind"]) for d in lines) == [
        ("a-lock", "lock"),
        ("geo\tcoder", "rate"),
    ]


def test_reset_rate_forgets_a_limiters_history_and_says_when_there_was_none():
    from django_redislock import RateLimiter

    limiter = RateLimiter("nightly-export", "1/h")
    assert limiter.try_acquire()
    assert (
        run("redislock", "reset-rate", "nightly-export") == "Reset rate limiter nightly-export.\n"
    )
    assert limiter.try_acquire()
    limiter.reset()
    with pytest.raises(CommandError, match="Nothing reset: rate limiter nightly-export has no"):
        run("redislock", "reset-rate", "nightly-export")
    with pytest.raises(CommandError, match="needs the NAME"):
        run("redislock", "reset-rate")


def test_reset_rate_with_redis_down_is_one_line():
    line = error_line(manage("redislock", "reset-rate", "x", **dead_redis()))
    assert "Redis is unreachable" in line


def test_stats_show_a_limiters_decisions_only_where_there_are_any():
    from django_redislock import RateLimiter

    limiter = RateLimiter("stats-rate", "1/m")
    limiter.try_acquire()
    limiter.try_acquire()
    with Lock("stats-lock", timeout=5):
        pass
    text = run("redislock", "stats")
    [rate_line] = [line for line in text.splitlines() if line.startswith("stats-rate\t")]
    [lock_line] = [line for line in text.splitlines() if line.startswith("stats-lock\t")]
    assert rate_line.endswith("allowed=1\tlimited=1\tthrottled=0")
    assert "allowed=" not in lock_line
    [row] = [json.loads(x) for x in run("redislock", "stats", "stats-rate", "--json").splitlines()]
    assert (row["allowed"], row["limited"], row["throttled"]) == (1, 1, 0)
