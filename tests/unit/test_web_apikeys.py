"""The API-key pages (list, create with the key shown once, revoke after a
confirmation; apikey.manage only) and the organization settings page (owners
rename; everyone else reads, and a POST is a 403)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from tenancy.apikeys import authenticate, create_api_key
from tenancy.models import ApiKey, Organization, Role
from tests.unit.test_web_workflows import (
    actions,
    actor_of,
    assert_csp_clean,
    client_for,
    make_team,
    sql_count,
    text,
)


@pytest.fixture
def team(org):
    return make_team(org)


def field_errors(body: str, field: str) -> str:
    start = body.find(f'id="id_{field}_errors"')
    if start < 0:
        return ""
    return re.sub(r"<[^>]+>", "", body[start : body.index("</ul>", start)])


def post_form(client, data: dict):
    """POST the create form as a browser does: with the one-time token of a fresh form."""
    page = client.get("/api-keys/").content.decode()
    token = re.search(r'name="form_token" value="([^"]+)"', page).group(1)
    return client.post("/api-keys/", {**data, "form_token": token})


def tomorrow() -> str:
    return (timezone.now().astimezone(dt.UTC).date() + dt.timedelta(days=1)).isoformat()


# --- API keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_roles_without_apikey_manage_get_403_everywhere(team, role):
    key, _ = create_api_key(actor=actor_of(team["owner"]), name="ci", role=Role.MEMBER)
    client = client_for(team[role])
    assert client.get("/api-keys/").status_code == 403
    resp = client.post("/api-keys/", {"name": "mine", "role": Role.VIEWER})
    assert resp.status_code == 403 and "may not do this: it needs apikey.manage, which only the owner and admin roles have" in text(resp)
    assert client.get(f"/api-keys/{key.pk}/revoke/").status_code == 403
    assert client.post(f"/api-keys/{key.pk}/revoke/").status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None
    assert ApiKey.objects.for_organization(team["org"]).count() == 1


def test_list_shows_prefix_name_role_dates_and_status(team):
    owner = actor_of(team["owner"])
    active, _ = create_api_key(
        actor=owner, name="CI deploys", role=Role.MEMBER, expires_at=timezone.now() + dt.timedelta(days=30)
    )
    revoked, _ = create_api_key(actor=owner, name="old <script>", role=Role.VIEWER)
    from tenancy.apikeys import revoke_api_key

    revoke_api_key(actor=owner, api_key=revoked)
    resp = client_for(team["admin"]).get("/api-keys/")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert f"<code>ffk_{active.prefix}_…</code>" in body and "CI deploys" in body
    assert '<span class="badge role-member">Member</span>' in body
    assert active.expires_at.strftime("%b") in body and '<span class="badge ok">Active</span>' in body
    assert '<span class="badge danger">Revoked</span>' in body and "old &lt;script&gt;" in body
    assert team["owner"].user.email in body and "Never" in body
    assert f'href="/api-keys/{active.pk}/revoke/"' in body
    assert f'href="/api-keys/{revoked.pk}/revoke/"' not in body
    # The create form offers the admin's own role and below, never owner.
    assert '<option value="admin"' in body and '<option value="owner"' not in body
    assert 'type="date"' in body
    assert_csp_clean(body)


def test_creating_a_key_shows_it_once_and_never_again(team):
    org = team["org"]
    client = client_for(team["admin"])
    resp = post_form(client, {"name": "CI deploys", "role": Role.MEMBER, "expires_on": tomorrow()})
    assert resp.status_code == 201
    assert "no-store" in resp["Cache-Control"]
    body = text(resp)
    full_key = re.search(r'value="(ffk_[a-z0-9]{12}_[A-Za-z0-9_-]+)"', body).group(1)
    assert "You will not see this key again." in body
    assert 'data-copy-target="#new-api-key"' in body
    assert re.search(r'<script src="/static/frontend/workflows\.js" nonce="[^"]+" defer></script>', body)
    assert_csp_clean(resp.content.decode())

    key = ApiKey.objects.for_organization(org).get()
    assert (key.name, key.role, key.created_by_id) == ("CI deploys", Role.MEMBER, team["admin"].user_id)
    assert key.expires_at == dt.datetime.combine(
        dt.date.fromisoformat(tomorrow()), dt.time.min, tzinfo=dt.UTC
    )
    assert full_key.startswith(f"ffk_{key.prefix}_") and authenticate(full_key).id == key.pk
    [record] = actions(org, "api_key.created")
    assert record.metadata["prefix"] == key.prefix
    # Never shown again: not in the list, not in the session, not in a message.
    secret = full_key.removeprefix(f"ffk_{key.prefix}_")  # (the secret itself may hold "_")
    assert len(secret) >= 43
    later = client.get("/api-keys/").content.decode()
    assert secret not in later and f"ffk_{key.prefix}_…" in later
    assert secret not in str(dict(client.session.items()))
    assert secret not in client.get("/").content.decode()


def test_a_key_above_your_role_is_refused_and_other_errors_are_next_to_the_field(team):
    org = team["org"]
    client = client_for(team["admin"])
    resp = post_form(client, {"name": "root", "role": Role.OWNER})
    assert resp.status_code == 403 and "cannot create a key with the owner role" in text(resp)
    resp = post_form(client, {"name": "  ", "role": Role.MEMBER})
    assert resp.status_code == 400 and "This field is required." in field_errors(text(resp), "name")
    yesterday = (timezone.now().date() - dt.timedelta(days=1)).isoformat()
    resp = post_form(client, {"name": "old", "role": Role.MEMBER, "expires_on": yesterday})
    assert resp.status_code == 400 and "Choose a date after today." in field_errors(text(resp), "expires_on")
    resp = post_form(client, {"name": "x", "role": "superuser"})
    assert resp.status_code == 400 and "Select a valid choice" in field_errors(text(resp), "role")
    assert not ApiKey.objects.for_organization(org).exists()


def test_sending_the_same_form_twice_creates_one_key(team):
    org = team["org"]
    client = client_for(team["admin"])
    page = client.get("/api-keys/").content.decode()
    token = re.search(r'name="form_token" value="([^"]+)"', page).group(1)
    data = {"name": "CI", "role": Role.MEMBER, "form_token": token}
    assert client.post("/api-keys/", data).status_code == 201
    again = client.post("/api-keys/", data)  # a reload of the page that showed the key
    assert again.status_code == 302 and again["Location"] == "/api-keys/"
    assert "That form was already sent or is no longer valid, so no key was created now." in text(
        client.get("/api-keys/"))
    assert client.post("/api-keys/", {"name": "CI", "role": Role.MEMBER}).status_code == 302  # no token
    # A token that was never issued does not claim a key was made from it.
    forged = client.post("/api-keys/", {"name": "CI", "role": Role.MEMBER, "form_token": "bogus"})
    assert forged.status_code == 302
    shown = text(client.get("/api-keys/"))
    assert "no key was created now" in shown and "the key it created is listed here" not in shown
    assert ApiKey.objects.for_organization(org).count() == 1
    # A form sent back with an error gets a fresh token, so fixing it works.
    bad = post_form(client, {"name": "", "role": Role.MEMBER})
    fresh = re.search(r'name="form_token" value="([^"]+)"', bad.content.decode()).group(1)
    assert (
        client.post("/api-keys/", {"name": "fixed", "role": Role.MEMBER, "form_token": fresh}).status_code
        == 201
    )
    assert ApiKey.objects.for_organization(org).count() == 2


def test_revoking_asks_first_then_revokes(team):
    org = team["org"]
    key, full_key = create_api_key(actor=actor_of(team["owner"]), name="ci", role=Role.MEMBER)
    client = client_for(team["admin"])
    confirm = client.get(f"/api-keys/{key.pk}/revoke/")
    assert confirm.status_code == 200
    body = text(confirm)
    assert "Revoke the key ci?" in body and f'action="/api-keys/{key.pk}/revoke/"' in body
    key.refresh_from_db()
    assert key.revoked_at is None  # GET changes nothing

    resp = client.post(f"/api-keys/{key.pk}/revoke/")
    assert resp.status_code == 302 and resp["Location"] == "/api-keys/"
    key.refresh_from_db()
    assert key.revoked_at is not None and key.revoked_by_id == team["admin"].user_id
    assert authenticate(full_key) is None
    assert len(actions(org, "api_key.revoked")) == 1
    assert "no longer works" in text(client.get("/api-keys/"))
    # Again: nothing more happens.
    client.post(f"/api-keys/{key.pk}/revoke/")
    assert len(actions(org, "api_key.revoked")) == 1


def test_another_organizations_key_is_404(team, make_org):
    other = make_org()
    from tenancy.actors import Actor
    from tenancy.models import Membership

    owner = Membership.objects.for_organization(other).get(role=Role.OWNER)
    theirs, _ = create_api_key(
        actor=Actor(organization=other, role=Role.OWNER, user=owner.user), name="theirs", role=Role.MEMBER
    )
    client = client_for(team["owner"])
    assert client.get(f"/api-keys/{theirs.pk}/revoke/").status_code == 404
    assert client.post(f"/api-keys/{theirs.pk}/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert theirs.prefix not in client.get("/api-keys/").content.decode()


def test_list_query_count_does_not_grow_with_keys(team):
    client = client_for(team["owner"])
    owner = actor_of(team["owner"])
    create_api_key(actor=owner, name="k0", role=Role.MEMBER)
    few, _ = sql_count(client, "/api-keys/")
    for i in range(1, 8):
        create_api_key(actor=actor_of(team["admin"]) if i % 2 else owner, name=f"k{i}", role=Role.VIEWER)
    many, resp = sql_count(client, "/api-keys/")
    assert resp.content.decode().count("/revoke/") == 8
    assert few == many, (few, many)


# --- settings ----------------------------------------------------------------------------------


def test_owner_renames_the_organization(team):
    org = team["org"]
    client = client_for(team["owner"])
    page = client.get("/settings/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'action="/settings/"' in body and f'value="{org.name}"' in body and "csrfmiddlewaretoken" in body
    resp = client.post("/settings/", {"name": "  Acme Robotics  "})
    assert resp.status_code == 302 and resp["Location"] == "/settings/"
    assert Organization.objects.get(pk=org.pk).name == "Acme Robotics"
    [record] = actions(org, "organization.renamed")
    assert record.metadata["name"] == {"before": org.name, "after": "Acme Robotics"}
    after = text(client.get("/settings/"))
    assert "The organization is now called Acme Robotics." in after
    assert '<span class="org-name"' in after and ">Acme Robotics</span>" in after

    resp = client.post("/settings/", {"name": ""})
    assert resp.status_code == 400 and "This field is required." in field_errors(text(resp), "name")


@pytest.mark.parametrize("role", [Role.ADMIN, Role.MEMBER, Role.VIEWER])
def test_others_read_the_settings_and_cannot_change_them(team, role):
    org = team["org"]
    client = client_for(team[role])
    page = client.get("/settings/")
    assert page.status_code == 200
    body = text(page)
    assert org.name in body and org.slug in body and "Only owners change these settings." in body
    assert 'action="/settings/"' not in body
    resp = client.post("/settings/", {"name": "Hijacked"})
    assert resp.status_code == 403 and "may not do this: it needs org.manage, which only the owner role has" in text(resp)
    assert Organization.objects.get(pk=org.pk).name == org.name


def test_settings_query_count(team):
    count, _ = sql_count(client_for(team["owner"]), "/settings/")
    assert count <= 6, count
