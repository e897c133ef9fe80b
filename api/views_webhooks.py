"""REST API v1: the organization's webhook endpoints and their delivery log (issue 19).

Every operation needs ``webhook.manage`` (owners and admins, docs/permissions.md): an
endpoint's URL can carry a receiver's token. Views parse and authorize, then call
engine.notifications, which changes the rows and writes the audit record in one transaction.
An endpoint or delivery of another organization is a 404 like a missing one
(engine.access.access_endpoint / access_delivery), read before the body.

The signing secret is in the answers of ``POST /webhooks/`` and
``POST /webhooks/<id>/rotate-secret/`` only (``Cache-Control: no-store``).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from api.base import validated_query
from api.exceptions import Conflict
from api.pagination import MAX_PAGE_SIZE, page, paginate_newest_first
from api.schema import invalid, problem, problem_example
from api.schema import page_parameters as schema_page_parameters
from api.serializers_webhooks import (
    DeliveryDetailSerializer,
    DeliveryFilterSerializer,
    DeliveryPageSerializer,
    DeliverySerializer,
    EndpointPageSerializer,
    EndpointSerializer,
    EndpointWithSecretSerializer,
    EndpointWriteSerializer,
    RotateSecretSerializer,
)
from api.views_org import AdminAPIView
from engine import notifications
from engine.access import access_delivery, access_endpoint
from tenancy.models import without_credentials
from tenancy.permissions import Action

ENDPOINT_ID = "6a7b8c9d-0e1f-4a2b-8c3d-4e5f6a7b8c9d"
DELIVERY_ID = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"
EVENT_ID = "8e9f0a1b-2c3d-4e5f-8a6b-7c8d9e0f1a2b"
RUN_ID = "3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b"
AT = "2026-01-15T09:30:00.000000Z"
ENDPOINT_EXAMPLE = {
    "id": ENDPOINT_ID, "url": "https://hooks.example.com/flowforge", "description": "on-call pager",
    "event_types": ["run.failed", "task.failed"], "workflow_name": "", "enabled": True, "secret_rotated_at": None,
    "previous_secret_expires_at": None, "created_by": "ada@example.com", "created_by_api_key": None, "created_at": AT, "updated_at": AT,
}
SECRET_EXAMPLE = "whsec_3q2Jv9Yw0fK4pL7sT1xN8bR5cM2hD6gA0eU4iO9yZkE"
WRITE_EXAMPLE = {"url": "https://hooks.example.com/flowforge", "event_types": ["run.failed", "task.failed"],
                 "description": "on-call pager"}
ATTEMPT_EXAMPLE = {"number": 1, "outcome": "failed", "retrying": True, "started_at": AT, "duration_ms": 212,
                   "status_code": 503, "error": "HTTP 503", "response_excerpt": "upstream unavailable",
                   "response_truncated": False}
DELIVERY_EXAMPLE = {
    "id": DELIVERY_ID,
    "event": {"id": EVENT_ID, "type": "run.failed", "created_at": AT, "workflow_run": RUN_ID,
              "workflow_name": "nightly-report"},
    "state": "succeeded", "attempts": 2, "next_attempt_at": None, "last_status": 200, "last_error": "",
    "delivered_at": "2026-01-15T09:30:41.000000Z", "dead_lettered_at": None, "replay_of": None, "created_at": AT,
    "attempt_log": [ATTEMPT_EXAMPLE, {**ATTEMPT_EXAMPLE, "number": 2, "outcome": "succeeded", "retrying": False,
                                      "status_code": 200, "error": "", "response_excerpt": "ok"}],
}
BODY_EXAMPLE = {"id": EVENT_ID, "type": "run.failed", "created_at": AT, "data": {
    "organization": {"id": "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"},
    "workflow": {"id": "0b7c1f43-5a4e-4f7e-9a51-6f1b2f7f3d10", "name": "nightly-report", "version": 3},
    "run": {"id": RUN_ID, "state": "failed", "error": "task load failed", "trigger_source": "cron", "priority": 0,
            "retry_of": None, "created_at": AT, "started_at": AT, "finished_at": "2026-01-15T09:30:40.000000+00:00"}}}

ENDPOINT_PARAMETER = OpenApiParameter("pk", str, OpenApiParameter.PATH, description="The endpoint's id.")
NOT_FOUND = problem(404, "No such webhook endpoint (or delivery) in the caller's organization (another "
                    "organization's answers the same).", problem_example(404, "Not found.", "not_found"))
FORBIDDEN = problem(403, "The caller's role may not manage webhooks (owners and admins may).",
                    problem_example(403, "role 'member' may not webhook.manage", "permission_denied"))
ENDPOINT_INVALID = invalid(
    "A field is missing or refused: a URL that is not an absolute http(s) URL or that the egress policy refuses "
    "(loopback, private, link-local ...) names `url`; an unknown event type `event_types`; a `workflow_name` that "
    "names no workflow of the organization (any version, active, draft or archived) `workflow_name`.",
    {"url": ["egress refused: 10.0.0.7 (private) for host 'hooks.internal' — allow it with FLOWFORGE_EGRESS_ALLOW"]})
PAGE_INVALID = invalid("The cursor or the page size is malformed; `errors` names it.",
                       {"page_size": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}"]})


def _example(name: str, value, *, request: bool = False, status_codes=None) -> OpenApiExample:
    if request:
        return OpenApiExample(name, value=value, request_only=True)
    return OpenApiExample(name, value=value, response_only=True, status_codes=status_codes or ["200"])


def _no_store(response: Response) -> Response:
    # The answer holds a signing secret: no cache keeps it.
    response["Cache-Control"] = "no-store"
    return response


class _WebhookView(AdminAPIView):
    required_action = {}

    def get_scoped_queryset(self):
        return without_credentials(notifications.endpoints_of(self.organization), "created_by", "created_by_api_key")

    def endpoint(self, pk):
        return access_endpoint(self.actor, pk, shape=lambda qs: without_credentials(qs, "created_by", "created_by_api_key"))

    def shown(self, pk) -> dict:
        return EndpointSerializer(self.endpoint(pk)).data


class WebhookListView(_WebhookView):
    """GET /webhooks/ — the organization's endpoints, newest first; POST — create one."""

    required_action = {"GET": Action.WEBHOOK_MANAGE, "POST": Action.WEBHOOK_MANAGE}

    @extend_schema(
        operation_id="webhooks_list", summary="List webhook endpoints",
        description="The organization's webhook endpoints, newest first (keyset pages). Never a secret.",
        parameters=schema_page_parameters("the creation time and id of the previous page's last endpoint",
                                          max_page_size=MAX_PAGE_SIZE),
        responses={200: EndpointPageSerializer, **PAGE_INVALID, **FORBIDDEN},
        examples=[_example("endpoints", {"results": [ENDPOINT_EXAMPLE], "next": None})],
    )
    def get(self, request):
        rows, next_url = paginate_newest_first(self.get_queryset(), request)
        return Response(page(EndpointSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="webhooks_create", summary="Create a webhook endpoint",
        description="Creates the endpoint and its signing secret, returned in this answer only. FlowForge POSTs "
        "each subscribed notification (`run.succeeded`, `run.failed`, `run.cancelled`, `task.failed`; optionally "
        "only for runs of `workflow_name`) as JSON, signed in `FlowForge-Signature: t=<unix>,v1=<hex>` (HMAC-SHA256 "
        "of `<t>.<body>`), retried with backoff on network errors, timeouts, 408, 429 and 5xx, then dead-lettered. "
        "The URL must pass the egress policy (checked now and at every connection). At most "
        "FLOWFORGE_MAX_WEBHOOKS_PER_ORG endpoints (10 by default): one more is a 422 `quota_exceeded`. Audited as "
        "`webhook.created` (the URL's scheme and host only).",
        request=EndpointWriteSerializer,
        responses={
            201: EndpointWithSecretSerializer, **ENDPOINT_INVALID, **FORBIDDEN,
            **problem(422, "The organization has the most endpoints allowed.", problem_example(
                422, "the organization has 10 webhook endpoints, the most allowed (FLOWFORGE_MAX_WEBHOOKS_PER_ORG=10); "
                "delete one it no longer needs first", "quota_exceeded")),
        },
        examples=[_example("pager", WRITE_EXAMPLE, request=True),
                  _example("created", {**ENDPOINT_EXAMPLE, "secret": SECRET_EXAMPLE}, status_codes=["201"])],
    )
    def post(self, request):
        payload = EndpointWriteSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        endpoint, secret = notifications.create_endpoint(actor=self.actor, **payload.validated_data)
        data = {**self.shown(endpoint.pk), "secret": secret}
        return _no_store(Response(data, status=status.HTTP_201_CREATED))


class WebhookDetailView(_WebhookView):
    """GET /webhooks/<id>/; PATCH — change fields; DELETE — remove it with its delivery log."""

    required_action = {"GET": Action.WEBHOOK_MANAGE, "PATCH": Action.WEBHOOK_MANAGE,
                       "DELETE": Action.WEBHOOK_MANAGE}

    @extend_schema(operation_id="webhooks_retrieve", summary="Get a webhook endpoint", parameters=[ENDPOINT_PARAMETER],
                   responses={200: EndpointSerializer, **NOT_FOUND, **FORBIDDEN},
                   examples=[_example("endpoint", ENDPOINT_EXAMPLE)])
    def get(self, request, pk):
        return Response(self.shown(pk))

    @extend_schema(
        operation_id="webhooks_partial_update", summary="Change a webhook endpoint", parameters=[ENDPOINT_PARAMETER],
        description="Changes any of url, event_types, workflow_name, description, enabled (the rules of the "
        "create). A disabled endpoint gets no new deliveries and its pending ones wait until it is enabled again. "
        "Audited as `webhook.updated`.",
        request=EndpointWriteSerializer,
        responses={200: EndpointSerializer, **ENDPOINT_INVALID, **NOT_FOUND, **FORBIDDEN},
        examples=[_example("disable", {"enabled": False}, request=True),
                  _example("disabled", {**ENDPOINT_EXAMPLE, "enabled": False})],
    )
    def patch(self, request, pk):
        endpoint = self.endpoint(pk)
        payload = EndpointWriteSerializer(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        notifications.update_endpoint(actor=self.actor, endpoint=endpoint, data=dict(payload.validated_data))
        return Response(self.shown(pk))

    @extend_schema(operation_id="webhooks_destroy", summary="Delete a webhook endpoint",
                   parameters=[ENDPOINT_PARAMETER],
                   description="Removes the endpoint and its delivery log. Audited as `webhook.deleted`.",
                   responses={204: OpenApiResponse(description="Deleted."), **NOT_FOUND, **FORBIDDEN})
    def delete(self, request, pk):
        notifications.delete_endpoint(actor=self.actor, endpoint=self.endpoint(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateView(_WebhookView):
    """POST /webhooks/<id>/rotate-secret/ — a new signing secret, shown once."""

    required_action = {"POST": Action.WEBHOOK_MANAGE}

    @extend_schema(
        operation_id="webhooks_rotate_secret", summary="Rotate a webhook endpoint's signing secret",
        parameters=[ENDPOINT_PARAMETER],
        description="Replaces the signing secret and returns the new one, this once. With "
        "`previous_valid_seconds` the replaced secret keeps signing beside it (a second `v1=`) for that long, so "
        "a receiver can switch without refusing a delivery. Audited as `webhook.secret_rotated`.",
        request=RotateSecretSerializer,
        responses={200: EndpointWithSecretSerializer, **invalid(
            "`previous_valid_seconds` is not a whole number from 0 to 604800.",
            {"previous_valid_seconds": ["Ensure this value is less than or equal to 604800."]}),
            **NOT_FOUND, **FORBIDDEN},
        examples=[_example("with a day's grace", {"previous_valid_seconds": 86400}, request=True),
                  _example("rotated", {**ENDPOINT_EXAMPLE, "secret_rotated_at": AT,
                                       "previous_secret_expires_at": "2026-01-16T09:30:00.000000Z",
                                       "secret": SECRET_EXAMPLE})],
    )
    def post(self, request, pk):
        endpoint = self.endpoint(pk)
        payload = RotateSecretSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        _endpoint, secret = notifications.rotate_secret(
            actor=self.actor, endpoint=endpoint,
            previous_valid_seconds=payload.validated_data.get("previous_valid_seconds", 0))
        return _no_store(Response({**self.shown(pk), "secret": secret}))


def _deliveries(organization, endpoint_id):
    return notifications.deliveries_of(organization, endpoint_id)


class WebhookDeliveryListView(_WebhookView):
    """GET /webhooks/<id>/deliveries/ — the endpoint's delivery log, newest first."""

    required_action = {"GET": Action.WEBHOOK_MANAGE}

    @extend_schema(
        operation_id="webhooks_deliveries_list", summary="List an endpoint's deliveries",
        description="Each delivery of an event to the endpoint with its attempts (status, latency, error, the "
        "start of the answer), newest first (keyset pages); `?state=` keeps one state.",
        parameters=[ENDPOINT_PARAMETER, OpenApiParameter(
            "state", {"type": "string", "enum": ["pending", "sending", "succeeded", "dead"]},
            description="Only deliveries in this state."),
            *schema_page_parameters("the creation time and id of the previous page's last delivery",
                                    max_page_size=MAX_PAGE_SIZE)],
        responses={200: DeliveryPageSerializer, **PAGE_INVALID, **NOT_FOUND, **FORBIDDEN},
        examples=[_example("deliveries", {"results": [DELIVERY_EXAMPLE], "next": None})],
    )
    def get(self, request, pk):
        endpoint = self.endpoint(pk)
        filters = validated_query(request, DeliveryFilterSerializer)
        rows = _deliveries(self.organization, endpoint.pk)
        if "state" in filters:
            rows = rows.filter(state=filters["state"])
        rows, next_url = paginate_newest_first(rows, request)
        return Response(page(DeliverySerializer(rows, many=True).data, next_url))


DELIVERY_PARAMETERS = [ENDPOINT_PARAMETER, OpenApiParameter("delivery_id", str, OpenApiParameter.PATH,
                                                            description="The delivery's id.")]


class WebhookDeliveryDetailView(_WebhookView):
    """GET /webhooks/<id>/deliveries/<delivery_id>/ — one delivery, its attempts and its body."""

    required_action = {"GET": Action.WEBHOOK_MANAGE}

    @extend_schema(operation_id="webhooks_deliveries_retrieve", summary="Get a delivery",
                   parameters=DELIVERY_PARAMETERS,
                   responses={200: DeliveryDetailSerializer, **NOT_FOUND, **FORBIDDEN},
                   examples=[_example("delivery", {**DELIVERY_EXAMPLE, "body": BODY_EXAMPLE})])
    def get(self, request, pk, delivery_id):
        delivery = access_delivery(self.actor, pk, delivery_id)
        return Response(DeliveryDetailSerializer(_deliveries(self.organization, pk).get(pk=delivery.pk)).data)


class WebhookDeliveryReplayView(_WebhookView):
    """POST /webhooks/<id>/deliveries/<delivery_id>/replay/ — deliver its event again."""

    required_action = {"POST": Action.WEBHOOK_MANAGE}

    @extend_schema(
        operation_id="webhooks_deliveries_replay", summary="Replay a delivery", parameters=DELIVERY_PARAMETERS,
        description="Sends a finished delivery's event (succeeded or dead-lettered) to the endpoint again, as a new "
        "delivery due now, with the same event id and body (receivers deduplicate by the id). 409 while the "
        "delivery, or a replay of it, is still pending, or when the endpoint is disabled. Audited as "
        "`webhook.delivery_replayed`.",
        request=None,
        responses={202: DeliverySerializer, **NOT_FOUND, **FORBIDDEN, **problem(
            409, "The delivery or a replay of it is still pending, or the endpoint is disabled.",
            problem_example(409, "a replay of this delivery is already pending", "conflict"))},
        examples=[_example("replaying", {**DELIVERY_EXAMPLE, "id": "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d",
                                         "state": "pending", "attempts": 0, "next_attempt_at": AT,
                                         "last_status": None, "delivered_at": None, "replay_of": DELIVERY_ID,
                                         "attempt_log": []}, status_codes=["202"])],
    )
    def post(self, request, pk, delivery_id):
        delivery = access_delivery(self.actor, pk, delivery_id)
        try:
            replay = notifications.replay_delivery(actor=self.actor, delivery=delivery)
        except notifications.ReplayRefused as exc:
            raise Conflict(str(exc)) from None
        fresh = _deliveries(self.organization, delivery.endpoint_id).get(pk=replay.pk)
        return Response(DeliverySerializer(fresh).data, status=status.HTTP_202_ACCEPTED)
