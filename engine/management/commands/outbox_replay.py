"""manage.py outbox_replay (--all | ID [ID ...]): replay dead-lettered dispatches."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from engine.models import OutboxMessage, TaskRun, WorkflowRun
from engine.services import InvalidStart, WorkflowNotStartable, retry_run
from engine.states import TaskRunState
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded


class Command(BaseCommand):
    help = (
        "Replay dead-lettered outbox rows. A generation still waiting for its dispatch is published "
        "again; one whose task run was failed for it gets a retry of its (finished) run, linked to it."
    )

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="*", help="outbox message ids")
        parser.add_argument("--all", action="store_true", help="every dead letter not replayed yet")

    def handle(self, *args, **opts):
        if not opts["ids"] and not opts["all"]:
            raise CommandError("name outbox message ids, or --all")
        # Staff/operator tooling across organizations: an explicit unscoped read.
        rows = OutboxMessage.objects.unscoped().filter(dead_lettered_at__isnull=False, replayed_at__isnull=True)
        if opts["ids"]:
            rows = rows.filter(pk__in=opts["ids"])
        rows = list(rows.select_related("organization").order_by("created_at"))
        if not rows:
            self.stdout.write("no dead letters to replay")
            return
        refused = 0
        for row in rows:
            try:
                outcome = self._replay(row)
            except (QuotaExceeded, WorkflowNotStartable, InvalidStart) as exc:
                # The retry's start was refused (runs-per-minute quota, an archived workflow,
                # an input it cannot use): nothing of this row changed; say so and go on.
                refused += 1
                self.stderr.write(f"{row.pk}: not replayed: {exc}")
                continue
            self.stdout.write(f"{row.pk}: {outcome}")
        if refused:
            raise CommandError(f"{refused} dead letter(s) not replayed; see above")

    def _replay(self, row: OutboxMessage) -> str:
        actor = Actor(organization=row.organization, role="owner", channel="cli")
        with transaction.atomic():
            task = TaskRun.objects.for_organization(row.organization_id).select_for_update().get(pk=row.task_run_id)
            waiting = (task.state == TaskRunState.RUNNING and task.fencing_token == row.fencing_token_snapshot
                       and task.started_fencing_token != row.fencing_token_snapshot)
            if waiting:
                OutboxMessage.objects.for_organization(row.organization_id).filter(pk=row.pk).update(
                    dead_lettered_at=None, publish_attempts=0, next_attempt_at=None, replayed_at=timezone.now())
                outcome = "published again (its generation was still waiting)"
            else:
                run = WorkflowRun.objects.for_organization(row.organization_id).get(pk=row.workflow_run_id)
                if not run.is_terminal:
                    return f"skipped: run {run.pk} is still {run.state}; replay once it has finished"
                new = retry_run(actor=actor, run=run)
                OutboxMessage.objects.for_organization(row.organization_id).filter(pk=row.pk).update(
                    replayed_at=timezone.now())
                outcome = f"run {run.pk} retried as run {new.pk}"
            audit.record("outbox.replayed", actor=actor, target=row, metadata={"outcome": outcome})
        return outcome
