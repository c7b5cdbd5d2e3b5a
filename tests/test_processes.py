"""Mutual exclusion and fencing across real processes."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.slow  # six Django processes

PROCESSES = 6
ITERATIONS = 200


def test_read_modify_write_across_processes_is_exact_and_never_overlaps(tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    log = tmp_path / "holds.jsonl"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.rmw_worker",
                "rmw",
                str(counter),
                str(ITERATIONS),
                str(log),
            ],
            cwd=ROOT,
            env=subprocess_env(),
        )
        for _ in range(PROCESSES)
    ]
    for p in procs:
        assert p.wait(240) == 0
    assert int(counter.read_text()) == PROCESSES * ITERATIONS

    holds = sorted(h for line in log.read_text().splitlines() for h in json.loads(line))
    assert len(holds) == PROCESSES * ITERATIONS
    for (_, prev_end, prev_token), (start, _, token) in itertools.pairwise(holds):
        assert start >= prev_end, "two processes held the lock at the same time"
        assert token > prev_token, "fencing tokens must strictly increase in hold order"
