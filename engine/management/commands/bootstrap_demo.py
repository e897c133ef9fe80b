"""manage.py bootstrap_demo: the demo organization, its owner and the example workflows."""

from pathlib import Path

from allauth.account.models import EmailAddress
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from engine.definitions import DefinitionError, parse_document, validate_document
from engine.models import Workflow
from engine.services import apply_definition
from tenancy.limits import QuotaExceeded
from tenancy.models import Membership, Organization, Role, User
from tenancy.services import create_organization

DEMO_SLUG = "demo"
DEMO_EMAIL = "demo@flowforge.local"


class Command(BaseCommand):
    help = (
        "Create (idempotently) the 'demo' organization with owner demo@flowforge.local and apply "
        "every definition in examples/ whose content changed since its latest version."
    )

    def add_arguments(self, parser):
        parser.add_argument("--password", default="flowforge-demo", help="password of the demo owner (default flowforge-demo)")

    def handle(self, *args, **opts):
        org = Organization.objects.filter(slug=DEMO_SLUG).first()
        if org is None:
            org, user, _ = create_organization(
                slug=DEMO_SLUG, name="Demo", owner_email=DEMO_EMAIL, owner_password=opts["password"]
            )
            self.stdout.write(f"created organization {DEMO_SLUG!r} with owner {DEMO_EMAIL}")
        demo_user = User.objects.filter(email=DEMO_EMAIL).first()
        if demo_user is not None:
            # The demo owner signs in at once: its address counts as verified.
            EmailAddress.objects.update_or_create(
                user=demo_user, email=DEMO_EMAIL, defaults={"verified": True, "primary": True}
            )
        # The demo owner, or (for an older demo organization) any of its owners.
        user = User.objects.filter(email=DEMO_EMAIL).first() or next(
            m.user
            for m in Membership.objects.for_organization(org).filter(role=Role.OWNER).select_related("user")
        )
        examples = sorted(
            p for p in (Path(settings.BASE_DIR) / "examples").iterdir() if p.suffix in (".json", ".yaml", ".yml")
        )
        for path in examples:
            try:
                normalized = validate_document(parse_document(path.read_text(), filename=path.name))
            except DefinitionError as exc:
                raise CommandError(f"{path}: {exc}") from exc
            latest = (
                Workflow.objects.for_organization(org).filter(name=normalized["name"]).order_by("-version").first()
            )
            if latest is not None and latest.definition == normalized:
                self.stdout.write(f"{path.name}: {latest.name} v{latest.version} is current")
                continue
            try:
                wf = apply_definition(organization=org, document=normalized, created_by=user)
            except QuotaExceeded as exc:  # max_definition_bytes: its message, not a traceback
                raise CommandError(f"{path}: {exc}") from exc
            self.stdout.write(f"{path.name}: applied {wf.name} v{wf.version}")
