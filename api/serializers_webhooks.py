"""Serializers of the organization's webhook endpoints and their delivery log (API v1, issue 19).

An endpoint shows its URL, what it subscribes to and when its secret last changed, never the
secret: that is in the answer to the create and the rotate calls only
(``EndpointWithSecretSerializer``). Input serializers check types; the rules (the URL and the
egress policy, the event types, the limits) are engine.notifications', whose errors name the
field (api.exceptions).
"""

from __future__ import annotations

import json

from django.utils import timezone
from rest_framework import serializers

from api.serializers import RejectUnknownFields, page_of
from api.serializers_org import StrictBooleanField, StrictChoiceField, TextField
from engine import notifications
from engine.models import (
    DeliveryState,
    NotificationAttempt,
    NotificationDelivery,
    NotificationType,
    WebhookEndpoint,
)
from engine.webhooks import MAX_URL_CHARS, event_body


class EndpointSerializer(serializers.ModelSerializer):
    """A webhook endpoint as the API shows it (no secret). Expects ``created_by`` and
    ``created_by_api_key`` selected."""

    event_types = serializers.ListField(child=serializers.ChoiceField(choices=NotificationType.choices),
                                        help_text="The notifications it receives.")
    workflow_name = serializers.CharField(help_text="Only runs of this workflow; empty for every workflow.")
    previous_secret_expires_at = serializers.DateTimeField(
        allow_null=True, help_text="Until when the secret replaced by the last rotation also signs (a second "
        "`v1=` in the signature header); null when it no longer does.")
    created_by = serializers.SerializerMethodField(help_text="The email of the user who created it (null for an "
                                                   "API key or a removed user).")
    created_by_api_key = serializers.SerializerMethodField(help_text="The public prefix of the API key that "
                                                           "created it (null for a user, or a deleted key).")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "event_types", "workflow_name", "enabled", "secret_rotated_at",
                  "previous_secret_expires_at", "created_by", "created_by_api_key", "created_at", "updated_at"]
        read_only_fields = fields

    def get_created_by(self, endpoint) -> str | None:
        return endpoint.created_by.email if endpoint.created_by_id else None

    def get_created_by_api_key(self, endpoint) -> str | None:
        return endpoint.created_by_api_key.prefix if endpoint.created_by_api_key_id else None

    def to_representation(self, instance):
        data = super().to_representation(instance)
        expires = instance.previous_secret_expires_at
        if expires is not None and expires <= timezone.now():
            data["previous_secret_expires_at"] = None
        return data


