"""The fault-injection suite (tests/faults/run.py) with real processes, every scenario.

Each scenario runs on a private PostgreSQL cluster and Redis server, so stopping and
restarting them here never disturbs anything else. ``make faults`` runs the same with a
bigger load; this test keeps the issue's minimum of 200 runs per scenario.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowforge.stack import BASE_DIR
from tests.faults.run import SCENARIOS

pytestmark = pytest.mark.integration


def test_every_fault_scenario_holds_every_invariant(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.run", "--runs", "200", "--json", str(out)],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=1200,
    )
    print(proc.stdout)  # the per-scenario table: runs started/finished, duplicates, drain time
    results = json.loads(out.read_text())
    assert [r["scenario"] for r in results] == list(SCENARIOS)
    for r in results:
        assert r["problems"] == [], (r["scenario"], r["problems"], proc.stderr[-3000:])
        assert r["runs_started"] == r["runs_finished"] == 200
        assert r["duplicate_executions"] == 0
    assert proc.returncode == 0
