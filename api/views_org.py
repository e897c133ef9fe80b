"""REST API v1: organization administration — cron triggers, members, invitations,
API keys, the audit log, and the organization's limits and usage.

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself. An object named in the URL is read through
the access helpers (engine.access.access_trigger, tenancy.access.access_membership,
access_invitation, access_api_key: 404 for a missing id and another organization's
alike, as in the web UI) before the body is read, so the answer for another tenant's id never depends on the body.
Lists fetch their relations in a constant number of queries.

Service errors become problems in api.exceptions (Forbidden → 403, TenancyError →
400, TriggerError → 400 naming its field); the views translate only what needs
a field name or another status.
"""

from __future__ import annotations

import dataclasses

from croniter import CroniterError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.exceptions import Conflict, FieldConflict
from api.pagination import MAX_PAGE_SIZE, page, paginate_by_name, paginate_newest_first
from api.schema import ProblemAutoSchema, invalid, problem, problem_example
from api.schema import page_parameters as schema_page_parameters
from api.serializers import ApiKeySerializer, page_of
from api.serializers_org import (
    ApiKeyCreatedSerializer,
    ApiKeyCreateInputSerializer,
    AuditEventFilterSerializer,
    AuditEventPageSerializer,
    AuditEventSerializer,
    InvitationCreatedSerializer,
    InvitationCreateSerializer,
    InvitationSerializer,
    MemberRoleSerializer,
    MemberSerializer,
    OrganizationLimitsSerializer,
    TriggerSerializer,
    TriggerWriteSerializer,
)
from api.views_runs import OwnTransactions
from audit.models import AuditLog
from audit.services import SecretInMetadata
from engine import triggers
from engine.access import access_trigger
from engine.models import ScheduledTrigger
from engine.reporting import quota_report
from tenancy.access import access_api_key, access_invitation, access_membership
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.mail import send_invitation_email
from tenancy.models import ApiKey, Invitation, Membership, without_credentials
from tenancy.permissions import Action
from tenancy.services import TenancyError, change_role, invite_member, remove_member, revoke_invitation

# --- shared ----------------------------------------------------------------------------------------

TRIGGER_ID = "3f1c2a9e-8b7d-4e61-9a0f-2d5c7b1e4a10"
MEMBER_ID = "9b2e7c41-5d3a-4f8e-b6c0-1a2b3c4d5e6f"
INVITATION_ID = "c8d1f0a2-3b4c-4d5e-8f60-718293a4b5c6"
API_KEY_ID = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9"
USER_ID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
CREATED_AT = "2026-01-15T09:30:00.000000Z"

TRIGGER_EXAMPLE = {
    "id": TRIGGER_ID,
    "name": "nightly report",
    "workflow_name": "nightly-report",
    "cron_expression": "30 2 * * *",
    "timezone": "Europe/Berlin",
    "input": {"region": "eu"},
    "input_rejected": None,
    "catch_up": "latest",
    "enabled": True,
    "priority": 0,
    "next_fire_at": "2026-01-16T01:30:00Z",
    "next_fire_times": ["2026-01-16T02:30:00+01:00", "2026-01-17T02:30:00+01:00", "2026-01-18T02:30:00+01:00",
                        "2026-01-19T02:30:00+01:00", "2026-01-20T02:30:00+01:00"],
    "last_fired_at": None,
    "missed_instants": None,
    "created_by": "ada@example.com",
    "created_at": CREATED_AT,
}
MEMBER_EXAMPLE = {"id": MEMBER_ID, "user_id": USER_ID, "email": "grace@example.com", "name": "Grace",
                  "role": "admin", "joined_at": CREATED_AT}
INVITATION_EXAMPLE = {"id": INVITATION_ID, "email": "linus@example.com", "role": "member", "state": "pending",
                      "invited_by": "ada@example.com", "created_at": CREATED_AT,
                      "expires_at": "2026-01-22T09:30:00.000000Z", "accepted_at": None, "revoked_at": None}
API_KEY_EXAMPLE = {"id": API_KEY_ID, "prefix": "k3x9q2m8w1za", "name": "ci", "role": "member",
                   "created_by": "ada@example.com", "created_at": CREATED_AT, "last_used_at": None,
                   "expires_at": None, "revoked_at": None}
