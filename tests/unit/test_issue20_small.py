"""Issue 20's small items: runs labelled with the API key that started them; the failed-run
banner naming the failing tasks; "retrying at" for a task waiting for its next attempt;
an identical re-upload answered "unchanged"; the console email printed decoded and whole;
a superuser reaching the admin without email verification."""

from __future__ import annotations

import html
import re

import pytest

from engine.models import WorkflowRun
from engine.services import apply_definition
from tenancy.models import Role
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_web_runs import actor_for, client_for, owner_of


@pytest.fixture
def api(make_org) -> Api:
    factory = new_api_factory(make_org)
    make = next(factory)
    yield make()
    next(factory, None)


def text(resp) -> str:
    return html.unescape(resp.content.decode())


# --- runs started with an API key ----------------------------------------------------------------


def test_a_run_started_with_an_api_key_is_labelled_with_the_keys_name(api):
    org = api.org
    wf = apply_definition(actor=actor_for(org), document={"name": "keyed", "tasks": [{"key": "a", "type": "noop"}]})
    resp = api.post("/api/v1/runs/", {"workflow": str(wf.pk)}, role=Role.MEMBER)
    assert resp.status_code == 201, resp.content
    run = WorkflowRun.objects.for_organization(org).get(pk=resp.json()["id"])
    key_prefix = api.keys[Role.MEMBER].split("_")[1]
    assert run.api_key.name == "member key" and run.api_key.prefix == key_prefix
    client = client_for(owner_of(org))
    by_hand = client.post(f"/workflows/{wf.pk}/start/", {"input": "{}"})
    assert by_hand.status_code == 302
    person_run = WorkflowRun.objects.for_organization(org).exclude(pk=run.pk).get()
    assert person_run.api_key_id is None

    listing = text(client.get("/runs/"))
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr[^>]*>.*?/runs/([0-9a-f-]{36})/.*?</tr>', listing, re.S)}
    assert "key member key" in rows[str(run.pk)]
    assert "key member key" not in rows[str(person_run.pk)] and owner_of(org).email in rows[str(person_run.pk)]

    page = text(client.get(f"/runs/{run.pk}/"))
    started = re.search(r"<dt>Started by</dt><dd>(.*?)</dd>", page, re.S).group(1)
    assert started == f"API key member key (ffk_{key_prefix}_…)"
    page = text(client.get(f"/runs/{person_run.pk}/"))
    assert re.search(r"<dt>Started by</dt><dd>(.*?)</dd>", page, re.S).group(1) == owner_of(org).email

    # The API says so too (the page did and the API did not: a fresh review), in the start's
    # answer, the run and the list; a person's run has no key.
    assert resp.json()["started_by_api_key"] == key_prefix and resp.json()["triggered_by"] is None
    detail = api.get(f"/api/v1/runs/{run.pk}/", role=Role.VIEWER).json()
    assert (detail["started_by_api_key"], detail["triggered_by"]) == (key_prefix, None)
    person = api.get(f"/api/v1/runs/{person_run.pk}/", role=Role.VIEWER).json()
    assert (person["started_by_api_key"], person["triggered_by"]) == (None, owner_of(org).email)
    listed = {r["id"]: r["started_by_api_key"] for r in api.get("/api/v1/runs/", role=Role.VIEWER).json()["results"]}
    assert listed == {str(run.pk): key_prefix, str(person_run.pk): None}


# --- "retrying at" ---------------------------------------------------------------------------------


def test_a_task_waiting_for_its_next_attempt_shows_when_it_retries(org):
    import datetime as dt

    from engine.models import TaskRun
    from engine.services import start_run
    from tests.unit.test_web_runs import drive_run

    wf = apply_definition(actor=actor_for(org), document={"name": "flaky", "tasks": [
        {"key": "fetch", "type": "fail", "config": {"fail_attempts": 1, "message": "timeout"}, "max_attempts": 3,
         "retry_backoff_seconds": 600},
        {"key": "after", "type": "noop", "depends_on": ["fetch"]}]})
    run = drive_run(start_run(workflow=wf, actor=actor_for(org)), flaky={"fetch"})
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="fetch")
    assert tr.state == "ready" and tr.attempt == 2  # the next attempt's number
    # The first attempt failed just now: attempt 2 waits base * 2**0 = 600 s.
    assert dt.timedelta(seconds=590) < tr.not_before - dt.datetime.now(dt.UTC) <= dt.timedelta(seconds=600)
    at = tr.not_before.astimezone(dt.UTC)
    shown = at.strftime("%H:%M:%S") if at.date() == dt.datetime.now(dt.UTC).date() else at.strftime("%b %-d, %H:%M:%S")
    expected = f'retrying at <time datetime="{at.isoformat(timespec="seconds")}">{shown} UTC</time>'

    client = client_for(owner_of(org))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    row = re.search(r'<tr id="task-fetch".*?</tr>', page, re.S).group(0)
    assert f'<span class="wait-reason retry-at">{expected}</span>' in row
    assert "retry backoff" not in row
    other = re.search(r'<tr id="task-after".*?</tr>', page, re.S).group(0)
    assert "retrying at" not in other  # pending, not waiting for a retry
    panel = client.get(f"/runs/{run.pk}/tasks/{tr.pk}/").content.decode()
    assert f"Attempt 2 is waiting for its retry backoff: {expected}." in panel

    # Once its backoff is over it no longer says so (it is only ready).
    TaskRun.objects.for_organization(org).filter(pk=tr.pk).update(not_before=dt.datetime.now(dt.UTC))
    assert "retrying at" not in client.get(f"/runs/{run.pk}/").content.decode()


