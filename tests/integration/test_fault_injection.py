"""The fault-injection suite (tests/faults/run.py) with real processes: a bounded subset.

Each scenario runs on a private PostgreSQL cluster and Redis server, so stopping and
restarting them here never disturbs anything else. ``make faults`` runs every scenario with
a bigger load (500 runs each); this test runs, with 200 runs each, the scenarios no other
test of ``make test`` covers with real processes (FAULT_SCENARIOS=all runs them all):
Redis down, PostgreSQL crashed (every server process stopped at once, every connection cut
mid-transaction, then crash recovery) and two clocks; a clean restart (postgres_restart,
``make faults``) cuts the same connections without the crash recovery.
The others have their own integration tests:
a SIGKILLed worker (test_faults), the whole pool SIGKILLed (test_pool_recovery), every
delivery duplicated (test_dispatch) and a task that kills its worker
(tests/security/test_python_callables, and make faults).
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

# The subset of SCENARIOS this test runs (see the module docstring); FAULT_SCENARIOS=all for every one.
SUBSET = ("redis_outage", "postgres_crash", "two_clocks")

pytestmark = pytest.mark.integration


# The runner's own limit, in seconds; the test's (pytest-timeout) is above it, so the runner
# is stopped here (SIGTERM: it stops what it started) rather than abandoned by a killed test,
# which left its web server, workers and clock running.
RUNNER_TIMEOUT_SECONDS = 1200


@pytest.mark.timeout(RUNNER_TIMEOUT_SECONDS + 120)
def test_the_fault_scenarios_hold_every_invariant(tmp_path):
    scenarios = list(SCENARIOS) if os.environ.get("FAULT_SCENARIOS") == "all" else list(SUBSET)
    assert set(scenarios) <= set(SCENARIOS), "a scenario named here no longer exists"
    out = tmp_path / "faults.json"
    runner = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.run", *scenarios, "--runs", "200", "--json", str(out)],
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
    assert [r["scenario"] for r in results] == scenarios
    for r in results:
        assert r["problems"] == [], (r["scenario"], r["problems"], proc.stderr[-3000:])
        assert r["runs_started"] == r["runs_finished"] == 200
        assert r["duplicate_executions"] == 0
    assert proc.returncode == 0
