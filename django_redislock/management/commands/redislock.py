"""``manage.py redislock``: inspect and force-release locks from a shell or a cron job.

Subcommands::

    manage.py redislock list [--match GLOB] [--sort KEY] [--json] [--using ALIAS]
    manage.py redislock release NAME [--token N] [--using ALIAS]
    manage.py redislock stats [NAME_OR_TEMPLATE] [--json] [--using ALIAS]

``list`` prints one tab-separated line (``--json``: one JSON object) per holder, or
"No lock is held." when there is none (nothing with ``--json`` or ``-v 0``). ``release`` exits with
status 1 when nothing was released (no such lock, or ``--token`` no longer
matches), so scripts can tell "done" from "nothing to do"; usage errors exit with status 2.
``list`` and ``release`` use the same :mod:`~django_redislock.operations` as the admin: the same
paging and sort orders, and a release that reports the holder the release script removed (never
a holder read before or after it). Waiters are woken and the release is signalled, but no
``LogEntry`` is written (there is no admin user); a warning goes to the ``django_redislock``
logger instead.

Every failure ends the command with one line on stderr and a non-zero exit (Redis unreachable:
which cache, where, what to check), never a traceback.
"""

from __future__ import annotations

import json
import logging
from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockBackendError, LockError
from django_redislock.operations import (
    SORTS,
    LockInfo,
    backend_problem,
    describe_holder,
    force_release_info,
    get_lock_info,
    page_locks,
)

logger = logging.getLogger("django_redislock")

SUBCOMMANDS = ("list", "release", "stats")
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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


class Command(BaseCommand):
    help = "List, force-release and show statistics of django-redislock locks."

    def add_arguments(self, parser: ArgumentParser) -> None:
        # One flat parser rather than argparse sub-parsers: Django's own options (--settings,
        # --verbosity ...) must keep working after the subcommand, as in every other command.
        parser.add_argument(
            "subcommand",
            choices=SUBCOMMANDS,
            help="list: active locks; release: force-release one lock; "
            "stats: acquisition statistics.",
        )
        parser.add_argument(
            "name",
            nargs="?",
            default=None,
            help="release: the lock name (exact). stats: a lock name or key "
            "template (default: all).",
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

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options["subcommand"]
        misplaced = [
            flag
            for flag, dest, allowed in (
                ("NAME", "name", ("release", "stats")),
                ("--match", "match", ("list",)),
                ("--sort", "sort", ("list",)),
                ("--token", "token", ("release",)),
                ("--json", "as_json", ("list", "stats")),
            )
            if options[dest] not in (None, False) and subcommand not in allowed
        ]
        if misplaced:
            raise CommandError(
                f"'redislock {subcommand}' does not take {', '.join(misplaced)}.", returncode=2
            )
        if subcommand == "release" and not options["name"]:
            raise CommandError(
                "'redislock release' needs the NAME of the lock to release.", returncode=2
            )
        try:
            getattr(self, f"handle_{subcommand}")(**options)
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
        seen: set[tuple[str, int]] = set()
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
                if (info.name, info.fencing_token) in seen:
                    continue  # SCAN may return a key again on a later page
                seen.add((info.name, info.fencing_token))
                listed += 1
                if as_json:
                    self.stdout.write(_dumps(_json_fields(info)))
                else:
                    self.stdout.write(_text_line(info))
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
            holder = describe_holder(info)
            logger.warning(
                "django_redislock: lock %r force-released from the command line (was held by %s).",
                name,
                holder,
            )
            self.stdout.write(f"Released lock {name!r} (was held by {holder}).")

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
                        }
                    )
                )
            else:
                rate = "-" if row.success_rate is None else f"{row.success_rate:.1%}"
                self.stdout.write(
                    f"{row.name}\tacquired={row.acquired}\tcontended={row.contended}\t"
                    f"failed={row.failed}\tlost={row.lost}\tforce_released={row.force_released}"
                    f"\tsuccess={rate}\tmean_wait={_seconds(row.mean_wait)}\t"
                    f"mean_hold={_seconds(row.mean_hold)}"
                )


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=False)


def _text_line(info: LockInfo) -> str:
    expires = f"{info.expires_in:.1f}s" if info.expires else "never"
    if info.unreadable:
        return f"{info.name}\tunreadable\texpires_in={expires}\tvalue={info.raw_excerpt!r}"
    if info.queued:
        owner = f"queued, published by {info.host}:{info.pid}"
    else:
        owner = f"{info.host}:{info.pid}:{info.thread}"
    task = f" task={info.task_id}" if info.task_id else ""
    return (
        f"{info.name}\ttoken={info.fencing_token}\tholds={info.hold_count}\t"
        f"expires_in={expires}\towner={owner}{task}"
    )


def _json_fields(info: LockInfo) -> dict[str, Any]:
    fields = info.as_dict()
    if info.expires:
        fields["expires_in"] = round(info.expires_in, 3)
    return fields
