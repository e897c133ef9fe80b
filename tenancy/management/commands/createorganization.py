"""manage.py createorganization SLUG NAME OWNER_EMAIL [--password P]"""

from django.core.management.base import BaseCommand, CommandError

from tenancy.services import TenancyError, create_organization


class Command(BaseCommand):
    help = "Create an organization with an owner (the owner user is created if missing)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("name")
        parser.add_argument("owner_email")
        parser.add_argument("--password", help="password for a newly created owner user")

    def handle(self, *args, **opts):
        try:
            org, user, created = create_organization(
                slug=opts["slug"], name=opts["name"], owner_email=opts["owner_email"], owner_password=opts["password"]
            )
        except TenancyError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"organization {org.slug} ({org.pk}) created; owner {user.email}"
            + (" (new user)" if created else " (existing user)")
        )
