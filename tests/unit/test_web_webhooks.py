"""The webhook pages and the workflow page's failure-email toggle (issue 19): create (the
secret shown once; a resent form creates nothing), the 400 naming the URL, the endpoint page
with its delivery log (constant queries), a delivery's attempts and body, replay, rotate,
delete; 403 for members and viewers; any member's own failure emails."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine.models import FailureSubscription, NotificationDelivery, WebhookEndpoint
from engine.notifications import create_endpoint
from engine.services import apply_definition
from tenancy.models import Role
from tests.unit.test_api_webhooks import URL, dead_delivery
from tests.unit.test_web_runs import actor_for, client_for, member, owner_of

pytestmark = pytest.mark.django_db


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def token_of(page: str) -> str:
    return re.search(r'name="form_token" value="([^"]+)"', page).group(1)


def endpoint_of(org) -> WebhookEndpoint:
    endpoint, _secret = create_endpoint(actor=actor_for(org), url=URL, event_types=["run.failed"])
    return endpoint


def test_an_admin_creates_an_endpoint_and_sees_its_secret_once(make_org):
    org = make_org()
    admin = client_for(member(org, Role.ADMIN))
    page = admin.get("/webhooks/")
    assert page.status_code == 200 and "Add an endpoint" in text(page)
    form = {"url": URL, "event_types": ["run.failed", "task.failed"], "workflow_name": "", "description": "pager",
            "enabled": "on", "form_token": token_of(text(page))}
    created = admin.post("/webhooks/", form)
    assert created.status_code == 201 and "no-store" in created["Cache-Control"]
    secret = re.search(r'value="(whsec_[^"]+)"', text(created)).group(1)
    endpoint = WebhookEndpoint.objects.for_organization(org).get()
    assert (endpoint.url, endpoint.event_types, endpoint.description) == (URL, ["run.failed", "task.failed"], "pager")
    # Sending the same form again (a reload of that page) creates nothing and shows no secret.
    again = admin.post("/webhooks/", form, follow=True)
    assert WebhookEndpoint.objects.for_organization(org).count() == 1
    assert secret not in text(again) and "already sent" in text(again)
    for path in ("/webhooks/", f"/webhooks/{endpoint.pk}/"):
        assert secret not in text(admin.get(path))


def test_a_refused_url_is_shown_on_its_field_and_nothing_is_stored(make_org):
    org = make_org()
    admin = client_for(owner_of(org))
    page = admin.get("/webhooks/")
    resp = admin.post("/webhooks/", {"url": "http://169.254.169.254/latest", "event_types": ["run.failed"],
                                     "enabled": "on", "form_token": token_of(text(page))})
    assert resp.status_code == 400
    assert re.search(r'id="id_url_errors".*Egress refused: 169\.254\.169\.254 \(link-local, cloud metadata\)',
                     text(resp), re.S)
    assert not WebhookEndpoint.objects.for_organization(org).exists()


def test_a_workflow_filter_naming_no_workflow_of_the_organization_is_shown_on_its_field(make_org):
    org, stranger = make_org(), make_org()
    apply_definition(actor=actor_for(stranger), document={"name": "theirs", "tasks": [{"key": "a", "type": "noop"}]})
    apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    admin = client_for(owner_of(org))
    # The field suggests the organization's own workflow names, never another organization's.
    page = text(admin.get("/webhooks/"))
    assert 'list="webhook-workflow-names"' in page
    assert re.search(r'<datalist id="webhook-workflow-names"><option value="nightly"></datalist>', page)
    for name in ("no-such-wf", "theirs"):  # another organization's workflow: the same answer as a missing one
        page = admin.get("/webhooks/")
        resp = admin.post("/webhooks/", {"url": URL, "event_types": ["run.failed"], "workflow_name": name,
                                         "enabled": "on", "form_token": token_of(text(page))})
        assert resp.status_code == 400
        assert re.search(r'id="id_workflow_name_errors".*No workflow named ' + re.escape(repr(name))
                         + r" in this organization; give the name of one of its workflows", text(resp), re.S)
    assert not WebhookEndpoint.objects.for_organization(org).exists()
    # Changing an endpoint's filter to a missing name is refused on the field too.
    endpoint = endpoint_of(org)
    resp = admin.post(f"/webhooks/{endpoint.pk}/", {"url": URL, "event_types": ["run.failed"],
                                                    "workflow_name": "no-such-wf", "enabled": "on"})
    assert resp.status_code == 400
    assert re.search(r'id="id_workflow_name_errors".*No workflow named \'no-such-wf\' in this organization',
                     text(resp), re.S)
    endpoint.refresh_from_db()
    assert endpoint.workflow_name == ""


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_get_403_on_every_webhook_page(make_org, role):
    org = make_org()
    endpoint = endpoint_of(org)
    delivery = dead_delivery(org, endpoint.pk)
    client = client_for(member(org, role))
    for path in ("/webhooks/", f"/webhooks/{endpoint.pk}/", f"/webhooks/{endpoint.pk}/rotate/",
                 f"/webhooks/{endpoint.pk}/delete/", f"/webhooks/{endpoint.pk}/deliveries/{delivery.pk}/"):
        assert client.get(path).status_code == 403, path
    assert client.post(f"/webhooks/{endpoint.pk}/deliveries/{delivery.pk}/replay/").status_code == 403
    assert not NotificationDelivery.objects.for_organization(org).filter(replay_of=delivery).exists()


def test_the_delivery_log_shows_attempts_in_constant_queries_and_replays(make_org):
    org = make_org()
    endpoint = endpoint_of(org)
    first = dead_delivery(org, endpoint.pk)
    admin = client_for(owner_of(org))
    path = f"/webhooks/{endpoint.pk}/"
    with CaptureQueriesContext(connection) as one:
        page = text(admin.get(path))
    assert f'data-delivery="{first.pk}"' in page and "Dead-lettered" in page and "HTTP 500" in page
    for _ in range(4):
        dead_delivery(org, endpoint.pk, attempts=3)
    with CaptureQueriesContext(connection) as five:
        page = text(admin.get(path))
    assert page.count('class="delivery state-dead"') == 5
    assert len(five.captured_queries) == len(one.captured_queries)
    detail = text(admin.get(f"{path}deliveries/{first.pk}/"))
    assert f'"id": "{first.event_id}"' in detail and '"type": "run.failed"' in detail
    assert detail.count("HTTP 500") >= 2 and "oops" in detail
    replayed = admin.post(f"{path}deliveries/{first.pk}/replay/", follow=True)
    assert "Replaying the delivery" in text(replayed)
    assert NotificationDelivery.objects.for_organization(org).filter(replay_of=first, state="pending").count() == 1
    refused = admin.post(f"{path}deliveries/{first.pk}/replay/", follow=True)
    assert "Not replayed: a replay of this delivery is already pending." in text(refused)


def test_settings_rotate_and_delete(make_org):
    org = make_org()
    endpoint = endpoint_of(org)
    admin = client_for(owner_of(org))
    path = f"/webhooks/{endpoint.pk}/"
    apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    saved = admin.post(path, {"url": URL, "event_types": ["run.succeeded"], "workflow_name": "nightly",
                              "description": ""}, follow=True)
    assert "Saved the endpoint" in text(saved)
    endpoint.refresh_from_db()
    assert (endpoint.event_types, endpoint.workflow_name, endpoint.enabled) == (["run.succeeded"], "nightly", False)
    form = text(admin.get(f"{path}rotate/"))
    rotated = admin.post(f"{path}rotate/", {"previous_valid_seconds": "86400", "form_token": token_of(form)})
    assert rotated.status_code == 200 and "no-store" in rotated["Cache-Control"]
    assert re.search(r'value="whsec_[^"]+"', text(rotated)) and "also signs until" in text(rotated)
    again = admin.post(f"{path}rotate/", {"previous_valid_seconds": "0", "form_token": token_of(form)}, follow=True)
    assert "already sent" in text(again)
    assert admin.post(f"{path}delete/").status_code == 302
    assert not WebhookEndpoint.objects.for_organization(org).exists()


def test_any_member_toggles_their_own_failure_emails_on_the_workflow_page(make_org):
    org = make_org()
    wf = apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    viewer = member(org, Role.VIEWER)
    client = client_for(viewer)
    page = text(client.get(f"/workflows/{wf.pk}/"))
    assert "Email me when it fails" in page
    on = client.post(f"/workflows/{wf.pk}/failure-emails/", {"subscribe": "1"}, follow=True)
    assert f"You will get an email at {viewer.email}" in text(on) and "Stop emailing me" in text(on)
    assert FailureSubscription.objects.for_organization(org).filter(user=viewer, workflow_name="nightly").exists()
    # Someone else's page state is their own.
    assert "Email me when it fails" in text(client_for(owner_of(org)).get(f"/workflows/{wf.pk}/"))
    off = client.post(f"/workflows/{wf.pk}/failure-emails/", {"subscribe": "0"}, follow=True)
    assert "no longer get emails" in text(off)
    assert not FailureSubscription.objects.for_organization(org).exists()