AUDIT_EXAMPLE = {"id": "7d8e9f00-1a2b-4c3d-8e4f-5a6b7c8d9e0f", "action": "trigger.created", "actor_type": "user",
                 "actor_email": "ada@example.com", "actor_api_key_prefix": "", "target_type": "scheduledtrigger",
                 "target_id": TRIGGER_ID, "metadata": {"name": "nightly report", "enabled": True},
                 "ip_address": "203.0.113.7", "user_agent": "curl/8.5.0",
                 "request_id": "4b9f0c1e2d3a4b5c6d7e8f9a0b1c2d3e", "created_at": CREATED_AT}

NOT_FOUND = problem(404, "No such object in the caller's organization (another organization's answers the same).",
                    problem_example(404, "Not found.", "not_found"))


TriggerPageSerializer = page_of(TriggerSerializer, "TriggerPageSerializer")
MemberPageSerializer = page_of(MemberSerializer, "MemberPageSerializer")
InvitationPageSerializer = page_of(InvitationSerializer, "InvitationPageSerializer")
ApiKeyPageSerializer = page_of(ApiKeySerializer, "ApiKeyPageSerializer")
PAGE_INVALID = invalid("The cursor or the page size is malformed; `errors` names it.",
                       {"page_size": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}"]})


def page_parameters(cursor_holds: str) -> list[OpenApiParameter]:
    return schema_page_parameters(cursor_holds, max_page_size=MAX_PAGE_SIZE)


def _example(name: str, value, *, request: bool = False, status_codes=None) -> OpenApiExample:
    if request:
        return OpenApiExample(name, value=value, request_only=True)
    return OpenApiExample(name, value=value, response_only=True, status_codes=status_codes or ["200"])


class AdminAPIView(OrganizationAPIView):
    """Base of this module's views: JSON bodies only (anything else is a 415) and the
    schema class that documents the common problem responses."""

    parser_classes = [JSONParser]
    schema = ProblemAutoSchema()


# --- cron triggers ---------------------------------------------------------------------------------


class _TriggerView(AdminAPIView):
    def get_scoped_queryset(self):
        return without_credentials(ScheduledTrigger.objects.for_organization(self.organization), "created_by")

    def trigger(self, pk) -> ScheduledTrigger:
        return access_trigger(self.actor, pk, shape=lambda qs: without_credentials(qs, "created_by"))

    def trigger_response(self, trigger, *, status_code: int = status.HTTP_200_OK) -> Response:
        fresh = self.trigger(trigger.pk)
        return Response(TriggerSerializer(fresh).data, status=status_code)


def _schedule_errors(call, *, organization, name: str | None = None, trigger_pk=None):
    """Run a trigger service call. A ``name`` that another trigger of the organization
    has is a 409 on ``name``; an expression croniter accepts but that never matches a
    date (``0 0 30 2 *``) is a 400 on ``cron_expression``, and an input the audit log
    refuses to record is a 400 on ``input``, instead of a 500."""
    try:
        return call()
    except triggers.TriggerError as exc:
        taken = (exc.field == "name" and name is not None and ScheduledTrigger.objects.for_organization(organization)
                 .filter(name=name.strip()).exclude(pk=trigger_pk).exists())
        if taken:
            raise FieldConflict({"name": [exc.message]}) from None
        raise
    except CroniterError as exc:
        raise ValidationError({"cron_expression": [f"never matches a date ({exc})"]}) from None
    except SecretInMetadata as exc:
        raise ValidationError({"input": [f"cannot be recorded in the audit log: {exc}"]}) from None


TRIGGER_WRITE_EXAMPLE = {"name": "nightly report", "workflow_name": "nightly-report", "cron_expression": "30 2 * * *",
                         "timezone": "Europe/Berlin", "input": {"region": "eu"}, "catch_up": "latest",
                         "enabled": True}
TRIGGER_INVALID = {
    **invalid("A field is missing or invalid: a bad cron expression or time zone names `cron_expression` / "
              "`timezone`, an unknown workflow `workflow_name`.",
              {"cron_expression": ["'61 * * * *' is not a valid cron expression"]}),
    **problem(409, "Another trigger of the organization has this name.",
              problem_example(409, "The request conflicts with existing data; see errors.", "conflict",
                              errors={"name": ["a trigger named 'nightly report' already exists"]})),
}


class TriggerListView(_TriggerView):
    """GET /triggers/ — the organization's cron triggers, by name, keyset-paginated.
    POST /triggers/ — create one (workflow.edit)."""

    required_action = {"GET": Action.READ, "POST": Action.WORKFLOW_EDIT}

    @extend_schema(
        operation_id="triggers_list",
        summary="List cron triggers",
        parameters=page_parameters("the last trigger name of the previous page"),
        responses={200: TriggerPageSerializer, **PAGE_INVALID},
        examples=[_example("triggers", {"results": [TRIGGER_EXAMPLE], "next": None})],
    )
    def get(self, request):
        rows, next_url = paginate_by_name(self.get_queryset().order_by("name"), request)
        return Response(page(TriggerSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="triggers_create",
        summary="Create a cron trigger",
        request=TriggerWriteSerializer,
        responses={201: TriggerSerializer, **TRIGGER_INVALID},
        examples=[_example("nightly", TRIGGER_WRITE_EXAMPLE, request=True),
                  _example("created", TRIGGER_EXAMPLE, status_codes=["201"])],
    )
    def post(self, request):
        payload = TriggerWriteSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = dict(payload.validated_data)
        trigger = _schedule_errors(lambda: triggers.create_trigger(actor=self.actor, data=data),
                                   organization=self.organization, name=data["name"])
        return self.trigger_response(trigger, status_code=status.HTTP_201_CREATED)


class TriggerDetailView(_TriggerView):
    """GET /triggers/<id>/; PATCH — change any fields (a schedule change recomputes
    next_fire_at); DELETE — remove it (204). Writes need workflow.edit."""

    required_action = {"GET": Action.READ, "PATCH": Action.WORKFLOW_EDIT, "DELETE": Action.WORKFLOW_EDIT}

    @extend_schema(operation_id="triggers_retrieve", summary="Get a cron trigger",
                   responses={200: TriggerSerializer, **NOT_FOUND}, examples=[_example("trigger", TRIGGER_EXAMPLE)])
    def get(self, request, pk):
        return Response(TriggerSerializer(self.trigger(pk)).data)

    @extend_schema(
        operation_id="triggers_partial_update",
        summary="Change a cron trigger",
        request=TriggerWriteSerializer,
        responses={200: TriggerSerializer, **TRIGGER_INVALID, **NOT_FOUND},
        examples=[_example("reschedule", {"cron_expression": "0 6 * * 1-5", "timezone": "America/New_York"},
                           request=True),
                  _example("changed", {**TRIGGER_EXAMPLE, "cron_expression": "0 6 * * 1-5",
                                       "timezone": "America/New_York"})],
    )
    def patch(self, request, pk):
        trigger = self.trigger(pk)
        payload = TriggerWriteSerializer(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        data = dict(payload.validated_data)
        changed = _schedule_errors(lambda: triggers.update_trigger(actor=self.actor, trigger=trigger, data=data),
                                   organization=self.organization, name=data.get("name"), trigger_pk=trigger.pk)
        return self.trigger_response(changed)

    @extend_schema(operation_id="triggers_destroy", summary="Delete a cron trigger",
                   responses={204: OpenApiResponse(description="Deleted."), **NOT_FOUND})
    def delete(self, request, pk):
        triggers.delete_trigger(actor=self.actor, trigger=self.trigger(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class _TriggerSwitchView(_TriggerView):
    required_action = {"POST": Action.WORKFLOW_EDIT}
    enabled: bool

    def post(self, request, pk):
        trigger = self.trigger(pk)
        changed = _schedule_errors(
            lambda: triggers.set_enabled(actor=self.actor, trigger=trigger, enabled=self.enabled),
            organization=self.organization)
        return self.trigger_response(changed)


class TriggerPauseView(_TriggerSwitchView):
    """POST /triggers/<id>/pause/ — stop firing (idempotent)."""

    enabled = False

    @extend_schema(operation_id="triggers_pause", summary="Pause a cron trigger", request=None,
                   responses={200: TriggerSerializer, **NOT_FOUND},
                   examples=[_example("paused", {**TRIGGER_EXAMPLE, "enabled": False})])
    def post(self, request, pk):
        return super().post(request, pk)


class TriggerResumeView(_TriggerSwitchView):
    """POST /triggers/<id>/resume/ — fire again from the next instant after now (missed
    instants of the paused period are not fired; idempotent)."""

    enabled = True

    @extend_schema(operation_id="triggers_resume", summary="Resume a cron trigger", request=None,
                   responses={200: TriggerSerializer, **NOT_FOUND},
                   examples=[_example("resumed", TRIGGER_EXAMPLE)])
    def post(self, request, pk):
        return super().post(request, pk)


# --- members ---------------------------------------------------------------------------------------


class _MemberView(AdminAPIView):
    def get_scoped_queryset(self):
        return without_credentials(Membership.objects.for_organization(self.organization), "user")


class MemberListView(_MemberView):
    """GET /members/ — the organization's members, newest first, keyset-paginated over
    (joined, id); every role may read them."""

    required_action = {"GET": Action.READ}

    @extend_schema(operation_id="members_list", summary="List members",
                   parameters=page_parameters("the join time and id of the previous page's last member"),
                   responses={200: MemberPageSerializer, **PAGE_INVALID},
                   examples=[_example("members", {"results": [MEMBER_EXAMPLE], "next": None})])
    def get(self, request):
        rows, next_url = paginate_newest_first(self.get_queryset(), request)
        return Response(page(MemberSerializer(rows, many=True).data, next_url))


class MemberDetailView(_MemberView):
    """GET /members/<id>/; PATCH {"role"} — change a member's role; DELETE — remove
    the member (204). Writes need member.manage; only an owner grants, removes or
    takes the owner role (403), and the last owner stays (400)."""

    required_action = {"GET": Action.READ, "PATCH": Action.MEMBER_MANAGE, "DELETE": Action.MEMBER_MANAGE}

    @extend_schema(operation_id="members_retrieve", summary="Get a member",
                   responses={200: MemberSerializer, **NOT_FOUND}, examples=[_example("member", MEMBER_EXAMPLE)])
    def get(self, request, pk):
        return Response(MemberSerializer(access_membership(self.actor, pk)).data)

    @extend_schema(
        operation_id="members_partial_update",
        summary="Change a member's role",
        request=MemberRoleSerializer,
        responses={
            200: MemberSerializer,
            **invalid("The role is not one of owner, admin, member, viewer, or the change would leave the "
                      "organization without an owner.",
                      {"role": ["the last owner cannot be demoted; make someone else an owner first"]}),
            **problem(403, "The caller may not manage members, or is not an owner and the change grants or "
                      "removes the owner role.",
                      problem_example(403, "only an owner can grant or remove the owner role", "permission_denied")),
            **NOT_FOUND,
        },
        examples=[_example("make admin", {"role": "admin"}, request=True), _example("member", MEMBER_EXAMPLE)],
    )
    def patch(self, request, pk):
        membership = access_membership(self.actor, pk)
        payload = MemberRoleSerializer(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        if "role" in payload.validated_data:  # a PATCH without fields changes nothing
            try:
                change_role(actor=self.actor, membership=membership, role=payload.validated_data["role"])
            except TenancyError as exc:
                raise ValidationError({"role": [str(exc)]}) from None
        return Response(MemberSerializer(access_membership(self.actor, pk)).data)

    @extend_schema(
        operation_id="members_destroy",
        summary="Remove a member",
        responses={
            204: OpenApiResponse(description="Removed."),
            **problem(400, "The member is the last owner.",
                      problem_example(400, "the last owner cannot leave or be removed; make someone else an "
                                      "owner first", "invalid_request")),
            **problem(403, "The caller may not manage members, or is not an owner and the member is one.",
                      problem_example(403, "only an owner can remove an owner", "permission_denied")),
            **NOT_FOUND,
        },
    )
    def delete(self, request, pk):
        remove_member(actor=self.actor, membership=access_membership(self.actor, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- invitations -----------------------------------------------------------------------------------


def _invitation_field(exc: TenancyError) -> str:
    return "role" if str(exc).startswith("role") else "email"


def _invitation(actor, pk) -> Invitation:
    """The invitation with what InvitationSerializer reads (tenancy.access: a 404 otherwise)."""
    return access_invitation(actor, pk, shape=lambda qs: without_credentials(qs, "invited_by", "organization"))


class _InvitationView(AdminAPIView):
    def get_scoped_queryset(self):
        return without_credentials(Invitation.objects.for_organization(self.organization), "invited_by", "organization")


class InvitationListView(OwnTransactions, _InvitationView):
    """GET /invitations/ — the pending invitations, newest first, keyset-paginated. POST /invitations/ —
    invite an address (the accept link is mailed once the invitation has committed, and
    the response says whether the mailer took it: ``email_sent``; it never holds the
    token). member.manage; inviting an owner needs an owner."""

    # Outside ATOMIC_REQUESTS (OwnTransactions): invite_member commits its own transaction,
    # then the mail is sent and its outcome answered (email_sent).

    required_action = {"GET": Action.MEMBER_MANAGE, "POST": Action.MEMBER_MANAGE}

    @extend_schema(operation_id="invitations_list", summary="List pending invitations",
                   parameters=page_parameters("the creation time and id of the previous page's last invitation"),
                   responses={200: InvitationPageSerializer, **PAGE_INVALID},
                   examples=[_example("invitations", {"results": [INVITATION_EXAMPLE], "next": None})])
    def get(self, request):
        pending = self.get_queryset().filter(accepted_at__isnull=True, revoked_at__isnull=True,
                                             expires_at__gt=timezone.now())
        rows, next_url = paginate_newest_first(pending, request)
        return Response(page(InvitationSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="invitations_create",
        summary="Invite someone",
        request=InvitationCreateSerializer,
        responses={
            201: InvitationCreatedSerializer,
            **invalid("The address is malformed or the role unknown.",
                      {"email": ["Enter a valid email address."]}),
            **problem(409, "The address is already a member's.",
                      problem_example(409, "The request conflicts with existing data; see errors.", "conflict",
                                      errors={"email": ["linus@example.com is already a member"]})),
            **problem(403, "The caller may not manage members, or invites an owner without being one.",
                      problem_example(403, "only an owner can invite an owner", "permission_denied")),
            **problem(429, "A rate limit is spent (the detail names which), or an invitation send limit: at "
                      "most FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG (50) invitations per organization and "
                      "FLOWFORGE_INVITATIONS_PER_DAY_PER_USER (100) per person, an API key's creator for a "
                      "key, in any 24 hours (`quota_exceeded`, `limit` invitations_per_day or "
                      "invitations_per_day_per_user). Retry after `Retry-After` seconds.",
                      problem_example(429, "Request was throttled. Expected available in 37 seconds.", "throttled"),
                      problem_example(429, "this organization has sent 50 invitations in the last 24 hours, "
                                      "the most allowed (50); the next can be sent in 3 hours 12 minutes",
                                      "quota_exceeded")),
        },
        examples=[_example("invite", {"email": "linus@example.com", "role": "member"}, request=True),
                  _example("invited", {**INVITATION_EXAMPLE, "email_sent": True}, status_codes=["201"])],
    )
    def post(self, request):
        payload = InvitationCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            invitation, token = invite_member(actor=self.actor, **payload.validated_data)
        except TenancyError as exc:
            field = _invitation_field(exc)
            if Membership.objects.for_organization(self.organization).filter(
                    user__email__iexact=payload.validated_data["email"]).exists():
                raise FieldConflict({"email": [str(exc)]}) from None
            raise ValidationError({field: [str(exc)]}) from None
        # invite_member has committed (no request transaction here): the mail goes out for an
        # invitation that exists, and a failing mailer (logged by tenancy.mail, never the
        # token) is the response's email_sent false, not a 500. The email is from the user,
        # or for an API key from the key's creator, on whose behalf the key acts.
        sent = send_invitation_email(request._request, invitation=invitation, token=token,
                                     inviter=self.actor.user or self.actor.api_key.created_by)
        # The invitation as committed, from memory (its inviter too): a read after the commit
        # that failed (a dropped connection) would make a 500 of an invitation that exists
        # and was mailed, and a client's retry would revoke it with a second mail.
        return Response(InvitationCreatedSerializer(invitation, context={"email_sent": sent}).data,
                        status=status.HTTP_201_CREATED)


class InvitationRevokeView(_InvitationView):
    """POST /invitations/<id>/revoke/ — withdraw a pending invitation; 409 when it is
    no longer pending (accepted or already revoked)."""

    required_action = {"POST": Action.MEMBER_MANAGE}

    @extend_schema(
        operation_id="invitations_revoke",
        summary="Withdraw an invitation",
        request=None,
        responses={
            200: InvitationSerializer,
            **problem(409, "The invitation was already accepted or withdrawn.",
                      problem_example(409, "The invitation is no longer pending (accepted).", "conflict")),
            **NOT_FOUND,
        },
        examples=[_example("revoked", {**INVITATION_EXAMPLE, "state": "revoked",
                                       "revoked_at": "2026-01-16T10:00:00.000000Z"})],
    )
    def post(self, request, pk):
        invitation = _invitation(self.actor, pk)
        if not revoke_invitation(actor=self.actor, invitation=invitation):
            state = InvitationSerializer().get_state(invitation)
            raise Conflict(f"The invitation is no longer pending ({state}).")
        return Response(InvitationSerializer(_invitation(self.actor, pk)).data)


# --- API keys --------------------------------------------------------------------------------------


class ApiKeyListView(AdminAPIView):
    """GET /api-keys/ — the organization's keys (revoked ones included), newest first,
    keyset-paginated over (created_at, id): keys created in the same instant are ordered by
    id, so none is skipped or repeated across pages.
    POST /api-keys/ — create one; the response holds the full key, shown this once."""

    required_action = {"GET": Action.APIKEY_MANAGE, "POST": Action.APIKEY_MANAGE}

    def get_scoped_queryset(self):
        return without_credentials(ApiKey.objects.for_organization(self.organization), "created_by")

    @extend_schema(operation_id="api_keys_list", summary="List API keys",
                   parameters=page_parameters("the creation time and id of the previous page's last key"),
                   responses={200: ApiKeyPageSerializer, **PAGE_INVALID},
                   examples=[_example("keys", {"results": [API_KEY_EXAMPLE], "next": None})])
    def get(self, request):
        rows, next_url = paginate_newest_first(self.get_queryset(), request)
        return Response(page(ApiKeySerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="api_keys_create",
        summary="Create an API key",
        description="The response holds the full key, shown this once (`Cache-Control: no-store`). An API key "
        "cannot create keys (403), and nobody creates a key above their own role (403).",
        request=ApiKeyCreateInputSerializer,
        responses={
            201: ApiKeyCreatedSerializer,
            **invalid("The name is empty or too long, the role unknown, or the expiry not a future date-time.",
                      {"expires_at": ["expires_at must be in the future"]}),
        },
        examples=[
            _example("ci key", {"name": "ci", "role": "member", "expires_at": None}, request=True),
            _example("created", {**API_KEY_EXAMPLE, "key": "ffk_k3x9q2m8w1za_" + "x" * 43}, status_codes=["201"]),
        ],
    )
    def post(self, request):
        payload = ApiKeyCreateInputSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            api_key, full_key = create_api_key(actor=self.actor, **payload.validated_data)
        except TenancyError as exc:
            field = str(exc).split(" ", 1)[0]
            raise ValidationError({field if field in payload.fields else "non_field_errors": [str(exc)]}) from None
        body = {**ApiKeySerializer(api_key).data, "key": full_key}
        # The secret is in this body: no cache along the way may keep it.
        return Response(body, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class ApiKeyRevokeView(AdminAPIView):
    """POST /api-keys/<id>/revoke/ — revoke a key (idempotent); refused everywhere from the next request."""

    required_action = {"POST": Action.APIKEY_MANAGE}

    def get_scoped_queryset(self):
        return without_credentials(ApiKey.objects.for_organization(self.organization), "created_by")

    @extend_schema(operation_id="api_keys_revoke", summary="Revoke an API key", request=None,
                   responses={200: ApiKeySerializer, **NOT_FOUND},
                   examples=[_example("revoked", {**API_KEY_EXAMPLE,
                                                  "revoked_at": "2026-01-16T10:00:00.000000Z"})])
    def post(self, request, pk):
        revoke_api_key(actor=self.actor, api_key=access_api_key(self.actor, pk))
        return Response(ApiKeySerializer(access_api_key(self.actor, pk)).data)


# --- audit log -------------------------------------------------------------------------------------


class AuditEventListView(AdminAPIView):
    """GET /audit-events/ — the organization's audit records, newest first, keyset-
    paginated over (created_at, id) (``idx_auditlog_org_recent``). Account-level
    records (sign-ins, which have no organization) are never listed. audit.read."""

    required_action = {"GET": Action.AUDIT_READ}

    def get_scoped_queryset(self):
        return AuditLog.objects.for_organization(self.organization)

    @extend_schema(
        operation_id="audit_events_list",
        summary="List audit events",
        parameters=[
            OpenApiParameter("action", str, description="An exact action (`trigger.created`), or a prefix ending "
                             "in a dot (`run.`) for every action under it."),
            OpenApiParameter("actor", str, description="An actor: a user's email address, or an API key's "
                             "public prefix (with or without `ffk_`)."),
            OpenApiParameter("created_after", OpenApiTypes.DATETIME,
                             description="Only records created at or after this ISO 8601 instant."),
            OpenApiParameter("created_before", OpenApiTypes.DATETIME,
                             description="Only records created before this ISO 8601 instant."),
            *page_parameters("the creation time and id of the previous page's last record"),
        ],
        responses={
            200: AuditEventPageSerializer,
            **invalid("A filter, the cursor or the page size is malformed; `errors` names it.",
                      {"created_after": ["Datetime has wrong format. Use one of these formats instead: "
                                         "YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]."]}),
        },
        examples=[_example("page", {"results": [AUDIT_EXAMPLE], "next": "https://flowforge.example/api/v1/"
                                    "audit-events/?cursor=eyJ0IjoiMjAyNi0wMS0xNVQwOTozMDowMC4wMDAwMDArMDA6MDAifQ"})],
    )
    def get(self, request):
        filters = AuditEventFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        rows, next_url = paginate_newest_first(self._filtered(self.get_queryset(), filters.validated_data), request)
        return Response(page(AuditEventSerializer(rows, many=True).data, next_url))

    @staticmethod
    def _filtered(qs, params: dict):
        action = params.get("action")
        if action:
            qs = qs.filter(action__startswith=action) if action.endswith(".") else qs.filter(action=action)
        actor = params.get("actor")
        if actor:
            if "@" in actor:
                qs = qs.filter(actor_email__iexact=actor)
            else:
                qs = qs.filter(actor_api_key_prefix=actor.removeprefix("ffk_").split("_", 1)[0])
        if "created_after" in params:
            qs = qs.filter(created_at__gte=params["created_after"])
        if "created_before" in params:
            qs = qs.filter(created_at__lt=params["created_before"])
        return qs


# --- limits and usage ------------------------------------------------------------------------------

LIMITS_EXAMPLE = {"plan": "free", "limits": [
    {"name": "weight", "description": "Share of the workers against other organizations with ready work",
     "limit": 1, "plan_default": 1, "overridden": False, "used": None},
    {"name": "max_running_task_runs", "description": "Task runs claimed or running at once",
     "limit": 250, "plan_default": 100, "overridden": True, "used": 42},
    {"name": "max_runs_per_minute", "description": "Runs started in the last 60 s (every channel)",
     "limit": 600, "plan_default": 600, "overridden": False, "used": 17},
    {"name": "max_definition_bytes", "description": "Bytes of stored workflow definitions (every version, "
     "JSON text)", "limit": 10485760, "plan_default": 10485760, "overridden": False, "used": 48213},
]}


class OrganizationLimitsView(AdminAPIView):
    """GET /org/limits/ — the organization's plan, each effective limit (weight, running
    task runs, runs per minute, definition bytes) and its usage now. Anyone who may read
    the organization (read); staff change them in the Django admin."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return Membership.objects.none()  # no list: the organization itself

    @extend_schema(
        operation_id="org_limits_retrieve",
        summary="Get the organization's limits and usage",
        description="The plan and, for each limit, its effective value (staff's override, else the plan's "
        "default), the plan's default and what is in use now: task runs claimed or running, runs started in the "
        "last 60 s, bytes of stored definitions. Over `max_running_task_runs` tasks wait (their "
        "`waiting_reason` says so); over `max_runs_per_minute` a start is a 429; over `max_definition_bytes` an "
        "apply is refused. See docs/scheduling.md.",
        responses={200: OrganizationLimitsSerializer},
        examples=[_example("limits", LIMITS_EXAMPLE)],
    )
    def get(self, request):
        report = quota_report(self.organization)
        return Response({"plan": report.plan, "limits": [dataclasses.asdict(line) for line in report.lines]})
