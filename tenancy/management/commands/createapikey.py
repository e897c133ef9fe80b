"""manage.py createapikey ORG_SLUG --name NAME [--role member] [--created-by EMAIL] [--expires-in-days N]

Prints the full key once on stdout (and nothing else there, so ``KEY=$(manage.py
createapikey ...)`` works); what was created goes to stderr.
"""

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import KeyRole, Membership, Organization, Role
from tenancy.permissions import Forbidden
from tenancy.services import TenancyError


class Command(BaseCommand):
    help = "Create an API key for an organization and print it once."

    def add_arguments(self, parser):
        parser.add_argument("org", help="the organization's slug")
        parser.add_argument("--name", required=True, help="what the key is for, e.g. 'ci'")
        parser.add_argument("--role", default=Role.MEMBER, choices=KeyRole.values,
                            help="the key's role (default member; worker: a key of your own worker processes)")
        parser.add_argument(
            "--created-by", dest="created_by",
            help="email of the member creating it (default: the organization's first owner); "
                 "the key never acts above this member's current role",
        )
        parser.add_argument("--expires-in-days", dest="expires_in_days", type=float, help="expire after N days")

    def handle(self, *args, **opts):
        org = Organization.objects.filter(slug=opts["org"]).first()
        if org is None:
            raise CommandError(f"no organization {opts['org']!r}")
        members = Membership.objects.for_organization(org).select_related("organization", "user")
        if opts["created_by"]:
            membership = members.filter(user__email=opts["created_by"].strip().lower()).first()
            if membership is None:
                raise CommandError(f"{opts['created_by']} is not a member of {org.slug}")
        else:
            membership = members.filter(role=Role.OWNER).order_by("created_at", "id").first()
            if membership is None:
                raise CommandError(f"{org.slug} has no owner; pass --created-by")
        expires_at = None
        if opts["expires_in_days"] is not None:
            expires_at = timezone.now() + dt.timedelta(days=opts["expires_in_days"])
        actor = actor_for_membership(membership, channel="cli")
        try:
            api_key, full_key = create_api_key(actor=actor, name=opts["name"], role=opts["role"], expires_at=expires_at)
        except (Forbidden, TenancyError) as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(
            f"API key {api_key.name!r} ({api_key.role}, prefix {api_key.prefix}) created in {org.slug} "
            f"by {membership.user.email}; it is shown once, store it now:"
        )
        self.stdout.write(full_key)
