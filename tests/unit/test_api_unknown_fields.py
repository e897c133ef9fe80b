"""Every write body of the API refuses a field it does not know: a 400 naming the field
and the ones the body takes, and nothing stored (``api.serializers.RejectUnknownFields``).
DRF drops unknown fields by default: a review's trigger with ``timzone: Europe/Paris``
was stored as UTC and fired at the wrong hour with a 201, and a webhook with
``workflow: prio`` (for ``workflow_name``) received every workflow's failures."""

from __future__ import annotations

import json

import pytest

from engine.models import ScheduledTrigger, WebhookEndpoint
from tenancy.models import ApiKey, Invitation, Role, Secret
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


def post(api, method: str, url: str, body: dict):
    send = getattr(api.client, method)
    return send(url, json.dumps(body), content_type="application/json", headers=bearer(api.keys[Role.OWNER]))


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "url", "body", "unknown", "stored"), [
    ("post", "/api/v1/triggers/", {"workflow_name": "prio", "cron_expression": "0 3 * * *", "name": "paris",
                                   "timzone": "Europe/Paris"}, "timzone",
     lambda org: ScheduledTrigger.objects.for_organization(org).count()),
    ("post", "/api/v1/webhooks/", {"url": "https://hooks.example.com/c", "event_types": ["run.failed"],
                                   "workflow": "prio"}, "workflow",
     lambda org: WebhookEndpoint.objects.filter(organization=org).count()),
    ("put", "/api/v1/secrets/OTHER/", {"value": "abcdefgh", "bogus": 1}, "bogus",
     lambda org: Secret.objects.filter(organization=org).count()),
    ("post", "/api/v1/invitations/", {"email": "new@example.com", "role": "member", "rol": "admin"}, "rol",
     lambda org: Invitation.objects.filter(organization=org).count()),
    ("post", "/api/v1/api-keys/", {"name": "ci", "role": "member", "expires": "2030-01-01"}, "expires",
     lambda org: ApiKey.objects.filter(organization=org).count()),
])
def test_an_unknown_body_field_is_a_400_naming_it_and_nothing_is_stored(api_factory, method, url, body, unknown,
                                                                         stored):
    api = api_factory()
    before = stored(api.org)
    response = post(api, method, url, body)
    assert response.status_code == 400, response.content
    problem = response.json()
    text = json.dumps(problem)
    assert unknown in text and "unknown field; this body takes" in text, problem
    assert stored(api.org) == before