class EndpointWithSecretSerializer(EndpointSerializer):
    """An endpoint just created or given a new secret: the one answer that holds the secret."""

    secret = serializers.CharField(help_text="The signing secret (`whsec_...`). Shown this once: store it where "
                                   "your receiver verifies signatures. FlowForge keeps it encrypted and never shows "
                                   "it again; rotate it to get a new one.")

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class EndpointWriteSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of POST /webhooks/ (url and event_types required) and PATCH /webhooks/<id>/ (any field)."""

    url = TextField(max_length=MAX_URL_CHARS, trim_whitespace=False,
                    help_text="An absolute http(s) URL the egress policy allows (no internal, loopback or "
                    "link-local address; checked again at every delivery). No user:password@, no #fragment.")
    event_types = serializers.ListField(
        child=StrictChoiceField(choices=NotificationType.choices), min_length=1, max_length=len(NotificationType),
        help_text="One or more of run.succeeded, run.failed, run.cancelled, task.failed.")
    workflow_name = TextField(max_length=200, allow_blank=True, default="", required=False,
                              help_text="Only runs of the workflow of this name (a workflow of the organization, "
                              "any version or state; another name is a 400); empty (the default) for every "
                              "workflow.")
    description = TextField(max_length=notifications.MAX_DESCRIPTION_CHARS, allow_blank=True, default="",
                            required=False)
    enabled = StrictBooleanField(default=True, required=False,
                                 help_text="A disabled endpoint gets no new deliveries; the pending ones wait.")


class RotateSecretSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of POST /webhooks/<id>/rotate-secret/."""

    previous_valid_seconds = serializers.IntegerField(
        min_value=0, max_value=notifications.MAX_PREVIOUS_SECRET_SECONDS, default=0, required=False,
        help_text="How long the replaced secret keeps signing beside the new one (0 to 604800 s; 0, the default, "
        "drops it at once).")

    def to_internal_value(self, data):
        raw = data.get("previous_valid_seconds") if isinstance(data, dict) else None
        if isinstance(raw, bool) or (raw is not None and not isinstance(raw, int)):
            raise serializers.ValidationError({"previous_valid_seconds": ["must be a whole number of seconds"]})
        return super().to_internal_value(data)


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    """One attempt of a delivery."""

    retrying = serializers.BooleanField(help_text="Whether the delivery was to be tried again after it.")
    duration_ms = serializers.IntegerField(allow_null=True, help_text="From the connection to the last byte read.")
    status_code = serializers.IntegerField(allow_null=True, help_text="The receiver's HTTP status; null when "
                                           "nothing came back (a network error, a timeout, the egress policy).")
    response_excerpt = serializers.CharField(help_text="The start of the receiver's answer (at most "
                                             "FLOWFORGE_WEBHOOK_RESPONSE_BYTES bytes, 1 KiB by default).")

    class Meta:
        model = NotificationAttempt
        fields = ["number", "outcome", "retrying", "started_at", "duration_ms", "status_code", "error",
                  "response_excerpt", "response_truncated"]
        read_only_fields = fields


class DeliveryEventSerializer(serializers.Serializer):
    id = serializers.UUIDField(help_text="The event id: the same in every attempt and replay (deduplicate by it).")
    type = serializers.ChoiceField(choices=NotificationType.choices)
    created_at = serializers.DateTimeField()
    workflow_run = serializers.UUIDField(source="workflow_run_id")
    workflow_name = serializers.CharField()


class DeliverySerializer(serializers.ModelSerializer):
    """One delivery of an event to the endpoint, with its attempts (oldest first).
    Expects ``event`` selected and ``attempt_log`` prefetched."""

    event = DeliveryEventSerializer()
    attempts = serializers.IntegerField(help_text="Attempts made so far.")
    next_attempt_at = serializers.DateTimeField(allow_null=True, help_text="When it is tried next (pending only).")
    replay_of = serializers.UUIDField(source="replay_of_id", allow_null=True,
                                      help_text="The delivery this one replays, if it is a replay.")
    attempt_log = DeliveryAttemptSerializer(many=True)

    class Meta:
        model = NotificationDelivery
        fields = ["id", "event", "state", "attempts", "next_attempt_at", "last_status", "last_error", "delivered_at",
                  "dead_lettered_at", "replay_of", "created_at", "attempt_log"]
        read_only_fields = fields


class DeliveryDetailSerializer(DeliverySerializer):
    """A delivery with the body it sends (``body``: the event's JSON document)."""

    body = serializers.SerializerMethodField(help_text="The JSON document POSTed: {id, type, created_at, data}.")

    class Meta(DeliverySerializer.Meta):
        fields = [*DeliverySerializer.Meta.fields, "body"]
        read_only_fields = fields

    def get_body(self, delivery) -> dict:
        event = delivery.event
        return json.loads(event_body(event_id=event.pk, event_type=event.type, created_at=event.created_at,
                                     payload=event.payload))


class DeliveryFilterSerializer(serializers.Serializer):
    state = StrictChoiceField(choices=DeliveryState.choices, required=False,
                              help_text="Only deliveries in this state.")


EndpointPageSerializer = page_of(EndpointSerializer, "WebhookEndpointPageSerializer")
DeliveryPageSerializer = page_of(DeliverySerializer, "WebhookDeliveryPageSerializer")
