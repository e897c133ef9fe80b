"""An organization's plan, limits and usage, visible (issue 16): GET /api/v1/org/limits/,
the settings page's table, and the admin where staff change the plan and the overrides
(validated, audited with the values before and after)."""

from __future__ import annotations

import datetime as dt
import html
import re

import pytest
from django.forms import MultiWidget
from django.utils import timezone

from engine.models import TaskRun, Workflow
from engine.reporting import definition_bytes, quota_report
from engine.services import apply_definition, start_run
from tenancy.models import Membership, Organization, Role
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory
from tests.unit.test_audit_actions import PASSWORD, Since, admin_form_data, check, client_for
from tests.unit.test_identity import unique_email

pytestmark = pytest.mark.django_db

TASKS = [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}]


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


def busy(org) -> Workflow:
    """Two runs (two ready roots, one of them claimed: running) and two definitions."""
    wf = apply_definition(organization=org, document={"name": "etl", "tasks": TASKS})
    apply_definition(organization=org, document={"name": "etl", "tasks": TASKS[:1]})
    start_run(workflow=wf, trigger_source="api")
    run = start_run(workflow=wf, trigger_source="api")
    TaskRun.objects.for_organization(org).filter(workflow_run=run, task__key="a").update(
        state="running", fencing_token=1, lease_expires_at=timezone.now() + dt.timedelta(minutes=1))
    return wf


def test_the_api_reports_the_plan_each_limit_and_its_usage(api_factory, settings):
    api = api_factory()
    other = api_factory()
    busy(api.org)
    busy(other.org)  # another organization's usage never counts
    api.org.plan = "team"
    api.org.max_running_task_runs_override = 250
    api.org.save()
    team = settings.FLOWFORGE_PLANS["team"]
    resp = api.get("/api/v1/org/limits/", role=Role.VIEWER)  # anyone who may read
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["plan"] == "team"
    lines = {line["name"]: line for line in body["limits"]}
    assert list(lines) == ["weight", "max_running_task_runs", "max_runs_per_minute", "max_definition_bytes"]
    assert {k: (v["limit"], v["plan_default"], v["overridden"], v["used"]) for k, v in lines.items()} == {
        "weight": (team["weight"], team["weight"], False, None),
        "max_running_task_runs": (250, team["max_running_task_runs"], True, 1),
        "max_runs_per_minute": (team["max_runs_per_minute"], team["max_runs_per_minute"], False, 2),
        "max_definition_bytes": (team["max_definition_bytes"], team["max_definition_bytes"], False,
                                 definition_bytes(api.org)),
    }
    assert all(v["description"] for v in lines.values())


def test_definition_bytes_are_the_json_text_of_every_version(org):
    assert definition_bytes(org) == 0
    one = apply_definition(organization=org, document={"name": "etl", "tasks": TASKS})
    two = apply_definition(organization=org, document={"name": "etl", "tasks": TASKS[:1]})
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT sum(octet_length(definition::text)) FROM core_workflow WHERE id IN (%s, %s)",
                    [one.pk, two.pk])
        expected = cur.fetchone()[0]
    assert definition_bytes(org) == expected > 0


def test_runs_older_than_a_minute_do_not_count_against_the_minute(org):
    wf = busy(org)
    assert [line.used for line in quota_report(org).lines if line.name == "max_runs_per_minute"] == [2]
    from engine.models import WorkflowRun

    WorkflowRun.objects.for_organization(org).filter(workflow__name=wf.name).update(
        created_at=timezone.now() - dt.timedelta(seconds=61))
    assert [line.used for line in quota_report(org).lines if line.name == "max_runs_per_minute"] == [0]


def test_the_limits_endpoint_needs_a_caller_and_is_in_the_schema(api_factory):
    api = api_factory()
    assert api.client.get("/api/v1/org/limits/").status_code == 401
    schema = api.client.get("/api/v1/schema/", headers=bearer(api.keys[Role.VIEWER]))
    if schema.status_code == 200:
        assert "org_limits_retrieve" in schema.content.decode()


