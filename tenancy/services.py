"""Tenancy actions shared by commands, API and web UI."""

from __future__ import annotations

import re

from django.db import transaction

from tenancy.models import Membership, Organization, Role, User

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class TenancyError(ValueError):
    """A tenancy action was refused; the message says what and why."""


def create_organization(*, slug: str, name: str, owner_email: str, owner_password: str | None = None):
    """Create an organization with ``owner_email`` as its owner (the user is created
    when missing, with ``owner_password`` or an unusable password).

    Returns (organization, user, user_created). Raises TenancyError for a malformed
    or taken slug.
    """
    if not SLUG_RE.match(slug or ""):
        raise TenancyError(f"slug {slug!r}: use 1-63 lowercase letters, digits or '-', starting with a letter or digit")
    if not name or not name.strip():
        raise TenancyError("name must not be empty")
    with transaction.atomic():
        if Organization.objects.filter(slug=slug).exists():
            raise TenancyError(f"an organization with slug {slug!r} already exists")
        org = Organization.objects.create(slug=slug, name=name.strip())
        email = owner_email.strip().lower()
        user = User.objects.filter(email=email).first()
        created = user is None
        if created:
            user = User.objects.create_user(email=email, password=owner_password)
        Membership.objects.create(organization=org, user=user, role=Role.OWNER)
    return org, user, created
