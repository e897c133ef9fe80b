"""A worker process run by ``python -m flowforge_sdk.worker``: SIGTERM drains it (the task
in flight finishes and is reported, no new poll, exit 0); a second SIGTERM stops it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeserver import WORKER_KEY, FakeFlowForge

WORKER_MODULE = """
import os, time
from flowforge_sdk import Client, Worker

worker = Worker(Client(os.environ["FF_URL"], os.environ["FF_KEY"], retries=0), "images", concurrency=1,
                poll_wait_seconds=0.3)

@worker.task("resize")
def resize(ctx):
    time.sleep(float(ctx.input["seconds"]))
    return {"slept": ctx.input["seconds"]}
"""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def start_worker(tmp_path: Path, fake: FakeFlowForge) -> subprocess.Popen[str]:
    (tmp_path / "sigworker.py").write_text(WORKER_MODULE)
    env = {**os.environ, "FF_URL": fake.url, "FF_KEY": WORKER_KEY}
    return subprocess.Popen([sys.executable, "-m", "flowforge_sdk.worker", "sigworker:worker"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_drains_the_task_in_flight_then_exits_0(tmp_path: Path, fake: FakeFlowForge) -> None:
    task_id = fake.enqueue("images", "resize", input={"seconds": 1.0})
    process = start_worker(tmp_path, fake)
    try:
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running", timeout=15)
        queued_later = fake.enqueue("images", "resize", input={"seconds": 0})
        process.send_signal(signal.SIGTERM)
        signalled_at = time.monotonic()
        output, _ = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert fake.task_runs[task_id].state == "succeeded" and fake.task_runs[task_id].output == {"slept": 1.0}
    assert fake.task_runs[queued_later].state == "ready"  # one slot, held until the drain ended: never polled for
    assert [p for p in fake.calls_to("/worker/poll") if p.at > signalled_at] == []
    assert "SIGTERM received, draining" in output


def test_a_second_sigterm_stops_at_once(tmp_path: Path, fake: FakeFlowForge) -> None:
    task_id = fake.enqueue("images", "resize", input={"seconds": 30})
    process = start_worker(tmp_path, fake)
    try:
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running", timeout=15)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        began = time.monotonic()
        output, _ = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert time.monotonic() - began < 5
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete") == []
    assert "stopping with 1 task(s) unfinished" in output
