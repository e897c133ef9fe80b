"""Helpers shared by the engine's management commands."""

from django.core.management.base import CommandError

from tenancy.models import Organization


def get_organization(slug_or_id: str) -> Organization:
    """Find an organization by slug or id; CommandError naming it when absent."""
    org = Organization.objects.filter(slug=slug_or_id).first()
    if org is None:
        try:
            org = Organization.objects.filter(pk=slug_or_id).first()
        except Exception:
            org = None
    if org is None:
        raise CommandError(f"no organization {slug_or_id!r} (create one with: manage.py createorganization)")
    return org
