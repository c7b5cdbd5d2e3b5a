"""``manage.py redislock run``: any command (a cron job) as a single instance across hosts.

::

    manage.py redislock run --name nightly-export [--wait S | --skip] [--timeout T] [--grace G] \\
        -- /usr/local/bin/export --full

The supervisor is elected (a :class:`~django_redislock.LeaderElection`, driven step by step: it
proves the lease itself rather than in ``lead()``'s thread), starts the command
in a process group of its own, renews the lease while it runs, and exits with the command's
status. It never lets the command run on without the lease:

- **Lease lost** (expired during a pause, force-released): noticed by the watchdog or the next
  renewal (within ``timeout / 3``); the command's process group gets SIGTERM, then SIGKILL after
  ``grace`` seconds; exit status :data:`EXIT_LOST` with one line on stderr.
- **Redis unreachable**: renewals are retried every second; once the lease has less than
  ``grace`` seconds left by this machine's clock (i.e. after ``timeout - grace`` seconds without a
  renewal) the group gets SIGTERM, and SIGKILL at the latest when the lease may expire — so the
  command is gone before another host can take the lock over.
- **Signals** SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 sent to the supervisor are
  forwarded to the command's process group; the lock is released once the command exits.
- **Supervisor killed** (SIGKILL, OOM): on Linux the command's own process gets SIGKILL at once
  (``PR_SET_PDEATHSIG``, set by a tiny exec wrapper); elsewhere it would run on unlocked until it
  ends, so prefer Linux hosts for long jobs.

The command sees ``REDISLOCK_LOCK_NAME`` and ``REDISLOCK_FENCING_TOKEN`` in its environment, so it
can fence its writes (see the README on fencing tokens).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from django_redislock.exceptions import LockBackendError, LockNotOwnedError
from django_redislock.leader import LeaderElection, LeaderLease

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_RUN",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "FORWARDED_SIGNALS",
    "Outcome",
    "Supervisor",
]

#: Another instance holds the lock (and ``--skip`` was not given), or ``--wait`` ran out.
EXIT_BUSY = 1
#: The lease was lost, or Redis was unreachable too long: the command was stopped.
EXIT_LOST = 75  # EX_TEMPFAIL: try again later
#: The command could not be executed (as a shell reports it).
EXIT_CANNOT_RUN = 126
#: The command was not found (as a shell reports it).
EXIT_NOT_FOUND = 127

FORWARDED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
#: Seconds between renewal attempts while Redis is unreachable.
RETRY_AFTER = 1.0

# Runs in the child before the command: die with the supervisor (Linux), then exec the command.
# It reports a missing or non-executable command itself, with the statuses a shell would use.
_PDEATHSIG_WRAPPER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(137)  # the supervisor died before prctl took effect
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"redislock run: cannot run {sys.argv[2]!r}: {exc.strerror}\\n")
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""


def _problem(exc: LockBackendError, lease: LeaderLease) -> str:
    from django_redislock.operations import backend_problem

    return backend_problem(exc, using=lease.using).summary()


def describe(argv: Sequence[str]) -> str:
    """The command as a shell would show it."""
    return shlex.join(argv)


def exit_status(returncode: int) -> int:
    """A ``Popen.returncode`` as a process exit status (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Outcome:
    """How a supervised run ended."""

    #: The command's exit status (128 + N when a signal N ended it).
    status: int
    #: Why the supervisor stopped the command (``None``: it ended by itself).
    stopped: str | None = None
    forwarded: list[int] = field(default_factory=list)


class Supervisor:
    """Run one command while this process leads ``election``; see the module docstring."""

    def __init__(
        self,
        election: LeaderElection,
        argv: Sequence[str],
        *,
        grace: float,
        warn: Callable[[str], None],
    ) -> None:
        self.election = election
        self.lease: LeaderLease = election.lease
        self.argv = list(argv)
        self.grace = grace
        self.warn = warn
        self.proc: subprocess.Popen[bytes] | None = None
        self._wake = threading.Event()
        self._forwarded: list[int] = []

    # -- starting ----------------------------------------------------------------------------------
    def start(self) -> subprocess.Popen[bytes]:
        """Start the command in its own process group; ``OSError`` if it cannot be executed."""
        env = dict(os.environ)
        env["REDISLOCK_LOCK_NAME"] = self.lease.name
        env["REDISLOCK_FENCING_TOKEN"] = str(self.lease.fencing_token or "")
        argv = self.argv
        if sys.platform == "linux":
            argv = [sys.executable, "-c", _PDEATHSIG_WRAPPER, str(os.getpid()), *argv]
        group: dict[str, Any] = (
            {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        )
        self.proc = subprocess.Popen(argv, env=env, **group)
        return self.proc

    # -- supervising -------------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Start the command, keep the lease while it runs, and return how it ended."""
        proc = self.start()
        self.lease.on_lost(self._wake.set)
        threading.Thread(
            target=self._reap, args=(proc,), name="redislock-run-reaper", daemon=True
        ).start()
        previous = self._forward_signals()
        try:
            stopped = self._supervise(proc)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        assert proc.returncode is not None
        return Outcome(exit_status(proc.returncode), stopped, list(self._forwarded))

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._wake.set()

    def _forward_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous  # only the main thread may install handlers
        for signum in FORWARDED_SIGNALS:
            previous[signum] = signal.signal(signum, self._forward)
        return previous

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._forwarded.append(signum)
        self._signal_group(signum)
        self._wake.set()

    def _signal_group(self, signum: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def _group_alive(self) -> bool:
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _supervise(self, proc: subprocess.Popen[bytes]) -> str | None:
        lease = self.lease
        every = lease.timeout / 3
        next_proof = time.monotonic() + every
        outage_since: float | None = None
        stopped: str | None = None
        kill_at: float | None = None
        while True:
            self._wake.clear()
            if proc.poll() is not None:
                if stopped is not None:
                    self._finish_group(kill_at)
                return stopped
            now = time.monotonic()
            if stopped is None:
                if lease.lost:
                    stopped = self._lost_line()
                elif now >= next_proof or outage_since is not None:
                    try:
                        if now >= next_proof:
                            self.election.prove()
                            next_proof = now + every
                            if outage_since is not None:
                                self.warn(
                                    f"redislock run: Redis answers again after "
                                    f"{now - outage_since:.1f} s; lock {lease.name!r} is still "
                                    "held."
                                )
                            outage_since = None
                    except LockNotOwnedError:
                        stopped = self._lost_line()
                    except LockBackendError as exc:
                        next_proof = now + min(RETRY_AFTER, every)
                        if outage_since is None:
                            outage_since = now
                            self.warn(
                                f"redislock run: cannot renew lock {lease.name!r}: "
                                f"{_problem(exc, lease)} The command is stopped in "
                                f"{max(0.0, lease.remaining() - self.grace):.1f} s unless Redis "
                                "answers."
                            )
                    if (
                        stopped is None
                        and outage_since is not None
                        and lease.remaining() <= self.grace
                    ):
                        stopped = (
                            f"redislock run: lock {lease.name!r} could not be renewed for "
                            f"{lease.proof_age():.1f} s (Redis unreachable) and may pass to "
                            f"another host within {lease.remaining():.1f} s; stopped "
                            f"{describe(self.argv)!r} (pid {proc.pid}) so it cannot overlap it."
                        )
                if stopped is not None:
                    self._signal_group(signal.SIGTERM)
                    kill_at = now + self.grace
                    if outage_since is not None:  # SIGKILL before the lease can expire
                        kill_at = min(kill_at, lease.valid_until())
            elif kill_at is not None and now >= kill_at:
                self._signal_group(signal.SIGKILL)
                kill_at = None
            wake_at = kill_at if stopped is not None else next_proof
            if stopped is None and outage_since is not None:
                wake_at = min(next_proof, lease.valid_until() - self.grace)
            self._wake.wait(None if wake_at is None else max(0.0, wake_at - time.monotonic()))

    def _lost_line(self) -> str:
        assert self.proc is not None
        return (
            f"redislock run: lock {self.lease.name!r} was lost (expired or force-released) "
            f"while {describe(self.argv)!r} (pid {self.proc.pid}) ran; stopped it so it cannot "
            "overlap the next holder."
        )

    def _finish_group(self, kill_at: float | None) -> None:
        """After the command itself exited: give the rest of its group until ``kill_at``."""
        while kill_at is not None and time.monotonic() < kill_at and self._group_alive():
            time.sleep(0.05)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
