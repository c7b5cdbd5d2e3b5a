"""Admin pages for locks: a list, a detail page, statistics, and a guarded force release.

Locks live in Redis, so these are plain views (like django-rq's) hung on a ``ModelAdmin`` of the
unmanaged :class:`~django_redislock.models.Lock`, which gives them the admin index entry, URL names
under the site's namespace (``admin:django_redislock_lock_changelist`` ...) and permissions. Every
view is wrapped in ``admin_site.admin_view`` (login, CSRF, never cached) *and* checks the
permission itself on every request: ``view_lock`` to look, ``force_release_lock`` to release.

The default site gets :class:`LockAdmin` when Django autodiscovers this module; any other
``AdminSite`` can host the pages with :func:`register`.

Paging, sorting and force release are :mod:`django_redislock.operations` (the ``redislock``
command uses the same functions): pages follow ``SCAN`` cursors, so the first page costs a
handful of round trips however many locks exist; a sorted view reads every lock (see
``benchmarks/admin_list.py`` for what that costs). When Redis cannot be reached, every page shows
one error panel saying where Redis was expected and what to check, and nothing else.

Lock names in URLs and forms (issue 27). A lock name is any text, but a browser does not send
every path it is given: it removes the segments ``.`` and ``..`` (also spelt ``%2E``) before the
request, so ``…/lock/../change/`` became a 404, and HTML forms rewrite CR, LF and NUL in field
values, so such a name could not be selected for release. Names are therefore written with
:func:`encode_name`, Django's admin quoting (``quote``: ``_`` followed by two hex digits for
``/``, ``_``, ``:`` ...) extended to control characters, and to the dots of a name that is
nothing but ``.`` or ``..`` (``_2E``). Every other name without control characters keeps
exactly the URL Django's own quoting gave it before (``LogEntry.get_admin_url`` agrees), and
links made before still lead to their lock whatever the name (decoding leaves characters that
are not escapes alone). Because ``_`` itself is always escaped, :func:`decode_name` reverses the
encoding exactly. Query parameters were the alternative; they would have changed every URL.
Checkbox values (``token:name``) carry names the same way; a value posted by a script with a
plain name still works unless the name itself contains such an escape.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_redislock import charts, stats
from django_redislock.exceptions import LockBackendError
from django_redislock.models import Lock
from django_redislock.naming import stats_shape
from django_redislock.operations import (
    HOLDS_NOTHING,
    SORTS,
    BackendProblem,
    LockInfo,
    backend_problem,
    force_release_info,
    lock_holders,
    page_locks,
    rate_limit_info,
    reset_rate_limit,
)

__all__ = ["LockAdmin", "decode_name", "encode_name", "register"]

ACTION_NAME = "force_release_selected"
REFRESH_CHOICES = (5, 10, 30, 60)
_GLOB_CHARS = frozenset("*?[")


#: The space between a number and its unit (``3 min``): made a no-break space in durations.
_UNIT_SPACE = re.compile(r"(\d) (?=\D)")


def duration(seconds: float | None) -> str:
    """Short human duration: ``4.2 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 4 h``, ``never``.

    A number and its unit are joined by a no-break space, so a narrow column wraps ``3 min 05 s``
    between the two parts, never between ``3`` and ``min``.
    """
    return _UNIT_SPACE.sub("\\1\u00a0", _duration(seconds))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return _("never")
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


#: Escaped by :func:`encode_name`: what Django's admin ``quote`` escapes, plus every control
#: character (HTML forms rewrite CR, LF and NUL; the others are invisible in a URL bar).
_ESCAPED = frozenset(c for c in map(chr, range(0xA0)) if quote(c) != c or c < " " or c >= "\x7f")
_ESCAPES = re.compile(f"_({'|'.join(f'{ord(c):02X}' for c in sorted(_ESCAPED | {'.'}))})")


def encode_name(name: str) -> str:
    """``name`` as one URL path segment or form value that no browser rewrites.

    Django's admin quoting extended to control characters; a name of only ``.`` or ``..`` has
    its dots escaped too (``_2E``), since browsers drop such segments from a path.
    """
    encoded = "".join(f"_{ord(c):02X}" if c in _ESCAPED else c for c in name)
    if encoded in (".", ".."):
        return encoded.replace(".", "_2E")
    return encoded


def decode_name(encoded: str) -> str:
    """The lock name :func:`encode_name` encoded (and what Django's ``unquote`` decodes)."""
    return _ESCAPES.sub(lambda m: chr(int(m[1], 16)), encoded)


def selection_value(info: LockInfo) -> str:
    """Checkbox value naming a holder: the fencing token the operator saw, and the lock name.

    The token tells holders of one name apart (semaphore permits) and makes the release refuse a
    lock that changed hands; an unreadable value has token 0. The name is encoded
    (:func:`encode_name`) so that forms send it back unchanged.
    """
    return f"{info.fencing_token}:{encode_name(info.name)}"


def parse_selection(values: Iterable[str]) -> list[tuple[int, str]]:
    """``[(token, name)]`` from checkbox values, each pair once; malformed values are ignored."""
    selected: dict[tuple[int, str], None] = {}
    for value in values:
        token, sep, name = value.partition(":")
        if sep and name and token.isdigit():
            selected.setdefault((int(token), decode_name(name)))
    return list(selected)


def holder_text(info: LockInfo) -> str:
    """Who holds a lock, as one line: worker ``host · pid · thread``, or who queued the task."""
    if info.unreadable:
        return _("unreadable value")
    if info.queued:
        publisher = " · ".join(str(part) for part in (info.host, info.pid) if part)
        return _("queued — published by %(publisher)s") % {"publisher": publisher or "?"}
    holder = " · ".join(str(part) for part in (info.host, info.pid, info.thread) if part)
    if info.mode == "read":
        return _("reading: %(holder)s") % {"holder": holder}
    if info.mode == "write":
        return _("writing: %(holder)s") % {"holder": holder}
    return holder


def audit_text(info: LockInfo) -> str:
    """The holder as the ``LogEntry`` records it (in English: audit logs are read by tools)."""
    if info.unreadable:
        return (
            f"Force-released an unreadable value (not a lock record; starts {info.raw_excerpt!r})."
        )
    if info.queued:
        holder = (
            f"held for queued Celery task {info.task_id}, published by {info.host} pid {info.pid}"
        )
    else:
        task = f", Celery task {info.task_id}" if info.task_id else ""
        holder = f"held by {info.host} pid {info.pid} thread {info.thread}{task}"
    return (
        f"Force-released lock (fencing token {info.fencing_token}, {holder}, "
        f"for {info.held_for:.1f} s)."
    )


_BREAK_AFTER = re.compile(r"([._])")


def _breakable(name: str) -> SafeString:
    """``name`` escaped, with a line-break opportunity (``<wbr>``) after each ``.`` and ``_``: a
    narrow column wraps ``reports.tasks.build_report`` between its parts, never inside one (a
    browser breaks after ``-`` by itself; ``:`` and ``/`` keep ``report:{n}`` whole)."""
    return mark_safe(_BREAK_AFTER.sub(r"\1<wbr>", escape(name)))  # escaped, then only <wbr> added


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
        if self.is_rate:
            return _("rate limiter (nobody holds it)")
        if info.kind == "latch":
            return _("count-down latch: %(left)s of %(count)s left") % {
                "left": info.hold_count,
                "count": info.permits,
            }
        if info.kind == "barrier":
            text = _("barrier: %(arrived)s of %(parties)s parties waiting") % {
                "arrived": info.hold_count,
                "parties": info.permits,
            }
            return text + (" " + _("(broken)") if info.mode == "broken" else "")
        return holder_text(info)

    @property
    def holds_nothing(self) -> bool:
        """A rate limiter, a latch or a barrier: listed, but nothing to force-release."""
        return self.info.kind in HOLDS_NOTHING

    @property
    def is_rate(self) -> bool:
        """A rate limiter: nothing to force-release (it is reset from its own page)."""
        return self.info.kind == "rate"

    @property
    def held_for(self) -> str:
        return "-" if self.info.unreadable or self.holds_nothing else duration(self.info.held_for)

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
        return f"{self.token}:{encode_name(self.name)}"

    @property
    def holder(self) -> str:
        return "" if self.current is None else holder_text(self.current)

    @property
    def held_for(self) -> str:
        if self.current is None or self.current.unreadable:
            return "-"
        return duration(self.current.held_for)


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
    #: Wait/hold charts are drawn for this many key templates (the busiest).
    chart_templates = 12
    #: Rows of the "current holders" and "outcomes" charts.
    chart_rows = 15
    #: The holders chart reads at most this many locks to find the longest-held ones.
    chart_holders_limit = 10_000

    list_template = "django_redislock/admin/lock_list.html"
    detail_template = "django_redislock/admin/lock_detail.html"
    confirmation_template = "django_redislock/admin/force_release_confirmation.html"
    reset_template = "django_redislock/admin/rate_reset_confirmation.html"
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
            path(
                "<path:object_id>/reset-rate/", wrap(self.reset_rate_view), name=f"{prefix}_reset"
            ),
        ]

    def _url(self, name: str, *args: Any) -> str:
        return reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}",
            args=args,
            current_app=self.admin_site.name,
        )

    def detail_url(self, lock_name: str) -> str:
        """The detail page of ``lock_name``, whatever its characters (see :func:`encode_name`)."""
        return self._url("change", encode_name(lock_name))

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
            "problem": None,
            **extra,
        }

    def _render(
        self, request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
    ) -> TemplateResponse:
        request.current_app = self.admin_site.name
        return TemplateResponse(request, template, context, status=status)

    def _problem(self, exc: LockBackendError) -> BackendProblem:
        return backend_problem(exc, using=self.using)

    # -- list -----------------------------------------------------------------------------------
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require(self.has_view_permission(request))
        if request.method == "POST":
            return self.action_view(request)
        title = capfirst(self.opts.verbose_name_plural)
        query = request.GET.get("q", "")
        sort = request.GET.get("o") if request.GET.get("o") in SORTS else None
        refresh = _int(request.GET.get("refresh"))
        refresh = refresh if refresh in REFRESH_CHOICES else None
        try:
            page = page_locks(
                match=name_glob(query),
                sort=sort,
                cursor=max(_int(request.GET.get("cursor")) or 0, 0),
                page=max(_int(request.GET.get("p")) or 1, 1),
                per_page=self.list_per_page,
                using=self.using,
                scan_count_max=self.scan_count_max,
                sort_limit=self.sort_limit,
            )
        except LockBackendError as exc:
            context = self._context(request, title, problem=self._problem(exc), refresh=refresh)
            return self._render(request, self.list_template, context)
        next_url = None
        if page.has_next and sort:
            next_url = self._query(request, p=page.number + 1, cursor=None)
        elif page.has_next:
            next_url = self._query(request, cursor=page.next_cursor, p=page.number + 1)
        headers = {
            key: self._sort_header(request, label, key, sort)
            for label, key in (
                (gettext_lazy("name"), "name"),
                (gettext_lazy("held for"), "held"),
                (gettext_lazy("expires in"), "expires"),
            )
        }
        context = self._context(
            request,
            title,
            rows=[Row(info, self.detail_url(info.name)) for info in page.infos],
            page=page,
            query=query,
            sort=sort,
            next_url=next_url,
            sort_limit=self.sort_limit,
            first_url=self._query(request, cursor=None, p=None) if page.has_previous else None,
            previous_url=(
                self._query(request, p=page.number - 1) if sort and page.has_previous else None
            ),
            refresh=refresh,
            refresh_choices=REFRESH_CHOICES,
            refresh_urls=[(s, self._query(request, refresh=s)) for s in REFRESH_CHOICES],
            refresh_off_url=self._query(request, refresh=None),
            name_header=headers["name"],
            held_header=headers["held"],
            expires_header=headers["expires"],
            preserved=[(k, v) for k, v in request.GET.items() if k in ("o", "refresh")],
            **(extra_context or {}),
        )
        return self._render(request, self.list_template, context)

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
                Candidate(name, token, _holder_with(lock_holders(name, using=self.using), token))
                for token, name in selected
            ]
        except LockBackendError as exc:
            self.message_user(request, self._unreachable_message(exc), messages.ERROR)
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
        """Release each ``(token, name)``; the audit record describes exactly what was released."""
        released: list[str] = []
        skipped: list[str] = []
        content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
        try:
            for token, name in selected:
                gone = force_release_info(name, token=token, using=self.using)
                if not gone:
                    skipped.append(name)
                    continue
                released.append(name)
                for info in gone:
                    self.log_force_release(request, content_type, info)
        except LockBackendError as exc:
            self.message_user(request, self._unreachable_message(exc), messages.ERROR)
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

    def _unreachable_message(self, exc: LockBackendError) -> str:
        problem = self._problem(exc)
        values = {"alias": problem.alias, "location": problem.location, "detail": problem.detail}
        if problem.unreachable:
            return (
                _(
                    "Redis is unreachable (cache “%(alias)s” at %(location)s), so no lock was "
                    "released or changed. Check that the Redis server is running and reachable "
                    "from this web server, then try again. (%(detail)s)"
                )
                % values
            )
        return (
            _(
                "Redis answered an error (cache “%(alias)s” at %(location)s), so no lock was "
                "released or changed: %(detail)s"
            )
            % values
        )

    def log_force_release(
        self, request: HttpRequest, content_type: ContentType, info: LockInfo
    ) -> LogEntry:
        """The audit record: who released which lock, and who held it (in English, for logs)."""
        entry: LogEntry = LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=content_type.pk,
            object_id=info.name,
            object_repr=info.name[:200],
            action_flag=DELETION,
            change_message=audit_text(info),
        )
        return entry

    # -- detail and statistics ------------------------------------------------------------------
    def detail_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        self._require(self.has_view_permission(request))
        name = decode_name(object_id)
        try:
            holders = lock_holders(name, using=self.using)
            rate = rate_limit_info(name, using=self.using)
            holders += [rate] if rate is not None else []
            figures = stats.get_stats(name, using=self.using)
        except LockBackendError as exc:
            context = self._context(request, name, lock_name=name, problem=self._problem(exc))
            return self._render(request, self.detail_template, context)
        rows = [Row(info, "") for info in holders]
        limiter = next((row for row in rows if row.is_rate), None)
        context = self._context(
            request,
            name,
            lock_name=name,
            rows=[row for row in rows if not row.is_rate],
            limiter=limiter,
            rate=self._rate_figures(name) if limiter is not None else None,
            reset_url=self._url("reset", encode_name(name)),
            # One holder for a lock; kept for templates that show a single one.
            info=holders[0] if holders else None,
            row=rows[0] if rows else None,
            stats=figures,
            stats_rows=[StatsRow(figures)] if figures else [],
            action_checkbox_name=ACTION_CHECKBOX_NAME,
        )
        return self._render(request, self.detail_template, context, status=200 if rows else 404)

    def _rate_figures(self, name: str) -> RateFigures:
        """What a rate limiter allowed and refused, by minute (its statistics row)."""
        figures = stats.get_stats(stats_shape(name), using=self.using, series=True)
        minutes = figures.per_minute if figures is not None else ()
        return RateFigures(
            last=minutes[-2] if len(minutes) >= 2 else None,
            current=minutes[-1] if minutes else None,
            throttled=figures.throttled if figures is not None else 0,
        )

    # -- rate limiter reset ---------------------------------------------------------------------
    def reset_rate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST only: a confirmation page, then (``post=yes``) the reset and its audit entry.

        The same permission as a force release, checked here on every request."""
        self._require(self.has_force_release_permission(request))
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        name = decode_name(object_id)
        detail = self.detail_url(name)
        if request.POST.get("post") != "yes":
            context = self._context(
                request, _("Reset rate limiter?"), lock_name=name, detail_url=detail
            )
            return self._render(request, self.reset_template, context)
        try:
            reset = reset_rate_limit(name, using=self.using)
        except LockBackendError as exc:
            self.message_user(request, self._unreachable_message(exc), messages.ERROR)
            return HttpResponseRedirect(detail)
        if reset:
            content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
            LogEntry.objects.create(
                user_id=request.user.pk,
                content_type_id=content_type.pk,
                object_id=name,
                object_repr=name[:200],
                action_flag=CHANGE,
                change_message="Reset rate limiter (its history was forgotten).",
            )
            self.message_user(
                request, _("Reset rate limiter “%(name)s”.") % {"name": name}, messages.SUCCESS
            )
        else:
            self.message_user(
                request,
                _("Rate limiter “%(name)s” had no history to reset.") % {"name": name},
                messages.WARNING,
            )
        return HttpResponseRedirect(self._url("changelist"))

    def statistics_view(self, request: HttpRequest) -> HttpResponse:
        self._require(self.has_view_permission(request))
        title = _("Lock statistics")
        try:
            found = itertools.islice(
                stats.iter_stats(using=self.using, series=True), self.stats_limit
            )
            rows = sorted(found, key=lambda s: s.name)
            holders = page_locks(
                sort="-held",
                per_page=self.chart_rows,
                using=self.using,
                scan_count_max=self.scan_count_max,
                sort_limit=self.chart_holders_limit,
            )
        except LockBackendError as exc:
            context = self._context(request, title, problem=self._problem(exc))
            return self._render(request, self.stats_template, context)
        timeline = charts.timeline_chart(rows)
        busiest = sorted(rows, key=lambda s: (-(s.acquired + s.released), s.name))
        context = self._context(
            request,
            title,
            rows=[StatsRow(s) for s in rows],
            stats_ttl_hours=stats.STATS_TTL // 3600,
            # Acquisitions over time when the last hour has any; else totals per key template.
            activity_chart=timeline if not timeline.empty else charts.outcome_chart(rows),
            holders_chart=charts.holders_chart(holders.infos, duration, limit=self.chart_rows),
            holders_truncated=holders.truncated,
            distributions=[
                (
                    StatsRow(s),
                    charts.distribution_chart(s, "wait"),
                    charts.distribution_chart(s, "hold"),
                )
                for s in busiest[: self.chart_templates]
                if s.wait_count or s.hold_count
            ],
        )
        return self._render(request, self.stats_template, context)


def _holder_with(holders: list[LockInfo], token: int) -> LockInfo | None:
    """The holder with ``token``, else the first (to show who holds the name now), else None."""
    for info in holders:
        if info.fencing_token == token:
            return info
    return holders[0] if holders else None


@dataclass(frozen=True)
class RateFigures:
    """A rate limiter's decisions by minute: the last whole minute and the current one."""

    last: stats.Minute | None
    current: stats.Minute | None
    throttled: int

    @property
    def per_minute(self) -> str:
        """The current rate: requests allowed in the last whole minute, per minute."""
        return f"{self.last.acquired}/min" if self.last is not None else "-"


@dataclass(frozen=True)
class StatsRow:
    """Statistics of one stats name, formatted for a table."""

    stats: stats.LockStats

    @property
    def name_html(self) -> SafeString:
        return _breakable(self.stats.name)

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
