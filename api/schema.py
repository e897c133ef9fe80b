"""OpenAPI 3 description of the REST API (drf-spectacular), shared by every view.

- ``ApiKeyAuthenticationScheme`` / ``SessionAuthenticationScheme``: the security
  schemes of api.authentication's two classes (``bearerAuth``: ``Authorization:
  Bearer ffk_...``; ``sessionAuth``: the browser session cookie, with CSRF).
- ``ProblemSerializer``: the reusable ``Problem`` component (RFC 9457, served as
  ``application/problem+json``), and ``problem()`` to declare one error response of
  an operation with an example.
- ``ProblemAutoSchema``: the AutoSchema of the API views. To each operation it adds
  the optional ``X-Organization`` header and the problem responses every operation
  can give (400, 401, 403, 404, 406, 429 with ``Retry-After``; 413 and 415 for
  methods with a body), unless the view declared that status itself.

These classes register with drf-spectacular when this module is imported; the view
modules import it, so they are in place before any schema is generated.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers

from api.exceptions import PROBLEM_CONTENT_TYPE, PROBLEM_TYPE
from tenancy.context import HEADER as ORGANIZATION_HEADER_NAME

# --- security schemes ----------------------------------------------------------------------------


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.ApiKeyAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "ffk_<prefix>_<secret>",
            "description": "An API key of the organization: `Authorization: Bearer ffk_<prefix>_<secret>`. "
            "The key fixes the organization; it acts with the lesser of its role and its creator's.",
        }


class SessionAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.CsrfSessionAuthentication"
    name = "sessionAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": settings.SESSION_COOKIE_NAME,
            "description": "The signed-in browser session. Unsafe methods need the CSRF token "
            "(`X-CSRFToken`); a user in several organizations names one with `X-Organization`.",
        }


# --- the Problem component -----------------------------------------------------------------------


@extend_schema_field({
    "type": "object",
    "description": "Field name → messages. A nested field's messages are an object of the same shape; "
    "`non_field_errors` holds messages about the request as a whole.",
    "additionalProperties": {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "object", "additionalProperties": {}},
        ]
    },
})
class FieldErrorsField(serializers.DictField):
    pass


class InputViolationSerializer(serializers.Serializer):
    """One way a run input breaks its workflow's input schema."""

    path = serializers.CharField(help_text="A JSON pointer into the input (`/customer/id`; empty for the whole "
                                 "input); a missing required property's own pointer.")
    message = serializers.CharField(help_text="What is wrong.")
    keyword = serializers.CharField(help_text="The schema keyword that failed (`required`, `type`, `enum`, ...).")


@extend_schema_serializer(component_name="Problem")
class ProblemSerializer(serializers.Serializer):
    """An RFC 9457 problem document (``application/problem+json``)."""

    type = serializers.CharField(help_text=f"A URI reference naming the problem type; `{PROBLEM_TYPE}` "
                                 "says it is no more than its HTTP status.")
    title = serializers.CharField(help_text="The HTTP status's reason phrase.")
    status = serializers.IntegerField(min_value=400, max_value=599, help_text="The HTTP status code.")
    detail = serializers.CharField(help_text="What went wrong, for a person to read.")
    code = serializers.CharField(help_text="A stable machine-readable name of the problem, e.g. `not_found`.")
    errors = FieldErrorsField(required=False, help_text="Per-field messages of an invalid request (400).")
    request_id = serializers.CharField(required=False, help_text="The request id (500 only): quote it when "
                                       "reporting the error.")
    limit = serializers.CharField(required=False, help_text="The organization's quota that refused the request "
                                  "(`quota_exceeded` only): max_runs_per_minute, max_definition_bytes, "
                                  "max_secrets, max_webhooks or max_failure_subscriptions; or the "
                                  "invitation send limits, invitations_per_day (per organization) or "
                                  "invitations_per_day_per_user (per person).")
    allowed = serializers.IntegerField(required=False, help_text="The quota's value (`quota_exceeded` only).")
    used = serializers.IntegerField(required=False, help_text="What is in use against it (`quota_exceeded` only; "
                                    "an API key's per-person invitation limit says `allowed` here).")
    retry_after_seconds = serializers.FloatField(required=False, help_text="Seconds until the request fits the "
                                                 "quota again (429 `quota_exceeded` only).")
    violations = InputViolationSerializer(many=True, required=False, help_text="An input that the workflow's "
                                          "input schema refuses (400 on `input` only): every violation found, "
                                          "at most 50 (then one entry with keyword `truncated`).")


def problem_example(status: int, detail: str, code: str, *, name: str | None = None,
                    errors: dict | None = None, summary: str | None = None,
                    violations: list | None = None) -> OpenApiExample:
    """An example problem document for ``status`` (``violations``: an input refused by
    a workflow's input schema)."""
    from http import HTTPStatus

    value = {"type": PROBLEM_TYPE, "title": HTTPStatus(status).phrase, "status": status, "detail": detail,
             "code": code}
    if errors is not None:
        value["errors"] = errors
    if violations is not None:
        value["violations"] = violations
    return OpenApiExample(name or f"{code}", value=value, summary=summary, response_only=True,
                          status_codes=[str(status)], media_type=PROBLEM_CONTENT_TYPE)


