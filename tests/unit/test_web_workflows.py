"""The workflow pages: list, upload a definition, one version's page (DAG, tasks,
versions, diff), archive/restore, start a run. Who sees which controls, what the
server refuses (403), other organizations' ids (404), nothing stored on a rejected
definition, and page query counts that do not grow with the data shown."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditLog
from engine.models import Task, Workflow, WorkflowRun, WorkflowState
from engine.services import apply_definition, archive_workflow, start_run
from tenancy.actors import Actor
from tenancy.models import Membership, Role, User
from tests.unit.test_identity import fresh_client, unique_email

REPO = Path(__file__).resolve().parents[2]


# --- helpers shared by the web tests of this section ------------------------------------------


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def add_member(org, role: str) -> Membership:
    user = User.objects.create_user(email=unique_email(role))
    return Membership.objects.create(organization=org, user=user, role=role)


def client_for(membership: Membership) -> Client:
    client = fresh_client()
    client.force_login(membership.user)
    return client


def actor_of(membership: Membership) -> Actor:
    return Actor(
        organization=membership.organization, role=membership.role, user=membership.user, channel="web"
    )


def sql_count(client: Client, url: str) -> tuple[int, object]:
    """(number of SQL statements, response) of GET ``url``, without the SAVEPOINT and
    RELEASE statements that ATOMIC_REQUESTS adds around the view."""
    with CaptureQueriesContext(connection) as queries:
        resp = client.get(url)
    assert resp.status_code == 200, (url, resp.status_code)
    statements = [q["sql"] for q in queries.captured_queries]
    return len([s for s in statements if not s.upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]), resp


def actions(org, action: str) -> list[AuditLog]:
    return list(AuditLog.objects.for_organization(org).filter(action=action))


def assert_csp_clean(body: str) -> None:
    """No inline script and no style attribute: the CSP would block them (a JSON data
    block, ``type="application/json"``, is never executed, so the CSP lets it be)."""
    assert " style=" not in body
    for tag in re.findall(r"<script\b[^>]*>", body):
        assert "src=" in tag or 'type="application/json"' in tag, tag


def make_team(org) -> dict:
    """``org`` with one member of each role: {"org", "owner", "admin", "member", "viewer"}."""
    return {
        "org": org,
        "owner": Membership.objects.for_organization(org).get(role=Role.OWNER),
        "admin": add_member(org, Role.ADMIN),
        "member": add_member(org, Role.MEMBER),
        "viewer": add_member(org, Role.VIEWER),
    }


@pytest.fixture
def team(org):
    return make_team(org)


def chain(org, name: str = "etl", n: int = 3, **kwargs) -> Workflow:
    """A chain t0 -> t1 -> ... of ``n`` noop tasks."""
    tasks = [{"key": "t0", "type": "noop"}] + [
        {"key": f"t{i}", "type": "noop", "depends_on": [f"t{i - 1}"]} for i in range(1, n)
    ]
    return apply_definition(organization=org, document={"name": name, "tasks": tasks}, **kwargs)


DIAMOND = {
    "name": "diamond",
    "description": "Fan out & <b>in</b>",
    "tasks": [
        {
            "key": "extract",
            "type": "noop",
            "max_attempts": 3,
            "retry_backoff_seconds": 2,
            "timeout_seconds": 30,
        },
        {"key": "left", "type": "noop", "depends_on": ["extract"], "edge_labels": {"extract": "rows <raw>"}},
        {"key": "right", "type": "sleep", "config": {"seconds": 0}, "depends_on": ["extract"]},
        {"key": "join", "type": "noop", "depends_on": ["left", "right"]},
    ],
}


# --- sign-in and list -------------------------------------------------------------------------


def test_section_pages_require_sign_in(db):
    client = fresh_client()
    for url in ("/workflows/", "/workflows/new/", "/triggers/", "/triggers/new/", "/api-keys/", "/settings/"):
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"] == f"/accounts/login/?next={url}", url


def test_list_shows_each_names_latest_version_with_state_tasks_and_latest_run(team):
    org, owner = team["org"], team["owner"]
    chain(org, "etl", 2)
    v2 = chain(org, "etl", 4)
    run = start_run(workflow=v2, actor=actor_of(owner))
    old = chain(org, "old-report", 1)
    archive_workflow(actor=actor_of(owner), workflow=old, confirm="old-report")

    resp = client_for(team["viewer"]).get("/workflows/")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert f'href="/workflows/{v2.pk}/"' in body and ">etl</a>" in body
    assert "v2" in body and "of 2" in body
    assert '<span class="badge wf-active">Active</span>' in body
    assert '<span class="badge wf-archived">Archived</span>' in body
    row = body[body.index(">etl</a>") : body.index(">old-report</a>")]
    assert '<td data-label="Tasks" class="num">4</td>' in row
    assert f'<a class="badge state-running" href="/runs/{run.pk}/">running</a>' in row
    assert "No runs yet" in body[body.index(">old-report</a>") :]
    # A viewer gets no "New workflow" button.
    assert "/workflows/new/" not in body
    assert 'href="/workflows/new/"' in client_for(team["member"]).get("/workflows/").content.decode()
    assert_csp_clean(body)


def test_list_page_query_count_does_not_grow_with_workflows(team):
    org, owner = team["org"], team["owner"]
    client = client_for(team["viewer"])
    start_run(workflow=chain(org, "first", 2), actor=actor_of(owner))
    few, _ = sql_count(client, "/workflows/")
    for i in range(6):
        chain(org, f"wf-{i}", 2)
        wf = chain(org, f"wf-{i}", 5)
        start_run(workflow=wf, actor=actor_of(owner))
    many, resp = sql_count(client, "/workflows/")
    assert len(re.findall(r'href="/runs/[0-9a-f-]{36}/"', resp.content.decode())) == 7
    assert few == many, (few, many)


# --- upload ------------------------------------------------------------------------------------


def test_uploading_a_json_definition_creates_the_next_version_and_records_it(team):
    org = team["org"]
    client = client_for(team["member"])
    page = client.get("/workflows/new/")
    assert page.status_code == 200
    assert 'enctype="multipart/form-data"' in page.content.decode()
    assert "csrfmiddlewaretoken" in page.content.decode()

    resp = client.post("/workflows/new/", {"definition": json.dumps(DIAMOND), "state": "active"})
    wf = Workflow.objects.for_organization(org).get(name="diamond")
    assert resp.status_code == 302 and resp["Location"] == f"/workflows/{wf.pk}/"
    assert (wf.version, wf.state) == (1, WorkflowState.ACTIVE)
    assert Task.objects.for_organization(org).filter(workflow=wf).count() == 4
    [record] = actions(org, "workflow.version_created")
    assert record.actor_user_id == team["member"].user_id and record.metadata["channel"] == "web"

    client.post("/workflows/new/", {"definition": json.dumps(DIAMOND), "state": "draft"})
    v2 = Workflow.objects.for_organization(org).get(name="diamond", version=2)
    assert v2.state == WorkflowState.DRAFT
    assert "Saved diamond version 1 (active)." in text(client.get(f"/workflows/{wf.pk}/"))


def test_uploading_a_yaml_file_keeps_positions_and_edge_labels(team):
    org = team["org"]
    source = (REPO / "examples" / "penguins.yaml").read_bytes()
    resp = client_for(team["admin"]).post(
        "/workflows/new/",
        {
            "definition": "",
            "state": "active",
            "file": SimpleUploadedFile("penguins.yaml", source, "application/yaml"),
        },
    )
    assert resp.status_code == 302
    wf = Workflow.objects.for_organization(org).get(name="penguins-report")
    page = client_for(team["viewer"]).get(f"/workflows/{wf.pk}/").content.decode()
    # The graph's data (drawn by graph.js, which uses the positions when every task has one).
    data = json.loads(re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert all(x is not None and y is not None for _, _, x, y in data["tasks"])
    assert len(data["edges"]) == 8
    assert "species mix" in [label for _, _, label in data["edges"]]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {
                "name": "bad",
                "tasks": [
                    {"key": "a", "type": "teleport"},
                    {"key": "b", "type": "noop", "depends_on": ["zz"]},
                ],
            },
            ["tasks[a].type: unknown task type 'teleport'", "tasks[b].depends_on: unknown dependency 'zz'"],
        ),
        (
            {
                "name": "loop",
                "tasks": [
                    {"key": "a", "type": "noop", "depends_on": ["b"]},
                    {"key": "b", "type": "noop", "depends_on": ["a"]},
                ],
            },
            ["tasks: dependency cycle: a -> b -> a"],
        ),
    ],
)
def test_an_invalid_definition_lists_every_problem_next_to_the_field_and_stores_nothing(
    team, document, expected
):
    org = team["org"]
    before = AuditLog.objects.for_organization(org).count()
    resp = client_for(team["member"]).post(
        "/workflows/new/", {"definition": json.dumps(document), "state": "active"}
    )
    assert resp.status_code == 400
    body = text(resp)
    errors = body[body.index('class="errorlist definition-errors"') :]
    errors = re.sub(r"<[^>]+>", "", errors[: errors.index("</ul>")])
    for line in expected:
        assert line in errors, (line, errors)
    # The text is kept in the field so it can be fixed.
    assert html.escape(json.dumps(document)) in resp.content.decode() or json.dumps(document) in body
    assert not Workflow.objects.for_organization(org).exists()
    assert AuditLog.objects.for_organization(org).count() == before


def test_syntax_errors_and_empty_submissions_are_shown_next_to_the_input(team):
    org = team["org"]
    client = client_for(team["member"])
    resp = client.post("/workflows/new/", {"definition": "", "state": "active"})
    assert resp.status_code == 400 and "Paste a definition or choose a file." in text(resp)
    resp = client.post(
        "/workflows/new/",
        {
            "definition": "",
            "state": "active",
            "file": SimpleUploadedFile("x.json", b'{"name": "x",', "application/json"),
        },
    )
    assert resp.status_code == 400
    body = text(resp)
    assert "document: invalid JSON at line 1" in re.sub(r"<[^>]+>", "", body)
    assert body.index("id_file") < body.index("definition-errors")  # shown by the file input
    resp = client.post("/workflows/new/", {"definition": "name: [unclosed", "state": "active"})
    assert resp.status_code == 400 and "invalid YAML" in text(resp)
    assert not Workflow.objects.for_organization(org).exists()


def test_viewer_cannot_open_or_post_the_upload_form(team):
    client = client_for(team["viewer"])
    assert client.get("/workflows/new/").status_code == 403
    resp = client.post("/workflows/new/", {"definition": json.dumps(DIAMOND), "state": "active"})
    assert resp.status_code == 403
    assert "may not do this: it needs workflow.edit, which only the owner, admin and member roles have" in text(resp)
    assert not Workflow.objects.for_organization(team["org"]).exists()


def test_new_version_form_starts_from_an_existing_definition(team):
    wf = apply_definition(organization=team["org"], document=DIAMOND)
    page = client_for(team["member"]).get(f"/workflows/new/?from={wf.pk}")
    assert page.status_code == 200
    body = text(page)
    assert "New version of diamond" in body and "name: diamond" in body and "- key: extract" in body


def test_the_definition_help_shows_the_scheduling_fields_in_a_valid_example(team):
    from engine.definitions import DefinitionError, parse_document, validate_document

    body = text(client_for(team["member"]).get("/workflows/new/"))
    help_box = body[body.index("<h2>Definition format</h2>"):body.index("</aside>")]
    example = re.search(r'<pre class="code small">(.*?)</pre>', help_box, flags=re.S).group(1)
    # The placeholder is the definition's, not the template engine's.
    assert 'concurrency: {key: "shop-{{ input.shop }}", limit: 2}' in example
    try:
        normalized = validate_document(parse_document(example))
    except DefinitionError as exc:  # only a callable outside this deployment's allow-list may fail
        assert [e["path"] for e in exc.errors] == ["tasks[extract].config"], exc.errors
    else:
        assert normalized["concurrency"] == {"max_running_runs": 1, "policy": "queue"}
    for words in ("<code>priority</code>", "<code>concurrency: {key, limit}</code>",
                  "<code>rate_limit: {key, per_second}</code>", "<code>{key, per_minute}</code>",
                  "<code>{{ input.field }}</code>",
                  "<code>concurrency: {max_running_tasks, max_running_runs, policy}</code>",
                  "<code>docs/scheduling.md</code>"):
        assert words in help_box, words


# --- one version -------------------------------------------------------------------------------


def test_detail_shows_the_dag_tasks_and_versions(team):
    org = team["org"]
    v1 = chain(org, "diamond", 1)
    v2 = apply_definition(organization=org, document=DIAMOND)
    resp = client_for(team["viewer"]).get(f"/workflows/{v2.pk}/")
    assert resp.status_code == 200
    body = resp.content.decode()
    # The DAG's data (drawn by graph.js): one row per task in the graph order, one pair
    # per dependency, the label escaped by json_script.
    found = re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', body, re.S)
    data = json.loads(found.group(1))
    keys = [row[0] for row in data["tasks"]]
    assert keys == ["extract", "left", "right", "join"], keys
    assert len(data["edges"]) == 4 and data["states"] is False
    assert "rows <raw>" in [label for _, _, label in data["edges"]]
    assert "rows <raw>" not in found.group(1)
    # The description is escaped too.
    assert "Fan out &amp; &lt;b&gt;in&lt;/b&gt;" in body
    # The tasks table: type, retries with backoff, timeout, dependencies.
    row = body[body.index("<code>extract</code>") :]
    row = row[: row.index("</tr>")]
    assert (
        '<span class="type-tag">noop</span>' in row
        and "2<div" in row
        and "2s backoff" in row
        and "30s" in row
    )
    join = body[body.index("<code>join</code>") :]
    assert "<code>left</code> <code>right</code>" in join[: join.index("</tr>")]
    # Version history with links.
    assert f'href="/workflows/{v1.pk}/"' in body and "(this page)" in body
    assert f"?compare={v1.pk}#diff" in body
    assert_csp_clean(body)
    # An older version says a newer one exists.
    older = text(client_for(team["viewer"]).get(f"/workflows/{v1.pk}/"))
    assert f'The latest is <a href="/workflows/{v2.pk}/">v2</a> (active).' in older


def task_row(body: str, key: str) -> str:
    row = body[body.index(f"<code>{key}</code>"):]
    return row[: row.index("</tr>")]


def test_detail_shows_each_tasks_scheduling_settings_and_the_workflow_limits(team):
    org = team["org"]
    wf = apply_definition(organization=org, document={
        "name": "charges",
        "concurrency": {"max_running_tasks": 20, "max_running_runs": 2, "policy": "cancel_oldest"},
        "tasks": [
            {"key": "charge", "type": "noop", "priority": 5,
             "concurrency": {"key": "customer-{{ input.customer_id }}", "limit": 2},
             "rate_limit": {"key": "stripe", "per_second": 10}},
            {"key": "mail", "type": "noop", "depends_on": ["charge"], "priority": -3,
             "rate_limit": {"key": "smtp", "per_minute": 600}},
            {"key": "plain", "type": "noop", "depends_on": ["charge"]},
        ]})
    body = client_for(team["viewer"]).get(f"/workflows/{wf.pk}/").content.decode()
    assert "<th>Scheduling</th>" in body
    charge = task_row(body, "charge")
    assert '<span class="muted small">priority</span> <code>+5</code></div>' in charge
    assert ('<span class="muted small">concurrency</span> <code>customer-{{ input.customer_id }}</code> '
            '<span class="small">limit 2</span>') in charge
    assert ('<span class="muted small">rate limit</span> <code>stripe</code> '
            '<span class="small">10 per second</span>') in charge
    mail = task_row(body, "mail")
    assert "<code>-3</code>" in mail and "<code>smtp</code> <span class=\"small\">600 per minute</span>" in mail
    assert "concurrency" not in mail
    # Nothing set: priority 0 is the default and is not shown.
    assert '<td data-label="Scheduling" class="scheduling"><span class="muted">—</span></td>' in task_row(body, "plain")
    limits = text(client_for(team["viewer"]).get(f"/workflows/{wf.pk}/"))
    limits = limits[limits.index('<dl class="wf-limits"'):limits.index("</dl>")]
    assert "<dt>max running tasks</dt><dd><code>20</code>" in limits
    assert ("<dt>max running runs</dt><dd><code>2</code> <span class=\"muted small\">runs at once, every version; "
            "then the oldest running run is cancelled (cancel_oldest)</span>") in limits
    assert_csp_clean(body)


def test_a_workflow_without_scheduling_settings_shows_no_scheduling_column_or_limits(team):
    wf = chain(team["org"], "plain", 2)
    body = client_for(team["viewer"]).get(f"/workflows/{wf.pk}/").content.decode()
    assert "Scheduling" not in body and "wf-limits" not in body


def test_scheduling_keys_are_escaped_on_the_workflow_page(team):
    wf = apply_definition(organization=team["org"], document={"name": "keys", "tasks": [
        {"key": "a", "type": "noop", "concurrency": {"key": "k", "limit": 1}, "rate_limit": {"key": "r", "per_second": 1}}]})
    # Keys are checked when a definition is applied; a row written any other way is still only text.
    Task.objects.unscoped().filter(workflow=wf).update(concurrency_key="<script>alert(1)</script>",
                                                       rate_key='"><img src=x onerror=alert(2)>')
    body = client_for(team["viewer"]).get(f"/workflows/{wf.pk}/").content.decode()
    assert "<script>alert(1)" not in body and "<img src=x" not in body
    assert "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>" in body
    assert "<code>&quot;&gt;&lt;img src=x onerror=alert(2)&gt;</code>" in body


def test_diff_between_versions_is_rendered_escaped(team):
    org = team["org"]
    v1 = apply_definition(organization=org, document=DIAMOND)
    changed = json.loads(json.dumps(DIAMOND))
    changed["tasks"][0]["timeout_seconds"] = 90
    changed["tasks"].append({"key": "notify", "type": "noop", "depends_on": ["join"]})
    changed["description"] = "<script>alert(1)</script>"
    v2 = apply_definition(organization=org, document=changed)
    resp = client_for(team["viewer"]).get(f"/workflows/{v2.pk}/?compare={v1.pk}")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert "Changes from v1 to v2" in body
    assert '<tr class="diff-del"><td>-      &quot;timeout_seconds&quot;: 30.0' in body
    assert '<tr class="diff-add"><td>+      &quot;timeout_seconds&quot;: 90.0' in body
    assert "&quot;key&quot;: &quot;notify&quot;" in body
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    # Comparing from the older version's page gives the same direction.
    assert (
        "Changes from v1 to v2"
        in client_for(team["viewer"]).get(f"/workflows/{v1.pk}/?compare={v2.pk}").content.decode()
    )


def test_compare_with_another_organizations_or_unknown_version_is_404(team, make_org):
    org = team["org"]
    mine = apply_definition(organization=org, document=DIAMOND)
    theirs = apply_definition(organization=make_org(), document=DIAMOND)
    other_name = chain(org, "other", 1)
    client = client_for(team["owner"])
    assert client.get(f"/workflows/{mine.pk}/?compare={theirs.pk}").status_code == 404
    assert client.get(f"/workflows/{mine.pk}/?compare={other_name.pk}").status_code == 404
    assert client.get(f"/workflows/{mine.pk}/?compare=not-a-uuid").status_code == 404


def test_another_organizations_workflow_is_404_for_every_action(team, make_org):
    theirs = apply_definition(organization=make_org(), document=DIAMOND)
    client = client_for(team["owner"])
    assert client.get(f"/workflows/{theirs.pk}/").status_code == 404
    assert client.get(f"/workflows/new/?from={theirs.pk}").status_code == 404
    for action in ("start", "archive", "restore"):
        assert (
            client.post(
                f"/workflows/{theirs.pk}/{action}/", {"confirm": "diamond", "input": "{}"}
            ).status_code
            == 404
        )
    theirs.refresh_from_db()
    assert theirs.state == WorkflowState.ACTIVE
    assert not WorkflowRun.objects.for_organization(theirs.organization_id).exists()


def test_viewer_sees_no_controls_and_the_server_refuses_them(team):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    client = client_for(team["viewer"])
    body = client.get(f"/workflows/{wf.pk}/").content.decode()
    for control in ("/start/", "/archive/", "/restore/", "?from=", "Archive this version", "Start run"):
        assert control not in body, control
    assert "can look at runs but not start them" in text(client.get(f"/workflows/{wf.pk}/"))

    assert client.post(f"/workflows/{wf.pk}/start/", {"input": "{}"}).status_code == 403
    assert client.post(f"/workflows/{wf.pk}/archive/", {"confirm": "diamond"}).status_code == 403
    archive_workflow(actor=actor_of(team["owner"]), workflow=wf, confirm="diamond")
    assert client.post(f"/workflows/{wf.pk}/restore/").status_code == 403
    wf.refresh_from_db()
    assert wf.state == WorkflowState.ARCHIVED
    assert not WorkflowRun.objects.for_organization(org).exists()


def test_archive_needs_the_typed_name_then_cancels_running_runs(team):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    run = start_run(workflow=wf, actor=actor_of(team["owner"]))
    client = client_for(team["member"])
    page = client.get(f"/workflows/{wf.pk}/").content.decode()
    assert f'action="/workflows/{wf.pk}/archive/"' in page and 'data-confirm-name="diamond"' in page

    resp = client.post(f"/workflows/{wf.pk}/archive/", {"confirm": "diamon"})
    assert resp.status_code == 400
    body = text(resp)
    error = body[body.index('id="id_confirm_errors"') :]
    assert "Type diamond exactly to confirm." in error[: error.index("</ul>")]
    wf.refresh_from_db()
    assert wf.state == WorkflowState.ACTIVE

    resp = client.post(f"/workflows/{wf.pk}/archive/", {"confirm": "diamond"})
    assert resp.status_code == 302 and resp["Location"] == f"/workflows/{wf.pk}/"
    wf.refresh_from_db()
    run.refresh_from_db()
    assert wf.state == WorkflowState.ARCHIVED and run.state == "cancelled"
    [record] = actions(org, "workflow.archived")
    assert record.metadata["runs_cancelled"] == 1
    page = text(client.get(f"/workflows/{wf.pk}/"))
    assert "Archived diamond v1. 1 running run was cancelled." in page
    assert "This version is archived" in page and "Archive this version" not in page


def test_restore_and_activate(team):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    archive_workflow(actor=actor_of(team["owner"]), workflow=wf, confirm="diamond")
    client = client_for(team["member"])
    assert f'action="/workflows/{wf.pk}/restore/"' in client.get(f"/workflows/{wf.pk}/").content.decode()
    resp = client.post(f"/workflows/{wf.pk}/restore/")
    assert resp.status_code == 302
    wf.refresh_from_db()
    assert wf.state == WorkflowState.ACTIVE
    assert len(actions(org, "workflow.restored")) == 1

    draft = apply_definition(organization=org, document=DIAMOND, state=WorkflowState.DRAFT)
    page = client.get(f"/workflows/{draft.pk}/").content.decode()
    assert ">Activate</button>" in page and "This version is a draft" in page
    client.post(f"/workflows/{draft.pk}/restore/")
    draft.refresh_from_db()
    assert draft.state == WorkflowState.ACTIVE


def test_start_run_with_json_input_redirects_to_the_run_page(team):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    client = client_for(team["member"])
    page = client.get(f"/workflows/{wf.pk}/").content.decode()
    assert f'action="/workflows/{wf.pk}/start/"' in page and "data-json-object" in page
    assert re.search(r'<script src="/static/frontend/workflows\.js" nonce="[^"]+" defer></script>', page)

    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": '{"limit": 5, "who": "me"}'})
    run = WorkflowRun.objects.for_organization(org).get()
    assert resp.status_code == 302 and resp["Location"] == f"/runs/{run.pk}/"
    assert run.input == {"limit": 5, "who": "me"} and run.trigger_source == "web"
    assert run.triggered_by_id == team["member"].user_id
    [record] = actions(org, "run.started")
    assert record.target_id == str(run.pk)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1, 2]", 'Run input must be a JSON object, such as {"limit": 10}.'),
        ('{"limit": }', "Run input is not valid JSON: Expecting value at line 1, column 11."),
        ('"text"', "Run input must be a JSON object"),
    ],
)
def test_start_run_refuses_input_that_is_not_a_json_object(team, raw, message):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {"input": raw})
    assert resp.status_code == 400
    body = text(resp)
    error = body[body.index('id="id_input_errors"') :]
    assert message in error[: error.index("</ul>")]
    assert raw in body  # kept in the field
    assert not WorkflowRun.objects.for_organization(org).exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("11", "Must be a whole number from -10 to 10, got 11."),
        ("-11", "Must be a whole number from -10 to 10, got -11."),
        ("1.0", "Must be a whole number from -10 to 10, got '1.0'."),
        ("high", "Must be a whole number from -10 to 10, got 'high'."),
    ],
)
def test_start_run_refuses_a_priority_out_of_range_in_the_apis_words(team, raw, message):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    client = client_for(team["member"])
    page = text(client.get(f"/workflows/{wf.pk}/"))
    assert '<input type="number" name="priority" value="0" min="-10" max="10"' in page  # the browser's own check
    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": "{}", "priority": raw})
    assert resp.status_code == 400
    body = text(resp)
    error = body[body.index('id="id_priority_errors"') :]
    assert message in error[: error.index("</ul>")]
    assert not WorkflowRun.objects.for_organization(org).exists()


@pytest.mark.parametrize(("raw", "stored"), [(" -10 ", -10), ("+10", 10), ("", 0), ("   ", 0)])
def test_start_run_with_a_priority_in_range_or_blank_stores_it(team, raw, stored):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {"input": "{}", "priority": raw})
    assert resp.status_code == 302
    assert WorkflowRun.objects.for_organization(org).get().priority == stored


def test_a_long_bad_priority_is_echoed_cut(team):
    wf = apply_definition(organization=team["org"], document=DIAMOND)
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {"input": "{}", "priority": "9" * 5000})
    assert resp.status_code == 400
    assert f"Must be a whole number from -10 to 10, got '{'9' * 20}…'." in text(resp)
    assert "9" * 21 not in text(resp).replace('value="' + "9" * 5000, "")  # only the field keeps it whole


def test_an_archived_version_cannot_start_runs(team):
    org = team["org"]
    wf = apply_definition(organization=org, document=DIAMOND)
    client = client_for(team["member"])
    archive_workflow(actor=actor_of(team["owner"]), workflow=wf, confirm="diamond")
    assert f'action="/workflows/{wf.pk}/start/"' not in client.get(f"/workflows/{wf.pk}/").content.decode()
    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": "{}"})
    assert resp.status_code == 400
    assert "only active workflows can start runs" in text(resp)
    assert not WorkflowRun.objects.for_organization(org).exists()


def test_detail_page_query_count_does_not_grow_with_tasks_versions_or_runs(team):
    org, owner = team["org"], team["owner"]
    client = client_for(team["member"])
    small = chain(org, "small", 2)
    start_run(workflow=small, actor=actor_of(owner))
    few, _ = sql_count(client, f"/workflows/{small.pk}/")
    for _ in range(3):
        chain(org, "big", 5)
    big = chain(org, "big", 40)
    for _ in range(4):
        start_run(workflow=big, actor=actor_of(owner))
    many, resp = sql_count(client, f"/workflows/{big.pk}/")
    found = re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', resp.content.decode(), re.S)
    assert len(json.loads(found.group(1))["tasks"]) == 40
    assert few == many, (few, many)
    # The diff reads no more: the other version is one of those already listed.
    first = Workflow.objects.for_organization(org).get(name="big", version=1)
    with_diff, _ = sql_count(client, f"/workflows/{big.pk}/?compare={first.pk}")
    assert with_diff == many


def test_json_input_nested_too_deeply_is_a_form_error_not_a_500():
    from django import forms as dj_forms

    from frontend.forms_workflows import parse_json_object

    with pytest.raises(dj_forms.ValidationError) as excinfo:
        parse_json_object("[" * 100_000 + "]" * 100_000)
    assert excinfo.value.messages == ["Input is nested too deeply."]
