"""examples/worker.py: its workflow, its handlers, and the whole script against the fake
server run as a small engine (apply, start the worker, start a run and serve it, exit 0),
which refuses a poll of a queue no workflow names, as the real server does on a fresh
organization."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fakeserver import MEMBER_KEY, WORKER_KEY, FakeFlowForge
from flowforge_sdk import Worker
from flowforge_sdk.worker.__main__ import load_worker

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, fake: FakeFlowForge) -> ModuleType:
    monkeypatch.setenv("FLOWFORGE_URL", fake.url)
    monkeypatch.setenv("FLOWFORGE_API_KEY", MEMBER_KEY)
    monkeypatch.setenv("FLOWFORGE_WORKER_KEY", WORKER_KEY)
    spec = importlib.util.spec_from_file_location("sdk_example_worker", EXAMPLES / "worker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_workflow_mixes_worker_and_built_in_tasks(example: ModuleType) -> None:
    doc = example.build_workflow().to_document()
    assert doc["name"] == "sdk-example"
    assert [(t["key"], t["type"], t.get("config", {}).get("name")) for t in doc["tasks"]] == [
        ("start", "noop", None), ("measure_small", "worker", "measure"), ("measure_large", "worker", "measure"),
        ("pause", "sleep", None), ("report", "worker", None), ("done", "noop", None)]
    assert doc["tasks"][4]["depends_on"] == ["measure_small", "measure_large", "pause"]
    assert {t["config"]["queue"] for t in doc["tasks"] if t["type"] == "worker"} == {"sdk-example"}


def test_the_example_script_runs_the_workflow_to_success(example: ModuleType, fake: FakeFlowForge,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    fake.engine = True
    fake.known_queues_only = True  # a fresh organization: polls are refused until the workflow is applied
    build = example.build_worker

    def quick_worker(client: Any = None) -> Worker:
        worker: Worker = build(client)
        worker.poll_wait_seconds = 0.3  # the drain waits for the poll in flight
        worker.handle_signals = False
        return worker

    monkeypatch.setattr(example, "build_worker", quick_worker)
    assert example.main(["--timeout", "20"]) == 0

    out = capsys.readouterr().out
    (run,) = fake.runs.values()
    assert run["state"] == "succeeded"
    assert f"run {run['id']}: succeeded" in out
    report = next(t for t in run["task_runs"] if t["key"] == "report")
    # 3 1 4 1 5 9 2 6 5 3 5 8 9 7 9: below 5 are 3 1 4 1 2 3 (6, sum 14); the other 9 sum to 63.
    # report fails attempt 1 on purpose and succeeds on attempt 2.
    assert report["attempt"] == 2
    assert report["output"] == {"numbers": 15, "small": {"count": 6, "sum": 14, "mean": 2.333},
                                "large": {"count": 9, "sum": 63, "mean": 7.0}, "share_large": 0.6}
    report_task = next(t for t in fake.task_runs.values() if t.task_key == "report")
    assert report_task.error == "RuntimeError: flaky on purpose: attempt 1 of report always fails"
    assert any("failing attempt 1 on purpose" in line["message"] for line in report_task.logs)
    (applied,) = fake.calls_to("/workflows/")
    assert all(poll.at > applied.at for poll in fake.calls_to("/worker/poll"))  # applied before the first poll


def test_the_example_worker_alone_applies_the_workflow_first_on_a_fresh_organization(
        example: ModuleType, fake: FakeFlowForge, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.known_queues_only = True
    build = example.build_worker
    workers: list[Worker] = []

    def quick_worker(client: Any = None) -> Worker:
        worker: Worker = build(client)
        worker.poll_wait_seconds = 0.3
        workers.append(worker)
        return worker

    monkeypatch.setattr(example, "build_worker", quick_worker)

    def serve_until_it_polls() -> int:
        polls_before, exit_code = len(fake.calls_to("/worker/poll")), []
        thread = threading.Thread(target=lambda: exit_code.append(example.main(["--worker"])))
        thread.start()
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) > polls_before)
        workers[-1].stop()
        thread.join(10)
        return exit_code[0]

    # 0: its polls were not refused, the worker stopped on request (a refused poll stops it with exit 2).
    assert serve_until_it_polls() == 0
    assert serve_until_it_polls() == 0  # the second start finds the workflow: no new version
    assert [(w["name"], w["version"]) for w in fake.workflows] == [("sdk-example", 1)]
    (applied,) = fake.calls_to("/workflows/")
    assert all(poll.at > applied.at for poll in fake.calls_to("/worker/poll"))
    assert all(poll.body["queue"] == "sdk-example" for poll in fake.calls_to("/worker/poll"))


def test_the_cli_loads_the_example_worker(example: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.delitem(sys.modules, "worker", raising=False)
    worker = load_worker("worker:build_worker")
    assert isinstance(worker, Worker)
    assert worker.queue == "sdk-example" and sorted(worker.handlers) == ["measure", "report"]
    with pytest.raises(ValueError, match="expected module:attribute"):
        load_worker("worker")
