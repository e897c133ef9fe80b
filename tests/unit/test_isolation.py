"""Cross-tenant isolation, enumerated from the URLconf.

Two organizations, A and B, each hold data of every kind. For every URL pattern of
the API and the frontend that takes an object id, A's owner (by session) and A's
admin API key (for the API) ask for B's object with every method: the answer must
be exactly the answer for an id that does not exist (404, or 405 for a method the
view does not serve) and never a 403 or a success. Every pattern without an id is
fetched by A and must not mention any of B's ids.

A new URL pattern that takes an id fails ``test_every_id_taking_url_pattern_is_covered``
until OBJECT_KINDS below says which kind of object its id names.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from audit.models import AuditLog
from engine.models import (
    NotificationDelivery,
    NotificationEvent,
    ScheduledTrigger,
    TaskRun,
    TaskRunEvent,
    WebhookEndpoint,
    Workflow,
    WorkflowRun,
)
from engine.notifications import create_endpoint
from engine.repositories.worker_queues import note_worker_seen
from engine.services import apply_definition, start_run
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key
from tenancy.models import ApiKey, Invitation, KeyRole, Membership, Role, Secret, User
from tenancy.services import create_organization, invite_member
from tenancy.vault import set_secret

# Namespaces whose patterns are tenant surfaces.
NAMESPACES = ("api", "frontend")

# url name -> {url kwarg: kind of object it names}. Kinds are keys of TenantData.ids().
OBJECT_KINDS: dict[str, dict[str, str]] = {
    "api:workflow-detail": {"pk": "workflow"},
    "api:run-detail": {"pk": "run"},
    "api:run-cancel": {"pk": "run"},
    "api:workflow-versions": {"pk": "workflow"},
    "api:workflow-archive": {"pk": "workflow"},
    "api:workflow-restore": {"pk": "workflow"},
    "api:run-retry": {"pk": "run"},
    "api:run-resume": {"pk": "run"},
    "api:run-task-retry": {"run_id": "run", "pk": "task_run"},
    "api:run-task-mark-succeeded": {"run_id": "run", "pk": "task_run"},
    "api:run-task-skip": {"run_id": "run", "pk": "task_run"},
    "api:run-events": {"pk": "run"},
    "api:run-event-stream": {"pk": "run"},
    "api:run-task-output": {"run_id": "run", "pk": "task_run"},
    "api:run-task-logs": {"run_id": "worker_run", "pk": "worker_task_run"},
    "api:run-task-detail": {"run_id": "run", "pk": "task_run"},
    "api:apikey-revoke": {"pk": "api_key"},
    "api:trigger-detail": {"pk": "trigger"},
    "api:trigger-pause": {"pk": "trigger"},
    "api:trigger-resume": {"pk": "trigger"},
    "api:trigger-backfill-list": {"pk": "trigger"},
    "api:trigger-backfill-preview": {"pk": "trigger"},
    "api:trigger-backfill-detail": {"pk": "trigger", "backfill_pk": "backfill"},
    "api:trigger-backfill-cancel": {"pk": "trigger", "backfill_pk": "backfill"},
    "api:member-detail": {"pk": "membership"},
    "api:invitation-revoke": {"pk": "invitation"},
    "frontend:member_role": {"membership_id": "membership"},
    "frontend:member_remove": {"membership_id": "membership"},
    "frontend:invitation_revoke": {"invitation_id": "invitation"},
    "frontend:run_detail": {"run_id": "run"},
    "frontend:run_live": {"run_id": "run"},
    "frontend:run_stream": {"run_id": "run"},
    "frontend:run_events": {"run_id": "run"},
    "frontend:run_task_output": {"run_id": "run", "task_run_id": "task_run"},
    "frontend:run_task_logs": {"run_id": "worker_run", "task_run_id": "worker_task_run"},
    "frontend:run_task": {"run_id": "run", "task_run_id": "task_run"},
    "frontend:run_input": {"run_id": "run"},
    "frontend:run_cancel": {"run_id": "run"},
    "frontend:run_retry": {"run_id": "run"},
    "frontend:run_resume": {"run_id": "run"},
    "frontend:run_task_retry": {"run_id": "run", "task_run_id": "task_run"},
    "frontend:run_task_mark_succeeded": {"run_id": "run", "task_run_id": "task_run"},
    "frontend:run_task_skip": {"run_id": "run", "task_run_id": "task_run"},
    "frontend:workflow_detail": {"workflow_id": "workflow"},
    "frontend:workflow_grid": {"workflow_id": "workflow"},
    "frontend:workflow_start": {"workflow_id": "workflow"},
    "frontend:workflow_archive": {"workflow_id": "workflow"},
    "frontend:workflow_restore": {"workflow_id": "workflow"},
    "frontend:trigger_edit": {"trigger_id": "trigger"},
    "frontend:trigger_pause": {"trigger_id": "trigger"},
    "frontend:trigger_resume": {"trigger_id": "trigger"},
    "frontend:trigger_delete": {"trigger_id": "trigger"},
    "frontend:trigger_detail": {"trigger_id": "trigger"},
    "frontend:trigger_backfill": {"trigger_id": "trigger"},
    "frontend:trigger_backfill_cancel": {"trigger_id": "trigger", "backfill_id": "backfill"},
    "frontend:apikey_revoke": {"key_id": "api_key"},
    # The worker API (worker keys only: asked by A's worker key, see clients()).
    "api:worker-heartbeat": {"pk": "worker_task_run"},
    "api:worker-logs": {"pk": "worker_task_run"},
    "api:worker-complete": {"pk": "worker_task_run"},
    "api:worker-fail": {"pk": "worker_task_run"},
    "api:webhook-detail": {"pk": "webhook"},
    "api:webhook-rotate": {"pk": "webhook"},
    "api:webhook-deliveries": {"pk": "webhook"},
    "api:webhook-delivery-detail": {"pk": "webhook", "delivery_id": "delivery"},
    "api:webhook-delivery-replay": {"pk": "webhook", "delivery_id": "delivery"},
    "frontend:webhook_detail": {"endpoint_id": "webhook"},
    "frontend:webhook_rotate": {"endpoint_id": "webhook"},
    "frontend:webhook_delete": {"endpoint_id": "webhook"},
    "frontend:webhook_delivery": {"endpoint_id": "webhook", "delivery_id": "delivery"},
    "frontend:webhook_delivery_replay": {"endpoint_id": "webhook", "delivery_id": "delivery"},
    "frontend:workflow_failure_emails": {"workflow_id": "workflow"},
    "frontend:secret_rotate": {"name": "secret"},
    "frontend:secret_delete": {"name": "secret"},
}

# Patterns whose parameter is not an object id, with the reason they are exempt.
EXEMPT: dict[str, str] = {
    "frontend:invitation_accept": "the parameter is a secret token, checked against the invited address, not an id",
    "api:secret-detail": "the parameter is a name in the caller's own organization, not an id: a PUT creates the "
    "caller's secret of that name; a GET or DELETE of another organization's name answers 404 like a missing one "
    "(tests/unit/test_secrets.py::test_another_organizations_secret_answers_like_a_missing_one)",
}

METHODS = ("get", "post", "put", "patch", "delete")
# A body every call of the worker API accepts (each reads the fields it takes).
WORKER_CALL_BODY = {"fencing_token": 1, "output": None, "error": "x", "lines": [{"message": "x"}]}


@dataclasses.dataclass
class TenantData:
    org: Any
    owner: User
    key: str
    workflow: Workflow
    run: WorkflowRun
    membership: Membership
    invitation: Invitation
    api_key: ApiKey
    worker_key: str
    worker_run: WorkflowRun

    def ids(self) -> dict[str, str]:
        return {
            "workflow": str(self.workflow.pk),
            "run": str(self.run.pk),
            "membership": str(self.membership.pk),
            "invitation": str(self.invitation.pk),
            "api_key": str(self.api_key.pk),
            "task_run": str(TaskRun.objects.for_organization(self.org).filter(workflow_run=self.run).first().pk),
            "event": str(TaskRunEvent.objects.for_organization(self.org).filter(workflow_run=self.run).first().pk),
            "audit": str(AuditLog.objects.for_organization(self.org).first().pk),
            "trigger": str(trigger_of(self).pk),
            "backfill": str(backfill_of(self).pk),
            "worker_task_run": str(TaskRun.objects.for_organization(self.org).get(workflow_run=self.worker_run).pk),
            "worker_run": str(self.worker_run.pk),
            "secret": secret_of(self),
            "webhook": str(webhook_of(self).pk),
            "delivery": str(delivery_of(self).pk),
        }


def trigger_of(tenant: TenantData) -> ScheduledTrigger:
    """The tenant's cron trigger (created on first use, by its owner)."""
    found = ScheduledTrigger.objects.for_organization(tenant.org).first()
    if found is not None:
        return found
    actor = Actor(organization=tenant.org, role=Role.OWNER, user=tenant.owner, channel="web")
    return create_trigger(actor=actor, data={"name": f"{tenant.org.slug} nightly", "cron_expression": "0 2 * * *",
                                             "workflow_name": tenant.workflow.name, "timezone": "UTC"})


