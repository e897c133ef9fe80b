"""manage.py backfill_trigger --org SLUG TRIGGER --start DATE --end DATE [--max-active-runs N]
[--priority P] [--dry-run] [--wait]"""

import time

from django.core.management.base import BaseCommand, CommandError

from engine.backfill import BackfillError, create_backfill, preview_backfill
from engine.management.commands._common import get_organization
from engine.models import ScheduledTrigger, TriggerBackfill
from engine.states import BackfillState
from tenancy.actors import Actor


def _named(exc: BackfillError) -> str:
    """The refusal, naming the option it is about (``--end: ...``) or the field."""
    option = {"start": "--start", "end": "--end", "range": "--start/--end", "max_active_runs": "--max-active-runs",
              "priority": "--priority"}
    return f"{option.get(exc.field, exc.field)}: {exc.message}"


class Command(BaseCommand):
    help = (
        "Backfill a cron trigger: one run per instant of its schedule from --start to --end (dates or ISO "
        "instants, read in the trigger's time zone; both included), oldest first, skipping instants that "
        "already have a run. Prints the count first; --dry-run stops there. A range with nothing to start "
        "(every instant already has a run, or it holds none) is refused: nothing is made, the exit is non-zero."
    )

    def add_arguments(self, parser):
        parser.add_argument("trigger", help="the trigger's name (or id)")
        parser.add_argument("--org", required=True, help="organization slug or id")
        parser.add_argument("--start", required=True, help="first day (2026-03-01) or instant (2026-03-01T06:00)")
        parser.add_argument("--end", required=True, help="last day (2026-03-31, included) or instant")
        parser.add_argument("--max-active-runs", dest="max_active_runs", type=int, default=None,
                            help="how many of its runs may be going at once (default 10; 1 = one after the other)")
        parser.add_argument("--priority", type=int, default=None, help="its runs' priority (default: the trigger's)")
        parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="print the preview only")
        parser.add_argument("--wait", action="store_true",
                            help="follow the backfill until every run is started (the clock and a worker go on with it)")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    def handle(self, *args, **opts):
        org = get_organization(opts["org"])
        actor = Actor(organization=org, role="owner", channel="cli")
        scoped = ScheduledTrigger.objects.for_organization(org)
        trigger = scoped.filter(name=opts["trigger"]).first()
        if trigger is None:
            try:
                trigger = scoped.filter(pk=opts["trigger"]).first()
            except Exception:  # not an id either
                trigger = None
        if trigger is None:
            raise CommandError(f"no trigger {opts['trigger']!r} in organization {org.slug!r}")
        try:
            preview = preview_backfill(actor=actor, trigger=trigger, start=opts["start"], end=opts["end"])
        except BackfillError as exc:
            raise CommandError(_named(exc)) from exc
        cut = " (cut at now)" if preview.end_cut else ""
        self.stdout.write(
            f"trigger {trigger.name}: {trigger.cron_expression} ({trigger.timezone}), "
            f"{preview.range_start.isoformat()} .. {preview.range_end.isoformat()}{cut}\n"
            f"{preview.instants} instants, {preview.existing} already have a run: {preview.runs} runs to start"
        )
        if preview.first is not None:
            self.stdout.write(f"first {preview.first.isoformat()}, last {preview.last.isoformat()}")
        if opts["dry_run"]:
            return
        try:
            backfill = create_backfill(actor=actor, trigger=trigger, start=opts["start"], end=opts["end"],
                                       max_active_runs=opts["max_active_runs"], priority=opts["priority"],
                                       expect_runs=preview.runs)
        except BackfillError as exc:
            raise CommandError(_named(exc)) from exc
        self.stdout.write(f"backfill {backfill.pk} started")
        if not opts["wait"]:
            return
        deadline = time.monotonic() + opts["timeout"]
        while True:
            backfill = TriggerBackfill.objects.for_organization(org).get(pk=backfill.pk)
            if backfill.state != BackfillState.RUNNING:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"backfill {backfill.pk} is still going after {opts['timeout']:g} s "
                                   f"({backfill.created_runs} runs started); is the clock running?")
            time.sleep(0.5)
        self.stdout.write(f"backfill {backfill.pk} {backfill.state}: {backfill.created_runs} runs started, "
                          f"{backfill.skipped} instants already had one")
        if backfill.state != BackfillState.SUCCEEDED:
            raise CommandError(backfill.error or f"backfill {backfill.state}")
