r"""``manage.py redislock``: inspect and force-release locks from a shell or a cron job.

Subcommands::

    manage.py redislock list [--match GLOB] [--sort KEY] [--json] [--using ALIAS]
    manage.py redislock release NAME [--token N] [--using ALIAS]
    manage.py redislock reset-rate NAME [--using ALIAS]
    manage.py redislock stats [NAME_OR_TEMPLATE] [--json] [--using ALIAS]
    manage.py redislock run --name NAME [--wait S | --skip] [--timeout T] [--grace G]
        [--using ALIAS] -- COMMAND [ARG ...]

``list`` prints one tab-separated line (``--json``: one JSON object) per holder, or
"No lock is held." when there is none (nothing with ``--json`` or ``-v 0``). ``release`` exits with
status 1 when nothing was released (no such lock, or ``--token`` no longer
matches), so scripts can tell "done" from "nothing to do"; usage errors exit with status 2.
``list`` shows rate limiters that have a history too (``NAME<tab>rate limiter<tab>rested_in=…``;
``--json``: ``"kind": "rate"``); ``reset-rate`` forgets one's history (status 1 when it had
none), as the admin's Reset button does.
``list`` and ``release`` use the same :mod:`~django_redislock.operations` as the admin: the same
paging and sort orders, and a release that reports the holder the release script removed (never
a holder read before or after it). Waiters are woken and the release is signalled, but no
``LogEntry`` is written (there is no admin user); a warning goes to the ``django_redislock``
logger instead.

Every failure ends the command with one line on stderr and a non-zero exit (Redis unreachable:
which cache, where, what to check), never a traceback.

Text output is one line per lock and tab-separated, and lock names, thread names, host names and
task ids are anybody's text: a name with a newline or a tab would forge lines and columns (issue
27). So every text field is printed escaped: characters that are not printable (``\n``, ``\t``,
``\r``, ``\x07``, Unicode separators and format characters such as ``\u2028`` or the bidi
override ``\u202e``) as ``repr`` writes them, without quotes, and a backslash as ``\\``: every
escape starts with a backslash and no backslash is printed bare, so the output is unambiguous
(two different names never print alike). Printable text, including non-ASCII letters, is left as
it is. ``--json`` output is exact: JSON escapes control characters itself, and the three
characters it may leave raw that ``str.splitlines`` still takes for line breaks (``\x85``,
``\u2028``, ``\u2029``) are written as ``\u`` escapes, which decode to the same text. Use
``--json`` when names must round-trip.

``run`` runs any command as a single instance across hosts (:mod:`django_redislock.management.run`):
it exits with the command's status, 0 when busy with ``--skip``, 1 when busy otherwise (or when
``--wait`` ran out), 75 when the lease was lost or Redis stayed unreachable and the command was
stopped.
"""

from __future__ import annotations

import json
import logging
from argparse import ArgumentParser, Namespace
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock.exceptions import LockBackendError, LockError
from django_redislock.management.base import escape, escaped
from django_redislock.operations import (
    SORTS,
    LockInfo,
    backend_problem,
    describe_holder,
    force_release_info,
    get_lock_info,
    page_locks,
    reset_rate_limit,
)

logger = logging.getLogger("django_redislock")

SUBCOMMANDS = ("list", "release", "reset-rate", "stats", "run")
#: Locks per SCAN page while listing without ``--sort``.
LIST_PAGE = 500


def _token(value: str) -> int:
    """argparse type for ``--token``: a positive integer."""
    try:
        token = int(value)
    except ValueError:
        raise ValueError(value) from None
    if token < 1:
        raise ValueError(value)
    return token


_token.__name__ = "fencing token (a positive integer)"  # argparse shows this in its error


def _positive_seconds(value: str) -> float:
    """argparse type for ``--timeout``: seconds > 0."""
    seconds = float(value)
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(value)
    return seconds