def backfill_of(tenant: TenantData):
    """The backfill of the tenant's trigger (made on first use by its owner, left running)."""
    from engine.backfill import create_backfill
    from engine.models import TriggerBackfill

    found = TriggerBackfill.objects.for_organization(tenant.org).first()
    if found is not None:
        return found
    actor = Actor(organization=tenant.org, role=Role.OWNER, user=tenant.owner, channel="web")
    return create_backfill(actor=actor, trigger=trigger_of(tenant), start="2026-03-01", end="2026-03-02")


def webhook_of(tenant: TenantData) -> WebhookEndpoint:
    """The tenant's webhook endpoint (created on first use, by its owner; a public address
    written as a number, so no DNS lookup)."""
    found = WebhookEndpoint.objects.for_organization(tenant.org).first()
    if found is not None:
        return found
    actor = Actor(organization=tenant.org, role=Role.OWNER, user=tenant.owner, channel="web")
    endpoint, _secret = create_endpoint(actor=actor, url=f"https://93.184.215.14/{tenant.org.slug}-hook",
                                        event_types=["run.failed"])
    return endpoint


def delivery_of(tenant: TenantData) -> NotificationDelivery:
    """A dead-lettered delivery to the tenant's endpoint (written as the notifier would leave
    one; created on first use): replayable, so a replay through another tenant would show."""
    found = NotificationDelivery.objects.for_organization(tenant.org).filter(replay_of=None).first()
    if found is not None:
        return found
    event = NotificationEvent.objects.create(organization=tenant.org, type="run.failed", workflow_run=tenant.run,
                                             workflow_name=tenant.workflow.name, run_event_seq=1, payload={})
    return NotificationDelivery.objects.create(organization=tenant.org, event=event, channel="webhook",
                                               endpoint=webhook_of(tenant), state="dead", attempts=1,
                                               dead_lettered_at=timezone.now(), last_error="HTTP 500")


