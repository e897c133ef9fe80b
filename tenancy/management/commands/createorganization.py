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
        from django.contrib.auth.password_validation import validate_password
        from django.core.exceptions import ValidationError
        from django.core.validators import validate_email

        from tenancy.models import User

        email = opts["owner_email"].strip().lower()
        try:
            validate_email(email)
        except ValidationError:
            raise CommandError(f"owner email {opts['owner_email']!r} is not an email address") from None
        existing = User.objects.filter(email=email).exists()
        if opts["password"] is not None:
            if existing:
                raise CommandError(f"{email} already has an account; --password only applies to a new user")
            try:
                validate_password(opts["password"], User(email=email))
            except ValidationError as exc:
                raise CommandError("--password: " + " ".join(exc.messages)) from None
        try:
            org, user, created = create_organization(
                slug=opts["slug"], name=opts["name"], owner_email=opts["owner_email"], owner_password=opts["password"]
            )
        except TenancyError as exc:
            raise CommandError(str(exc)) from exc
        if created:
            # Whoever runs the command on the server vouches for the address, as for
            # createsuperuser: with mandatory email verification the new owner could not sign in.
            from allauth.account.models import EmailAddress

            EmailAddress.objects.update_or_create(user=user, email=user.email,
                                                  defaults={"verified": True, "primary": True})
        self.stdout.write(
            f"organization {org.slug} ({org.pk}) created; owner {user.email}"
            + (" (new user)" if created else " (existing user)")
        )
        if created and opts["password"] is None:
            self.stderr.write(
                f"note: {user.email} has no password yet; they can set one with the "
                "'Forgot your password?' link, or run: manage.py changepassword " + user.email
            )