def test_the_settings_page_shows_the_same_table(org, settings):
    busy(org)
    org.max_runs_per_minute_override = 2
    org.save()
    owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    from tests.unit.test_web_runs import client_for as web_client

    body = html.unescape(web_client(owner).get("/settings/").content.decode())
    section = re.search(r'<section class="card" id="limits">.*?</section>', body, re.S).group(0)
    assert '<span class="badge plan-free">Free</span>' in section
    free = settings.FLOWFORGE_PLANS["free"]

    def row(name):
        cells = re.search(rf'<tr data-limit="{name}"[^>]*>(.*?)</tr>', section, re.S).group(1)
        return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", cells, re.S)]

    assert row("max_running_task_runs") == ["Task runs claimed or running at once", f"{free['max_running_task_runs']:,}",
                                            "1", f"{free['max_running_task_runs']:,}"]
    assert row("max_runs_per_minute")[1:] == ["2 (set for this organization)", "2", f"{free['max_runs_per_minute']:,}"]
    assert re.search(r'<tr data-limit="max_runs_per_minute" class="full">', section)  # at its limit
    assert row("weight")[1:] == [str(free["weight"]), "—", str(free["weight"])]
    assert row("max_definition_bytes")[1:3] == ["10.0\u00a0MiB", f"{definition_bytes(org)}\u00a0B"]


# --- the admin ---------------------------------------------------------------------------------------


@pytest.fixture
def staff(db):
    from tenancy.models import User

    return User.objects.create_superuser(email=unique_email("staff"), password=PASSWORD)


def org_form_data(page) -> dict:
    """The change form's data as the browser sends it, its membership inline included."""
    data = admin_form_data(page)
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        for name, field in formset.management_form.fields.items():
            data[f"{formset.prefix}-{name}"] = str(formset.management_form[name].value() or field.initial or 0)
        for form in formset.forms:
            for name in form.fields:
                value = form[name].value()
                widget = form.fields[name].widget
                if isinstance(widget, MultiWidget):
                    for i, part in enumerate(widget.decompress(value)):
                        data[f"{form.add_prefix(name)}_{i}"] = "" if part is None else str(part)
                elif value is not None and value is not False:
                    data[form.add_prefix(name)] = str(value)
    return data


def test_staff_change_the_plan_and_an_override_and_the_change_is_audited(org, staff, settings):
    client = client_for(staff)
    url = f"/admin/tenancy/organization/{org.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    free = settings.FLOWFORGE_PLANS["free"]
    # The help text names each plan's default.
    assert f"free {free['max_running_task_runs']:,}" in html.unescape(text)
    since = Since()
    resp = client.post(url, {**org_form_data(page), "plan": "team", "max_running_task_runs_override": "500"})
    assert resp.status_code == 302, (resp.context["adminform"].form.errors, [f.errors for i in resp.context["inline_admin_formsets"] for f in i.formset.forms], [i.formset.non_form_errors() for i in resp.context["inline_admin_formsets"]])
    org = Organization.objects.get(pk=org.pk)
    assert (org.plan, org.max_running_task_runs_override) == ("team", 500)
    row = since.one("admin.organization.changed")
    check(row, actor_type="user", user=staff, organization=org, target=("organization", org.pk))
    assert row.metadata["change"] == ("Changed plan: free -> team; max_running_task_runs_override: plan default -> 500.")


@pytest.mark.parametrize("field,value", [("weight_override", "0"), ("weight_override", "101"),
                                         ("max_running_task_runs_override", "0"),
                                         ("max_runs_per_minute_override", "-5"),
                                         ("max_definition_bytes_override", "0"), ("plan", "platinum")])
