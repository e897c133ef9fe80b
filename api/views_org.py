"""REST API v1: organization administration (API keys; members, invitations and
the audit log join them).

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself.
"""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.serializers import ApiKeyCreateSerializer, ApiKeySerializer
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.models import ApiKey
from tenancy.permissions import Action


class ApiKeyListView(OrganizationAPIView):
    """GET /api-keys/ — the organization's keys, newest first (revoked ones included).
    POST /api-keys/ — create one; the response holds the full key, shown this once."""

    required_action = {"GET": Action.APIKEY_MANAGE, "POST": Action.APIKEY_MANAGE}

    def get_scoped_queryset(self):
        return ApiKey.objects.for_organization(self.organization).select_related("created_by").order_by(
            "-created_at", "id"
        )

    def get(self, request):
        return Response(ApiKeySerializer(self.get_queryset(), many=True).data)

    def post(self, request):
        payload = ApiKeyCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        api_key, full_key = create_api_key(actor=self.actor, **payload.validated_data)
        body = {**ApiKeySerializer(api_key).data, "key": full_key}
        # The secret is in this body: no cache along the way may keep it.
        return Response(body, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class ApiKeyRevokeView(OrganizationAPIView):
    """POST /api-keys/<id>/revoke/ — revoke a key (idempotent); refused everywhere from the next request."""

    required_action = {"POST": Action.APIKEY_MANAGE}

    def get_scoped_queryset(self):
        return ApiKey.objects.for_organization(self.organization).select_related("created_by")

    def post(self, request, pk):
        revoke_api_key(actor=self.actor, api_key=self.get_object())
        return Response(ApiKeySerializer(self.get_object()).data)