def secret_of(tenant: TenantData) -> str:
    """The name of the tenant's secret (created on first use): a name only this tenant has."""
    name = tenant.org.slug.replace("-", "_").upper() + "_TOKEN"
    if not Secret.objects.for_organization(tenant.org).filter(name=name).exists():
        actor = Actor(organization=tenant.org, role=Role.OWNER, user=tenant.owner, channel="web")
        set_secret(actor=actor, name=name, value=f"{tenant.org.slug}-secret-value")
    return name


def build_tenant(slug: str) -> TenantData:
    org, owner, _ = create_organization(slug=slug, name=slug.upper(), owner_email=f"owner@{slug}.example")
    owner_m = Membership.objects.for_organization(org).get(user=owner)
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    colleague = User.objects.create_user(email=f"colleague@{slug}.example")
    membership = Membership.objects.create(organization=org, user=colleague, role=Role.MEMBER)
    invitation, _token = invite_member(actor=actor, email=f"invitee@{slug}.example", role=Role.VIEWER)
    api_key, full_key = create_api_key(actor=actor, name=f"{slug} ci", role=Role.ADMIN)
    workflow = apply_definition(
        actor=actor,
        document={"name": f"{slug}-flow", "tasks": [{"key": "a", "type": "noop"},
                                                    {"key": "b", "type": "noop", "depends_on": ["a"]}]},
    )
    run = start_run(workflow=workflow, actor=actor)
    worker_row, worker_key = create_api_key(actor=actor, name=f"{slug} workers", role=KeyRole.WORKER)
    worker_wf = apply_definition(actor=actor, document={"name": f"{slug}-own", "tasks": [
        {"key": "w", "type": "worker", "config": {"queue": "jobs"}}]})
    worker_run = start_run(workflow=worker_wf, actor=actor)
    # A worker of the tenant seen polling a queue of its own (the workers lists and page show it).
    note_worker_seen(organization_id=org.pk, worker_id=f"{slug}-worker-id", queue=f"{slug}-queue",
                     name=f"{slug}-worker-name", host=f"{slug}-host", sdk="", concurrency=None,
                     api_key_id=worker_row.pk)
    assert owner_m.role == Role.OWNER
    return TenantData(org, owner, full_key, workflow, run, membership, invitation, api_key, worker_key, worker_run)


@pytest.fixture
def tenants(db):
    return build_tenant("iso-a"), build_tenant("iso-b")


