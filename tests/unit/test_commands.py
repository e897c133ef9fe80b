"""The management commands a person types: clear errors, nothing half-done."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from engine.models import Workflow, WorkflowRun
from tenancy.models import Organization, User

DIAMOND = '{"name": "d", "tasks": [{"key": "a", "type": "noop"}]}'


def run(*args, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **kwargs)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_apply_workflow_reads_every_file_before_applying_any(org, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(DIAMOND)
    with pytest.raises(CommandError, match=r"missing\.json: cannot read \(No such file or directory\); nothing was applied"):
        run("apply_workflow", str(good), str(tmp_path / "missing.json"), org=org.slug)
    assert not Workflow.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_apply_workflow_refuses_a_file_that_is_not_utf8(org, tmp_path):
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{\x00}\x00")
    with pytest.raises(CommandError, match=r"binary\.json: not UTF-8 text \(byte 0: invalid start byte\)"):
        run("apply_workflow", str(binary), org=org.slug)


@pytest.mark.django_db
def test_apply_workflow_accepts_a_utf8_bom(org, tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + DIAMOND.encode())
    out, _ = run("apply_workflow", str(path), org=org.slug)
    assert "d v1" in out


@pytest.mark.django_db
def test_a_draft_is_published_and_archived_from_the_command_line(org, tmp_path):
    path = tmp_path / "wf.json"
    path.write_text(DIAMOND)
    run("apply_workflow", str(path), org=org.slug, draft=True)
    assert Workflow.objects.for_organization(org).get(name="d").state == "draft"
    with pytest.raises(CommandError, match="is draft; only active workflows can start runs"):
        run("start_run", "d", org=org.slug)
    out, _ = run("set_workflow_state", "d", "active", org=org.slug)
    assert out.strip() == "d v1 is active"
    run("start_run", "d", org=org.slug)
    assert WorkflowRun.objects.for_organization(org).count() == 1
    out, _ = run("set_workflow_state", "d", "archived", org=org.slug)
    assert out.strip() == "d v1 is archived; 1 running run(s) cancelled"
    assert WorkflowRun.objects.for_organization(org).get().state == "cancelled"


def test_set_workflow_state_help_describes_the_lifecycle_and_the_default_version():
    from engine.management.commands.set_workflow_state import Command

    parser = Command().create_parser("manage.py", "set_workflow_state")
    assert Command.help.startswith("Move a workflow version through its lifecycle (draft -> active -> archived): ")
    assert "seed" not in parser.format_help()
    (version,) = [a for a in parser._actions if a.dest == "workflow_version"]
    assert version.help == "version (default: the highest-numbered version of that name, whatever its state)"


@pytest.mark.django_db
def test_set_workflow_state_without_a_version_changes_the_highest_numbered_one_whatever_its_state(org, tmp_path):
    path = tmp_path / "wf.json"
    path.write_text(DIAMOND)
    run("apply_workflow", str(path), org=org.slug)  # d v1, active
    run("apply_workflow", str(path), org=org.slug, draft=True)  # d v2, draft
    # start_run picks v1 (the latest active); set_workflow_state picks v2 (the latest).
    out, _ = run("set_workflow_state", "d", "archived", org=org.slug)
    assert out.strip() == "d v2 is archived; 0 running run(s) cancelled"
    out, _ = run("set_workflow_state", "d", "active", org=org.slug)
    assert out.strip() == "d v2 is active"
    states = dict(Workflow.objects.for_organization(org).filter(name="d").values_list("version", "state"))
    assert states == {1: "active", 2: "active"}


@pytest.mark.django_db
def test_start_run_refuses_a_non_positive_timeout(org):
    with pytest.raises(CommandError, match="--timeout must be a positive number of seconds"):
        run("start_run", "d", org=org.slug, wait=True, timeout=-1)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("email", "password", "message"),
    [
        ("not-an-email", None, "owner email 'not-an-email' is not an email address"),
        ("a b@@x", None, "is not an email address"),
        ("ok@example.com", "123", "--password: This password is too short"),
    ],
)
def test_createorganization_validates_the_owner(email, password, message):
    with pytest.raises(CommandError, match=message):
        run("createorganization", "acme", "Acme", email, password=password)
    assert not Organization.objects.filter(slug="acme").exists()
    assert not User.objects.filter(email=email.lower()).exists()


@pytest.mark.django_db
def test_createorganization_without_password_says_how_to_set_one():
    out, err = run("createorganization", "acme", "Acme", "Owner@Example.com")
    assert "owner owner@example.com (new user)" in out
    assert "has no password yet" in err
    assert not User.objects.get(email="owner@example.com").has_usable_password()


@pytest.mark.django_db
def test_the_owner_createorganization_makes_with_a_password_can_sign_in():
    """Reviewer's finding: the README's first command made an owner whose sign-in stopped at
    "confirm your address" (mandatory verification); the operator vouches for it."""
    from django.test import Client

    run("createorganization", "acme", "Acme", "Boss@Example.com", password="a-long-enough-pass-9")
    client = Client()
    response = client.post("/accounts/login/", {"login": "boss@example.com", "password": "a-long-enough-pass-9"})
    assert response.status_code == 302 and "confirm" not in response["Location"], response
    assert client.get("/").status_code == 200
    assert "_auth_user_id" in client.session


@pytest.mark.django_db
def test_createorganization_refuses_a_password_for_an_existing_user():
    User.objects.create_user(email="exists@example.com", password="an-old-long-password")
    with pytest.raises(CommandError, match="already has an account; --password only applies to a new user"):
        run("createorganization", "acme", "Acme", "exists@example.com", password="another-long-password-1")


@pytest.mark.django_db
def test_apply_workflow_over_the_definitions_quota_is_a_command_error_with_the_quotas_message(org, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(DIAMOND)
    second.write_text(DIAMOND.replace('"d"', '"e"'))
    run("apply_workflow", str(first), org=org.slug)
    one = Workflow.objects.for_organization(org).get().definition
    from django.db import connection

    with connection.cursor() as cur:  # the quota counts the stored text of every version
        cur.execute("SELECT octet_length(definition::text) FROM core_workflow WHERE organization_id = %s", [org.pk])
        (used,) = cur.fetchone()
    Organization.objects.filter(pk=org.pk).update(max_definition_bytes_override=used)  # full
    with pytest.raises(CommandError) as excinfo:
        run("apply_workflow", str(second), org=org.slug)
    message = str(excinfo.value)
    assert message.startswith(f"{second}: rejected, nothing of it stored: stored definitions quota "
                              f"(max_definition_bytes) exceeded: the organization stores {used} bytes")
    assert message.endswith(f"and the limit is {used} bytes; stored versions (archived ones too) keep counting, "
                            "so ask staff to raise max_definition_bytes")
    assert list(Workflow.objects.for_organization(org).values_list("definition", flat=True)) == [one]


@pytest.mark.django_db
def test_outbox_replay_reports_a_retry_over_the_runs_quota_and_leaves_the_row(org, make_workflow):
    from django.db import transaction

    from engine.models import OutboxMessage
    from engine.repositories import task_runs
    from engine.services import cancel_run, start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    wr = start_run(workflow=wf)
    with transaction.atomic():
        (d,) = task_runs.claim_ready_many(limit=10, lease_seconds=300, owner="test")
    OutboxMessage.objects.for_organization(org).filter(task_run_id=d.task_run_id).update(
        dead_lettered_at=wr.created_at, publish_attempts=10, last_error="Refused")
    cancel_run(run=wr)  # finished: the replay would retry the run
    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=1)  # the one run started fills it
    err = io.StringIO()
    with pytest.raises(CommandError, match=r"^1 dead letter\(s\) not replayed; see above$"):
        call_command("outbox_replay", "--all", stdout=io.StringIO(), stderr=err)
    row_id = OutboxMessage.objects.for_organization(org).get(task_run_id=d.task_run_id).pk
    assert err.getvalue().startswith(f"{row_id}: not replayed: runs per minute quota (max_runs_per_minute) reached: "
                                     "the organization started 1 runs in the last 60 s, its limit is 1")
    row = OutboxMessage.objects.for_organization(org).get(task_run_id=d.task_run_id)
    assert row.replayed_at is None
    assert WorkflowRun.objects.for_organization(org).count() == 1
