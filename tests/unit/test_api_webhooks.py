"""Webhook endpoints and their delivery log through the REST API (issue 19): create (the
secret once), list and read (never the secret), change, rotate, delete, the delivery log
with its attempts, replay; 400s naming the field, the endpoint cap's 422, webhook.manage
(403 for members and viewers), and constant query counts for the lists."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditLog
from engine.models import NotificationAttempt, NotificationDelivery, NotificationEvent, WebhookEndpoint
from engine.services import apply_definition, start_run
from tenancy.apikeys import create_api_key
from tenancy.models import Role
from tests.unit.test_api_org import assert_problem, bearer, data_queries
from tests.unit.test_web_runs import actor_for

pytestmark = pytest.mark.django_db

URL = "https://93.184.215.14/hooks/flowforge"  # a public address written as a number: no DNS lookup


def client_with(org, role=Role.ADMIN) -> Client:
    _key, full = create_api_key(actor=actor_for(org), name=f"k-{role}", role=role)
    return Client(headers=bearer(full))


def create(client, **fields):
    body = {"url": URL, "event_types": ["run.failed", "task.failed"], **fields}
    return client.post("/api/v1/webhooks/", body, content_type="application/json")


def dead_delivery(org, endpoint_id, *, attempts: int = 2) -> NotificationDelivery:
    """A dead-lettered delivery with its attempts, as the notifier leaves one."""
    wf = apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    run = start_run(workflow=wf, actor=actor_for(org))
    event = NotificationEvent.objects.create(organization=org, type="run.failed", workflow_run=run,
                                             workflow_name="nightly", run_event_seq=3,
                                             payload={"run": {"id": str(run.pk)}})
    delivery = NotificationDelivery.objects.create(organization=org, event=event, channel="webhook",
                                                   endpoint_id=endpoint_id, state="dead", attempts=attempts,
                                                   last_status=500, last_error="HTTP 500",
                                                   dead_lettered_at=timezone.now())
    for n in range(1, attempts + 1):
        NotificationAttempt.objects.create(organization=org, delivery=delivery, number=n, outcome="failed",
                                           retrying=n < attempts, started_at=timezone.now(), duration_ms=12,
                                           status_code=500, error="HTTP 500", response_excerpt="oops")
    return delivery


def test_create_returns_the_secret_once_and_no_read_shows_it(make_org):
    org = make_org()
    client = client_with(org)
    apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    resp = create(client, description="pager", workflow_name="nightly")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert resp["Cache-Control"] == "no-store"
    assert body["secret"].startswith("whsec_")
    assert (body["url"], body["event_types"], body["workflow_name"], body["enabled"]) == (
        URL, ["run.failed", "task.failed"], "nightly", True)
    endpoint = WebhookEndpoint.objects.for_organization(org).get(pk=body["id"])
    for path in ("/api/v1/webhooks/", f"/api/v1/webhooks/{endpoint.pk}/"):
        shown = client.get(path).content.decode()
        assert body["secret"] not in shown and "whsec_" not in shown and endpoint.secret_ciphertext not in shown
    listed = client.get("/api/v1/webhooks/").json()
    assert [e["id"] for e in listed["results"]] == [body["id"]] and listed["next"] is None
    assert AuditLog.objects.for_organization(org).filter(action="webhook.created").count() == 1


@pytest.mark.parametrize(("fields", "field"), [
    ({"url": "http://127.0.0.1/hook"}, "url"),
    ({"url": "http://192.168.1.20/hook"}, "url"),
    ({"url": "gopher://93.184.215.14/"}, "url"),
    ({"url": 7}, "url"),
    ({"event_types": ["run.exploded"]}, "event_types"),
    ({"event_types": []}, "event_types"),
    ({"workflow_name": "has spaces"}, "workflow_name"),
    ({"enabled": "yes"}, "enabled"),
])
def test_a_refused_field_is_a_400_naming_it_and_nothing_is_stored(make_org, fields, field):
    org = make_org()
    body = assert_problem(create(client_with(org), **fields), 400)
    assert list(body["errors"]) == [field]
    assert not WebhookEndpoint.objects.for_organization(org).exists()


def test_a_workflow_filter_naming_no_workflow_of_the_organization_is_a_400_on_create_and_change(make_org):
    org, stranger = make_org(), make_org()
    apply_definition(actor=actor_for(stranger), document={"name": "theirs", "tasks": [{"key": "a", "type": "noop"}]})
    apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    client = client_with(org)
    errors = {}
    for name in ("no-such-wf", "theirs"):
        body = assert_problem(create(client, workflow_name=name), 400)
        errors[name] = body["errors"]
    assert errors["no-such-wf"] == {"workflow_name": [
        "no workflow named 'no-such-wf' in this organization; give the name of one of its workflows (any version, "
        "active, draft or archived), or leave it empty for every workflow"]}
    # Another organization's workflow gets the very answer a missing one does: nothing tells it exists.
    assert errors["theirs"] == {"workflow_name": [errors["no-such-wf"]["workflow_name"][0].replace(
        "'no-such-wf'", "'theirs'")]}
    assert not WebhookEndpoint.objects.for_organization(org).exists()
    created = create(client, workflow_name="nightly")
    assert created.status_code == 201, created.content
    path = f"/api/v1/webhooks/{created.json()['id']}/"
    for name in ("no-such-wf", "theirs"):
        body = assert_problem(client.patch(path, {"workflow_name": name}, content_type="application/json"), 400)
        assert list(body["errors"]) == ["workflow_name"] and f"no workflow named {name!r}" in body["errors"][
            "workflow_name"][0]
    assert client.get(path).json()["workflow_name"] == "nightly"
    assert client.patch(path, {"workflow_name": ""}, content_type="application/json").json()["workflow_name"] == ""


def test_past_the_endpoint_cap_the_create_is_a_422_naming_the_limit(make_org, settings):
    settings.FLOWFORGE_MAX_WEBHOOKS_PER_ORG = 1
    org = make_org()
    client = client_with(org)
    assert create(client).status_code == 201
    body = assert_problem(create(client), 422)
    assert (body["code"], body["limit"], body["allowed"], body["used"]) == ("quota_exceeded", "max_webhooks", 1, 1)


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_may_not_read_or_manage_webhooks(make_org, role):
    org = make_org()
    endpoint_id = create(client_with(org)).json()["id"]
    client = client_with(org, role)
    assert_problem(client.get("/api/v1/webhooks/"), 403)
    assert_problem(create(client), 403)
    for path in (f"/api/v1/webhooks/{endpoint_id}/", f"/api/v1/webhooks/{endpoint_id}/deliveries/"):
        assert_problem(client.get(path), 403)
    assert_problem(client.post(f"/api/v1/webhooks/{endpoint_id}/rotate-secret/", {},
                               content_type="application/json"), 403)


def test_change_rotate_and_delete(make_org):
    org = make_org()
    client = client_with(org)
    created = create(client).json()
    path = f"/api/v1/webhooks/{created['id']}/"
    changed = client.patch(path, {"enabled": False, "event_types": ["run.succeeded"]},
                           content_type="application/json")
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert changed.json()["event_types"] == ["run.succeeded"]
    assert list(assert_problem(client.patch(path, {"url": "http://10.0.0.1/"}, content_type="application/json"),
                               400)["errors"]) == ["url"]
    rotated = client.post(f"{path}rotate-secret/", {"previous_valid_seconds": 3600}, content_type="application/json")
    assert rotated.status_code == 200 and rotated["Cache-Control"] == "no-store"
    assert rotated.json()["secret"].startswith("whsec_") and rotated.json()["secret"] != created["secret"]
    assert rotated.json()["previous_secret_expires_at"] is not None
    for bad in (604801, -1, True, "60"):
        refused = client.post(f"{path}rotate-secret/", {"previous_valid_seconds": bad},
                              content_type="application/json")
        assert list(assert_problem(refused, 400)["errors"]) == ["previous_valid_seconds"], bad
    assert client.delete(path).status_code == 204
    assert_problem(client.get(path), 404)
    actions = list(AuditLog.objects.for_organization(org).filter(action__startswith="webhook.")
                   .order_by("seq").values_list("action", flat=True))
    assert actions == ["webhook.created", "webhook.updated", "webhook.secret_rotated", "webhook.deleted"]


def test_the_delivery_log_shows_each_attempt_in_constant_queries(make_org):
    org = make_org()
    client = client_with(org)
    endpoint_id = create(client).json()["id"]
    first = dead_delivery(org, endpoint_id)
    path = f"/api/v1/webhooks/{endpoint_id}/deliveries/"
    with CaptureQueriesContext(connection) as one:
        body = client.get(path).json()
    (row,) = body["results"]
    assert (row["id"], row["state"], row["attempts"], row["last_status"]) == (str(first.pk), "dead", 2, 500)
    assert row["event"]["type"] == "run.failed" and row["event"]["id"] == str(first.event_id)
    assert [(a["number"], a["status_code"], a["response_excerpt"]) for a in row["attempt_log"]] == [
        (1, 500, "oops"), (2, 500, "oops")]
    for _ in range(4):
        dead_delivery(org, endpoint_id, attempts=3)
    with CaptureQueriesContext(connection) as five:
        body = client.get(path).json()
    assert len(body["results"]) == 5
    assert len(data_queries(five)) == len(data_queries(one))
    assert client.get(f"{path}?state=succeeded").json()["results"] == []
    assert list(assert_problem(client.get(f"{path}?state=lost"), 400)["errors"]) == ["state"]
    detail = client.get(f"{path}{first.pk}/").json()
    assert detail["body"]["id"] == str(first.event_id) and detail["body"]["type"] == "run.failed"
    assert detail["body"]["data"] == {"run": {"id": first.event.payload["run"]["id"]}}


def test_a_replay_is_accepted_once_and_a_second_is_a_409(make_org):
    org = make_org()
    client = client_with(org)
    endpoint_id = create(client).json()["id"]
    dead = dead_delivery(org, endpoint_id)
    path = f"/api/v1/webhooks/{endpoint_id}/deliveries/{dead.pk}/replay/"
    resp = client.post(path)
    assert resp.status_code == 202, resp.content
    body = resp.json()
    assert (body["replay_of"], body["state"], body["event"]["id"]) == (str(dead.pk), "pending", str(dead.event_id))
    assert assert_problem(client.post(path), 409)["detail"] == "a replay of this delivery is already pending"
    # A delivery of another endpoint of the organization is not this endpoint's.
    other = create(client).json()["id"]
    assert_problem(client.post(f"/api/v1/webhooks/{other}/deliveries/{dead.pk}/replay/"), 404)


def test_what_an_api_key_creates_names_the_key_in_the_api_and_on_the_pages(make_org):
    """A webhook endpoint and a workflow version made with an API key show the key's
    prefix where a person's email would be (they showed no one: 'by —')."""
    from django.contrib.auth import get_user_model

    from tenancy.models import Membership

    org = make_org()
    key_row, full = create_api_key(actor=actor_for(org), name="ci", role=Role.ADMIN)
    client = Client(headers=bearer(full))
    resp = create(client)
    assert resp.status_code == 201, resp.content
    assert (resp.json()["created_by"], resp.json()["created_by_api_key"]) == (None, key_row.prefix)
    endpoint_id = resp.json()["id"]
    read = client.get(f"/api/v1/webhooks/{endpoint_id}/").json()
    assert (read["created_by"], read["created_by_api_key"]) == (None, key_row.prefix)
    with CaptureQueriesContext(connection) as queries:
        listed = client.get("/api/v1/webhooks/").json()["results"]
        client.get(f"/api/v1/webhooks/{endpoint_id}/")
    assert [e["created_by_api_key"] for e in listed] == [key_row.prefix]
    # Who made it is read without the key's hash or a person's password hash.
    assert not any("hashed_key" in q["sql"] or '"password"' in q["sql"] for q in queries.captured_queries
                   if "core_webhookendpoint" in q["sql"])
    assert any("core_webhookendpoint" in q["sql"] and "core_apikey" in q["sql"] for q in queries.captured_queries)
    applied = client.post("/api/v1/workflows/", {"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]},
                          content_type="application/json")
    assert applied.status_code == 201, applied.content
    # A person's own work still names the person, and no key.
    by_person = create(client_with(org))  # another key: its own prefix
    assert by_person.json()["created_by_api_key"] not in (None, key_row.prefix)

    owner = Membership.objects.for_organization(org).get(role=Role.OWNER)
    web = Client()
    web.force_login(get_user_model().objects.get(pk=owner.user_id))
    versions = web.get(f"/workflows/{applied.json()['id']}/")
    assert versions.status_code == 200
    assert f"by key <code>ffk_{key_row.prefix}_…</code>" in versions.content.decode()  # the page's header
    assert f"key <code>ffk_{key_row.prefix}_…</code></td>" in versions.content.decode()  # the versions table
    page = web.get(f"/webhooks/{endpoint_id}/")
    assert page.status_code == 200 and f"by key <code>ffk_{key_row.prefix}_…</code>" in page.content.decode()
    assert f"key ffk_{key_row.prefix}_…" in web.get("/webhooks/").content.decode()
