"""Errors of the REST API as RFC 9457 problem details.

Every error body is ``{"type", "title", "status", "detail"}`` (plus ``code``, a
stable machine-readable name, and ``errors`` with the per-field messages of a
validation error), served as ``application/problem+json``.

``problem_exception_handler`` is the DRF exception handler. api.base's views use it
whatever the settings say; ``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` names it too, so
every DRF view (the schema views included) answers the same way. Errors raised
outside DRF on an ``/api/`` path (no route, a body over the limit before any view
ran, Django's own 500 page) are turned into the same shape by
``api.middleware.ApiProblemMiddleware``, which uses ``problem_response`` below.

Service-layer errors are translated here, so views can let them propagate:
tenancy Forbidden → 403, TenancyError → 400, a cron trigger's TriggerError, a refused
start's InvalidStart, a refused secret's InvalidSecret and a refused webhook endpoint's
InvalidWebhook → 400 naming its field (an input
that a workflow's input schema refuses: one ``errors.input`` entry per violation, and
``violations``, a list of {"path": JSON pointer, "message", "keyword"}), a missing
(or another organization's) object → 404, a body over the limit → 413, an organization's
quota (tenancy.limits.QuotaExceeded) → 429 with Retry-After for the runs-per-minute
quota, else 422, both with code ``quota_exceeded`` and the members ``limit``,
``allowed`` and ``used``. Like DRF, a handled error rolls the request's transaction back
(ATOMIC_REQUESTS), except a refused authentication (401): nothing was written before
it but its ``api_key.auth_failed`` audit record, which is kept. Anything else is a
bug: it is logged, reported to Django's ``got_request_exception`` signal (so the
test client re-raises it and error reporters see it), the request's transaction is
rolled back, and the client gets a 500 problem that names the request id — never a
traceback.
"""

from __future__ import annotations

import logging
import math
import sys
from http import HTTPStatus
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.core.signals import got_request_exception
from django.db import connections
from django.http import Http404, HttpResponse
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from api.authentication import unsupported_scheme_detail
from engine.services import InvalidStart
from engine.triggers import TriggerError
from engine.webhooks import InvalidWebhook
from tenancy.limits import QuotaExceeded
from tenancy.permissions import Forbidden
from tenancy.services import TenancyError
from tenancy.vault import InvalidSecret

logger = logging.getLogger("api.errors")

PROBLEM_CONTENT_TYPE = "application/problem+json"
# RFC 9457: "about:blank" says the problem is no more than its HTTP status; the
# ``code`` extension member tells our problems apart.
PROBLEM_TYPE = "about:blank"
UNEXPECTED_DETAIL = "An unexpected error occurred. It has been logged; quote the request id when reporting it."


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


class Gone(exceptions.APIException):
    """410: the resource existed but its stored content is no longer available (an
    offloaded output whose bytes are missing from the storage)."""

    status_code = status.HTTP_410_GONE
    default_detail = "The resource is no longer available."
    default_code = "gone"