_positive_seconds.__name__ = "number of seconds (> 0)"


def _seconds_or_zero(value: str) -> float:
    """argparse type for ``--wait`` and ``--grace``: seconds >= 0."""
    seconds = float(value)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(value)
    return seconds


_seconds_or_zero.__name__ = "number of seconds (>= 0)"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


class Command(BaseCommand):
    help = (
        "List, force-release and show statistics of django-redislock locks; run a command as a "
        "single instance across hosts (run --name NAME -- COMMAND ...)."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """A parser that leaves everything after the first ``--`` to ``run``'s COMMAND.

        argparse cannot do this itself: with an optional positional before it, a ``--`` tail after
        options is rejected ("unrecognized arguments"), and a later ``--`` inside the command
        would be stripped.
        """
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse = parser.parse_args

        def parse_args(
            args: Sequence[str] | None = None, namespace: Namespace | None = None
        ) -> Namespace:
            given = list(args) if args is not None else []
            command: list[str] | None = None
            if "--" in given:
                split = given.index("--")
                given, command = given[:split], given[split + 1 :]
            options = parse(given, namespace)
            options.command = command
            return options

        parser.parse_args = parse_args  # type: ignore[method-assign,assignment]
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        # One flat parser rather than argparse sub-parsers: Django's own options (--settings,
        # --verbosity ...) must keep working after the subcommand, as in every other command.
        parser.add_argument(
            "subcommand",
            choices=SUBCOMMANDS,
            help="list: active locks (and rate limiters); release: force-release one lock; "
            "reset-rate: forget a rate limiter's history; "
            "stats: acquisition statistics; run: run -- COMMAND as a single instance.",
        )
        parser.add_argument(
            "name",
            nargs="?",
            default=None,
            help="release: the lock name (exact). reset-rate: the rate limiter's name (exact). "
            "stats: a lock name or key template (default: all).",
        )
        parser.add_argument(
            "--match",
            metavar="GLOB",
            default=None,
            help="list: only locks whose name matches this glob (* ? [...]).",
        )
        parser.add_argument(
            "--sort",
            choices=list(SORTS),
            default=None,
            help="list: order by name, expires (soonest first) or held (shortest first); "
            "a leading '-' reverses (--sort=-held: longest held first). Sorting reads every "
            "lock before printing.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            dest="as_json",
            help="list, stats: one JSON object per line instead of text.",
        )
        parser.add_argument(
            "--token",
            type=_token,
            default=None,
            help="release: only if the lock still has this fencing token (as shown by list).",
        )
        parser.add_argument(
            "--using",
            metavar="ALIAS",
            default=None,
            help="CACHES alias holding the locks (default: REDISLOCK['CACHE']).",
        )
        run = parser.add_argument_group("run --name NAME [options] -- COMMAND [ARG ...]")
        run.add_argument(
            "--name",
            dest="lock_name",
            default=None,
            help="run: the lock that makes COMMAND a single instance across hosts.",
        )
        busy = run.add_mutually_exclusive_group()
        busy.add_argument(
            "--wait",
            type=_seconds_or_zero,
            default=None,
            metavar="SECONDS",
            help="run: when another instance holds the lock, stand by up to SECONDS for it "
            "(woken when it ends), then exit 1. Default: exit 1 at once.",
        )
        busy.add_argument(
            "--skip",
            action="store_true",
            help="run: when another instance holds the lock, exit 0 saying so.",
        )
        run.add_argument(
            "--timeout",
            type=_positive_seconds,
            default=None,
            metavar="SECONDS",
            help="run: lease of the lock, renewed while COMMAND runs (default: "
            "REDISLOCK['TIMEOUT']). A dead host's lock frees itself within it.",
        )
        run.add_argument(
            "--grace",
            type=_seconds_or_zero,
            default=10.0,
            metavar="SECONDS",
            help="run: when the lock is lost, COMMAND's process group gets SIGTERM, then SIGKILL "
            "after SECONDS (default 10).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options["subcommand"]
        misplaced = [
            flag
            for flag, dest, allowed in (
                ("NAME", "name", ("release", "reset-rate", "stats", "run")),  # run: explains itself
                ("--match", "match", ("list",)),
                ("--sort", "sort", ("list",)),
                ("--token", "token", ("release",)),
                ("--json", "as_json", ("list", "stats")),
                ("--name", "lock_name", ("run",)),
                ("--wait", "wait", ("run",)),
                ("--skip", "skip", ("run",)),
                ("--timeout", "timeout", ("run",)),
                ("a command after --", "command", ("run",)),
            )
            if options.get(dest) not in (None, False) and subcommand not in allowed
        ]
        if misplaced:
            raise CommandError(
                f"'redislock {subcommand}' does not take {', '.join(misplaced)}.", returncode=2
            )
        if subcommand == "release" and not options["name"]:
            raise CommandError(
                "'redislock release' needs the NAME of the lock to release.", returncode=2
            )
        if subcommand == "reset-rate" and not options["name"]:
            raise CommandError(
                "'redislock reset-rate' needs the NAME of the rate limiter to reset.", returncode=2
            )
        if subcommand == "run":
            self._check_run_usage(options)
        try:
            getattr(self, f"handle_{subcommand.replace('-', '_')}")(**options)
        except LockBackendError as exc:
            raise CommandError(backend_problem(exc, using=options["using"]).summary()) from exc
        except (LockError, ImproperlyConfigured) as exc:
            raise CommandError(" ".join(str(exc).split())) from exc

    def handle_list(
        self,
        *,
        match: str | None,
        sort: str | None,
        as_json: bool,
        using: str | None,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        listed = 0
        seen: set[tuple[str, str, int]] = set()
        cursor = 0
        while True:
            # Sorted: one page of everything; unsorted: SCAN pages, streamed as they come.
            page = page_locks(
                match=match,
                sort=sort,
                cursor=cursor,
                per_page=None if sort else LIST_PAGE,
                using=using,
            )
            for info in page.infos:
                if (info.kind, info.name, info.fencing_token) in seen:
                    continue  # SCAN may return a key again on a later page
                seen.add((info.kind, info.name, info.fencing_token))
                listed += 1
                if as_json:
                    self.stdout.write(_dumps(_json_fields(info)))
                else:
                    self.stdout.write(_text_line(escaped(info)))
            if not page.has_next:
                break
            cursor = page.next_cursor
        if not listed and not as_json and verbosity >= 1:
            self.stdout.write(
                f"No lock matching {match!r} is held." if match else "No lock is held."
            )

    def handle_release(
        self, *, name: str, token: int | None, using: str | None, **options: Any
    ) -> None:
        released = force_release_info(name, token=token, using=using)
        if not released:
            # Only explains the refusal: what was (not) released came from the script itself.
            now = get_lock_info(name, using=using) if token is not None else None
            if now is None:
                raise CommandError(f"Nothing released: no lock named {name!r} is held.")
            raise CommandError(
                f"Nothing released: lock {name!r} has fencing token {now.fencing_token}, "
                f"not {token} (it changed hands since that token was read)."
            )
        for info in released:
            holder = describe_holder(escaped(info))
            logger.warning(
                "django_redislock: lock %r force-released from the command line (was held by %s).",
                name,
                holder,
            )
            self.stdout.write(f"Released lock {name!r} (was held by {holder}).")

    def handle_reset_rate(self, *, name: str, using: str | None, **options: Any) -> None:
        if not reset_rate_limit(name, using=using):
            raise CommandError(f"Nothing reset: rate limiter {escape(name)} has no history.")
        logger.warning("django_redislock: rate limiter %r reset from the command line.", name)
        self.stdout.write(f"Reset rate limiter {escape(name)}.")

    def handle_stats(
        self, *, name: str | None, as_json: bool, using: str | None, **options: Any
    ) -> None:
        from django_redislock import stats

        stats.flush()
        if name is not None:
            found = stats.get_stats(name, using=using)
            if found is None:
                raise CommandError(f"No statistics recorded for {name!r} in the last 24 hours.")
            rows = [found]
        else:
            rows = sorted(stats.iter_stats(using=using), key=lambda s: s.name)
        for row in rows:
            if as_json:
                self.stdout.write(
                    _dumps(
                        {
                            "name": row.name,
                            "acquired": row.acquired,
                            "contended": row.contended,
                            "failed": row.failed,
                            "released": row.released,
                            "lost": row.lost,
                            "force_released": row.force_released,
                            "success_rate": row.success_rate,
                            "mean_wait": row.mean_wait,
                            "max_wait": row.wait_max,
                            "mean_hold": row.mean_hold,
                            "max_hold": row.hold_max,
                            "allowed": row.allowed,
                            "limited": row.limited,
                            "throttled": row.throttled,
                        }
                    )
                )
            else:
                rate = "-" if row.success_rate is None else f"{row.success_rate:.1%}"
                self.stdout.write(
                    f"{escape(row.name)}\tacquired={row.acquired}\tcontended={row.contended}\t"
                    f"failed={row.failed}\tlost={row.lost}\tforce_released={row.force_released}"
                    f"\tsuccess={rate}\tmean_wait={_seconds(row.mean_wait)}\t"
                    f"mean_hold={_seconds(row.mean_hold)}{_flow_fields(row)}"
                )

    # -- run --------------------------------------------------------------------------------------
    @staticmethod
    def _check_run_usage(options: dict[str, Any]) -> None:
        usage = "manage.py redislock run --name NAME [options] -- COMMAND [ARG ...]"
        if options["name"]:
            raise CommandError(
                f"'redislock run' takes the command after --, not {options['name']!r} before "
                f"it: {usage}",
                returncode=2,
            )
        if not options.get("lock_name"):
            raise CommandError(f"'redislock run' needs --name: {usage}", returncode=2)
        if not options.get("command"):
            raise CommandError(f"'redislock run' needs a command after --: {usage}", returncode=2)

    def handle_run(
        self,
        *,
        lock_name: str,
        command: list[str],
        wait: float | None,
        skip: bool,
        timeout: float | None,
        grace: float,
        using: str | None,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        from django_redislock.leader import LeaderElection
        from django_redislock.management import run

        election = LeaderElection(lock_name, timeout=timeout, using=using)
        lease = election.lease
        if not self._acquire_for_run(election, wait, skip, using, verbosity):
            return
        supervisor = run.Supervisor(
            election, command, grace=grace, warn=lambda line: self.stderr.write(line)
        )
        if verbosity >= 2:
            self.stdout.write(
                f"redislock run: holding lock {lock_name!r} (fencing token "
                f"{lease.fencing_token}, lease {lease.timeout:g} s); running "
                f"{run.describe(command)!r}."
            )
        try:
            outcome = supervisor.run()
        except OSError as exc:  # not Linux: Popen itself reports a command it cannot execute
            self._release_after_run(election)
            status = run.EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else 126
            raise CommandError(
                f"redislock run: cannot run {command[0]!r}: {exc.strerror or exc}",
                returncode=status,
            ) from exc
        released = self._release_after_run(election)
        if outcome.stopped is not None:
            raise CommandError(outcome.stopped, returncode=run.EXIT_LOST)
        if not released:
            raise CommandError(
                f"redislock run: lock {lock_name!r} was lost (expired or force-released) while "
                f"{run.describe(command)!r} ran; it ended with status {outcome.status}, but its "
                "work may have overlapped another holder's.",
                returncode=run.EXIT_LOST,
            )
        if outcome.status != 0:
            raise SystemExit(outcome.status)

    def _acquire_for_run(
        self, election: Any, wait: float | None, skip: bool, using: str | None, verbosity: int
    ) -> bool:
        """Take the lease; False when busy with ``--skip``; ``CommandError`` when busy otherwise.

        SIGTERM or SIGINT while standing by leave the lock's queue cleanly (exit 128 + signal).
        """
        import signal
        import threading

        from django_redislock.management import run

        def stop_waiting(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        previous: dict[int, Any] = {}
        if wait and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, stop_waiting)
        try:
            acquired = election.elect(wait or 0.0) is not None
        finally:
            for restored, handler in previous.items():
                signal.signal(restored, handler)
        if acquired:
            return True
        lease = election.lease
        info = get_lock_info(lease.name, using=using)
        holder = f" (held by {describe_holder(escaped(info))})" if info is not None else ""
        if skip:
            if verbosity >= 1:
                self.stdout.write(
                    f"Skipped: lock {lease.name!r} is busy{holder}: another instance is running."
                )
            return False
        waited = f" after waiting {wait:g} s" if wait else ""
        raise CommandError(
            f"redislock run: lock {lease.name!r} is busy{holder}{waited}: another instance is "
            "running. Pass --skip to exit 0 instead, or --wait SECONDS to stand by.",
            returncode=run.EXIT_BUSY,
        )

    def _release_after_run(self, election: Any) -> bool:
        """End the term and release the lease; False when it was no longer ours. Redis down:
        warn, True."""
        lease = election.lease
        try:
            return bool(election.resign())
        except LockBackendError as exc:
            self.stderr.write(
                f"redislock run: could not release lock {lease.name!r} "
                f"({backend_problem(exc, using=lease.using).summary()}); it expires within "
                f"{lease.timeout:g} s."
            )
            return True


#: Line breaks to ``str.splitlines`` that ``json.dumps(ensure_ascii=False)`` leaves raw.
_JSON_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _dumps(data: dict[str, Any]) -> str:
    """One JSON object on one line, whoever splits the lines.

    Outside strings JSON text has none of these characters, so replacing them by their escape
    changes no value.
    """
    return json.dumps(data, ensure_ascii=False, sort_keys=False).translate(_JSON_LINE_BREAKS)


def _flow_fields(row: Any) -> str:
    """A rate limiter's decisions and a task's throttled runs, on rows that have any."""
    if not (row.allowed or row.limited or row.throttled):
        return ""
    return f"\tallowed={row.allowed}\tlimited={row.limited}\tthrottled={row.throttled}"


def _text_line(info: LockInfo) -> str:
    expires = f"{info.expires_in:.1f}s" if info.expires else "never"
    if info.kind == "rate":
        return f"{info.name}\trate limiter\trested_in={expires}"
    if info.kind == "latch":
        return f"{info.name}\tlatch\tleft={info.hold_count}/{info.permits}\texpires_in={expires}"
    if info.kind == "barrier":
        broken = "\tbroken" if info.mode == "broken" else ""
        return (
            f"{info.name}\tbarrier\twaiting={info.hold_count}/{info.permits}{broken}\t"
            f"expires_in={expires}"
        )
    if info.unreadable:
        return f"{info.name}\tunreadable\texpires_in={expires}\tvalue={info.raw_excerpt!r}"
    if info.queued:
        owner = f"queued, published by {info.host}:{info.pid}"
    else:
        owner = f"{info.host}:{info.pid}:{info.thread}"
    task = f" task={info.task_id}" if info.task_id else ""
    if info.mode:
        task += f" side={info.mode}"
    return (
        f"{info.name}\ttoken={info.fencing_token}\tholds={info.hold_count}\t"
        f"expires_in={expires}\towner={owner}{task}"
    )


def _json_fields(info: LockInfo) -> dict[str, Any]:
    fields = info.as_dict()
    if info.expires:
        fields["expires_in"] = round(info.expires_in, 3)
    return fields
