"""Shared fixtures. Unit tests need PostgreSQL only; integration tests also start
real Dramatiq worker processes against Redis (see tests/integration/conftest.py)."""

from __future__ import annotations

import itertools

import pytest

from engine.services import apply_definition
from tenancy.services import create_organization

_counter = itertools.count(1)


@pytest.fixture
def make_org(db):
    """Factory: make_org(slug=None) -> Organization with an owner user."""

    def make(slug: str | None = None):
        slug = slug or f"org-{next(_counter)}"
        org, _user, _ = create_organization(slug=slug, name=slug.title(), owner_email=f"owner@{slug}.example")
        return org

    return make


@pytest.fixture
def org(make_org):
    return make_org()


@pytest.fixture
def make_workflow(db):
    """Factory: make_workflow(org, tasks, name="wf") -> Workflow (active)."""

    def make(org, tasks, name: str = "wf", **kwargs):
        return apply_definition(organization=org, document={"name": name, "tasks": tasks}, **kwargs)

    return make
