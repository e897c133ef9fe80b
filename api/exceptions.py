"""Errors of the REST API as RFC 9457 problem details.

Every error body is ``{"type", "title", "status", "detail"}`` (plus ``code``, a
stable machine-readable name, and ``errors`` with the per-field messages of a
validation error), served as ``application/problem+json``.

``problem_exception_handler`` is the DRF exception handler. api.base's views use it
whatever the settings say; to give every DRF view the same shape set
``REST_FRAMEWORK["EXCEPTION_HANDLER"] = "api.exceptions.problem_exception_handler"``.

Service-layer errors are translated here, so views can let them propagate:
tenancy Forbidden → 403, TenancyError → 400, a missing (or another organization's)
object → 404.
"""

from __future__ import annotations

from http import HTTPStatus

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import exceptions, status
from rest_framework.views import exception_handler as drf_exception_handler

from tenancy.permissions import Forbidden
from tenancy.services import TenancyError

PROBLEM_CONTENT_TYPE = "application/problem+json"
# RFC 9457: "about:blank" says the problem is no more than its HTTP status; the
# ``code`` extension member tells our problems apart.
PROBLEM_TYPE = "about:blank"


class InvalidRequest(exceptions.APIException):
    """400: a rule refused the request (the message says which)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request was refused."
    default_code = "invalid_request"


class OrganizationRequired(exceptions.APIException):
    """400: a signed-in user with several memberships did not say which organization."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Choose an organization with the X-Organization header."
    default_code = "organization_required"


class Conflict(exceptions.APIException):
    """409: the request is valid but the object's state does not allow it now."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the resource."
    default_code = "conflict"


def _translate(exc: Exception) -> Exception:
    """Service-layer and Django errors as the DRF exceptions with the right status."""
    if isinstance(exc, Forbidden):
        return exceptions.PermissionDenied(str(exc))
    if isinstance(exc, TenancyError):
        return InvalidRequest(str(exc))
    if isinstance(exc, ObjectDoesNotExist):
        # Same body whatever the model or reason: never confirm another tenant's ids.
        return exceptions.NotFound()
    return exc


def _code(exc: Exception, data) -> str:
    if isinstance(exc, exceptions.ValidationError):
        return "invalid"
    detail = data.get("detail") if isinstance(data, dict) else None
    return getattr(detail, "code", None) or getattr(exc, "default_code", None) or "error"


def problem_exception_handler(exc: Exception, context: dict):
    """DRF exception handler producing problem+json; None (a 500 by Django) for
    exceptions DRF does not handle either."""
    exc = _translate(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    problem = {
        "type": PROBLEM_TYPE,
        "title": HTTPStatus(response.status_code).phrase,
        "status": response.status_code,
        "detail": "",
        "code": _code(exc, data),
    }
    if isinstance(exc, exceptions.ValidationError):
        problem["detail"] = "The request body is invalid; see errors."
        problem["errors"] = data if isinstance(data, dict) else {"non_field_errors": data}
    elif isinstance(data, dict) and "detail" in data:
        problem["detail"] = str(data["detail"])
    else:
        problem["detail"] = str(data)
    response.data = problem
    request = context.get("request")
    renderer = getattr(request, "accepted_renderer", None)
    if renderer is None or getattr(renderer, "format", None) == "json":
        response.content_type = PROBLEM_CONTENT_TYPE
    return response
