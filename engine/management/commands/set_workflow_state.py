"""manage.py set_workflow_state --org SLUG NAME --workflow-version N active|archived"""

from django.core.management.base import BaseCommand, CommandError

from engine.definitions import DefinitionError
from engine.management.commands._common import get_organization
from engine.models import Workflow
from engine.services import archive_workflow, resolve_workflow, restore_workflow
from tenancy.actors import Actor


class Command(BaseCommand):
    help = (
        "Move a workflow version through its lifecycle (draft -> active -> archived): 'active' publishes a draft or "
        "restores an archived version (re-validating it); 'archived' refuses new runs and cancels running ones."
    )

    def add_arguments(self, parser):
        parser.add_argument("workflow", help="workflow name or id")
        parser.add_argument("state", choices=["active", "archived"])
        parser.add_argument("--org", required=True, help="organization slug or id")
        parser.add_argument("--workflow-version", dest="workflow_version", type=int,
                            help="version (default: the highest-numbered version of that name, whatever its state)")

    def handle(self, *args, **opts):
        org = get_organization(opts["org"])
        actor = Actor(organization=org, role="owner", channel="cli")
        try:
            wf = resolve_workflow(organization=org, workflow=opts["workflow"], version=opts["workflow_version"])
            if opts["workflow_version"] is None:
                wf = Workflow.objects.for_organization(org).filter(name=wf.name).order_by("-version").first()
        except Workflow.DoesNotExist as exc:
            raise CommandError(str(exc)) from exc
        if opts["state"] == "active":
            try:
                wf = restore_workflow(actor=actor, workflow=wf)
            except DefinitionError as exc:
                raise CommandError(f"{wf.name} v{wf.version} no longer validates: {exc}") from exc
            self.stdout.write(f"{wf.name} v{wf.version} is active")
        else:
            wf, cancelled = archive_workflow(actor=actor, workflow=wf, confirm=wf.name)
            self.stdout.write(f"{wf.name} v{wf.version} is archived; {cancelled} running run(s) cancelled")