# --- the failed-run banner -----------------------------------------------------------------------


def test_the_failed_run_banner_names_the_failing_tasks_with_links_to_their_panels(org):
    from engine.models import TaskRun
    from engine.services import start_run
    from tests.unit.test_web_runs import drive_run

    wf = apply_definition(actor=actor_for(org), document={"name": "breaks", "tasks": [
        {"key": "extract", "type": "noop"},
        {"key": "validate", "type": "noop", "depends_on": ["extract"]},
        {"key": "load", "type": "noop", "depends_on": ["extract"]},
        {"key": "report", "type": "noop", "depends_on": ["validate", "load"]}]})
    run = drive_run(start_run(workflow=wf, actor=actor_for(org)), fail={"validate", "load"})
    assert run.state == "failed"
    ids = dict(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("task__key", "id"))
    client = client_for(owner_of(org))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    banner = re.search(r'<div class="alert error run-error" role="alert">(.*?)</div>', page, re.S).group(1)
    named = re.findall(r'<a class="task-link" href="([^"]+)"[^>]*><code>(\w+)</code></a>', banner)
    # Both failed tasks (the table's order: depth, then key), each linking to its own panel;
    # neither the succeeded nor the skipped one.
    assert named == [(f"/runs/{run.pk}/tasks/{ids['load']}/", "load"),
                     (f"/runs/{run.pk}/tasks/{ids['validate']}/", "validate")]
    assert "Failed tasks:" in banner
    # Each one's error, escaped (the errors hold markup).
    assert banner.count("failed &lt;b&gt;on purpose&lt;/b&gt;") == 2 and "<b>" not in banner
    for url, _key in named:
        assert client.get(url).status_code == 200

    # A succeeded run has no banner.
    ok = drive_run(start_run(workflow=wf, actor=actor_for(org)))
    assert ok.state == "succeeded"
    assert 'class="alert error run-error"' not in client.get(f"/runs/{ok.pk}/").content.decode()


def test_the_banner_says_which_failures_a_handler_handled_and_lists_the_others_first(org):
    """The run's error counts the failures nothing handled (runs.sql run_finish_if_done); the
    banner names every failed task, those a one_failed task handled last, saying by which,
    so the two agree (a fresh review saw a count of two beside three names)."""
    from engine.services import start_run
    from tests.unit.test_web_runs import drive_run

    wf = apply_definition(actor=actor_for(org), document={"name": "handled", "tasks": [
        {"key": "boom", "type": "noop"},
        {"key": "alert", "type": "noop", "depends_on": ["boom"], "trigger_rule": "one_failed"},
        {"key": "validate", "type": "noop"},
        {"key": "web", "type": "noop"}]})
    run = drive_run(start_run(workflow=wf, actor=actor_for(org)), fail={"boom", "validate", "web"})
    assert (run.state, run.error) == ("failed", "2 tasks failed: validate, web")
    page = client_for(owner_of(org)).get(f"/runs/{run.pk}/").content.decode()
    banner = re.search(r'<p class="failed-tasks">(.*?)</p>', page, re.S).group(1)
    named = re.findall(r'<code>(\w+)</code></a>( <span class="handled">\(handled by <code>(\w+)</code>\)</span>)?',
                       banner)
    assert [(key, handler) for key, _span, handler in named] == [("validate", ""), ("web", ""), ("boom", "alert")]
    # A failed task may be on another page of the task table: the banner links to the table
    # filtered to failed tasks.
    assert '<a class="small show-failed" href="?task_state=failed#tasks">Show them in the task table</a>' in banner