class FieldConflict(exceptions.ValidationError):
    """409 naming the field whose value clashes with an existing object (a taken
    name, an address that is already a member): a problem with ``errors``."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class FieldTooLarge(exceptions.ValidationError):
    """413 naming the field whose value is over its size limit (a worker's output, say):
    a problem with ``errors`` and the code ``payload_too_large``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


class PayloadTooLarge(exceptions.APIException):
    """413: the request body is larger than ``settings.FLOWFORGE_MAX_BODY_BYTES``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class QuotaProblem(exceptions.APIException):
    """An organization's quota refused the request (tenancy.limits.QuotaExceeded): 429
    with Retry-After (whole seconds, rounded up) when waiting helps (runs per minute),
    else 422 (stored definitions size). The problem names the quota (``limit``), its
    value (``allowed``) and what is in use (``used``)."""

    default_code = "quota_exceeded"

    def __init__(self, exc: QuotaExceeded):
        super().__init__(str(exc), code="quota_exceeded")
        self.quota = exc
        if exc.retry_after_seconds is not None:
            self.status_code = status.HTTP_429_TOO_MANY_REQUESTS
            self.wait = max(1, math.ceil(exc.retry_after_seconds))  # DRF sends it as Retry-After
        else:
            self.status_code = status.HTTP_422_UNPROCESSABLE_ENTITY


def body_too_large_detail() -> str:
    from django.conf import settings

    return f"The request body is larger than the limit of {settings.FLOWFORGE_MAX_BODY_BYTES} bytes."


def _raised_by_json_parser(exc: BaseException) -> bool:
    """True when ``exc`` was raised while DRF's JSONParser decoded a body."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "parse" and code.co_filename.replace("\\", "/").endswith("rest_framework/parsers.py"):
            return True
        tb = tb.tb_next
    return False


def _translate(exc: Exception) -> Exception:
    """Service-layer and Django errors as the DRF exceptions with the right status."""
    if isinstance(exc, Forbidden):
        return exceptions.PermissionDenied(str(exc))
    if isinstance(exc, TenancyError):
        return InvalidRequest(str(exc))
    if isinstance(exc, TriggerError | InvalidStart | InvalidSecret | InvalidWebhook):
        violations = getattr(exc, "violations", None)
        if violations:  # an input a workflow's input_schema refuses: one entry per violation
            return exceptions.ValidationError({exc.field: [f"{v['path'] or '(input)'}: {v['message']}"
                                                           for v in violations]})
        return exceptions.ValidationError({exc.field: [exc.message]})
    if isinstance(exc, QuotaExceeded):
        return QuotaProblem(exc)
    if isinstance(exc, ObjectDoesNotExist | Http404):
        # Same body whatever the model or reason: never confirm another tenant's ids, nor
        # name the model (get_object_or_404's Http404 says "No WorkflowRun matches ...").
        return exceptions.NotFound()
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(body_too_large_detail())
    if isinstance(exc, RecursionError) and _raised_by_json_parser(exc):
        # json.load gives up on deeply nested arrays with RecursionError, not ValueError.
        return exceptions.ParseError("JSON parse error - the document is nested too deeply.")
    return exc


def _code(exc: Exception, data) -> str:
    if isinstance(exc, FieldConflict):
        return "conflict"
    if isinstance(exc, FieldTooLarge):
        return "payload_too_large"
    if isinstance(exc, exceptions.ValidationError):
        return "invalid"
    detail = data.get("detail") if isinstance(data, dict) else None
    return getattr(detail, "code", None) or getattr(exc, "default_code", None) or "error"


def problem_body(status_code: int, detail: str, *, code: str, errors: dict | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The problem document for ``status_code`` (``title`` is the status's reason phrase)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE,
        "title": HTTPStatus(status_code).phrase,
        "status": status_code,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return body


def problem_response(status_code: int, detail: str, *, code: str, errors: dict | None = None,
                     headers: dict[str, str] | None = None, **extra: Any) -> HttpResponse:
    """A plain Django response holding a problem document (for code outside DRF),
    serialized as DRF's JSONRenderer serializes the problems of DRF views."""
    body = problem_body(status_code, detail, code=code, errors=errors, **extra)
    response = HttpResponse(JSONRenderer().render(body), status=status_code, content_type=PROBLEM_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _unexpected(exc: Exception, context: dict) -> Response:
    """The last resort: a 500 problem for an exception nothing above knew.

    Rolls the request's transaction back (ATOMIC_REQUESTS would otherwise commit
    whatever the view did before it failed), logs the traceback and sends Django's
    ``got_request_exception`` — the signal the test client listens to, so a test
    that provokes a bug fails with that bug's traceback instead of passing on a
    tidy 500.
    """
    set_rollback()
    drf_request = context.get("request")
    django_request = getattr(drf_request, "_request", drf_request)
    request_id = getattr(django_request, "request_id", "") or ""
    logger.error("unhandled %s in %s (request id %s)", type(exc).__name__,
                 getattr(django_request, "path", "?"), request_id, exc_info=exc)
    if sys.exc_info()[1] is exc:  # inside DRF's ``except`` block: receivers read sys.exc_info()
        got_request_exception.send(sender=None, request=django_request)
    response = Response(
        problem_body(500, UNEXPECTED_DETAIL, code="server_error", request_id=request_id),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
    response.content_type = PROBLEM_CONTENT_TYPE
    # Logged above with its traceback: Django's log_response need not log it again.
    response._has_been_logged = True
    return response


def _rollback_flags() -> list:
    """(connection, needs_rollback) of each connection in a request transaction."""
    return [(db, db.needs_rollback) for db in connections.all(initialized_only=True)
            if db.settings_dict["ATOMIC_REQUESTS"] and db.in_atomic_block]


def problem_exception_handler(exc: Exception, context: dict):
    """DRF exception handler producing problem+json, for every exception (an
    unexpected one becomes a logged 500 problem, see ``_unexpected``)."""
    # An input refused by a workflow's input_schema (engine.services.InvalidInput, or a
    # trigger's TriggerError on input) also lists its violations as objects.
    violations = getattr(exc, "violations", None) if isinstance(exc, TriggerError | InvalidStart) else None
    exc = _translate(exc)
    if isinstance(exc, exceptions.NotAuthenticated):
        # Credentials were sent, only in a scheme no class accepts: say so, not "not provided".
        detail = unsupported_scheme_detail(context.get("request"))
        if detail is not None:
            replaced = exceptions.NotAuthenticated(detail)
            replaced.auth_header = getattr(exc, "auth_header", None)  # DRF's WWW-Authenticate value
            exc = replaced
    keep = _rollback_flags() if isinstance(exc, exceptions.AuthenticationFailed | exceptions.NotAuthenticated) else None
    response = drf_exception_handler(exc, context)
    if keep is not None:
        # DRF marks the request's transaction for rollback on every handled error. A
        # refused authentication wrote nothing but its audit record (api_key.auth_failed,
        # tenancy.apikeys), which must survive the 401: put the flags back as they were.
        for db, needs_rollback in keep:
            db.set_rollback(needs_rollback)
    if response is None:
        return _unexpected(exc, context)
    data = response.data
    problem = problem_body(response.status_code, "", code=_code(exc, data))
    if isinstance(exc, exceptions.ValidationError):
        problem["detail"] = ("The request conflicts with existing data; see errors." if isinstance(exc, FieldConflict)
                             else "A field is over its size limit; see errors." if isinstance(exc, FieldTooLarge)
                             else "The request is invalid; see errors.")
        problem["errors"] = data if isinstance(data, dict) else {"non_field_errors": data}
        if violations:
            problem["violations"] = violations
    elif isinstance(data, dict) and "detail" in data:
        problem["detail"] = str(data["detail"])
        if isinstance(exc, QuotaProblem):
            problem.update(limit=exc.quota.limit, allowed=exc.quota.allowed, used=exc.quota.used)
            if exc.quota.retry_after_seconds is not None:
                problem["retry_after_seconds"] = round(exc.quota.retry_after_seconds, 3)
    else:
        problem["detail"] = str(data)
    response.data = problem
    request = context.get("request")
    renderer = getattr(request, "accepted_renderer", None)
    if renderer is None or getattr(renderer, "format", None) == "json":
        response.content_type = PROBLEM_CONTENT_TYPE
    return response
