"""Finding 7c of issue 14: a failed API key authentication with a known prefix is
written into the audit chain of the organization that owns the prefix. Prefixes are
public (shown in lists, logs, screenshots), so an outsider could send bad secrets with
another organization's prefix and grow that organization's audit chain without bound.

Afterwards the failures of one prefix are counted per clock minute in the shared cache
and audited at the 1st, 10th, 100th, ... failure of the minute, each record naming the
failures of the minute so far: N failures in a minute write at most 1 + log10(N) rows.
(The per-address limit, FLOWFORGE_API_KEY_FAILURES_PER_MINUTE, still applies on top;
it is off in tests, as for an attacker with many addresses.)"""

from __future__ import annotations

import secrets

import pytest
from django.test import Client

from audit.models import AuditLog
from tenancy import apikeys
from tenancy.models import Role
from tests.unit.test_api_org import acme, org_factory, other  # noqa: F401 (fixtures)

ATTEMPTS = 100
# 1 + log10(100): the failures numbered 1, 10 and 100 of the minute.
MAX_ROWS = 3


def auth_failures(org) -> list[AuditLog]:
    return list(AuditLog.objects.for_organization(org).filter(action="api_key.auth_failed").order_by("seq"))


@pytest.fixture
def pinned_minute(monkeypatch):
    """Every attempt of the test falls in one clock minute (none straddles a boundary)."""
    at = 1_900_000_020.0
    monkeypatch.setattr(apikeys, "failure_clock", lambda: at, raising=False)
    return at


def test_an_outsider_guessing_secrets_for_a_victims_prefix_writes_a_bounded_number_of_rows(
        acme, other, pinned_minute):  # noqa: F811
    victim_prefix = acme.key_rows[Role.VIEWER].prefix
    before = len(auth_failures(acme.org))
    client = Client()
    for _ in range(ATTEMPTS):
        guess = f"ffk_{victim_prefix}_{secrets.token_urlsafe(32)}"
        response = client.get("/api/v1/runs/", headers={"Authorization": f"Bearer {guess}"})
        assert response.status_code == 401
    rows = auth_failures(acme.org)[before:]
    assert 1 <= len(rows) <= MAX_ROWS, len(rows)
    # The count is recorded: the last record names all 100 failures of the minute.
    assert [r.metadata["failures_this_minute"] for r in rows] == [1, 10, 100]
    assert {r.metadata["prefix"] for r in rows} == {victim_prefix}
    assert {r.metadata["reason"] for r in rows} == {"wrong_secret"}
    # Nothing of it in the attacker's own organization.
    assert not auth_failures(other.org)


def test_the_next_minute_starts_a_new_count(acme, monkeypatch):  # noqa: F811
    prefix = acme.key_rows[Role.MEMBER].prefix
    client = Client()
    at = [1_900_000_080.0]
    monkeypatch.setattr(apikeys, "failure_clock", lambda: at[0], raising=False)
    for minute in range(2):
        at[0] += 60 * minute
        for _ in range(3):
            guess = f"ffk_{prefix}_{secrets.token_urlsafe(32)}"
            assert client.get("/api/v1/runs/", headers={"Authorization": f"Bearer {guess}"}).status_code == 401
    rows = [r for r in auth_failures(acme.org) if r.metadata["prefix"] == prefix]
    assert [r.metadata["failures_this_minute"] for r in rows] == [1, 1]
