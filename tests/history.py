"""Histories of lock calls, recorded by the clients and checked afterwards (issue 27, section E).

Two halves:

- :class:`HistoryRecorder`, used by worker processes (``tests/faults/chaos_worker.py``) and by
  tests: every ``acquire``/``release`` of every client is one JSON line — pid, thread or task,
  owner, name, when the call started and ended (``time.monotonic()``: on Linux one clock for the
  whole machine, so times compare across processes), its outcome and fencing token — appended to
  a file with one ``os.write`` per line (``O_APPEND``: lines of threads never interleave, a
  SIGKILL loses at most the call in flight).
- :func:`check_history`, which reads those lines (plus what was left in Redis, and which
  processes the test killed) and lists every broken promise in a :class:`Report`.

What is checked, and why each check is sound (no false alarm on a correct lock):

``overlap`` — two owners holding one name at once (two *readers* of a read-write lock may:
    calls recorded with ``mode="read"``/``"write"`` are holds of its two sides). A *hold* runs
    from the moment ``acquire()`` returned True to the moment ``release()`` was *called*: Redis
    gave the lock before the former and freed it after the latter, so a correct lock never lets
    two such intervals intersect.
    Holds whose owner saw the loss (``lock.lost``, ``LockNotOwnedError``/``LockLostError`` at
    release) are left out — a lease can always run out under a paused holder — and so are holds
    whose end is not confirmed: a release whose outcome is unknown, or a SIGKILLed holder, counts
    only while still inside the lease the acquisition started (``end - attempt start < lease``).
    Workers keep critical sections far below the lease and use auto-renew, so that leaves out
    almost nothing. With ``exclusion_across_failovers=False`` (Sentinel/Cluster without
    ``REPLICAS``: README "Guarantees" does not promise it) overlaps between holds acquired on two
    sides of a failover are counted apart (``exempt_overlaps``), not as violations.
``token`` — fencing tokens strictly increasing in acquisition order per name. Acquisition B must
    get a token above A's when A certainly came first: A's ``acquire()`` returned before B's
    started (whatever else happened), or both are valid holds (above) and A's came first (the
    exclusion then orders them; its breaches are ``overlap`` violations). Nested re-entrant
    acquisitions keep the outer token (API.md) and are not compared; a nested acquisition with
    another token than its outer hold is a ``token`` violation too.
``leftover`` — locks, queue entries or semaphore permits still alive in Redis once every
    client exited (read with a raw client on the real port, :func:`read_leftovers`; an entry past
    its own expiry is dead data every script skips, not a leftover). A SIGKILLed client's keys
    may stay one lease (a queue entry: one lease plus the engine's 2 s entry margin) after the
    kill; a client that exited cleanly must leave nothing.
``unresolved`` — every *unknown* outcome resolved. Unknown: the call may or may not have acted
    in Redis — ``LockOutcomeUnknown`` on an engine that has it, else any ``LockBackendError``
    that may have reached Redis (a reply lost, a timeout after sending; not "cannot connect").
    Resolved: the package sent ``lock_outcome_resolved`` for it (matched by attempt id, or by
    pid, name and action after the call started when the call carried no id). The current
    engine resolves nothing, so each unknown is a violation there.
``orphan`` — an ``acquire()`` that returned ``hold_count > 1`` although this owner knew no hold
    of the name: an earlier unknown outcome (lost reply, cancellation) left a hold in Redis that
    the client never heard of; it is re-entered, its token reused, and it outlives its user.
    One violation per orphaned hold (owner, name, token), however often it is re-entered.
``over_limit`` — a rate limiter allowed more than its rate (issue 30). Decision calls
    (``op="decide"``, outcome ``allowed``/``refused``/``error``) of a limiter of ``count`` per
    ``period`` with ``burst`` (GCRA: one request per ``period / count``, ``burst`` at once after a
    quiet period) are checked in windows of one period starting at each allowed call: the allowed
    calls whose *whole* call interval lies in ``[t, t + period]`` must number at most
    ``burst + count``. Sound: each allowance happened on the server at an instant inside its
    call, so those all happened within one span of ``period``, in which GCRA allows at most
    ``burst + floor(period / interval)``. A decision whose reply was lost is an ``error``: the
    caller did not act on it, so it is not counted (the limiter errs on the strict side). With
    ``exclusion_across_failovers=False`` a window that contains a failover is counted apart
    (``exempt_over_limit``): a failover that loses writes forgets the allowances among them.
``incomplete`` — the history cannot be trusted: a worker crashed, neither exited cleanly nor
    was killed by the test, or left a hold it never released.

A cancelled call (asyncio ``CancelledError``/``TimeoutError``) is recorded as ``cancelled``, not
``unknown``: a cancellation may come before anything was sent, and then there is nothing to
resolve, so an unmatched one is no violation by itself. What a cancellation can break shows
where it breaks: the task that retries finds an ``orphan``, and keys stay behind (``leftover``).
Resolutions sent for cancelled calls are matched and counted all the same.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KINDS",
    "QUEUE_MARGIN",
    "CallRecord",
    "HistoryRecorder",
    "Leftover",
    "Report",
    "Violation",
    "check_history",
    "classify_error",
    "load_history",
    "read_leftovers",
]

#: Violation kinds, in the order reports list them.
KINDS = ("overlap", "token", "over_limit", "leftover", "unresolved", "orphan", "incomplete")

#: How long a queue entry outlives its waiter's deadline (``django_redislock.engine.ENTRY_MARGIN``,
#: not imported: this module must load without Django configured).
QUEUE_MARGIN = 2.0

#: Outcomes of an acquire / a release call.
ACQUIRE_OUTCOMES = ("acquired", "not-acquired", "error", "unknown", "cancelled")
RELEASE_OUTCOMES = ("released", "lost", "error", "unknown", "cancelled")

_KEY_KINDS = {
    "lock": "lock",
    "queue": "queue",
    "sem": "sem",
    "semrec": "semrec",
    "semq": "semq",
    # A read-write lock (issue 31): the writer's record is a lock's; readers are permits.
    "rw": "lock",
    "rwr": "sem",
    "rwq": "queue",
}
#: Where the records of a permit-like key's members are.
_RECORDS = {"sem": "semrec", "rwr": "rwrec"}


# -- recording -----------------------------------------------------------------------------------


def _outcome_unknown_class() -> type[BaseException] | None:
    """``django_redislock.LockOutcomeUnknown`` where the engine has it (the fixed one)."""
    try:
        import django_redislock
    except Exception:  # pragma: no cover - the package is always importable in this repo
        return None
    cls = getattr(django_redislock, "LockOutcomeUnknown", None)
    if cls is None:
        exceptions = getattr(django_redislock, "exceptions", None)
        cls = getattr(exceptions, "LockOutcomeUnknown", None)
    return cls if isinstance(cls, type) else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


#: Texts of redis-py errors raised before a command could be sent.
_NOT_SENT = (
    "connecting to",  # "Error 111 connecting to ...", "Timeout connecting to server"
    "no master found",  # Sentinel: MasterNotFoundError
    "no slave found",
    "no replica found",
    "too many connections",  # pool exhausted
    "connection pool",
)


_FROM_PACKAGE: Any = object()


def classify_error(
    exc: BaseException, unknown_cls: type[BaseException] | None = _FROM_PACKAGE
) -> tuple[str, dict[str, Any]]:
    """``("unknown", fields)`` when the failed call may have acted in Redis, else
    ``("error", fields)``; ``fields`` carry ``LockOutcomeUnknown``'s ``attempt``, ``action``
    and ``lease_ends_by`` where the engine raised it.

    With ``LockOutcomeUnknown`` in the package, the engine says which calls are unknown: only
    that exception is. Without it (the current engine) a ``LockBackendError`` is unknown when
    a redis-py ``TimeoutError``/``ConnectionError`` (or an ``OSError``) under it is not one of
    "could not connect" (the command was never sent); an error reply (``ResponseError``: the
    script did not run, or ``REPLICAS`` undid it) is a plain error. ``unknown_cls`` overrides
    the class looked up in the package (``None``: classify as the current engine needs).
    """
    fields: dict[str, Any] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    if unknown_cls is _FROM_PACKAGE:
        unknown_cls = _outcome_unknown_class()
    if unknown_cls is not None:
        if isinstance(exc, unknown_cls):
            for attr in ("attempt", "action", "lease_ends_by"):
                value = getattr(exc, attr, None)
                fields[attr] = None if value is None else value
            if fields.get("attempt") is not None:
                fields["attempt"] = str(fields["attempt"])
            return "unknown", fields
        return "error", fields
    import redis.exceptions as rex

    for link in _chain(exc):
        if isinstance(link, rex.ResponseError):
            return "error", fields
        if isinstance(link, (rex.TimeoutError, rex.ConnectionError, OSError)):
            text = str(link).lower()
            if any(marker in text for marker in _NOT_SENT):
                return "error", fields
            return "unknown", fields
    return "error", fields


def _thread_label() -> str:
    """The calling thread's name, with the asyncio task's name inside a task."""
    label = threading.current_thread().name
    try:
        import asyncio

        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None:
        label = f"{label}/{task.get_name()}"
    return label


class CallRecord:
    """One call being timed: created just before it, finished with one of the ``done`` methods
    (each writes the call's line once)."""

    def __init__(
        self, recorder: HistoryRecorder, op: str, lock: Any, via: str, fields: dict[str, Any]
    ) -> None:
        self.recorder = recorder
        self.fields: dict[str, Any] = {
            "op": op,
            "name": lock.name,
            "owner": lock.owner,
            "thread": _thread_label(),
            "via": via,
            "lease": float(lock.timeout),
            **fields,
        }
        self.written = False
        self.start = time.monotonic()  # last: nothing of ours is timed inside the call

    def done(self, outcome: str, **fields: Any) -> None:
        end = time.monotonic()
        if self.written:
            raise RuntimeError(f"call already recorded: {self.fields}")
        self.written = True
        self.recorder.write(
            "call", start=self.start, end=end, outcome=outcome, **{**self.fields, **fields}
        )

    def acquired(self, lock: Any) -> None:
        """``acquire()`` returned True: the token and the hold count it left."""
        end = time.monotonic()
        self.fields.update(token=lock.fencing_token, hold_count=lock.hold_count)
        self._done_at(end, "acquired")

    def failed(self, exc: BaseException) -> str:
        """The call raised ``exc``: recorded as ``unknown`` or ``error`` (see
        :func:`classify_error`); returns which."""
        outcome, fields = classify_error(exc)
        self.done(outcome, **fields)
        return outcome

    def cancelled(self) -> None:
        self.done("cancelled")

    def _done_at(self, end: float, outcome: str) -> None:
        if self.written:
            raise RuntimeError(f"call already recorded: {self.fields}")
        self.written = True
        self.recorder.write("call", start=self.start, end=end, outcome=outcome, **self.fields)


class HistoryRecorder:
    """Append-only JSON-lines history of one process (thread-safe; one ``os.write`` a line).

    Every line has ``ev`` (``"call"``, ``"resolved"``, ``"start"``, ``"exit"``, ``"killed"``,
    ``"crash"``, ...), ``pid``, ``client`` (a label the worker was given) and ``t`` (monotonic
    time of writing). Call lines add ``op``, ``name``, ``owner``, ``thread``, ``via``,
    ``lease``, ``start``, ``end``, ``outcome`` and, as they apply, ``token``, ``hold_count``,
    ``lost``, ``attempt``, ``action``, ``lease_ends_by``, ``error``.
    """

    def __init__(self, path: str | os.PathLike[str], *, client: str = "") -> None:
        self.path = Path(path)
        self.client = client
        self.pid = os.getpid()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._receivers: list[Any] = []

    def write(self, ev: str, **fields: Any) -> None:
        fd = self._fd
        if fd is None:
            return
        line = {"ev": ev, "pid": self.pid, "client": self.client, "t": time.monotonic(), **fields}
        os.write(fd, (json.dumps(line, default=str) + "\n").encode())

    def call(self, op: str, lock: Any, *, via: str = "", **fields: Any) -> CallRecord:
        """Start timing ``lock.<op>()``; call right before it, in the owner's thread/task."""
        return CallRecord(self, op, lock, via, fields)

    def killed(self, pid: int, at: float | None = None) -> None:
        """The test SIGKILLed worker ``pid`` at monotonic time ``at`` (default: now)."""
        self.write("killed", victim=pid, at=time.monotonic() if at is None else at)

    def resolved(self, name: str, attempt: Any, action: str, outcome: Any) -> None:
        self.write(
            "resolved",
            name=name,
            attempt=None if attempt is None else str(attempt),
            action=action,
            outcome=str(outcome),
        )

    def connect_signals(self) -> bool:
        """Record ``lock_outcome_resolved`` where the package sends it; False where it has no
        such signal (the current engine)."""
        from django_redislock import signals

        signal = getattr(signals, "lock_outcome_resolved", None)
        if signal is None:
            return False

        def on_resolved(
            sender: Any,
            name: str = "",
            attempt: Any = None,
            action: str = "",
            outcome: Any = None,
            **kwargs: Any,
        ) -> None:
            self.resolved(name, attempt, action, outcome)

        signal.connect(on_resolved, weak=False)
        self._receivers.append((signal, on_resolved))
        return True

    def close(self) -> None:
        for signal, receiver in self._receivers:
            with contextlib.suppress(Exception):
                signal.disconnect(receiver)
        self._receivers.clear()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- loading -------------------------------------------------------------------------------------


def load_history(*sources: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every event of the given files, or of every ``*.jsonl`` file in the given directories.

    A torn last line (a writer killed mid-write; ``os.write`` of one line makes it unlikely) is
    skipped and counted as an ``ev="torn"`` event, so reports show it.
    """
    paths: list[Path] = []
    for source in sources:
        path = Path(source)
        paths.extend(sorted(path.glob("*.jsonl")) if path.is_dir() else [path])
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    events.append(json.loads(line))
                except ValueError:
                    events.append({"ev": "torn", "file": str(path), "text": line[:80]})
    return events


# -- what Redis kept -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Leftover:
    """A lock, queue or semaphore key found in Redis once the clients were gone."""

    key: str
    kind: str  # "lock", "queue", "sem" (live permits), "semq"
    pttl_ms: int  # -1: no expiry
    pids: frozenset[int]  # processes named in the key's records/entries
    detail: str = ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _pid_of(record: str) -> int | None:
    try:
        meta = json.loads(record).get("m") or {}
        return int(meta["pid"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _entry_pid(entry: str) -> int | None:
    """A queue entry is ``expiry\nwaiter\nowner\nlease_ms\nmetadata`` (``enqueue`` in
    ``lua/_library.lua``; README "Key layout" omits ``lease_ms``): the metadata JSON is last."""
    at = entry.find("\n{")
    if at < 0:
        return None
    try:
        return int(json.loads(entry[at + 1 :])["pid"])
    except (ValueError, TypeError, KeyError):
        return None


def _expiry_ms(entry: str) -> int:
    head = entry.split("\n", 1)[0]
    return int(head) if head.isdigit() else 0


def read_leftovers(clients: Iterable[Any], namespace: str = "redislock") -> list[Leftover]:
    """Locks, queue entries and semaphore permits of ``namespace`` still alive on each raw
    redis-py client (one per server: every primary of a Cluster), read with ``SCAN`` and plain
    commands — not through the package.

    Key layout (README "Key layout"): ``<ns>:lock:{name}`` (a record with ``PX``: alive while it
    exists), ``<ns>:queue:{name}`` and ``<ns>:semq:{name}`` (lists of waiter entries, each with
    its own expiry in server milliseconds; the list lives as long as its longest entry),
    ``<ns>:sem:{name}`` (permits: token → expiry) with their records in
    ``<ns>:semrec:{name}``. Only what is still alive by the server's clock counts: an entry or
    permit past its own expiry is ignored by every script (dead data kept in a list until the
    key expires), so it is mentioned in the detail, not reported. Fencing counters and
    statistics are not leftovers.
    """
    found: list[Leftover] = []
    prefix = f"{namespace}:"
    for client in clients:
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        for raw_key in client.scan_iter(match=f"{namespace}:*", count=1000):
            key = _text(raw_key)
            segment = key[len(prefix) :].split(":", 1)[0]
            kind = _KEY_KINDS.get(segment)
            if kind in (None, "semrec") or not key[len(prefix) + len(segment) :].startswith(":{"):
                continue
            pttl = int(client.pttl(key))
            if pttl == -2:  # expired between SCAN and PTTL
                continue
            pids: set[int] = set()
            try:
                if kind == "lock":
                    value = _text(client.get(key) or b"")
                    pid = _pid_of(value)
                    pids.update([pid] if pid is not None else [])
                    detail = value[:200]
                elif kind in ("queue", "semq"):
                    entries = [_text(e) for e in client.lrange(key, 0, -1)]
                    live = [e for e in entries if _expiry_ms(e) > now_ms]
                    if not live:
                        continue
                    pids.update(p for p in map(_entry_pid, live) if p is not None)
                    detail = (
                        f"{len(live)} live entries ({len(entries) - len(live)} expired), "
                        f"first: {live[0][:200]!r}"
                    )
                else:  # sem: live permits (score = expiry); their records name the holders
                    tokens = [_text(t) for t in client.zrangebyscore(key, now_ms + 1, "+inf")]
                    if not tokens:
                        continue
                    records = _RECORDS[segment]
                    records_key = f"{prefix}{records}:{key[len(prefix) + len(segment) + 1 :]}"
                    for record in client.hmget(records_key, tokens):
                        pid = _pid_of(_text(record)) if record is not None else None
                        pids.update([pid] if pid is not None else [])
                    detail = f"{len(tokens)} live permits: tokens {', '.join(tokens)[:160]}"
            except Exception as exc:  # a key of another type: report it as it is
                detail = f"unreadable: {exc!r}"[:200]
            found.append(Leftover(key, kind, pttl, frozenset(pids), detail))
    return found


# -- checking ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


@dataclass
class Report:
    """What :func:`check_history` checked and found."""

    processes: int = 0
    histories: int = 0  # clients: one (process, thread or task) owner each
    events: int = 0
    calls: int = 0
    holds: int = 0
    acquisitions: int = 0
    unknown: int = 0
    resolved: int = 0
    #: Unknown outcomes of clients SIGKILLed before they could settle them: the lease ends
    #: them (the leftover check allows their keys one lease after the kill, no longer).
    unknown_of_killed: int = 0
    cancelled: int = 0
    cancelled_resolved: int = 0
    leftovers: int = 0
    leftovers_allowed: int = 0
    exempt_overlaps: int = 0
    #: Rate limiter decisions checked, those allowed, and over-limit windows across a failover.
    decisions: int = 0
    allowed: int = 0
    exempt_over_limit: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for v in self.violations:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        return counts

    def summary(self, title: str = "history") -> str:
        counts = ", ".join(f"{k} {n}" for k, n in self.counts().items())
        return (
            f"[{title}] {self.processes} processes, {self.histories} histories, "
            f"{self.events} events ({self.calls} calls, {self.holds} holds, "
            f"{self.unknown} unknown outcomes: {self.resolved} resolved, "
            f"{self.unknown_of_killed} ended by the lease of a killed client; {self.cancelled} "
            f"cancelled: {self.cancelled_resolved} resolved; {self.leftovers} keys left, "
            f"{self.leftovers_allowed} of killed clients within their lease; "
            f"{self.exempt_overlaps} overlaps across a failover, not guaranteed; "
            f"{self.decisions} rate decisions, {self.allowed} allowed, "
            f"{self.exempt_over_limit} over-limit windows across a failover) — "
            f"violations: {len(self.violations)} ({counts})"
        )

    def details(self, limit: int = 15) -> str:
        lines: list[str] = []
        for kind in KINDS:
            of_kind = [v for v in self.violations if v.kind == kind]
            lines.extend(str(v) for v in of_kind[:limit])
            if len(of_kind) > limit:
                lines.append(f"[{kind}] ... and {len(of_kind) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary() + ("\n" + self.details() if self.violations else "")


@dataclass
class _Hold:
    owner: str
    pid: int
    label: str
    name: str
    token: int | None
    attempt_start: float  # the acquire call's start
    start: float  # acquire() returned True
    lease: float
    fresh: bool  # hold_count 1 at acquisition: a new token
    end: float | None = None  # release() called (or the holder was killed)
    ended_by: str = ""  # the release outcome, or "killed"
    lost: bool = False
    depth: int = 1
    #: A read-write lock's side ("read" or "write"); "" for a lock. Readers may overlap.
    mode: str = ""

    @property
    def valid(self) -> bool:
        """Counted for exclusion: ownership confirmed by a release, or inside the first lease."""
        if self.lost or self.end is None:
            return False
        return self.ended_by == "released" or self.end - self.attempt_start < self.lease


def _label(event: Mapping[str, Any]) -> str:
    return f"{event.get('client') or event['pid']}/{event.get('thread', '?')}"


def check_history(
    events: Sequence[Mapping[str, Any]],
    *,
    leftovers: Iterable[Leftover] = (),
    checked_at: float | None = None,
    killed: Mapping[int, float] | None = None,
    lease: float | None = None,
    failovers: Sequence[float] = (),
    exclusion_across_failovers: bool = True,
    queue_margin: float = QUEUE_MARGIN,
    slack: float = 0.5,
    rates: Mapping[str, tuple[int, float, int]] | None = None,
) -> Report:
    """Check ``events`` (see :func:`load_history`) and what Redis kept (``leftovers``, read at
    monotonic time ``checked_at``, default now).

    ``killed`` (pid → monotonic kill time) adds to the ``ev="killed"`` events; ``lease`` is the
    longest lease a leftover of a killed client may keep (default: the longest lease of any
    call); ``failovers`` are monotonic times at which a failover may have lost unreplicated
    writes (the kill of the old primary), used with ``exclusion_across_failovers=False``.
    ``slack`` covers the few milliseconds between a kill and the kernel closing its sockets.
    ``rates``: limiter name → ``(count, period, burst)`` of the rate limiters whose decisions
    are checked (``over_limit``).
    """
    report = Report(events=len(events))
    t0 = min(
        (float(e.get("start", e.get("t"))) for e in events if "start" in e or "t" in e),
        default=0.0,
    )

    def at(t: float | None) -> str:
        return "-" if t is None else f"{t - t0:.3f}s"

    kills: dict[int, float] = {}
    for e in events:
        if e.get("ev") == "killed":
            kills[int(e["victim"])] = float(e.get("at", e["t"]))
    kills.update(killed or {})
    exits = {int(e["pid"]) for e in events if e.get("ev") == "exit"}
    calls = [e for e in events if e.get("ev") == "call"]
    report.calls = len(calls)
    pids = {int(e["pid"]) for e in calls}
    report.processes = len(pids)
    v = report.violations

    for e in events:
        if e.get("ev") == "crash":
            v.append(Violation("incomplete", f"client {_label(e)} crashed: {e.get('error', '')}"))
        elif e.get("ev") == "torn":
            v.append(Violation("incomplete", f"torn line in {e.get('file')}: {e.get('text')}"))
    for pid in sorted(pids - exits - set(kills)):
        v.append(
            Violation(
                "incomplete",
                f"process {pid} neither exited cleanly nor was killed by the test: its "
                "history may miss calls",
            )
        )

    # -- holds, per owner (one owner's calls never overlap: a thread or a task) --------------
    by_owner: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in calls:
        by_owner[str(e["owner"])].append(e)
    report.histories = len(by_owner)
    holds: list[_Hold] = []
    orphans: dict[tuple[str, str, int | None], list[Mapping[str, Any]]] = {}
    unknowns: list[Mapping[str, Any]] = []
    cancelled: list[Mapping[str, Any]] = []
    for owner, owner_calls in by_owner.items():
        owner_calls.sort(key=lambda e: (float(e["start"]), float(e["end"])))
        open_holds: dict[str, _Hold] = {}
        for e in owner_calls:
            name, outcome = str(e["name"]), e["outcome"]
            side = f"{name}\0{e.get('mode') or ''}"  # one owner may hold both sides
            if outcome == "unknown":
                unknowns.append(e)
            elif outcome == "cancelled":
                cancelled.append(e)
            if e["op"] == "acquire":
                if outcome != "acquired":
                    continue
                report.acquisitions += 1
                token = e.get("token")
                token = None if token is None else int(token)
                count = int(e.get("hold_count") or 0)
                hold = open_holds.get(side)
                if hold is not None:  # nested: keeps the outer token
                    hold.depth += 1
                    if token != hold.token:
                        v.append(
                            Violation(
                                "token",
                                f"{name!r}: nested acquisition by {_label(e)} at "
                                f"{at(e['end'])} got token {token}, its outer hold has "
                                f"{hold.token}",
                            )
                        )
                    continue
                if count > 1:  # one violation per orphaned hold, however often re-entered
                    orphans.setdefault((owner, name, token), []).append(e)
                hold = _Hold(
                    owner,
                    int(e["pid"]),
                    _label(e),
                    name,
                    token,
                    float(e["start"]),
                    float(e["end"]),
                    float(e.get("lease") or 0.0),
                    fresh=count <= 1,
                    mode=str(e.get("mode") or ""),
                )
                open_holds[side] = hold
                holds.append(hold)
            elif e["op"] == "release":
                hold = open_holds.get(side)
                if hold is None:
                    continue  # a release of nothing we hold (recorded all the same)
                hold.depth -= 1
                if hold.depth > 0:
                    continue
                hold.end = float(e["start"])
                hold.ended_by = str(outcome)
                hold.lost = outcome == "lost" or bool(e.get("lost"))
                del open_holds[side]
        for hold in open_holds.values():
            if hold.pid in kills:
                hold.end, hold.ended_by = kills[hold.pid], "killed"
            else:
                v.append(
                    Violation(
                        "incomplete",
                        f"{hold.name!r}: {hold.label} took token {hold.token} at "
                        f"{at(hold.start)} and never called release()",
                    )
                )
    report.holds = len(holds)
    for (_, name, token), entered in orphans.items():
        first = entered[0]
        v.append(
            Violation(
                "orphan",
                f"{name!r}: acquire() by {_label(first)} at {at(first['end'])} returned "
                f"hold_count {first.get('hold_count')} (token {token}) while this owner knew no "
                "hold: an earlier unknown outcome left a hold in Redis that it never heard of"
                + (f" (re-entered {len(entered)} times)" if len(entered) > 1 else ""),
            )
        )

    # -- (a) exclusion -----------------------------------------------------------------------
    epochs = sorted(failovers)

    def epoch(t: float) -> int:
        return bisect.bisect_right(epochs, t)

    per_name: dict[str, list[_Hold]] = defaultdict(list)
    for hold in holds:
        per_name[hold.name].append(hold)
    for name, name_holds in sorted(per_name.items()):
        valid = sorted((h for h in name_holds if h.valid), key=lambda h: h.start)
        active: list[_Hold] = []
        for hold in valid:
            assert hold.end is not None
            active = [a for a in active if a.end is not None and a.end > hold.start]
            for other in active:
                if other.owner == hold.owner or (other.mode == hold.mode == "read"):
                    continue
                if not exclusion_across_failovers and epoch(other.start) != epoch(hold.start):
                    report.exempt_overlaps += 1
                    continue
                assert other.end is not None
                overlap = min(other.end, hold.end) - hold.start
                v.append(
                    Violation(
                        "overlap",
                        f"{name!r}: {other.label} (token {other.token}, held "
                        f"{at(other.start)}-{at(other.end)}) and {hold.label} (token "
                        f"{hold.token}, held {at(hold.start)}-{at(hold.end)}) held it at once "
                        f"for {overlap * 1000:.1f} ms",
                    )
                )
            active.append(hold)

        # -- (b) fencing tokens ---------------------------------------------------------------
        fresh = sorted(
            (h for h in name_holds if h.fresh and h.token is not None), key=lambda h: h.start
        )
        flagged: set[int] = set()
        ends = [h.start for h in fresh]
        best: list[_Hold] = []  # best[i]: the highest token among fresh[0..i]
        for h in fresh:
            best.append(h if not best or (h.token or 0) > (best[-1].token or 0) else best[-1])
        for hold in fresh:
            i = bisect.bisect_left(ends, hold.attempt_start)  # returned before hold's call
            if i > 0 and (best[i - 1].token or 0) >= (hold.token or 0):
                earlier = best[i - 1]
                flagged.add(id(hold))
                v.append(
                    Violation(
                        "token",
                        f"{name!r}: {hold.label} got token {hold.token} at {at(hold.start)} "
                        f"(call started {at(hold.attempt_start)}), not above token "
                        f"{earlier.token} that {earlier.label} got at {at(earlier.start)}",
                    )
                )
        previous: _Hold | None = None
        for hold in (h for h in fresh if h.valid):
            if previous is not None and previous.mode == hold.mode == "read":
                # Two readers need not be ordered: the later-returning one may hold the older
                # token (its reply was slower), both holds being legitimate at once.
                previous = hold if (hold.token or 0) > (previous.token or 0) else previous
                continue
            if (
                previous is not None
                and id(hold) not in flagged
                and previous.end is not None
                and previous.end <= hold.start
                and (previous.token or 0) >= (hold.token or 0)
            ):
                flagged.add(id(hold))
                v.append(
                    Violation(
                        "token",
                        f"{name!r}: {hold.label} got token {hold.token} at {at(hold.start)} "
                        f"{hold.mode} after {previous.label}'s {previous.mode} hold with token "
                        f"{previous.token} "
                        f"({at(previous.start)}-{at(previous.end)})",
                    )
                )
            previous = hold

    # -- (d) unknown outcomes resolved -------------------------------------------------------
    resolutions = [e for e in events if e.get("ev") == "resolved"]
    used: set[int] = set()
    by_attempt: dict[tuple[int, str], list[int]] = defaultdict(list)
    by_call: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(resolutions):
        if r.get("attempt") is not None:
            by_attempt[(int(r["pid"]), str(r["attempt"]))].append(i)
        by_call[(int(r["pid"]), str(r.get("name")), str(r.get("action")))].append(i)

    def match(call: Mapping[str, Any]) -> bool:
        if call.get("attempt") is not None:
            for i in by_attempt.get((int(call["pid"]), str(call["attempt"])), []):
                if i not in used:
                    used.add(i)
                    return True
            return False
        key = (int(call["pid"]), str(call["name"]), str(call.get("action") or call["op"]))
        for i in by_call.get(key, []):
            if i not in used and float(resolutions[i]["t"]) >= float(call["start"]):
                used.add(i)
                return True
        return False

    report.unknown = len(unknowns)
    pending = sorted(unknowns, key=lambda e: (e.get("attempt") is None, float(e["start"])))
    for call in pending:
        if match(call):
            report.resolved += 1
            continue
        if int(call["pid"]) in kills:
            report.unknown_of_killed += 1
            continue
        v.append(
            Violation(
                "unresolved",
                f"{call['name']!r}: {call['op']} by {_label(call)} at {at(call['start'])}-"
                f"{at(call['end'])} ended with an unknown outcome ({call.get('error', '')}) "
                "that was never resolved",
            )
        )
    report.cancelled = len(cancelled)
    report.cancelled_resolved = sum(
        1 for c in sorted(cancelled, key=lambda e: e["start"]) if match(c)
    )

    # -- (c) nothing left behind -----------------------------------------------------------------
    now = time.monotonic() if checked_at is None else checked_at
    longest = (
        lease
        if lease is not None
        else max((float(e.get("lease") or 0) for e in calls), default=0.0)
    )
    for leftover in leftovers:
        report.leftovers += 1
        expires_at = float("inf") if leftover.pttl_ms < 0 else now + leftover.pttl_ms / 1000
        margin = queue_margin if leftover.kind in ("queue", "semq") else 0.0
        if leftover.pids and all(p in kills for p in leftover.pids):
            allowed_until = max(kills[p] for p in leftover.pids) + longest + margin + slack
            if expires_at <= allowed_until:
                report.leftovers_allowed += 1
                continue

        def whose(pid: int) -> str:
            if pid in kills:
                return f"pid {pid} (killed at {at(kills[pid])})"
            return f"pid {pid} ({'exited cleanly' if pid in exits else 'not a recorded client'})"

        who = ", ".join(whose(p) for p in sorted(leftover.pids)) or "no holder named"
        expiry = (
            "never expires"
            if leftover.pttl_ms < 0
            else f"expires in {leftover.pttl_ms / 1000:.1f} s"
        )
        v.append(
            Violation(
                "leftover",
                f"{leftover.key} ({leftover.kind}) still in Redis after every client was gone: "
                f"{who}; {expiry}; {leftover.detail}",
            )
        )
    # -- (f) rate limiters allowed no more than their rate ----------------------------------
    _check_rates(calls, rates or {}, failovers, exclusion_across_failovers, report, at)
    return report


def _check_rates(
    calls: Sequence[Mapping[str, Any]],
    rates: Mapping[str, tuple[int, float, int]],
    failovers: Sequence[float],
    exclusion_across_failovers: bool,
    report: Report,
    at: Any,
) -> None:
    """The ``over_limit`` check (see the module docstring)."""
    decisions = [c for c in calls if c.get("op") == "decide"]
    report.decisions = len(decisions)
    for name, (count, period, burst) in rates.items():
        allowed = sorted(
            (float(c["start"]), float(c["end"]))
            for c in decisions
            if c["name"] == name and c["outcome"] == "allowed"
        )
        report.allowed += len(allowed)
        bound = burst + count
        flagged_until = float("-inf")
        for i, (t, _) in enumerate(allowed):
            inside = [(s, e) for s, e in allowed[i:] if e <= t + period]
            if len(inside) <= bound or t < flagged_until:
                continue
            flagged_until = t + period  # one violation per offending span
            if not exclusion_across_failovers and any(t <= f <= t + period for f in failovers):
                report.exempt_over_limit += 1
                continue
            report.violations.append(
                Violation(
                    "over_limit",
                    f"rate limiter {name!r} ({count}/{period:g}s, burst {burst}) allowed "
                    f"{len(inside)} requests within {period:g} s from {at(t)} (at most {bound})",
                )
            )
