"""Problem details for every error on an ``/api/`` path, including those no DRF view
produced (RFC 9457; the DRF side is api.exceptions.problem_exception_handler).

``ApiProblemMiddleware`` sits near the top of ``settings.MIDDLEWARE`` (after the
request id middleware, so its responses carry ``X-Request-ID`` too) and, for
``/api/`` paths only:

- refuses a body over ``settings.FLOWFORGE_MAX_BODY_BYTES`` from its
  ``Content-Length`` before anything reads it (413);
- refuses a malformed ``Content-Length`` (400) and a body without a
  ``Content-Type`` on POST/PUT/PATCH (415: DRF would silently read it as ``{}``);
- reads the body through ``request.body``, so Django's own limit
  (``DATA_UPLOAD_MAX_MEMORY_SIZE``, which is FLOWFORGE_MAX_BODY_BYTES unless a
  deployment sets them apart) applies to what DRF's parsers see: left alone they read
  the raw WSGI stream, which Django does not check, and ``RequestDataTooBig`` would
  never be raised for a JSON body (413 when it is);
- turns ``RequestDataTooBig`` raised later by a non-DRF view into a 413 problem
  (in a DRF view, api.exceptions does the same);
- rewrites any other error response that is not already JSON (Django's 404 page for
  an unknown path, its 400 and 500 pages, a template-rendered DRF error) into a
  problem with the same status (a 404's code is ``not_found``, as a DRF view's),
  keeping ``Allow``, ``Retry-After`` and ``WWW-Authenticate``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import UnreadablePostError

from api.exceptions import UNEXPECTED_DETAIL, body_too_large_detail, problem_response

API_PREFIX = "/api/"
# Methods whose body DRF parses.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Headers of an error response worth keeping when it is rewritten as a problem.
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "X-Request-ID")
DETAILS = {
    400: "The request could not be understood.",
    403: "You do not have permission to perform this action.",
    404: "There is no API endpoint at this path.",
    405: "The method is not allowed for this endpoint.",
    500: UNEXPECTED_DETAIL,
}
# The ``code`` of a rewritten error: DRF's own code where a DRF view answers the same status.
CODES = {404: "not_found"}


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIX)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class ApiProblemMiddleware:
    """See the module docstring."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not is_api_path(request.path_info):
            return self.get_response(request)
        refused = self.check_body(request)
        if refused is not None:
            return refused
        return self.as_problem(request, self.get_response(request))

    @staticmethod
    def check_body(request):
        """A problem response when the request's body is refused up front, else None."""
        raw = request.META.get("CONTENT_LENGTH") or ""
        if not raw.strip():
            return None
        try:
            length = int(raw)
            if length < 0:
                raise ValueError(raw)
        except ValueError:
            return problem_response(400, "The Content-Length header is not a number of bytes.",
                                    code="invalid_content_length")
        if length > settings.FLOWFORGE_MAX_BODY_BYTES:
            return problem_response(413, body_too_large_detail(), code="payload_too_large")
        if not length:
            return None
        if request.method in BODY_METHODS and not request.META.get("CONTENT_TYPE"):
            return problem_response(415, "A request body needs a Content-Type header: send application/json.",
                                    code="unsupported_media_type")
        try:
            # Read through request.body, where Django enforces DATA_UPLOAD_MAX_MEMORY_SIZE
            # (and, under ASGI, catches a body longer than its Content-Length). DRF's
            # parsers then read this buffered copy instead of the raw stream, which
            # Django does not limit. A parser reads the whole body anyway: no extra cost.
            request.body  # noqa: B018
        except RequestDataTooBig:
            return problem_response(413, body_too_large_detail(), code="payload_too_large")
        except UnreadablePostError:
            return problem_response(400, "The request body could not be read.", code="unreadable_body")
        return None

    def process_exception(self, request, exception):
        if is_api_path(request.path_info) and isinstance(exception, RequestDataTooBig):
            return problem_response(413, body_too_large_detail(), code="payload_too_large")
        return None

    @staticmethod
    def as_problem(request, response):
        """``response`` itself, or a problem with its status when it is an error that is not JSON."""
        if response.status_code < 400 or getattr(response, "streaming", False):
            return response
        if _is_json(response.get("Content-Type", "")):
            return response
        status = response.status_code
        extra = {"request_id": getattr(request, "request_id", "")} if status >= 500 else {}
        problem = problem_response(
            status,
            DETAILS.get(status, "The request failed."),
            code="server_error" if status >= 500 else CODES.get(status, "error"),
            headers={name: response[name] for name in KEPT_HEADERS if response.has_header(name)},
            **extra,
        )
        # Keep what Django decided about logging and cookies (e.g. a session it saved).
        problem.cookies = response.cookies
        if getattr(response, "_has_been_logged", False):
            problem._has_been_logged = True
        return problem
