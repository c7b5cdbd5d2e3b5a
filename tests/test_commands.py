"""``manage.py redislock`` and ``LockedCommand``, run in-process AND as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redislock import Lock, get_lock_info, stats
from django_redislock.management.base import LockedCommand
from tests.conftest import ROOT, hold, subprocess_env


def manage(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGS --settings tests.settings`` in a fresh process, same Redis."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings", "tests.settings"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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


def test_list_of_nothing_prints_nothing():
    assert run("redislock", "list") == ""


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
    hold(holders, "stuck")
    out = run("redislock", "release", "stuck")
    assert "Released lock 'stuck'" in out
    assert get_lock_info("stuck") is None


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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "slow_guarded",
            "--seconds",
            "20",
            "--settings",
            "tests.settings",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


def test_second_run_of_a_locked_command_is_refused(running_guarded):
    with pytest.raises(CommandError, match="already running") as excinfo:
        run("slow_guarded")
    assert excinfo.value.returncode == 1
    assert f"pid {running_guarded.pid}" in str(excinfo.value)


def test_skip_if_locked_exits_quietly(running_guarded):
    out = run("slow_guarded", "--skip-if-locked")
    assert out.startswith("Skipped: slow_guarded is already running")
    assert "started" not in out


def test_second_run_in_a_subprocess_exits_non_zero_then_zero_with_skip(running_guarded):
    refused = manage("slow_guarded")
    assert refused.returncode == 1
    assert "already running" in refused.stderr
    assert "started" not in refused.stdout
    skipped = manage("slow_guarded", "--skip-if-locked")
    assert skipped.returncode == 0, skipped.stderr
    assert "Skipped" in skipped.stdout


def test_lock_is_free_again_once_the_first_run_ends():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "slow_guarded",
            "--seconds",
            "0.5",
            "--settings",
            "tests.settings",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.split() == ["started", "done"]
    deadline = time.monotonic() + 5
    while get_lock_info("command:slow_guarded") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
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
