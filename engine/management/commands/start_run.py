"""manage.py start_run --org SLUG WORKFLOW [--version N] [--input JSON] [--priority P] [--wait]"""

import json
import time

from django.core.management.base import BaseCommand, CommandError

from engine.management.commands._common import get_organization
from engine.models import Workflow, WorkflowRun
from engine.reporting import state_counts
from engine.services import WorkflowNotStartable, resolve_workflow, start_run
from engine.states import TASK_TERMINAL_STATES, RunState
from tenancy.limits import QuotaExceeded


class Command(BaseCommand):
    help = "Start a run of a workflow (by name or id). With --wait, follow it and exit 0 only if it succeeded."

    def add_arguments(self, parser):
        parser.add_argument("workflow", help="workflow name or id")
        parser.add_argument("--org", required=True, help="organization slug or id")
        parser.add_argument("--workflow-version", dest="workflow_version", type=int, help="version to start (default: latest active)")
        parser.add_argument("--input", default="{}", help="run input, a JSON object")
        parser.add_argument("--priority", type=int, default=0, help="the run's priority, -10 to 10 (default 0)")
        parser.add_argument("--wait", action="store_true", help="show progress until the run finishes")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    def handle(self, *args, **opts):
        if opts["timeout"] <= 0:
            raise CommandError("--timeout must be a positive number of seconds")
        org = get_organization(opts["org"])
        try:
            run_input = json.loads(opts["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not valid JSON: {exc.msg} at column {exc.colno}") from exc
        if not isinstance(run_input, dict):
            raise CommandError("--input must be a JSON object, e.g. '{\"limit\": 10}'")
        try:
            wf = resolve_workflow(organization=org, workflow=opts["workflow"], version=opts["workflow_version"])
            run = start_run(workflow=wf, run_input=run_input, priority=opts["priority"])
        except Workflow.DoesNotExist as exc:
            raise CommandError(str(exc)) from exc
        except (WorkflowNotStartable, ValueError, QuotaExceeded) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"run {run.pk} started ({wf.name} v{wf.version})")
        if not opts["wait"]:
            return
        state = wait_for_run(run, timeout=opts["timeout"], stdout=self.stdout)
        if state == "timeout":
            raise CommandError(
                f"run {run.pk} is still running after {opts['timeout']:g} s (it goes on; follow it with "
                f"manage.py show_run {run.pk}). If nothing moved, no worker may be consuming tasks: start one with "
                "`dramatiq flowforge.worker` and the clock with `manage.py run_clock`."
            )
        if state != RunState.SUCCEEDED:
            raise CommandError(f"run {run.pk} ended {state}; see: manage.py show_run {run.pk}")


def wait_for_run(run: WorkflowRun, *, timeout: float, stdout) -> str:
    """Poll the run until it is terminal, drawing a progress bar of task states.
    Returns the final state ("timeout" if ``timeout`` seconds passed first)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(state_counts(run.pk, run.organization_id).values())
    console = Console(file=stdout._out if hasattr(stdout, "_out") else None)
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[states]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("tasks", total=total, states="")
        while True:
            counts = state_counts(run.pk, run.organization_id)
            done = sum(counts[s] for s in TASK_TERMINAL_STATES)
            progress.update(
                bar, completed=done, states="  ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )
            run.refresh_from_db(fields=["state", "finished_at", "started_at"])
            if run.is_terminal:
                break
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.2)
    return run.state