def test_the_admin_refuses_an_override_out_of_bounds(org, staff, field, value):
    client = client_for(staff)
    url = f"/admin/tenancy/organization/{org.pk}/change/"
    page = client.get(url)
    since = Since()
    resp = client.post(url, {**org_form_data(page), field: value})
    assert resp.status_code == 200  # the form again, with the error
    assert resp.context["adminform"].form.errors.get(field), resp.context["adminform"].form.errors
    assert since.new() == []
    org.refresh_from_db()
    assert (org.plan, getattr(org, field)) == ("free", None if field != "plan" else "free")


@pytest.mark.parametrize("field,value,message", [
    ("name", "Acme\r\nBcc: victim@example.com", "control characters"),
    ("name", "Acme\u2028Corp", "control characters"),
    ("name", "\u202eelgooG", "invisible characters"),
    ("name", "   ", "required"),  # the form's own check: blank is empty
    ("slug", "Acme_Corp", "lowercase letters, digits or '-'"),
    ("slug", "-acme", "starting with a letter or digit"),
])
def test_the_admin_refuses_an_organization_name_or_slug_that_create_and_rename_refuse(org, staff, field, value,
                                                                                        message):
    """Before: the change form stored a name with a line break (which reaches invitation mail
    subjects) and any slug Django's SlugField took."""
    client = client_for(staff)
    url = f"/admin/tenancy/organization/{org.pk}/change/"
    page = client.get(url)
    since = Since()
    resp = client.post(url, {**org_form_data(page), field: value})
    assert resp.status_code == 200  # the form again, with the error
    assert message in " ".join(resp.context["adminform"].form.errors.get(field, [])), \
        resp.context["adminform"].form.errors
    assert since.new() == []
    stored = Organization.objects.get(pk=org.pk)
    assert (stored.name, stored.slug) == (org.name, org.slug)


def test_the_admin_stores_a_name_stripped(org, staff):
    client = client_for(staff)
    url = f"/admin/tenancy/organization/{org.pk}/change/"
    page = client.get(url)
    resp = client.post(url, {**org_form_data(page), "name": "  Acme Renamed  "})
    assert resp.status_code == 302
    assert Organization.objects.get(pk=org.pk).name == "Acme Renamed"


def test_the_admin_keeps_a_slug_stored_before_the_rule_when_it_changes_something_else(org, staff):
    """Found by review: a slug the admin took before (any SlugField) made every later save of
    the organization fail until staff renamed it, which breaks clients that send it."""
    Organization.objects.filter(pk=org.pk).update(slug="Legacy_Org")
    client = client_for(staff)
    url = f"/admin/tenancy/organization/{org.pk}/change/"
    page = client.get(url)
    resp = client.post(url, {**org_form_data(page), "plan": "team"})
    assert resp.status_code == 302, resp.context["adminform"].form.errors
    stored = Organization.objects.get(pk=org.pk)
    assert (stored.slug, stored.plan) == ("Legacy_Org", "team")
    # Changed, the slug must follow the rule.
    page = client.get(url)
    resp = client.post(url, {**org_form_data(page), "slug": "Other_Org"})
    assert resp.status_code == 200
    assert Organization.objects.get(pk=org.pk).slug == "Legacy_Org"


def test_the_admin_add_form_checks_the_slug(staff):
    """An unsaved organization already has its id (a UUID default): the add form must still
    check its slug (``_state.adding``, not ``pk``)."""
    client = client_for(staff)
    page = client.get("/admin/tenancy/organization/add/")
    data = {**org_form_data(page), "name": "Added", "plan": "free"}
    resp = client.post("/admin/tenancy/organization/add/", {**data, "slug": "Acme_Corp"})
    assert resp.status_code == 200
    assert "lowercase letters" in " ".join(resp.context["adminform"].form.errors.get("slug", []))
    assert not Organization.objects.filter(name="Added").exists()
    resp = client.post("/admin/tenancy/organization/add/", {**data, "slug": "added-ok"})
    assert resp.status_code == 302, resp.context["adminform"].form.errors
    assert Organization.objects.get(slug="added-ok").name == "Added"
