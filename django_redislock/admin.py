"""Admin pages for locks: a list, a detail page, statistics, and a guarded force release.

Locks live in Redis, so these are plain views (like django-rq's) hung on a ``ModelAdmin`` of the
unmanaged :class:`~django_redislock.models.Lock`, which gives them the admin index entry, URL names
under the site's namespace (``admin:django_redislock_lock_changelist`` ...) and permissions. Every
view is wrapped in ``admin_site.admin_view`` (login, CSRF, never cached) *and* checks the
permission itself on every request: ``view_lock`` to look, ``force_release_lock`` to release.

The default site gets :class:`LockAdmin` when Django autodiscovers this module; any other
``AdminSite`` can host the pages with :func:`register`.

Paging is cursor-based over ``SCAN`` (:func:`~django_redislock.operations.lock_page`), so the first
page costs a handful of round trips however many locks exist. Sorting by expiry or age needs every
lock, so a sorted view scans them all (see ``benchmarks/admin_list.py`` for what that costs).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_redislock import stats
from django_redislock.exceptions import LockBackendError
from django_redislock.models import Lock
from django_redislock.operations import (
    LockInfo,
    force_release,
    get_lock_info,
    lock_page,
)

__all__ = ["LockAdmin", "register"]

ACTION_NAME = "force_release_selected"
#: ``?o=`` values: sort key and whether descending (no ``o`` = SCAN order, cursor paging).
#: "held for" sorts on ``acquired_at`` (older = held longer), which needs no clock reading per lock.
SORTS: dict[str, tuple[Callable[[LockInfo], Any], bool]] = {
    "expires": (lambda info: info.expires_in, False),
    "-expires": (lambda info: info.expires_in, True),
    "held": (lambda info: info.acquired_at, True),
    "-held": (lambda info: info.acquired_at, False),
}
REFRESH_CHOICES = (5, 10, 30, 60)
_GLOB_CHARS = frozenset("*?[")


def duration(seconds: float | None) -> str:
    """Short human duration: ``4.2 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 4 h``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return _("%(seconds).1f s") % {"seconds": seconds}
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return _("%(minutes)d min %(seconds)02d s") % {"minutes": minutes, "seconds": secs}
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return _("%(hours)d h %(minutes)02d min") % {"hours": hours, "minutes": minutes}
    days, hours = divmod(hours, 24)
    return _("%(days)d d %(hours)d h") % {"days": days, "hours": hours}


def name_glob(query: str) -> str | None:
    """The ``match`` glob for a search box entry: a glob as typed, plain text as a substring."""
    query = query.strip()
    if not query:
        return None
    if _GLOB_CHARS & set(query):
        return query
    return f"*{query}*"


def selection_value(info: LockInfo) -> str:
    """Checkbox value naming a lock *and* the fencing token the operator saw."""
    return f"{info.fencing_token}:{info.name}"


def parse_selection(values: Iterable[str]) -> list[tuple[int, str]]:
    """``[(token, name)]`` from checkbox values; malformed values are ignored."""
    selected: dict[str, int] = {}
    for value in values:
        token, sep, name = value.partition(":")
        if sep and name and token.isdigit() and int(token) > 0:
            selected.setdefault(name, int(token))
    return [(token, name) for name, token in selected.items()]


@dataclass(frozen=True)
class Row:
    """One lock as a table row (formatted in the view so templates stay simple)."""

    info: LockInfo
    detail_url: str

    @property
    def value(self) -> str:
        return selection_value(self.info)

    @property
    def holder(self) -> str:
        info = self.info
        return " · ".join(str(part) for part in (info.host, info.pid, info.thread) if part)

    @property
    def held_for(self) -> str:
        return duration(self.info.held_for)

    @property
    def expires_in(self) -> str:
        return duration(self.info.expires_in)


@dataclass(frozen=True)
class Candidate:
    """A selected lock on the confirmation page: what the operator saw and what holds it now."""

    name: str
    token: int
    current: LockInfo | None

    @property
    def unchanged(self) -> bool:
        return self.current is not None and self.current.fencing_token == self.token

    @property
    def value(self) -> str:
        return f"{self.token}:{self.name}"

    @property
    def holder(self) -> str:
        if self.current is None:
            return ""
        info = self.current
        return " · ".join(str(part) for part in (info.host, info.pid, info.thread) if part)

    @property
    def held_for(self) -> str:
        return duration(self.current.held_for) if self.current else "-"


class LockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Admin pages for the locks of one cache (``using``; ``None`` = ``REDISLOCK["CACHE"]``)."""

    using: str | None = None
    #: Locks per page (a page may hold a few more: SCAN cannot stop mid-step).
    list_per_page = 100
    #: Largest SCAN ``COUNT`` while filling a page; small pages start at ``list_per_page``.
    scan_count_max = 5000
    #: A sorted view reads at most this many locks (it must read them all to sort them).
    sort_limit = 200_000
    #: The statistics page shows at most this many names.
    stats_limit = 1000

    list_template = "django_redislock/admin/lock_list.html"
    detail_template = "django_redislock/admin/lock_detail.html"
    confirmation_template = "django_redislock/admin/force_release_confirmation.html"
    stats_template = "django_redislock/admin/lock_stats.html"

    # -- permissions -------------------------------------------------------------------------
    def _perm(self, codename: str) -> str:
        return f"{self.opts.app_label}.{codename}"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.has_perm(self._perm("view_lock")))

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        return bool(
            request.user.is_active and request.user.has_perm(self._perm("force_release_lock"))
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _require(self, allowed: bool) -> None:
        if not allowed:
            raise PermissionDenied

    # -- URLs ---------------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"

        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            return self.admin_site.admin_view(view)

        return [
            path("", wrap(self.changelist_view), name=f"{prefix}_changelist"),
            path("statistics/", wrap(self.statistics_view), name=f"{prefix}_statistics"),
            # "change" is the name the admin (and LogEntry.get_admin_url) links objects by.
            path("<path:object_id>/change/", wrap(self.detail_view), name=f"{prefix}_change"),
        ]

    def _url(self, name: str, *args: Any) -> str:
        return reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}",
            args=args,
            current_app=self.admin_site.name,
        )

    def detail_url(self, lock_name: str) -> str:
        return self._url("change", quote(lock_name))

    def _context(self, request: HttpRequest, title: Any, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "subtitle": None,
            "changelist_url": self._url("changelist"),
            "statistics_url": self._url("statistics"),
            "has_force_release_permission": self.has_force_release_permission(request),
            "action_name": ACTION_NAME,
            **extra,
        }

    def _render(
        self, request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
    ) -> TemplateResponse:
        request.current_app = self.admin_site.name
        return TemplateResponse(request, template, context, status=status)

    # -- list -----------------------------------------------------------------------------------
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require(self.has_view_permission(request))
        if request.method == "POST":
            return self.action_view(request)
        query = request.GET.get("q", "")
        match = name_glob(query)
        sort = request.GET.get("o") if request.GET.get("o") in SORTS else None
        refresh = _int(request.GET.get("refresh"))
        refresh = refresh if refresh in REFRESH_CHOICES else None
        error = None
        next_url = None
        page = max(_int(request.GET.get("p")) or 1, 1)
        truncated = False
        try:
            if sort is None:
                cursor = max(_int(request.GET.get("cursor")) or 0, 0)
                infos, next_cursor = self.scan_page(match, cursor)
                if next_cursor:
                    next_url = self._query(request, cursor=next_cursor, p=page + 1)
            else:
                infos, more, truncated = self.sorted_page(match, sort, page)
                if more:
                    next_url = self._query(request, p=page + 1, cursor=None)
        except LockBackendError as exc:
            infos, error = [], str(exc)
        rows = [Row(info, self.detail_url(info.name)) for info in infos]
        first = (page - 1) * self.list_per_page + 1 if sort else None
        headers = [
            self._sort_header(request, label, key, sort)
            for label, key in (
                (gettext_lazy("held for"), "held"),
                (gettext_lazy("expires in"), "expires"),
            )
        ]
        context = self._context(
            request,
            capfirst(self.opts.verbose_name_plural),
            rows=rows,
            query=query,
            sort=sort,
            page=page,
            first=first,
            error=error,
            next_url=next_url,
            truncated=truncated,
            sort_limit=self.sort_limit,
            first_url=self._query(request, cursor=None, p=None) if page > 1 else None,
            previous_url=(self._query(request, p=page - 1) if sort and page > 1 else None),
            refresh=refresh,
            refresh_choices=REFRESH_CHOICES,
            refresh_urls=[(s, self._query(request, refresh=s)) for s in REFRESH_CHOICES],
            refresh_off_url=self._query(request, refresh=None),
            held_header=headers[0],
            expires_header=headers[1],
            preserved=[(k, v) for k, v in request.GET.items() if k in ("o", "refresh")],
            **(extra_context or {}),
        )
        return self._render(request, self.list_template, context)

    def scan_page(self, match: str | None, cursor: int) -> tuple[list[LockInfo], int]:
        """At least ``list_per_page`` locks (unless fewer remain) from ``cursor`` on, in SCAN order.

        Each SCAN step's COUNT doubles while steps come back sparse (a namespace holds many
        more fence counters than live locks), capped by ``scan_count_max``.
        """
        found: dict[str, LockInfo] = {}
        count = self.list_per_page
        while True:
            cursor, infos = lock_page(cursor=cursor, match=match, count=count, using=self.using)
            for info in infos:
                found.setdefault(info.name, info)
            if cursor == 0 or len(found) >= self.list_per_page:
                return list(found.values()), cursor
            if len(infos) < count // 4:
                count = min(count * 2, self.scan_count_max)

    def sorted_page(
        self, match: str | None, sort: str, page: int
    ) -> tuple[list[LockInfo], bool, bool]:
        """Page ``page`` of every lock sorted by ``sort``: ``(infos, more, truncated)``.

        Reads every lock (up to ``sort_limit``) but keeps only the ``page * list_per_page`` best
        in a heap (plus a set of names seen, as SCAN may repeat one).
        """
        key, descending = SORTS[sort]
        wanted = page * self.list_per_page + 1
        scanned = 0
        truncated = False

        def limited() -> Iterable[LockInfo]:
            nonlocal scanned, truncated
            seen: set[str] = set()
            cursor = 0
            while True:
                cursor, infos = lock_page(
                    cursor=cursor, match=match, count=self.scan_count_max, using=self.using
                )
                for info in infos:
                    if info.name in seen:
                        continue
                    if scanned >= self.sort_limit:
                        truncated = True
                        return
                    seen.add(info.name)
                    scanned += 1
                    yield info
                if cursor == 0:
                    return

        pick = heapq.nlargest if descending else heapq.nsmallest
        best = pick(wanted, limited(), key=key)
        start = (page - 1) * self.list_per_page
        return best[start : start + self.list_per_page], len(best) == wanted, truncated

    def _query(self, request: HttpRequest, **changes: Any) -> str:
        params = {k: v for k, v in request.GET.items()}
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = str(value)
        return "?" + urlencode(params) if params else "?"

    def _sort_header(
        self, request: HttpRequest, label: Any, key: str, sort: str | None
    ) -> dict[str, Any]:
        ascending = sort == key
        descending = sort == f"-{key}"
        toggle = f"-{key}" if ascending else key
        return {
            "label": label,
            "sorted": ascending or descending,
            "ascending": ascending,
            "url": self._query(request, o=toggle, cursor=None, p=None),
            "remove_url": self._query(request, o=None, cursor=None, p=None),
        }

    # -- force release --------------------------------------------------------------------------
    def action_view(self, request: HttpRequest) -> HttpResponse:
        """POST from the list or detail page: confirmation first, then the release itself."""
        self._require(self.has_force_release_permission(request))
        back = self._url("changelist")
        if request.POST.get("action") != ACTION_NAME:
            self.message_user(request, _("No action selected."), messages.WARNING)
            return HttpResponseRedirect(back)
        selected = parse_selection(request.POST.getlist(ACTION_CHECKBOX_NAME))
        if not selected:
            self.message_user(
                request,
                _(
                    "Items must be selected in order to perform actions on "
                    "them. No items have been changed."
                ),
                messages.WARNING,
            )
            return HttpResponseRedirect(back)
        if request.POST.get("post") == "yes":
            return self.release_selected(request, selected)
        return self.confirmation_view(request, selected)

    def confirmation_view(
        self, request: HttpRequest, selected: list[tuple[int, str]]
    ) -> HttpResponse:
        try:
            candidates = [
                Candidate(name, token, get_lock_info(name, using=self.using))
                for token, name in selected
            ]
        except LockBackendError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(self._url("changelist"))
        releasable = [c for c in candidates if c.unchanged]
        context = self._context(
            request,
            _("Force-release locks?"),
            candidates=candidates,
            releasable=releasable,
            changed=[c for c in candidates if not c.unchanged],
            action_checkbox_name=ACTION_CHECKBOX_NAME,
        )
        return self._render(request, self.confirmation_template, context)

    def release_selected(
        self, request: HttpRequest, selected: list[tuple[int, str]]
    ) -> HttpResponse:
        released: list[str] = []
        skipped: list[str] = []
        content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
        try:
            for token, name in selected:
                before = get_lock_info(name, using=self.using)
                if before is None or before.fencing_token != token:
                    skipped.append(name)
                    continue
                if not force_release(name, token=token, using=self.using):
                    skipped.append(name)
                    continue
                released.append(name)
                self.log_force_release(request, content_type, before)
        except LockBackendError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        if released:
            self.message_user(
                request,
                ngettext(
                    "Force-released %(count)d lock: %(names)s.",
                    "Force-released %(count)d locks: %(names)s.",
                    len(released),
                )
                % {"count": len(released), "names": ", ".join(released)},
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "Not released, because it changed hands or was released since you looked at "
                    "it: %(names)s.",
                    "Not released, because they changed hands or were released since you looked at "
                    "them: %(names)s.",
                    len(skipped),
                )
                % {"names": ", ".join(skipped)},
                messages.WARNING,
            )
        return HttpResponseRedirect(self._url("changelist"))

    def log_force_release(
        self, request: HttpRequest, content_type: ContentType, info: LockInfo
    ) -> LogEntry:
        """The audit record: who released which lock, and who held it (in English, for logs)."""
        task = f", Celery task {info.task_id}" if info.task_id else ""
        entry: LogEntry = LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=content_type.pk,
            object_id=info.name,
            object_repr=info.name[:200],
            action_flag=DELETION,
            change_message=(
                f"Force-released lock (fencing token {info.fencing_token}, held by {info.host} "
                f"pid {info.pid} thread {info.thread}{task}, for {info.held_for:.1f} s)."
            ),
        )
        return entry

    # -- detail and statistics ------------------------------------------------------------------
    def detail_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        self._require(self.has_view_permission(request))
        name = unquote(object_id)
        try:
            info = get_lock_info(name, using=self.using)
            figures = stats.get_stats(name, using=self.using)
        except LockBackendError as exc:
            info, figures = None, None
            self.message_user(request, str(exc), messages.ERROR)
        context = self._context(
            request,
            name,
            lock_name=name,
            info=info,
            row=Row(info, "") if info else None,
            stats=figures,
            stats_rows=[StatsRow(figures)] if figures else [],
            action_checkbox_name=ACTION_CHECKBOX_NAME,
        )
        return self._render(request, self.detail_template, context, status=200 if info else 404)

    def statistics_view(self, request: HttpRequest) -> HttpResponse:
        self._require(self.has_view_permission(request))
        error = None
        try:
            found = itertools.islice(stats.iter_stats(using=self.using), self.stats_limit)
            rows = sorted(found, key=lambda s: s.name)
        except LockBackendError as exc:
            rows, error = [], str(exc)
        context = self._context(
            request,
            _("Lock statistics"),
            rows=[StatsRow(s) for s in rows],
            error=error,
            stats_ttl_hours=stats.STATS_TTL // 3600,
        )
        return self._render(request, self.stats_template, context)


@dataclass(frozen=True)
class StatsRow:
    """Statistics of one stats name, formatted for a table."""

    stats: stats.LockStats

    @property
    def success_rate(self) -> str:
        rate = self.stats.success_rate
        return "-" if rate is None else f"{rate:.1%}"

    @property
    def mean_wait(self) -> str:
        return duration(self.stats.mean_wait)

    @property
    def max_wait(self) -> str:
        return duration(self.stats.wait_max) if self.stats.acquired else "-"

    @property
    def mean_hold(self) -> str:
        return duration(self.stats.mean_hold)

    @property
    def max_hold(self) -> str:
        return duration(self.stats.hold_max) if self.stats.released else "-"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def register(site: admin.AdminSite, admin_class: type[LockAdmin] = LockAdmin) -> None:
    """Put the Locks pages on ``site`` (any ``AdminSite``); a no-op if already there."""
    if not site.is_registered(Lock):
        site.register(Lock, admin_class)


register(admin.site)
