"""The SDK's example: a worker with two handlers, and a workflow built in code that mixes
its worker tasks with built-in noop and sleep tasks.

From the repository's folder, after ``make install``:

    export FLOWFORGE_URL=http://127.0.0.1:8000
    export FLOWFORGE_API_KEY=ffk_...      # member key: applies the workflow, starts a run
    export FLOWFORGE_WORKER_KEY=ffk_...   # worker key: polls the queue "sdk-example"

    .venv/bin/python sdk/python/examples/worker.py            # apply, start the worker, start a run, print the result
    .venv/bin/python sdk/python/examples/worker.py --worker   # only the worker (applying the workflow if there is none), until Ctrl-C
    .venv/bin/python sdk/python/examples/worker.py --start    # only apply and start a run, and wait for it (a worker must be running)

The workflow is applied before the worker starts: the server refuses (400) a poll of a
queue that no task of the organization's workflows names, as on a fresh organization.

The workflow ``sdk-example``::

    start (noop) ──┬──> measure_small (worker: measure) ──┐
                   ├──> measure_large (worker: measure) ──┼──> report (worker: report) ──> done (noop)
                   └──> pause (sleep 0.5 s) ──────────────┘

``report`` fails its first attempt on purpose and succeeds on its retry, so every run
shows a retry. Exit status: 0 when the run succeeded, 1 when it did not, 2 when the API
refused a request, 3 when a setting is missing or the server cannot be reached.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
from typing import Any

from flowforge_sdk import Client, FlowForgeError, NetworkError, TaskContext, Worker, Workflow, WorkflowVersion

WORKFLOW = "sdk-example"
QUEUE = "sdk-example"
RUN_INPUT = {"numbers": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]}


def build_workflow() -> Workflow:
    """The example workflow (its document is what ``workflow.to_document()`` returns)."""
    wf = Workflow(WORKFLOW, description="The Python SDK's example: worker tasks and built-in tasks.")
    start = wf.noop("start", position=(0, 160))
    small = wf.worker_task("measure_small", QUEUE, name="measure", input={"threshold": 5, "keep": "below"},
                           depends_on=[start], max_attempts=2, retry_backoff_seconds=1, timeout_seconds=60,
                           position=(220, 0))
    large = wf.worker_task("measure_large", QUEUE, name="measure", input={"threshold": 5, "keep": "above"},
                           depends_on=[start], max_attempts=2, retry_backoff_seconds=1, timeout_seconds=60,
                           position=(220, 160))
    pause = wf.sleep("pause", 0.5, depends_on=[start], position=(220, 320))
    report = wf.worker_task("report", QUEUE, input={"fail_first_attempt": True},
                            depends_on=[small, large, pause], edge_labels={small: "small", large: "large"},
                            max_attempts=3, retry_backoff_seconds=0.5, timeout_seconds=60, position=(440, 160))
    wf.noop("done", depends_on=[report], position=(660, 160))
    return wf


def measure(ctx: TaskContext) -> dict[str, Any]:
    """Statistics of the run input's ``numbers`` below (or above) ``threshold``."""
    numbers = [n for n in ctx.run_input.get("numbers", []) if isinstance(n, int | float)]
    threshold = ctx.input["threshold"]
    kept = [n for n in numbers if (n < threshold if ctx.input["keep"] == "below" else n >= threshold)]
    ctx.log(f"{ctx.task_key}: {len(kept)} of {len(numbers)} numbers are {ctx.input['keep']} {threshold}")
    if ctx.wait(0.3):  # some work; returns early if the run is cancelled meanwhile
        ctx.raise_if_cancelled()
    return {"count": len(kept), "sum": sum(kept), "mean": round(statistics.fmean(kept), 3) if kept else None}


def report(ctx: TaskContext) -> dict[str, Any]:
    """Combine the two measurements; fails attempt 1 on purpose when ``fail_first_attempt``."""
    if ctx.input.get("fail_first_attempt") and ctx.attempt == 1:
        ctx.log("failing attempt 1 on purpose, to show a retry", level="warning")
        raise RuntimeError("flaky on purpose: attempt 1 of report always fails")
    small, large = ctx.upstream["measure_small"], ctx.upstream["measure_large"]
    total = small["count"] + large["count"]
    ctx.log(f"attempt {ctx.attempt}: {total} numbers, {small['count']} small and {large['count']} large")
    return {"numbers": total, "small": small, "large": large,
            "share_large": round(large["count"] / total, 3) if total else None}