def iter_patterns(resolver: URLResolver | None = None, prefix: str = "", namespace: str = ""):
    """Yield (qualified name, route regex source, pattern) for every leaf pattern."""
    resolver = resolver or get_resolver()
    for p in resolver.url_patterns:
        if isinstance(p, URLResolver):
            ns = p.namespace or namespace
            yield from iter_patterns(p, prefix + str(p.pattern.regex.pattern).lstrip("^"), ns)
        elif isinstance(p, URLPattern):
            name = f"{namespace}:{p.name}" if namespace and p.name else (p.name or "")
            yield name, prefix + str(p.pattern.regex.pattern).lstrip("^"), p


def tenant_patterns():
    return [(n, r, p) for n, r, p in iter_patterns() if n.split(":")[0] in NAMESPACES]


def params_of(regex: str) -> list[str]:
    return re.findall(r"\(\?P<(\w+)>", regex)


def build_path(regex: str, values: dict[str, str]) -> str:
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values[m.group(1)], regex)
    return "/" + path.replace("\\Z", "").replace("$", "").replace("\\", "")


def test_every_id_taking_url_pattern_is_covered():
    missing = [
        f"{name} ({regex})"
        for name, regex, _ in tenant_patterns()
        if params_of(regex) and name not in OBJECT_KINDS and name not in EXEMPT
    ]
    assert not missing, (
        "URL patterns take an id but the isolation suite does not know which object it names; "
        f"add them to OBJECT_KINDS in {__file__}: {missing}"
    )
    stale = sorted(set(OBJECT_KINDS) - {n for n, _, _ in tenant_patterns()})
    assert not stale, f"OBJECT_KINDS names patterns that no longer exist: {stale}"


def clients(a: TenantData) -> list[tuple[str, Client, str]]:
    session = Client()
    session.force_login(a.owner)
    key = Client(headers={"Authorization": f"Bearer {a.key}"})
    worker = Client(headers={"Authorization": f"Bearer {a.worker_key}"})
    # The worker API answers every other key and session with 403 before looking at an id
    # (tests/unit/test_worker_api.py): its patterns are asked by A's worker key alone.
    return [("session", session, "any"), ("api key", key, "api"), ("worker key", worker, "worker")]


def _asks(name: str, scope: str) -> bool:
    """Whether a client of ``scope`` asks for the pattern ``name``."""
    if name.startswith("api:worker-"):
        return scope == "worker"
    return scope == "any" or (scope == "api" and name.startswith("api:"))


@pytest.mark.django_db
def test_another_organizations_objects_answer_exactly_like_missing_ones(tenants):
    a, b = tenants
    b_ids = b.ids()
    checked = 0
    for name, regex, _ in tenant_patterns():
        kinds = OBJECT_KINDS.get(name)
        if not kinds:
            continue
        foreign = build_path(regex, {param: b_ids[kind] for param, kind in kinds.items()})
        missing = build_path(regex, {param: str(uuid.uuid4()) for param in kinds})
        for label, client, scope in clients(a):
            if not _asks(name, scope):
                continue
            headers = {"X-Organization": a.org.slug} if name.startswith("api:") and label == "session" else {}
            for method in METHODS:
                # A worker call's body is valid for each of them, so the id is what is judged.
                kw = ({"data": WORKER_CALL_BODY, "content_type": "application/json"} if scope == "worker"
                      and method == "post" else {})
                got = getattr(client, method)(foreign, headers=headers, **kw)
                ref = getattr(client, method)(missing, headers=headers, **kw)
                assert got.status_code == ref.status_code, (name, label, method, got.status_code, ref.status_code)
                assert got.status_code in (404, 405), (name, label, method, got.status_code)
                checked += 1
    assert checked >= len(OBJECT_KINDS) * len(METHODS)
    assert TaskRun.objects.for_organization(b.org).get(workflow_run=b.worker_run).state == "ready"
    # Nothing of B changed through any of those requests.
    b.run.refresh_from_db()
    assert b.run.state == "running"
    assert Membership.objects.for_organization(b.org).filter(pk=b.membership.pk, role=Role.MEMBER).exists()
    assert Invitation.objects.for_organization(b.org).get(pk=b.invitation.pk).revoked_at is None
    assert ApiKey.objects.for_organization(b.org).get(pk=b.api_key.pk).revoked_at is None
    assert Secret.objects.for_organization(b.org).get(name=b_ids["secret"]).version == 1
    assert backfill_of(b).state == "running"
    endpoint = WebhookEndpoint.objects.for_organization(b.org).get(pk=b_ids["webhook"])
    assert (endpoint.enabled, endpoint.secret_rotated_at) == (True, None)
    assert not NotificationDelivery.objects.for_organization(b.org).filter(replay_of_id=b_ids["delivery"]).exists()