def problem(status: int, description: str, *examples: OpenApiExample) -> dict:
    """``{(status, "application/problem+json"): OpenApiResponse(Problem)}`` to merge into
    an operation's ``responses``."""
    return {(status, PROBLEM_CONTENT_TYPE): OpenApiResponse(ProblemSerializer, description=description,
                                                            examples=list(examples))}


def invalid(description: str, errors: dict[str, list[str]]) -> dict:
    """The 400 of an operation that validates input, with an example naming the fields."""
    return problem(
        400, description,
        problem_example(400, "The request is invalid; see errors.", "invalid", name="invalid", errors=errors),
        problem_example(400, "Choose an organization with the X-Organization header.", "organization_required",
                        name="organization_required"),
    )


# Responses every API operation can give (the view's own declaration of a status wins).
COMMON_PROBLEMS: dict[int, tuple[str, OpenApiExample]] = {
    400: ("A session user in several organizations did not say which (X-Organization), or the request "
          "is invalid.",
          problem_example(400, "Choose an organization with the X-Organization header.", "organization_required")),
    401: ("No credentials, or an API key that is malformed, unknown, expired or revoked (one answer for all).",
          problem_example(401, "Invalid API key.", "authentication_failed")),
    403: ("The caller's role may not do this (or, for a session, the CSRF token is missing).",
          problem_example(403, "Your role (viewer) may not workflow.edit.", "permission_denied")),
    404: ("No such object in the caller's organization (another organization's object answers the same), "
          "or a session's X-Organization names no organization of the user.",
          problem_example(404, "Not found.", "not_found")),
    406: ("The Accept header allows no media type the API serves (application/json).",
          problem_example(406, "Could not satisfy the request Accept header.", "not_acceptable")),
    429: ("A rate limit is spent: the caller's (requests per minute per API key, or per user) or its "
          "organization's (all its keys and users together); the detail names which. Retry after "
          "`Retry-After` seconds.",
          problem_example(429, "Request was throttled. Expected available in 37 seconds.", "throttled")),
}
BODY_PROBLEMS: dict[int, tuple[str, OpenApiExample]] = {
    413: ("The request body is larger than the limit (FLOWFORGE_MAX_BODY_BYTES, 1 MiB by default).",
          problem_example(413, "The request body is larger than the limit of 1048576 bytes.", "payload_too_large")),
    415: ("The body is not JSON (send `Content-Type: application/json`).",
          problem_example(415, 'Unsupported media type "text/plain" in request.', "unsupported_media_type")),
}
RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "Seconds until the request may be made again: the rate limit's window ends, or "
                       "(quota_exceeded) the quota has room again.",
        "schema": {"type": "integer", "minimum": 1},
    }
}

def page_parameters(cursor_holds: str, *, max_page_size: int = 500) -> list[OpenApiParameter]:
    """The query parameters of a keyset-paginated list (api.pagination), with the
    page size's bounds in the schema so generated clients and fuzzers respect them."""
    return [
        OpenApiParameter("cursor", str, description=f"Where the page starts (opaque: {cursor_holds}); take it "
                         "from the `next` link of the previous page."),
        OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": max_page_size},
                         description=f"Rows per page, 1 to {max_page_size} (default 50)."),
    ]


ORGANIZATION_HEADER = OpenApiParameter(
    ORGANIZATION_HEADER_NAME,
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Session users only: the slug or id of the organization to act in (needed when the user "
    "belongs to several). Ignored for API keys, which fix their organization.",
)


class ProblemAutoSchema(AutoSchema):
    """AutoSchema adding the X-Organization header and the common problem responses."""

    def get_override_parameters(self):
        params = list(super().get_override_parameters())
        if not any(isinstance(p, OpenApiParameter) and p.name == ORGANIZATION_HEADER_NAME for p in params):
            params.append(ORGANIZATION_HEADER)
        return params

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        common = dict(COMMON_PROBLEMS)
        if self.method in ("POST", "PUT", "PATCH"):
            common.update(BODY_PROBLEMS)
        for status, (description, example) in sorted(common.items()):
            if str(status) in responses:
                continue
            response = OpenApiResponse(ProblemSerializer, description=description, examples=[example])
            responses[str(status)] = self._get_response_for_code(
                response, str(status), (PROBLEM_CONTENT_TYPE,), direction
            )
            if status == 429:
                responses[str(status)]["headers"] = RETRY_AFTER_HEADER
        if "429" in responses:  # an operation's own 429 (a quota) says Retry-After too
            responses["429"].setdefault("headers", RETRY_AFTER_HEADER)
        return dict(sorted(responses.items()))
