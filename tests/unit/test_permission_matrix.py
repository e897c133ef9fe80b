"""Every cell of the permission matrix (docs/permissions.md), through the service
functions that the API, the pages and the commands call, plus the API over HTTP."""

from __future__ import annotations

import itertools

import pytest
from django.test import Client

from engine.services import apply_definition, cancel_run, start_run
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.models import KeyRole, Membership, Role, User
from tenancy.permissions import MATRIX, Action, Forbidden, can
from tenancy.services import invite_member, rename_organization

ROLES = [Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER]
EXPECTED = {
    Action.READ: {Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER},
    Action.RUN_OPERATE: {Role.OWNER, Role.ADMIN, Role.MEMBER},
    Action.WORKFLOW_EDIT: {Role.OWNER, Role.ADMIN, Role.MEMBER},
    Action.MEMBER_MANAGE: {Role.OWNER, Role.ADMIN},
    Action.APIKEY_MANAGE: {Role.OWNER, Role.ADMIN},
    Action.SECRET_MANAGE: {Role.OWNER, Role.ADMIN},
    Action.WEBHOOK_MANAGE: {Role.OWNER, Role.ADMIN},
    Action.AUDIT_READ: {Role.OWNER, Role.ADMIN},
    Action.ORG_MANAGE: {Role.OWNER},
    # An API key of the worker role only (tests/unit/test_worker_api.py): no member role.
    Action.WORKER_SERVE: set(),
}
_n = itertools.count()


def test_the_matrix_is_the_documented_one():
    assert set(EXPECTED) == set(Action)
    for role in ROLES:
        assert MATRIX[role] == {a for a, roles in EXPECTED.items() if role in roles}
    assert not can(None, Action.READ)
    assert MATRIX[KeyRole.WORKER] == {Action.WORKER_SERVE}


def actor_with(org, role) -> Actor:
    user = User.objects.create_user(email=f"{role}-{next(_n)}@matrix.example")
    Membership.objects.create(organization=org, user=user, role=role)
    return Actor(organization=org, role=role, user=user, channel="web")


def _run(org):
    owner = Actor.system(org)
    wf = apply_definition(actor=owner, document={"name": f"m{next(_n)}", "tasks": [{"key": "a", "type": "noop"}]})
    return wf, start_run(workflow=wf, actor=owner)


def do_read(org, actor):
    client = Client()
    client.force_login(actor.user)
    resp = client.get("/api/v1/workflows/", headers={"X-Organization": org.slug})
    if resp.status_code == 403:
        raise Forbidden("read")
    assert resp.status_code == 200


def do_run_operate(org, actor):
    wf, run = _run(org)
    start_run(workflow=wf, actor=actor)
    assert cancel_run(run=run, actor=actor) is True


def do_workflow_edit(org, actor):
    apply_definition(actor=actor, document={"name": "edited", "tasks": [{"key": "a", "type": "noop"}]})


def do_member_manage(org, actor):
    invite_member(actor=actor, email=f"new{next(_n)}@matrix.example", role=Role.MEMBER)


def do_apikey_manage(org, actor):
    key, _ = create_api_key(actor=actor, name="matrix", role=Role.VIEWER)
    revoke_api_key(actor=actor, api_key=key)


def do_secret_manage(org, actor):
    from tenancy.vault import delete_secret, set_secret

    set_secret(actor=actor, name=f"MATRIX_{next(_n)}", value="matrix-value")
    set_secret(actor=actor, name="MATRIX_SHARED", value="matrix-value")
    delete_secret(actor=actor, name="MATRIX_SHARED")


def do_webhook_manage(org, actor):
    from engine.notifications import create_endpoint, delete_endpoint, rotate_secret

    # A public address written as a number: no DNS lookup in the test.
    endpoint, _secret = create_endpoint(actor=actor, url="https://93.184.215.14/hooks/flowforge",
                                        event_types=["run.failed"])
    rotate_secret(actor=actor, endpoint=endpoint)
    delete_endpoint(actor=actor, endpoint=endpoint)


