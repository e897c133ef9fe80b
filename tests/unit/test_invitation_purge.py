"""Invitations nobody can use any more are deleted 30 days after they expired or were
revoked (tenancy.services.purge_stale_invitations, run by the clock's housekeeping);
accepted and usable ones stay. Before, an unused invitation stayed for ever."""

from __future__ import annotations

import datetime as dt
import secrets

import pytest
from django.utils import timezone

from tenancy.models import Invitation, Membership, Role
from tenancy.services import purge_stale_invitations


def invitation(org, name: str, **fields) -> Invitation:
    now = timezone.now()
    values = {"created_at": now, "expires_at": now + dt.timedelta(days=7), **fields}
    return Invitation.objects.create(organization=org, email=f"{name}@example.com", role=Role.MEMBER,
                                     token_hash=secrets.token_hex(32), **values)


@pytest.fixture
def invitations(org):
    now = timezone.now()
    day = dt.timedelta(days=1)
    owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    return {
        "expired_31": invitation(org, "expired_31", created_at=now - 38 * day, expires_at=now - 31 * day),
        "expired_29": invitation(org, "expired_29", created_at=now - 36 * day, expires_at=now - 29 * day),
        "revoked_31": invitation(org, "revoked_31", created_at=now - 32 * day, revoked_at=now - 31 * day),
        "revoked_29": invitation(org, "revoked_29", created_at=now - 30 * day, revoked_at=now - 29 * day),
        "accepted_long_ago": invitation(org, "accepted", created_at=now - 400 * day, expires_at=now - 393 * day,
                                        accepted_at=now - 399 * day, accepted_by=owner),
        "pending": invitation(org, "pending"),
    }


def remaining(org) -> set[str]:
    return {i.email.split("@")[0] for i in Invitation.objects.for_organization(org)}


@pytest.mark.django_db
def test_unusable_invitations_go_30_days_after_they_expired_or_were_revoked(org, invitations):
    assert purge_stale_invitations() == 2
    assert remaining(org) == {"expired_29", "revoked_29", "accepted", "pending"}
    assert purge_stale_invitations() == 0


@pytest.mark.django_db
def test_the_purge_goes_in_batches(org, invitations):
    assert purge_stale_invitations(batch_size=1, max_batches=1) == 1
    assert len(remaining(org)) == 5
    assert purge_stale_invitations(batch_size=1, max_batches=5) == 1
    assert remaining(org) == {"expired_29", "revoked_29", "accepted", "pending"}


@pytest.mark.django_db
def test_the_clocks_housekeeping_purges_them(org, invitations):
    from engine.actors import housekeeping

    housekeeping.fn()
    assert remaining(org) == {"expired_29", "revoked_29", "accepted", "pending"}