# --- an identical re-upload is "unchanged" --------------------------------------------------------


SCHEMA_DOC = {"name": "report", "input_schema": {"type": "object", "properties": {
    "zeta": {"type": "string"}, "alpha": {"type": "integer"}}},
    "tasks": [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}]}


def test_the_api_answers_an_identical_definition_with_the_latest_version_unchanged(api):
    from audit.models import AuditLog
    from engine.models import Workflow

    created = api.post("/api/v1/workflows/", SCHEMA_DOC, role=Role.MEMBER)
    assert created.status_code == 201 and created.json()["unchanged"] is False
    # The same document, written with its keys in another order and defaults spelled out.
    same = {"tasks": [{"key": "a", "type": "noop", "depends_on": []}, {"depends_on": ["a"], "type": "noop", "key": "b"}],
            "input_schema": SCHEMA_DOC["input_schema"], "name": "report"}
    again = api.post("/api/v1/workflows/", same, role=Role.MEMBER)
    assert again.status_code == 200, again.content
    body = again.json()
    assert (body["id"], body["version"], body["unchanged"]) == (created.json()["id"], 1, True)
    assert body["tasks"] == created.json()["tasks"]
    assert again["Location"].endswith(f"/api/v1/workflows/{body['id']}/")
    assert Workflow.objects.for_organization(api.org).filter(name="report").count() == 1
    assert AuditLog.objects.for_organization(api.org).filter(action="workflow.version_created").count() == 1

    # Any difference makes a version: a task's setting, the input schema's property order.
    changed = {**SCHEMA_DOC, "tasks": [{"key": "a", "type": "noop", "max_attempts": 2}, SCHEMA_DOC["tasks"][1]]}
    assert api.post("/api/v1/workflows/", changed).json()["version"] == 2
    reordered = {**changed, "input_schema": {"type": "object", "properties": {
        "alpha": {"type": "integer"}, "zeta": {"type": "string"}}}}
    third = api.post("/api/v1/workflows/", reordered)
    assert (third.status_code, third.json()["version"], third.json()["unchanged"]) == (201, 3, False)
    # Identical to an older version but not the latest: a new version (v4 = v1's definition).
    back = api.post("/api/v1/workflows/", SCHEMA_DOC)
    assert (back.status_code, back.json()["version"]) == (201, 4)


def test_an_identical_re_upload_of_an_archived_latest_version_makes_a_new_active_one(api):
    first = api.post("/api/v1/workflows/", SCHEMA_DOC).json()
    assert api.post(f"/api/v1/workflows/{first['id']}/archive/", {"confirm": "report"}).status_code == 200
    again = api.post("/api/v1/workflows/", SCHEMA_DOC)
    assert (again.status_code, again.json()["version"], again.json()["state"]) == (201, 2, "active")


def test_the_web_upload_says_unchanged_and_stores_no_version(org):
    import yaml

    from engine.models import Workflow

    client = client_for(owner_of(org))
    text_doc = yaml.safe_dump(SCHEMA_DOC, sort_keys=False)
    first = client.post("/workflows/new/", {"definition": text_doc, "state": "active"}, follow=True)
    assert "Saved report version 1 (active)." in text(first)
    wf = Workflow.objects.for_organization(org).get(name="report")
    again = client.post("/workflows/new/", {"definition": text_doc, "state": "active"}, follow=True)
    assert again.redirect_chain == [(f"/workflows/{wf.pk}/", 302)]
    assert ("Unchanged: report version 1 already has this definition, so no new version was created."
            in text(again))
    assert Workflow.objects.for_organization(org).filter(name="report").count() == 1
    # Saved as a draft instead: not the latest version's state, so a new (draft) version.
    draft = client.post("/workflows/new/", {"definition": text_doc, "state": "draft"}, follow=True)
    assert "Saved report version 2 (draft)." in text(draft)


# --- the console email, decoded and whole ----------------------------------------------------------


