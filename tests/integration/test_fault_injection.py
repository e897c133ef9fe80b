"""The fault-injection suite (tests/faults/run.py) with real processes, every scenario.

Each scenario runs on a private PostgreSQL cluster and Redis server, so stopping and
restarting them here never disturbs anything else. ``make faults`` runs the same with a
bigger load; this test keeps the issue's minimum of 200 runs per scenario.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from flowforge.stack import BASE_DIR
from tests.faults.run import SCENARIOS

pytestmark = pytest.mark.integration


# The runner's own limit, in seconds; the test's (pytest-timeout) is above it, so the runner
# is stopped here (SIGTERM: it stops what it started) rather than abandoned by a killed test,
# which left its web server, workers and clock running.
RUNNER_TIMEOUT_SECONDS = 1200


@pytest.mark.timeout(RUNNER_TIMEOUT_SECONDS + 120)
def test_every_fault_scenario_holds_every_invariant(tmp_path):
    out = tmp_path / "faults.json"
    runner = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.run", "--runs", "200", "--json", str(out)],
        cwd=BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = runner.communicate(timeout=RUNNER_TIMEOUT_SECONDS)
    finally:
        if runner.poll() is None:  # timed out (or the test was interrupted): stop everything it started
            runner.terminate()  # the runner stops its stacks and private servers on SIGTERM
            try:
                runner.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
    proc = subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr)
    print(proc.stdout)  # the per-scenario table: runs started/finished, duplicates, drain time
    results = json.loads(out.read_text())
    assert [r["scenario"] for r in results] == list(SCENARIOS)
    for r in results:
        assert r["problems"] == [], (r["scenario"], r["problems"], proc.stderr[-3000:])
        assert r["runs_started"] == r["runs_finished"] == 200
        assert r["duplicate_executions"] == 0
    assert proc.returncode == 0
