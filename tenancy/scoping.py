"""Organization scoping for tenant models (seed 000, "Tenancy and security").

Every tenant row carries ``organization_id``. ``Model.objects.for_organization(org)``
is the sanctioned read path; ``Model.objects.unscoped()`` is the explicit, greppable
escape hatch for staff and system code (the scheduler, the reaper, the relay), which
act on every organization at once.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class OrganizationScopedQuerySet(models.QuerySet):
    """A queryset of a tenant model."""

    def for_organization(self, organization: Any) -> OrganizationScopedQuerySet:
        """Rows of ``organization`` (an Organization or its id) only.

        Raises ValueError when ``organization`` is None: an unscoped read must be
        asked for by name, through ``unscoped()``.
        """
        if organization is None:
            raise ValueError("for_organization() needs an organization; use unscoped() for a cross-tenant read")
        org_id = getattr(organization, "pk", organization)
        return self.filter(organization_id=org_id)


class OrganizationScopedManager(models.Manager.from_queryset(OrganizationScopedQuerySet)):
    """Default manager of tenant models: ``for_organization(org)`` or ``unscoped()``."""

    def unscoped(self) -> OrganizationScopedQuerySet:
        """Every organization's rows. For staff and system code only: each call is a reviewed cross-tenant read."""
        return super().get_queryset()