def test_the_dev_console_mailer_is_the_decoding_one(settings):
    """make run's configuration (DEBUG on, no EMAIL_HOST) picks it, computed by the settings
    module in a child process as make run would."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("EMAIL_HOST", "DJANGO_SETTINGS_MODULE")}
    env.update(DEBUG="1", DJANGO_SETTINGS_MODULE="flowforge.settings")
    out = subprocess.run([sys.executable, "-c", "import json; from flowforge import settings as s; "
                          "print(json.dumps(s.MAILERS))"], env=env, capture_output=True, text=True, check=True)
    mailers = json.loads(out.stdout.strip().splitlines()[-1])
    assert mailers["default"]["BACKEND"] == "frontend.mail_backends.DecodedConsoleEmailBackend"


def test_the_sign_up_confirmation_link_printed_by_the_console_mailer_is_whole_and_works(db, capsys, settings):
    from allauth.account.models import EmailAddress

    from tests.unit.test_identity import PASSWORD, fresh_client, unique_email

    settings.MAILERS = {"default": {"BACKEND": "frontend.mail_backends.DecodedConsoleEmailBackend"}}
    # A long address makes a long line: quoted-printable would cut it at 76 characters.
    email = unique_email("a-rather-long-local-part-for-the-confirmation-link")
    client = fresh_client()
    resp = client.post("/accounts/signup/", {"email": email, "password1": PASSWORD, "password2": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/confirm-email/"
    printed = capsys.readouterr().out
    assert f"To: {email}" in printed
    assert "=\n" not in printed and "=3D" not in printed  # no quoted-printable left
    lines = [line for line in printed.splitlines() if "/accounts/confirm-email/" in line]
    assert lines, printed
    link = re.search(r"http://testserver(/accounts/confirm-email/\S+/)", lines[0]).group(1)
    assert len(link) > 76  # it would have been cut
    # Copied from the log as printed, the link confirms the address.
    page = client.get(link)
    assert page.status_code == 200 and email in page.content.decode()
    assert client.post(link).status_code == 302
    assert EmailAddress.objects.get(email=email).verified is True


# --- staff made with createsuperuser reach the admin ----------------------------------------------


def test_a_superuser_made_with_createsuperuser_signs_in_to_the_admin_without_verifying(db, monkeypatch):
    from allauth.account.models import EmailAddress
    from django.core.management import call_command

    from tenancy.models import User
    from tests.unit.test_identity import PASSWORD, fresh_client, unique_email

    email = unique_email("root")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", PASSWORD)
    call_command("createsuperuser", interactive=False, email=email, verbosity=0)
    user = User.objects.get(email=email)
    assert user.is_staff and user.is_superuser
    assert EmailAddress.objects.get(user=user).verified is True

    client = fresh_client()
    # The admin's login is allauth's (rate limits, MFA): /admin/ sends there, and back.
    start = client.get("/admin/login/?next=/admin/")
    assert start.status_code == 302 and start["Location"].startswith("/accounts/login/"), start.get("Location")
    resp = client.post("/accounts/login/?next=/admin/", {"login": email, "password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/admin/", resp.get("Location")
    admin = client.get("/admin/")
    assert admin.status_code == 200 and "Site administration" in admin.content.decode()

    # Anyone else still confirms their address first.
    other = unique_email("someone")
    User.objects.create_user(email=other, password=PASSWORD)
    resp = fresh_client().post("/accounts/login/", {"login": other, "password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/confirm-email/"


# --- who started a backfill's run (a fresh review) ---------------------------------------------------


def test_a_backfills_run_page_names_the_backfill_and_who_made_it_also_after_its_trigger_is_deleted(org, make_workflow):
    """The run page said "cron trigger nightly" for a backfill's run while the trigger
    existed, and "FlowForge (system)" once it was deleted; the API and the runs list name
    the backfill's maker."""
    from engine.backfill import advance_backfill, create_backfill
    from engine.models import ScheduledTrigger
    from engine.triggers import create_trigger, delete_trigger

    make_workflow(org, [{"key": "a", "type": "noop"}], name="nightly-flow")
    owner = owner_of(org)
    actor = actor_for(org)
    trigger = create_trigger(actor=actor, data={"name": "nightly", "workflow_name": "nightly-flow",
                                                "cron_expression": "0 2 * * *", "timezone": "UTC"})
    backfill = create_backfill(actor=actor, trigger=trigger, start="2026-03-01", end="2026-03-02")
    advance_backfill(backfill.pk)
    run = WorkflowRun.objects.for_organization(org).filter(trigger_source="backfill").first()
    assert run is not None and run.triggered_by_id == owner.pk
    client = client_for(owner)

    def shown() -> str:
        page = text(client.get(f"/runs/{run.pk}/"))
        return re.search(r"<dt>Started by</dt><dd>(.*?)</dd>", page, re.S).group(1)

    assert shown() == f"backfill of cron trigger nightly by {owner.email}"
    delete_trigger(actor=actor, trigger=ScheduledTrigger.objects.for_organization(org).get(pk=trigger.pk))
    assert shown() == f"backfill of a deleted cron trigger by {owner.email}"
