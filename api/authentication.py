"""DRF authentication for the REST API: API keys (``Authorization: Bearer ffk_...``)
and the browser session (with CSRF enforced).

Order matters (settings.REST_FRAMEWORK and api.base): the API key class is first, so
an unauthenticated request gets 401 with ``WWW-Authenticate: Bearer``, and a request
that carries a key is judged by the key alone, whatever session cookie it also has.
"""

from __future__ import annotations

from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled

from api import throttling
from flowforge.middleware import client_ip
from tenancy import apikeys
from tenancy.apikeys import AuthenticatedKey

# One message for every failure (malformed, unknown, wrong, expired, revoked, creator
# gone): the response must not tell an attacker which prefixes exist.
INVALID_KEY_MESSAGE = "Invalid API key."


# Longest scheme name echoed back in UNSUPPORTED_SCHEME_MESSAGE (the header is the caller's).
MAX_SCHEME_SHOWN = 40
UNSUPPORTED_SCHEME_MESSAGE = (
    "Unsupported authorization scheme {scheme!r}; send the API key as 'Authorization: Bearer <key>'."
)
# A header of one word (a bare key, or a scheme without credentials): nothing is echoed,
# since the word may be a secret.
MALFORMED_HEADER_MESSAGE = (
    "Malformed Authorization header: expected a scheme and a key; "
    "send the API key as 'Authorization: Bearer <key>'."
)


def unsupported_scheme_detail(request) -> str | None:
    """The 401 detail for a request that no authentication class accepted although it
    has an ``Authorization`` header of a scheme other than Bearer (``Token <key>``,
    ``Basic ...``: the scheme is named) or of one word or starting with a key (the
    header is called malformed, without echoing it), or None when it has no such header.

    Used by api.exceptions in place of DRF's "Authentication credentials were not
    provided." only once every class has declined, so a browser session still works
    behind a proxy that adds its own ``Authorization: Basic`` header.
    """
    if request is None:
        return None
    parts = get_authorization_header(request).split()
    if not parts or parts[0].lower() == ApiKeyAuthentication.keyword:
        return None
    scheme = parts[0].decode("latin-1")
    if len(parts) == 1 or scheme.lower().startswith(f"{apikeys.KEY_SCHEME}_"):
        return MALFORMED_HEADER_MESSAGE
    if len(scheme) > MAX_SCHEME_SHOWN:
        scheme = scheme[:MAX_SCHEME_SHOWN] + "…"
    return UNSUPPORTED_SCHEME_MESSAGE.format(scheme=scheme)


class ApiKeyPrincipal:
    """``request.user`` of a request authenticated by an API key.

    Deliberately not a User: code that reaches for ``request.user`` to find
    memberships fails loudly instead of acting with the creator's other
    organizations. Use ``request.actor`` (api.base) or ``request.auth`` (the
    AuthenticatedKey).
    """

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, key: AuthenticatedKey):
        self.api_key = key

    def __str__(self) -> str:
        return f"API key {self.api_key}"


class ApiKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer ffk_<prefix>_<secret>`` → (ApiKeyPrincipal, AuthenticatedKey).

    No Authorization header or another scheme: not this class's business (None; the
    session may still authenticate, and if nothing does, the 401 names the scheme:
    ``unsupported_scheme_detail``). A
    Bearer header that does not verify, for whatever reason: AuthenticationFailed with
    INVALID_KEY_MESSAGE (401). An address past FLOWFORGE_API_KEY_FAILURES_PER_MINUTE
    failures this minute: Throttled (429 with Retry-After), without verifying.
    """

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        ip = client_ip(request)
        wait = throttling.failed_key_wait(ip)
        if wait is not None:
            # Before any verification: a guessing address costs no Argon2 work.
            # DRF adds "Expected available in N seconds." to the detail (and Retry-After).
            raise Throttled(wait=wait, detail="Too many failed API key attempts from this address.")
        key = None
        if len(parts) == 2:
            try:
                key = apikeys.authenticate(parts[1].decode("ascii"))
            except UnicodeDecodeError:
                key = None
        if key is None:
            throttling.record_failed_key(ip)
            raise AuthenticationFailed(INVALID_KEY_MESSAGE)
        return ApiKeyPrincipal(key), key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class CsrfSessionAuthentication(SessionAuthentication):
    """The signed-in browser session; unsafe methods need a valid CSRF token (403 otherwise).

    DRF's views are csrf_exempt, so Django's middleware does not check them: this
    class is where the check happens. It is spelled out here rather than inherited
    silently so a reader (and a test) sees that session-authenticated writes are
    CSRF-protected.
    """

    def authenticate(self, request):
        user = getattr(request._request, "user", None)
        if user is None or not user.is_authenticated or not user.is_active:
            return None
        self.enforce_csrf(request)  # raises PermissionDenied("CSRF Failed: ...") for an unsafe method
        return user, None