def build_worker(client: Client | None = None) -> Worker:
    """The worker of the queue ``sdk-example`` with its two handlers (key: FLOWFORGE_WORKER_KEY)."""
    if client is None:
        client = Client(_url(), _setting("FLOWFORGE_WORKER_KEY", "a worker key (role worker)"), retries=0)
    worker = Worker(client, QUEUE, concurrency=4, worker_name=f"sdk-example-{os.getpid()}")
    worker.register("measure", measure)
    worker.register("report", report)
    return worker


def apply_workflow(client: Client) -> WorkflowVersion:
    """Apply the workflow: a new version, active."""
    version = client.workflows.apply(build_workflow())
    print(f"applied {version.name} v{version.version} ({len(version.tasks)} tasks)")
    return version


def ensure_workflow(client: Client) -> WorkflowVersion:
    """The organization's latest version of the workflow, applied first when it has none
    (its worker's polls would be refused: no task of the organization waits on the queue)."""
    version = client.workflows.latest(WORKFLOW)
    return version if version is not None else apply_workflow(client)


def start_run(client: Client, version: WorkflowVersion) -> str:
    """Start a run of ``version``; returns its id."""
    run = client.runs.start(version, RUN_INPUT)
    print(f"started run {run.id}")
    return run.id


def apply_and_start(client: Client) -> str:
    """Apply the workflow (a new version) and start a run; returns its id."""
    return start_run(client, apply_workflow(client))


def print_result(client: Client, run_id: str, timeout: float) -> bool:
    run = client.runs.wait(run_id, timeout=timeout, poll_interval=1.0)
    print(f"run {run.id}: {run.state}")
    for task_run in run.task_runs:
        print(f"  {task_run.key:<14} {task_run.state:<10} attempt {task_run.attempt}  output {task_run.output}")
    return run.succeeded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--worker", action="store_true", help="only run the worker, until Ctrl-C")
    mode.add_argument("--start", action="store_true", help="only apply and start a run, and wait for it")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run (default 120)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    try:
        if args.worker:
            _serve()
            return 0
        with Client(_url(), _setting("FLOWFORGE_API_KEY", "a member key")) as client:
            if args.start:
                return 0 if print_result(client, apply_and_start(client), args.timeout) else 1
            return _run_both(client, args.timeout)
    except NetworkError as exc:
        print(f"error: cannot reach FlowForge at {_url()}: {exc}", file=sys.stderr)
        return 3
    except FlowForgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3


def _serve() -> None:
    """Only the worker, until SIGTERM / Ctrl-C (they drain it); with a member key
    (FLOWFORGE_API_KEY) the workflow is applied first if the organization has none."""
    if os.environ.get("FLOWFORGE_API_KEY", "").strip():
        with Client(_url(), os.environ["FLOWFORGE_API_KEY"]) as client:
            ensure_workflow(client)
    else:
        logging.warning("FLOWFORGE_API_KEY is not set: the workflow %s is not applied; the server refuses the "
                        "worker's polls (400) until a workflow with a task on the queue %r exists", WORKFLOW, QUEUE)
    build_worker().run()


def _run_both(client: Client, timeout: float) -> int:
    """Apply the workflow, then serve a run of it: the worker runs in the main thread
    (Ctrl-C drains it), the run is started and followed in another, which stops the
    worker at its end. Applied first: the worker's first poll names the queue."""
    version = apply_workflow(client)
    worker = build_worker()
    outcome: dict[str, Any] = {}

    def drive() -> None:
        try:
            outcome["succeeded"] = print_result(client, start_run(client, version), timeout)
        except Exception as exc:  # shown after the worker stopped
            outcome["error"] = exc
        finally:
            worker.stop()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    worker.run()
    driver.join(timeout=5)
    if "error" in outcome:
        raise outcome["error"]
    return 0 if outcome.get("succeeded") else 1


def _url() -> str:
    return os.environ.get("FLOWFORGE_URL", "http://127.0.0.1:8000")


def _setting(name: str, what: str) -> str:
    value = os.environ.get(name, "")
    if not value.strip():
        raise SystemExit(f"{name} is not set: export {what} (ffk_...)")
    return value


if __name__ == "__main__":
    sys.exit(main())
