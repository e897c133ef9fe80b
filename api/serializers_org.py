"""Serializers of organization administration (API v1): cron triggers, members,
invitations, API keys (the input/output shapes beside api.serializers') and the
audit log.

Read shapes are explicit field lists. Input serializers only check types and
shapes; the rules (a workflow that exists, a valid cron expression, the last owner)
are the service functions', whose errors api.exceptions turns into problems.

Input strings are strict: a JSON number or boolean where a string is expected is
refused rather than converted, and so is a string PostgreSQL cannot store (a NUL or
an unpaired surrogate), so such input is a 400 naming the field, never a 500.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from croniter import CroniterError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.serializers import (
    ApiKeyCreateSerializer,
    ApiKeySerializer,
    InstantField,
    RejectUnknownFields,
    StrictPriorityField,
    page_of,
)
from audit.models import AuditLog
from engine import triggers
from engine.models import CatchUpPolicy, ScheduledTrigger
from tenancy.apikeys import NAME_MAX_LENGTH
from tenancy.models import Invitation, InvitationState, KeyRole, Membership, Role

# NUL and unpaired surrogates: text PostgreSQL cannot store (and UTF-8 cannot encode).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Deepest nesting accepted in a JSON object field: deeper documents exhaust Python's
# recursion limit somewhere between here and the database.
MAX_JSON_DEPTH = 32
# How many upcoming fire times a trigger shows.
PREVIEW_COUNT = 5

OBJECT_SCHEMA = {"type": "object", "additionalProperties": {}}


class StrictText:
    """Mixin for CharField and its subclasses: only a JSON string, and one that can be stored."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("Must be a string.", code="invalid")
        if _UNSTORABLE.search(data):
            raise serializers.ValidationError("Must not contain NUL or unpaired surrogate characters.",
                                              code="invalid")
        return super().to_internal_value(data)


class TextField(StrictText, serializers.CharField):
    pass


class EmailField(StrictText, serializers.EmailField):
    pass


class StrictChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` only (DRF would also take "yes", "on", 1, ...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), computed without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


@extend_schema_field(OBJECT_SCHEMA)
class JSONObjectField(serializers.JSONField):
    """A JSON object (not an array, string or null), at most MAX_JSON_DEPTH deep."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be a JSON object.", code="invalid")
        if json_depth(data) > MAX_JSON_DEPTH:
            raise serializers.ValidationError(f"Must not be nested more than {MAX_JSON_DEPTH} levels deep.",
                                              code="invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "nullable": True, "description": "An IPv4 or IPv6 address."})
class IPAddressText(serializers.CharField):
    pass


# --- cron triggers ---------------------------------------------------------------------------------


class StoredInstantField(serializers.DateTimeField):
    """An instant kept as ISO 8601 text in a JSON column, shown as every other instant of
    the API is (UTC, ``Z``)."""

    def to_representation(self, value):
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        return super().to_representation(value)


class MissedInstantsSerializer(serializers.Serializer):
    """Due instants a tick of the clock did not fire (engine.cron.missed_note)."""

    at = StoredInstantField(help_text="When the clock found them.")
    policy = serializers.CharField(help_text="The trigger's catch_up policy then.")
    reason = serializers.ChoiceField(choices=["catch_up_bound", "catch_up_policy"], help_text=(
        "catch_up_bound: more were due than the `all` policy fires at once (max_catch_up, the most recent); "
        "catch_up_policy: `skip` or `latest` left them."))
    due = serializers.IntegerField()
    fired = serializers.IntegerField()
    not_fired = serializers.IntegerField()
    first_not_fired = StoredInstantField()
    last_not_fired = StoredInstantField()
    max_catch_up = serializers.IntegerField()


class TriggerSerializer(serializers.ModelSerializer):
    """A cron trigger with its next fire instants.

    ``next_fire_at`` is in UTC; ``next_fire_times`` are the next instants of the
    expression in the trigger's own time zone (with its UTC offset), whether or not
    the trigger is paused (a paused trigger fires none of them until resumed).
    Expects ``created_by`` selected.
    """

    input = JSONObjectField(read_only=True)
    input_rejected = serializers.SerializerMethodField(
        help_text="Null, or why every firing will fail: the input schema of the workflow's latest active "
        "`version` refuses this trigger's input (`message`, and each of the `violations` with its JSON pointer "
        "`path`). Fix the input (PATCH) or the workflow.")
    next_fire_times = serializers.SerializerMethodField()
    created_by = serializers.SerializerMethodField()
    missed_instants = MissedInstantsSerializer(
        read_only=True, allow_null=True,
        help_text="The last time the clock left due instants unfired (downtime past the catch-up bound, or its "
        "policy): how many and which; a backfill of first_not_fired .. last_not_fired fires them. Null when it "
        "never happened.")

    class Meta:
        model = ScheduledTrigger
        fields = ["id", "name", "workflow_name", "cron_expression", "timezone", "input", "input_rejected",
                  "catch_up", "enabled", "priority", "next_fire_at", "next_fire_times", "last_fired_at",
                  "missed_instants", "created_by", "created_at"]
        read_only_fields = fields

    def _rejections(self) -> dict:
        """{trigger id: InputRejection} of the serialized triggers: one query for a list
        (engine.triggers.input_rejections), computed once per serializer."""
        root = self.parent if isinstance(self.parent, serializers.ListSerializer) else self
        cached = getattr(root, "_input_rejections", None)
        if cached is None:
            rows = root.instance if isinstance(root, serializers.ListSerializer) else [self.instance]
            rows = list(rows or [])
            cached = triggers.input_rejections(rows[0].organization_id, rows) if rows else {}
            root._input_rejections = cached
        return cached

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "version": {"type": "integer"}, "message": {"type": "string"},
        "violations": {"type": "array", "items": {"type": "object", "properties": {
            "path": {"type": "string"}, "message": {"type": "string"}, "keyword": {"type": "string"}}}}}})
    def get_input_rejected(self, trigger) -> dict[str, Any] | None:
        found = self._rejections().get(trigger.pk)
        if found is None:
            return None
        return {"version": found.version, "message": found.message(), "violations": found.violations}

    @extend_schema_field({"type": "array", "items": {"type": "string", "format": "date-time"},
                          "maxItems": PREVIEW_COUNT})
    def get_next_fire_times(self, trigger) -> list[str]:
        try:
            instants = triggers.preview(trigger.cron_expression, trigger.timezone, count=PREVIEW_COUNT)
        except (triggers.TriggerError, CroniterError):  # a stored schedule that no longer parses: none
            return []
        return [instant.isoformat() for instant in instants]

    def get_created_by(self, trigger) -> str | None:
        return trigger.created_by.email if trigger.created_by_id else None


class TriggerWriteSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of POST /triggers/ (all fields) and PATCH /triggers/<id>/ (any of them)."""

    name = TextField(max_length=triggers.NAME_MAX)
    workflow_name = TextField(max_length=200, help_text="The workflow to start (its latest active version).")
    cron_expression = TextField(max_length=200, help_text="Five fields: minute hour day month weekday.")
    timezone = TextField(max_length=64, default="UTC", help_text="An IANA time zone, e.g. Europe/Berlin.")
    input = JSONObjectField(default=dict, help_text="The input document of each run it starts.")
    catch_up = StrictChoiceField(choices=CatchUpPolicy.choices, default=CatchUpPolicy.LATEST,
                                 help_text="Instants missed while the clock was down: fire none (skip), "
                                 "the latest, or all.")
    enabled = StrictBooleanField(default=True)
    # A JSON integer only, as POST /runs/ takes it: "3" and 2.0 are refused, not converted.
    priority = StrictPriorityField(default=0,
                                   help_text="The priority of the runs it starts, -10 to 10 (higher is "
                                   "claimed first within the organization's share).")


# --- members and invitations -----------------------------------------------------------------------


class MemberSerializer(serializers.ModelSerializer):
    """A member of the organization. Expects ``user`` selected."""

    user_id = serializers.UUIDField(source="user.id", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)
    name = serializers.CharField(source="user.name", read_only=True)
    joined_at = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user_id", "email", "name", "role", "joined_at"]
        read_only_fields = fields


class MemberRoleSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of PATCH /members/<id>/."""

    role = StrictChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    """An invitation, never its token. Expects ``invited_by`` selected."""

    state = serializers.SerializerMethodField()
    invited_by = serializers.SerializerMethodField()

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "state", "invited_by", "created_at", "expires_at", "accepted_at",
                  "revoked_at"]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "enum": InvitationState.values})
    def get_state(self, invitation) -> str:
        if invitation.accepted_at is not None:
            return InvitationState.ACCEPTED.value
        if invitation.revoked_at is not None:
            return InvitationState.REVOKED.value
        return (InvitationState.PENDING if invitation.is_pending else InvitationState.EXPIRED).value

    def get_invited_by(self, invitation) -> str | None:
        return invitation.invited_by.email if invitation.invited_by_id else None


class InvitationCreatedSerializer(InvitationSerializer):
    """The response of POST /invitations/: the invitation, and whether its mail went out."""

    email_sent = serializers.SerializerMethodField(
        help_text="Whether the mailer accepted the accept link's mail. False: the invitation exists but its "
                  "address got nothing; invite it again to send a new link (each invitation counts toward "
                  "the daily invitation limits).")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "email_sent"]
        read_only_fields = fields

    def get_email_sent(self, invitation) -> bool:
        return bool(self.context.get("email_sent"))


class InvitationCreateSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of POST /invitations/."""

    email = EmailField(max_length=254)
    role = StrictChoiceField(choices=Role.choices, default=Role.MEMBER)


# --- API keys --------------------------------------------------------------------------------------


class ApiKeyCreateInputSerializer(RejectUnknownFields, ApiKeyCreateSerializer):
    """Input of POST /api-keys/ (api.serializers' fields, with strict strings)."""

    name = TextField(max_length=NAME_MAX_LENGTH)
    role = StrictChoiceField(choices=KeyRole.choices, default=Role.MEMBER)


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """The response of POST /api-keys/: the key as lists show it, plus the full key, shown this once."""

    key = serializers.CharField(read_only=True, help_text="The full key, `ffk_<prefix>_<secret>`. "
                                "It is shown only in this response: store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


# --- audit log -------------------------------------------------------------------------------------


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit record of the organization (never a secret: see audit.services)."""

    metadata = JSONObjectField(read_only=True)
    ip_address = IPAddressText(read_only=True, allow_null=True)

    class Meta:
        model = AuditLog
        fields = ["id", "action", "actor_type", "actor_email", "actor_api_key_prefix", "target_type", "target_id",
                  "metadata", "ip_address", "user_agent", "request_id", "created_at"]
        read_only_fields = fields


AuditEventPageSerializer = page_of(AuditEventSerializer, "AuditEventPageSerializer")


class AuditEventFilterSerializer(serializers.Serializer):
    """The query parameters of GET /audit-events/ (cursor and page_size are the paginator's)."""

    action = TextField(required=False, max_length=100)
    actor = TextField(required=False, max_length=254)
    # InstantField: an offset beyond ±15:59, or an instant out of the calendar in UTC, is a 400.
    created_after = InstantField(required=False)
    created_before = InstantField(required=False)


class QuotaLineSerializer(serializers.Serializer):
    """One limit of the organization and its usage (engine.reporting.QuotaLine)."""

    name = serializers.ChoiceField(choices=["weight", "max_running_task_runs", "max_runs_per_minute",
                                            "max_definition_bytes"])
    description = serializers.CharField()
    limit = serializers.IntegerField(help_text="The effective value: the override when staff set one, "
                                     "else the plan's default.")
    plan_default = serializers.IntegerField()
    overridden = serializers.BooleanField()
    used = serializers.IntegerField(allow_null=True, help_text="In use now (null for the weight).")


class OrganizationLimitsSerializer(serializers.Serializer):
    """GET /org/limits/: the organization's plan and each limit with its usage."""

    plan = serializers.ChoiceField(choices=["free", "team", "business"])
    limits = QuotaLineSerializer(many=True)
