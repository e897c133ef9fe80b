"""REST API v1: the organization's secrets (issue 18).

``GET /secrets/`` and ``GET /secrets/<name>/`` show names and metadata to every role
that may read the organization; ``PUT /secrets/<name>/`` (create or rotate) and
``DELETE /secrets/<name>/`` need ``secret.manage`` (owners and admins). No response
ever holds a value: the value goes in, encrypted (tenancy.vault), and out only to the
task attempts that reference it. Views parse and authorize, then call tenancy.vault,
which writes the change and its audit record in one transaction.

Another organization's secret is a 404 like a missing one (a name in the URL never
confirms that another tenant has it); a name that is not a secret name is a 404 for a
read or a delete and a 400 naming ``name`` for a PUT.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from api.pagination import MAX_PAGE_SIZE, page, paginate_by_name
from api.schema import ProblemAutoSchema, invalid, problem, problem_example
from api.schema import page_parameters as schema_page_parameters
from api.serializers_secrets import SecretPageSerializer, SecretSerializer, SecretValueSerializer
from api.views_org import AdminAPIView
from tenancy import vault
from tenancy.access import ObjectNotFound
from tenancy.models import Secret, without_credentials
from tenancy.permissions import Action

SECRET_EXAMPLE = {"name": "API_TOKEN", "version": 2, "created_at": "2026-01-15T09:30:00.000000Z",
                  "updated_at": "2026-02-01T08:00:00.000000Z", "created_by": "ada@example.com",
                  "created_by_api_key": None, "updated_by": None, "updated_by_api_key": "k3x9q2m8w1za"}
NAME_PARAMETER = OpenApiParameter(
    "name", {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"}, OpenApiParameter.PATH,
    description=f"The secret's name ({vault.NAME_FORM}), as task configs reference it: {{{{ secrets.NAME }}}}.")
NOT_FOUND = problem(404, "The organization has no secret of this name (another organization's answers the same).",
                    problem_example(404, "No such secret.", "not_found"))
SHAPE = ("created_by", "updated_by", "created_by_api_key", "updated_by_api_key")


def _shown(organization, name: str) -> Secret:
    """The secret with what SecretSerializer reads (one query; ObjectNotFound otherwise)."""
    row = None
    if vault.is_name(name):
        row = without_credentials(vault.secrets_of(organization), *SHAPE).filter(name=name).first()
    if row is None:
        raise ObjectNotFound("No such secret.")
    return row


class _SecretView(AdminAPIView):
    schema = ProblemAutoSchema()

    def get_scoped_queryset(self):
        return without_credentials(vault.secrets_of(self.organization), *SHAPE)


class SecretListView(_SecretView):
    """GET /secrets/ — the organization's secrets by name (metadata only), keyset-paginated."""

    required_action = {"GET": Action.READ}

    @extend_schema(
        operation_id="secrets_list",
        summary="List secrets",
        description="Names and metadata of the organization's secrets, by name. Values are never returned.",
        parameters=schema_page_parameters("the last secret name of the previous page", max_page_size=MAX_PAGE_SIZE),
        responses={200: SecretPageSerializer, **invalid("The cursor or the page size is malformed; `errors` "
                                                         "names it.", {"page_size": [
                                                             f"must be a whole number from 1 to {MAX_PAGE_SIZE}"]})},
        examples=[OpenApiExample("secrets", value={"results": [SECRET_EXAMPLE], "next": None}, response_only=True,
                                 status_codes=["200"])],
    )
    def get(self, request):
        rows, next_url = paginate_by_name(self.get_queryset(), request)
        return Response(page(SecretSerializer(rows, many=True).data, next_url))


class SecretDetailView(_SecretView):
    """GET /secrets/<name>/ — one secret's metadata; PUT {"value"} — create it (201) or
    rotate its value (200); DELETE — remove it (204). Writes need secret.manage."""

    required_action = {"GET": Action.READ, "PUT": Action.SECRET_MANAGE, "DELETE": Action.SECRET_MANAGE}

    @extend_schema(operation_id="secrets_retrieve", summary="Get a secret's metadata", parameters=[NAME_PARAMETER],
                   description="The secret's name, version and who changed it when; never its value.",
                   responses={200: SecretSerializer, **NOT_FOUND},
                   examples=[OpenApiExample("secret", value=SECRET_EXAMPLE, response_only=True, status_codes=["200"])])
    def get(self, request, name):
        return Response(SecretSerializer(_shown(self.organization, name)).data)

    @extend_schema(
        operation_id="secrets_set",
        summary="Create a secret or rotate its value",
        description="Stores the value encrypted (FLOWFORGE_SECRET_KEYS) under the name: 201 when the secret is new, "
        "200 when it existed (its version goes up by one; runs started from then on use the new value). The "
        "response is the secret's metadata, never the value. Audited as `secret.created` / `secret.rotated`, "
        "without the value. An organization holds at most FLOWFORGE_MAX_SECRETS_PER_ORG secrets (200 by "
        "default): one more is a 422 `quota_exceeded`.",
        parameters=[NAME_PARAMETER],
        request=SecretValueSerializer,
        responses={
            200: SecretSerializer,
            201: SecretSerializer,
            **invalid("The name is not a secret name, or the value is too short, too large or holds NUL; "
                      "`errors` names the field.", {"value": ["must be at least 4 characters: ..."]}),
            **problem(403, "The caller's role may not manage secrets (owners and admins may).",
                      problem_example(403, "role 'member' may not secret.manage", "permission_denied")),
            **problem(422, "The organization holds the most secrets allowed.",
                      problem_example(422, "the organization has 200 secrets, the most allowed "
                                      "(FLOWFORGE_MAX_SECRETS_PER_ORG=200); delete one it no longer needs first",
                                      "quota_exceeded")),
        },
        examples=[
            OpenApiExample("value", value={"value": "sk_live_0123456789abcdef"}, request_only=True),
            OpenApiExample("rotated", value=SECRET_EXAMPLE, response_only=True, status_codes=["200"]),
            OpenApiExample("created", value={**SECRET_EXAMPLE, "version": 1, "updated_at": SECRET_EXAMPLE["created_at"],
                                             "updated_by": "ada@example.com", "updated_by_api_key": None},
                           response_only=True, status_codes=["201"]),
        ],
    )
    def put(self, request, name):
        payload = SecretValueSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        _row, created = vault.set_secret(actor=self.actor, name=name, value=payload.validated_data["value"])
        return Response(SecretSerializer(_shown(self.organization, name)).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(operation_id="secrets_destroy", summary="Delete a secret", parameters=[NAME_PARAMETER],
                   description="Removes the secret; audited as `secret.deleted`. Definitions that reference it keep "
                   "the reference: their next attempts fail (`secret NAME no longer exists`) until it is set again.",
                   responses={204: OpenApiResponse(description="Deleted."), **NOT_FOUND})
    def delete(self, request, name):
        vault.delete_secret(actor=self.actor, name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)
