"""``manage.py redislock run``: real ``python -m django redislock run`` processes running real
children (``sh`` scripts that record what happens to them in files)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redislock import force_release, get_lock_info
from django_redislock.management.run import EXIT_LOST
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.redis_server import RedisServer


def waiting_child(then: str = "") -> str:
    """A command that records its pid and a background grandchild's, runs ``then``, and waits
    for a file ``go`` to appear (``$1``: the directory)."""
    return (
        'echo "$$" > "$1/child.pid"; sleep 300 & echo "$!" > "$1/grandchild.pid"; '
        f'{then} echo start >> "$1/events"; while [ ! -e "$1/go" ]; do sleep 0.05; done; '
        'echo end >> "$1/events"'
    )


WAITING_CHILD = waiting_child()


class Runs:
    """``redislock run`` processes of one test, killed by PID at its end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, *args: str, settings: str = "tests.settings", **env: str
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "redislock", "run", *args],
            cwd=ROOT,
            env=subprocess_env(DJANGO_SETTINGS_MODULE=settings, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
        proc = self.start(*args, **env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def runs() -> Iterator[Runs]:
    started = Runs()
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """PIDs of children a test started through ``redislock run``; SIGKILLed at its end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent to reap it counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_pid(path: Path) -> int:
    text = wait_for(lambda: path.exists() and path.read_text().strip(), 20, what=str(path))
    return int(text)


def events(workdir: Path) -> list[str]:
    path = workdir / "events"
    return path.read_text().split() if path.exists() else []


def test_the_commands_exit_status_and_output_pass_through(runs: Runs) -> None:
    result = runs.run(
        "--name", "job", "--", "sh", "-c", 'echo "token=$REDISLOCK_FENCING_TOKEN"; exit 7'
    )
    assert result.returncode == 7, result.stderr
    assert re.fullmatch(r"token=\d+\n", result.stdout)
    assert result.stderr == ""
    assert get_lock_info("job") is None  # released when the command ended


def test_a_command_that_cannot_be_found_exits_127_with_one_line(runs: Runs) -> None:
    result = runs.run("--name", "job", "--", "/nonexistent/command")
    assert result.returncode == 127
    assert result.stderr.strip().splitlines() == [
        "redislock run: cannot run '/nonexistent/command': No such file or directory"
    ]
    assert get_lock_info("job") is None


@pytest.mark.slow
def test_while_one_run_holds_the_lock_others_skip_fail_or_wait(
    runs: Runs, tmp_path: Path, leftovers: list[int]
) -> None:
    first = runs.start("--name", "nightly", "--", "sh", "-c", WAITING_CHILD, "sh", str(tmp_path))
    leftovers.append(read_pid(tmp_path / "grandchild.pid"))
    wait_for(lambda: events(tmp_path) == ["start"], 20, what="the first run's command")

    skipped = runs.run("--name", "nightly", "--skip", "--", "sh", "-c", "echo ran")
    assert skipped.returncode == 0
    assert skipped.stdout.startswith("Skipped: lock 'nightly' is busy (held by ")
    refused = runs.run("--name", "nightly", "--", "sh", "-c", "echo ran")
    assert refused.returncode == 1
    assert "another instance is running" in refused.stderr
    gave_up = runs.run("--name", "nightly", "--wait", "0.5", "--", "sh", "-c", "echo ran")
    assert gave_up.returncode == 1
    assert "after waiting 0.5 s" in gave_up.stderr
    assert "ran" not in skipped.stdout + refused.stdout + gave_up.stdout

    standby = runs.start(
        "--name", "nightly", "--wait", "30", "--", "sh", "-c", f'echo second >> "{tmp_path}/events"'
    )
    time.sleep(0.5)  # give the standby time to (wrongly) run before the first one ends
    assert events(tmp_path) == ["start"]
    (tmp_path / "go").touch()
    assert first.wait(20) == 0
    assert standby.wait(20) == 0
    assert events(tmp_path) == ["start", "end", "second"]
    assert get_lock_info("nightly") is None


@pytest.mark.slow
def test_a_force_released_lock_kills_the_commands_process_group(
    runs: Runs, tmp_path: Path, leftovers: list[int]
) -> None:
    # The command ignores SIGTERM (its grandchild does not): it takes the SIGKILL after the grace
    # period.
    script = waiting_child("trap '' TERM;")
    proc = runs.start(
        "--name", "job", "--timeout", "3", "--grace", "1", "--", "sh", "-c", script, "sh",
        str(tmp_path),
    )  # fmt: skip
    child = read_pid(tmp_path / "child.pid")
    grandchild = read_pid(tmp_path / "grandchild.pid")
    leftovers.extend([child, grandchild])
    assert get_lock_info("job") is not None

    released_at = time.monotonic()
    assert force_release("job")
    wait_for(lambda: not alive(grandchild), 10, 0.01, what="the grandchild (SIGTERM) to die")
    term_after = time.monotonic() - released_at
    wait_for(lambda: not alive(child), 10, 0.01, what="the command (SIGKILL) to die")
    kill_after = time.monotonic() - released_at
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == EXIT_LOST
    lines = [line for line in err.splitlines() if line.startswith("CommandError:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("CommandError: redislock run: lock 'job' was lost (expired or ")
    assert f"(pid {child}) ran; stopped it so it cannot overlap the next holder." in lines[0]
    # Noticed within timeout / 3 (1 s); the slack is for a loaded 2-core machine.
    assert term_after <= 3 / 3 + 1.5, f"SIGTERM {term_after:.2f}s after the release"
    assert term_after + 1.0 - 0.1 <= kill_after <= term_after + 1.0 + 1.0, (
        f"SIGTERM after {term_after:.2f}s, SIGKILL after {kill_after:.2f}s (grace 1 s)"
    )
    print(f"\nforce release -> SIGTERM {term_after:.2f}s, SIGKILL {kill_after:.2f}s")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signals_are_forwarded_to_the_command_and_the_lock_released_when_it_exits(
    runs: Runs, tmp_path: Path, leftovers: list[int], signum: int
) -> None:
    script = (
        f'trap \'echo "got $1" >> "{tmp_path}/events"; sleep 0.3; exit 3\' TERM INT; '
        f'echo "$$" > "{tmp_path}/child.pid"; echo start >> "{tmp_path}/events"; '
        "while :; do sleep 0.05; done"
    )
    proc = runs.start("--name", "job", "--", "sh", "-c", script, "sh", "signal")
    leftovers.append(read_pid(tmp_path / "child.pid"))
    wait_for(lambda: events(tmp_path) == ["start"], 20, what="the command")
    proc.send_signal(signum)
    time.sleep(0.1)  # the command is still cleaning up: the lock is still held
    assert get_lock_info("job") is not None
    assert proc.wait(10) == 3  # the command's own exit status
    assert events(tmp_path) == ["start", "got", "signal"]
    assert get_lock_info("job") is None


@pytest.mark.slow
def test_a_killed_supervisor_takes_its_command_with_it(
    runs: Runs, tmp_path: Path, leftovers: list[int]
) -> None:
    if not sys.platform.startswith("linux"):  # pragma: no cover - CI runs Linux
        pytest.fail("PR_SET_PDEATHSIG is Linux-only; this test documents the Linux behaviour")
    proc = runs.start("--name", "job", "--", "sh", "-c", WAITING_CHILD, "sh", str(tmp_path))
    child = read_pid(tmp_path / "child.pid")
    leftovers.extend([child, read_pid(tmp_path / "grandchild.pid")])
    proc.kill()
    wait_for(lambda: not alive(child), 5, 0.01, what="the command to die with its supervisor")


@pytest.mark.slow
def test_redis_unreachable_longer_than_the_lease_allows_stops_the_command(
    runs: Runs, tmp_path: Path, leftovers: list[int], redis_factory: type[RedisServer]
) -> None:
    server = redis_factory().start()
    timeout, grace = 3.0, 1.0
    proc = runs.start(
        "--name", "job", "--timeout", str(timeout), "--grace", str(grace), "--",
        "sh", "-c", WAITING_CHILD, "sh", str(tmp_path),
        settings="tests.beatapp.settings", REDISLOCK_TEST_LOCK_REDIS_URL=server.url,
    )  # fmt: skip
    child = read_pid(tmp_path / "child.pid")
    leftovers.extend([child, read_pid(tmp_path / "grandchild.pid")])
    wait_for(lambda: events(tmp_path) == ["start"], 20, what="the command")

    stopped_at = time.monotonic()
    server.stop()
    wait_for(lambda: not alive(child), timeout + 5, 0.01, what="the command to be stopped")
    gone_after = time.monotonic() - stopped_at
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == EXIT_LOST, err
    assert "redislock run: cannot renew lock 'job': Redis is unreachable" in err
    assert "could not be renewed for" in err and "(Redis unreachable)" in err
    # SIGTERM once less than `grace` of the lease was left: gone before the lease could expire.
    assert gone_after <= timeout, f"stopped {gone_after:.2f}s after Redis went away"
    print(f"\nRedis down -> command gone after {gone_after:.2f}s (lease {timeout:g}s)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--", "true"], "needs --name"),
        (["run", "--name", "x"], "needs a command after --"),
        (["run", "oops", "--name", "x", "--", "true"], "takes the command after --"),
        (["list", "--", "true"], "does not take a command after --"),
        (["list", "--name", "x"], "does not take --name"),
        (["release", "x", "--skip"], "does not take --skip"),
    ],
)
def test_usage_errors_exit_with_status_2(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as caught:
        call_command("redislock", *args)
    assert caught.value.returncode == 2


def test_wait_and_skip_exclude_each_other() -> None:
    with pytest.raises(CommandError, match="not allowed with argument"):
        call_command("redislock", "run", "--name", "x", "--skip", "--wait", "1", "--", "true")


def test_a_command_after_dashes_keeps_its_own_dashes_and_options(runs: Runs) -> None:
    result = runs.run("--name", "job", "-v", "0", "--", "sh", "-c", 'echo "$@"', "sh", "--", "-v")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "-- -v\n"