@pytest.mark.django_db
def test_lists_and_pages_never_mention_another_organizations_objects(tenants):
    a, b = tenants
    b_values = set(b.ids().values()) | {b.org.slug, b.workflow.name, b.api_key.prefix, str(b.org.pk),
                                        "iso-b-worker-id", "iso-b-worker-name", "iso-b-host", "iso-b-queue"}
    a_values = set(a.ids().values())
    fetched = 0
    for name, regex, _ in tenant_patterns():
        if params_of(regex):
            continue
        path = build_path(regex, {})
        for label, client, scope in clients(a):
            if not _asks(name, scope) or scope == "worker":
                continue
            if name == "frontend:org_stream":
                # The organization's live stream never ends and gives its database connection
                # back before it streams (which this test's transaction cannot survive): it
                # carries no object data (only "change" and an instant), and
                # tests/unit/test_web_home_live.py shows another organization's changes never
                # reach it.
                continue
            headers = {"X-Organization": a.org.slug} if name.startswith("api:") and label == "session" else {}
            resp = client.get(path, headers=headers)
            if resp.status_code == 405:
                continue
            body = resp.content.decode(errors="replace")
            leaked = sorted(v for v in b_values if v in body)
            assert not leaked, (name, label, leaked)
            fetched += 1
    assert fetched >= 5
    # The pages really show A's data, so an empty or error page is not what passed.
    for label, client, scope in clients(a):
        if scope == "worker":  # a worker key reads nothing (403): tests/unit/test_worker_api.py
            continue
        body = client.get("/api/v1/workflows/", headers={"X-Organization": a.org.slug}).content.decode()
        assert a.workflow.name in body and str(a.workflow.pk) in body, label
        for path in ("/api/v1/workers/", "/api/v1/queues/"):
            body = client.get(path, headers={"X-Organization": a.org.slug}).content.decode()
            assert "iso-a-queue" in body, (label, path)
        if scope == "any":
            assert "iso-a-worker-name" in client.get("/workers/").content.decode()
    assert a_values


# A joined row's credential columns, as Django's SQL names them.
CREDENTIAL_COLUMNS = ('"core_user"."password"', '"core_apikey"."hashed_key"')


@pytest.mark.django_db
def test_no_page_or_answer_reads_a_joined_users_password_hash_or_a_keys_hash(tenants):
    """Who made, holds or started something is shown by name or prefix: no GET of any pattern
    (A's own ids; as a signed-in owner and as an API key) selects the password hash of a
    user or the hash of an API key it joins (tenancy.models.without_credentials). The
    requester's own sign-in and key check read them unjoined, and are not what is asked."""
    a, _b = tenants
    ids = a.ids()
    kinds_of = {**OBJECT_KINDS, "api:secret-detail": {"name": "secret"}}
    joined: set[str] = set()
    for name, regex, _ in tenant_patterns():
        kinds = kinds_of.get(name, {})
        if "stream" in name or set(params_of(regex)) - set(kinds):
            continue  # a stream never ends; a parameter that names no object of A's
        path = build_path(regex, {param: ids[kind] for param, kind in kinds.items()})
        for label, client, scope in clients(a):
            if not _asks(name, scope) or scope == "worker":
                continue
            headers = {"X-Organization": a.org.slug} if name.startswith("api:") and label == "session" else {}
            with CaptureQueriesContext(connection) as captured:
                client.get(path, headers=headers)
            for query in captured.captured_queries:
                sql = query["sql"]
                if 'JOIN "core_user"' in sql or 'JOIN "core_apikey"' in sql:
                    joined.add(name)
                    assert not any(column in sql for column in CREDENTIAL_COLUMNS), (name, label, sql)
    # The joins are really there (the members, keys, triggers, backfills, workflows, runs and
    # webhooks lists and pages name people and keys), so the check above is not vacuous.
    for name in ("api:member-list", "api:apikey-list", "api:trigger-list", "api:trigger-backfill-list",
                 "api:invitation-list", "frontend:members", "frontend:apikeys", "frontend:trigger_detail",
                 "frontend:workflow_detail", "frontend:run_list", "frontend:run_detail", "frontend:webhooks",
                 "frontend:secrets", "api:secret-list", "api:run-list"):
        assert name in joined, (name, " ".join(sorted(joined)))
