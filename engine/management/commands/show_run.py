"""manage.py show_run RUN_ID [--events]"""

import json

from django.core.management.base import BaseCommand, CommandError

from engine.models import WorkflowRun
from engine.reporting import load_summary


class Command(BaseCommand):
    help = "Show a run: its state, every task run (attempts, errors) and its events."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--no-events", action="store_true", help="omit the event log")

    def handle(self, *args, **opts):
        try:
            # A command-line operator acts across organizations: an explicit unscoped read.
            run = WorkflowRun.objects.unscoped().get(pk=opts["run_id"])
        except (WorkflowRun.DoesNotExist, ValueError, Exception) as exc:
            raise CommandError(f"no run {opts['run_id']!r}") from exc
        print_summary(self.stdout, load_summary(run.pk, run.organization_id), events=not opts["no_events"])


def print_summary(stdout, summary, *, events: bool = True) -> None:
    """Write a run summary as tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stdout._out if hasattr(stdout, "_out") else None, width=140)
    run = summary.run
    duration = f"{summary.duration_seconds:.2f} s" if summary.duration_seconds is not None else "-"
    console.print(
        f"[bold]run {run.pk}[/bold]  {run.workflow.name} v{run.workflow.version}  "
        f"state [bold]{run.state}[/bold]  duration {duration}"
    )
    if run.scheduled_for is not None:  # a cron trigger's or a backfill's run
        console.print(f"scheduled for {run.scheduled_for.isoformat()}  data interval "
                      f"{run.data_interval_start.isoformat()} .. {run.data_interval_end.isoformat()}  "
                      f"({run.trigger_source})")
    table = Table("task", "type", "state", "attempt", "duration s")
    table.add_column("error / output", overflow="ellipsis", no_wrap=True, max_width=70)
    for tr in sorted(summary.task_runs, key=lambda t: (t.started_at is None, t.started_at, t.task.key)):
        took = f"{(tr.finished_at - tr.started_at).total_seconds():.3f}" if tr.finished_at and tr.started_at else "-"
        detail = tr.error or (json.dumps(tr.output)[:80] if tr.output is not None else "")
        table.add_row(tr.task.key, tr.task.type, tr.state, str(tr.attempt), took, detail)
    console.print(table)
    if events:
        ev = Table("seq", "at", "task", "kind", "from", "to", "attempt", "token")
        keys = {tr.pk: tr.task.key for tr in summary.task_runs}
        for e in summary.events:
            ev.add_row(
                str(e.seq), e.created_at.strftime("%H:%M:%S.%f")[:-3], keys.get(e.task_run_id, "(run)"), e.kind,
                e.from_state, e.to_state, str(e.attempt or ""), str(e.fencing_token or ""),
            )
        console.print(ev)
