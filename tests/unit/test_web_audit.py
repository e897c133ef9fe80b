"""The audit page: owners and admins only (audit.read), the organization's own records
only (never account-level ones, never another organization's), filters, keyset pages
and a query count that does not grow with the records shown."""

from __future__ import annotations

import datetime as dt
import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit import services as audit
from audit.models import AuditLog
from frontend.views import audit as audit_views
from tenancy.actors import Actor
from tenancy.models import Role
from tests.unit.test_web_runs import client_for, make_run, member, owner_of


def record_ids(resp) -> list[str]:
    return re.findall(r'<tr class="audit-row" data-id="([0-9a-f-]+)"', resp.content.decode())


def actions(resp) -> list[str]:
    return re.findall(r'<tr class="audit-row"[^>]* data-action="([^"]+)"', resp.content.decode())


def add_records(org, n: int, *, action: str = "test.event", user=None) -> None:
    actor = Actor(organization=org, role=Role.OWNER, user=user or owner_of(org), channel="web")
    for i in range(n):
        audit.record(action, actor=actor, target=("workflowrun", "not-a-uuid"), metadata={"i": i})


def test_only_owners_and_admins_may_read_the_audit_log(org):
    add_records(org, 1)
    assert client_for(owner_of(org)).get("/audit/").status_code == 200
    assert client_for(member(org, Role.ADMIN)).get("/audit/").status_code == 200
    for role in (Role.MEMBER, Role.VIEWER):
        resp = client_for(member(org, role)).get("/audit/")
        assert resp.status_code == 403, role
        assert "test.event" not in resp.content.decode()


def test_audit_log_shows_only_this_organizations_records(make_org):
    mine, theirs = make_org(), make_org()
    run = make_run(mine, 1)
    add_records(theirs, 2, action="test.theirs")
    # Account-level records (organization NULL): a sign-in of the owner, and one with no user.
    audit.record("account.login", user=owner_of(mine))
    audit.record("account.login_failed", actor_email=owner_of(mine).email)
    assert AuditLog.objects.unscoped().filter(organization__isnull=True).count() >= 2
    resp = client_for(owner_of(mine)).get("/audit/")
    got = actions(resp)
    assert "run.started" in got and "workflow.version_created" in got and "organization.created" in got
    assert not any(a.startswith("account.") or a == "test.theirs" for a in got), got
    body = html.unescape(resp.content.decode())
    assert f'href="/runs/{run.pk}/"' in body  # a run target links to the run
    assert owner_of(mine).email in body


def test_audit_log_filters_by_action_prefix_actor_and_dates(org):
    admin = member(org, Role.ADMIN)
    add_records(org, 2, action="run.started", user=admin)
    add_records(org, 1, action="member.role_changed")
    old = AuditLog.objects.for_organization(org).filter(action="member.role_changed").get()
    client = client_for(owner_of(org))
    assert set(actions(client.get("/audit/?action=run."))) == {"run.started"}
    assert set(actions(client.get("/audit/?action=member."))) == {"member.role_changed"}
    by_admin = actions(client.get(f"/audit/?actor={admin.email.upper()}"))
    assert by_admin and set(by_admin) == {"run.started"}
    today = timezone.now().date()
    assert actions(client.get(f"/audit/?created_before={today - dt.timedelta(days=1)}")) == []
    assert "member.role_changed" in actions(client.get(f"/audit/?created_after={today}&created_before={today}"))
    assert old.created_at.date() == today
    resp = client.get("/audit/?created_after=31-12-2024")
    assert resp.status_code == 400 and "Enter a date as YYYY-MM-DD." in html.unescape(resp.content.decode())


def test_audit_log_pages_with_keyset_cursors(org, monkeypatch):
    monkeypatch.setattr(audit_views, "AUDIT_PAGE_SIZE", 3)
    add_records(org, 7, action="test.page")
    expected = [
        str(pk) for pk in AuditLog.objects.for_organization(org).filter(action="test.page")
        .order_by("-created_at", "-id").values_list("id", flat=True)
    ]
    client = client_for(owner_of(org))
    url, pages = "/audit/?action=test.page", []
    while url:
        resp = client.get(url)
        pages.append(record_ids(resp))
        m = re.search(r'rel="next" href="([^"]+)"', resp.content.decode())
        url = "/audit/" + html.unescape(m.group(1)) if m else None
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == expected


def test_audit_log_query_count_does_not_grow_with_records(org):
    client = client_for(owner_of(org))
    client.get("/audit/")

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/audit/").status_code == 200
        return len([q for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))])

    few = count()
    add_records(org, 60)
    assert count() == few


@pytest.mark.parametrize("cursor", ["garbage", "eyJ0IjoxfQ"])
def test_audit_log_refuses_a_forged_cursor(org, cursor):
    resp = client_for(owner_of(org)).get(f"/audit/?older_than={cursor}")
    assert resp.status_code == 400 and "organization.created" in resp.content.decode()
