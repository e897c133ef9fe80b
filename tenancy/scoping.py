"""Organization scoping for tenant models (seed 000, "Tenancy and security"), failing closed.

Every tenant row carries ``organization_id``. A query of a tenant model can only be
evaluated when it is scoped:

- ``Model.objects.for_organization(org)`` — the sanctioned read path;
- a ``filter()`` on ``organization``/``organization_id`` (what ``get_or_create`` and
  unique validation do);
- a related manager reached from an already loaded object (``run.task_runs.all()``);
- ``Model.objects.unscoped()`` — the explicit, greppable escape hatch for staff and
  system code (the scheduler, the reaper, the relay act on every organization).

Anything else (``Model.objects.filter(pk=x).get()``) raises UnscopedQueryError when it
hits the database, so a forgotten scope is a loud failure in tests, not a leak.
Forward foreign-key access, ``save()``, ``refresh_from_db()`` and cascade deletes use
Django's plain base manager and are unaffected.
"""

from __future__ import annotations

from typing import Any

from django.db import models

_ORG_LOOKUPS = {"organization", "organization_id"}


class UnscopedQueryError(RuntimeError):
    """A tenant model was queried without an organization scope (see module docstring)."""


class OrganizationScopedQuerySet(models.QuerySet):
    """A queryset of a tenant model that refuses to run until it is scoped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ff_scoped = False

    def _clone(self):
        clone = super()._clone()
        clone._ff_scoped = self._ff_scoped
        return clone

    def _scoped(self) -> OrganizationScopedQuerySet:
        self._ff_scoped = True
        return self

    def _require_scope(self) -> None:
        if not self._ff_scoped:
            raise UnscopedQueryError(
                f"unscoped query of tenant model {self.model.__name__}: use "
                f"{self.model.__name__}.objects.for_organization(org) (or .unscoped() in staff/system code)"
            )

    # -- scoping ---------------------------------------------------------------------------
    def for_organization(self, organization: Any) -> OrganizationScopedQuerySet:
        """Rows of ``organization`` (an Organization or its id) only.

        Raises ValueError when ``organization`` is None: an unscoped read must be
        asked for by name, through ``unscoped()``.
        """
        if organization is None:
            raise ValueError("for_organization() needs an organization; use unscoped() for a cross-tenant read")
        org_id = getattr(organization, "pk", organization)
        return self.filter(organization_id=org_id)._scoped()

    def filter(self, *args: Any, **kwargs: Any) -> OrganizationScopedQuerySet:
        clone = super().filter(*args, **kwargs)
        if any(key.split("__", 1)[0] in _ORG_LOOKUPS and not key.endswith("__isnull") for key in kwargs):
            clone._ff_scoped = True
        return clone

    # -- every way a queryset reaches the database --------------------------------------------
    def _fetch_all(self) -> None:
        if self._result_cache is None:
            self._require_scope()
        super()._fetch_all()

    def iterator(self, *args: Any, **kwargs: Any):
        self._require_scope()
        return super().iterator(*args, **kwargs)

    def count(self) -> int:
        if self._result_cache is None:
            self._require_scope()
        return super().count()

    def exists(self) -> bool:
        if self._result_cache is None:
            self._require_scope()
        return super().exists()

    def aggregate(self, *args: Any, **kwargs: Any):
        self._require_scope()
        return super().aggregate(*args, **kwargs)

    def update(self, **kwargs: Any) -> int:
        self._require_scope()
        return super().update(**kwargs)

    def delete(self):
        self._require_scope()
        return super().delete()

    def explain(self, *args: Any, **kwargs: Any) -> str:
        self._require_scope()
        return super().explain(*args, **kwargs)


class OrganizationScopedManager(models.Manager.from_queryset(OrganizationScopedQuerySet)):
    """Default manager of tenant models: ``for_organization(org)`` or ``unscoped()``."""

    def get_queryset(self) -> OrganizationScopedQuerySet:
        qs = super().get_queryset()
        # A related manager (``run.task_runs``) filters by an object that was itself
        # read through a scope, so its queries are scoped by construction.
        if getattr(self, "instance", None) is not None and hasattr(self, "core_filters"):
            qs._ff_scoped = True
        return qs

    def unscoped(self) -> OrganizationScopedQuerySet:
        """Every organization's rows. For staff and system code only: each call is a reviewed cross-tenant read."""
        return super().get_queryset()._scoped()