def do_audit_read(org, actor):
    from tenancy.permissions import require

    require(actor.role, Action.AUDIT_READ)


def do_require(actor, action):
    from tenancy.permissions import require

    require(actor.role, action)


def do_org_manage(org, actor):
    rename_organization(actor=actor, name=f"Renamed {next(_n)}")


PERFORM = {
    Action.READ: do_read,
    Action.RUN_OPERATE: do_run_operate,
    Action.WORKFLOW_EDIT: do_workflow_edit,
    Action.MEMBER_MANAGE: do_member_manage,
    Action.APIKEY_MANAGE: do_apikey_manage,
    Action.SECRET_MANAGE: do_secret_manage,
    Action.WEBHOOK_MANAGE: do_webhook_manage,
    Action.AUDIT_READ: do_audit_read,
    Action.ORG_MANAGE: do_org_manage,
    Action.WORKER_SERVE: lambda org, actor: do_require(actor, Action.WORKER_SERVE),
}


@pytest.mark.django_db
@pytest.mark.parametrize("action", list(Action), ids=str)
@pytest.mark.parametrize("role", ROLES, ids=str)
def test_each_cell_is_enforced(org, role, action):
    actor = actor_with(org, role)
    if role in EXPECTED[action]:
        PERFORM[action](org, actor)
    else:
        with pytest.raises(Forbidden):
            PERFORM[action](org, actor)


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES, ids=str)
def test_api_keys_of_each_role_over_http(org, role):
    owner = Actor(organization=org, role=Role.OWNER,
                  user=Membership.objects.for_organization(org).get(role=Role.OWNER).user, channel="web")
    _, full = create_api_key(actor=owner, name=f"k-{role}", role=role)
    client = Client(headers={"Authorization": f"Bearer {full}"})
    _, run = _run(org)
    assert client.get("/api/v1/workflows/").status_code == 200
    expected_cancel = 200 if role in EXPECTED[Action.RUN_OPERATE] else 403
    assert client.post(f"/api/v1/runs/{run.pk}/cancel/").status_code == expected_cancel
    expected_keys = 200 if role in EXPECTED[Action.APIKEY_MANAGE] else 403
    assert client.get("/api/v1/api-keys/").status_code == expected_keys
    assert client.get("/api/v1/secrets/").status_code == 200  # names: every role reads them
    expected_secret = 201 if role in EXPECTED[Action.SECRET_MANAGE] else 403
    assert client.put("/api/v1/secrets/FROM_KEY/", {"value": "matrix-value"},
                      content_type="application/json").status_code == expected_secret


def test_a_refusal_says_which_roles_may():
    """A 403 used to say 'Your role (viewer) may not apikey.manage.': the permission's name
    as if it were a verb, and nothing of who may. Now it names the roles that may."""
    from tenancy.permissions import require, who_may

    assert who_may(Action.APIKEY_MANAGE) == "apikey.manage, which only the owner and admin roles have"
    assert who_may(Action.ORG_MANAGE) == "org.manage, which only the owner role has"
    assert who_may(Action.RUN_OPERATE) == "run.operate, which only the owner, admin and member roles have"
    assert who_may(Action.READ) == "read, which every member role has"
    assert who_may(Action.WORKER_SERVE) == "worker.serve, which only a worker API key has"
    with pytest.raises(Forbidden) as refused:
        require(Role.MEMBER, Action.AUDIT_READ)
    assert str(refused.value) == "role 'member' may not do this: it needs audit.read, which only the owner and admin roles have"


def test_an_api_403_says_which_roles_may(make_org):
    org = make_org()
    owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    _row, key = create_api_key(actor=Actor(organization=org, role=Role.OWNER, user=owner), name="v", role=Role.VIEWER)
    response = Client().get("/api/v1/api-keys/", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 403
    assert response.json()["detail"] == (
        "Your role (viewer) may not do this: it needs apikey.manage, which only the owner and admin roles have.")
