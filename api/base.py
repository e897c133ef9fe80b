"""The one base class of the REST API's views (after PostHog's TeamAndOrgViewSetMixin).

``OrganizationAPIView.initial()`` authenticates the request, resolves the
organization and the caller's effective role into ``request.actor``, and checks the
action the view declares for the HTTP method, before any handler runs. Subclasses:

- implement ``get_scoped_queryset(self)`` — built from
  ``Model.objects.for_organization(self.organization)``;
- declare ``required_action = {"GET": Action.READ, "POST": Action.RUN_OPERATE, ...}``
  for every handler they define;
- read one object by id with the access helpers (engine.access, tenancy.access:
  ``access_run(self.actor, pk)`` and siblings — a 404 for a missing id and for another
  organization's, the same response, shared with the web UI) and lists with
  ``self.get_queryset()``; query parameters with ``validated_query``.

They may not define the methods and attributes in ``PROTECTED``: defining one raises
TypeError when the class is created, so no view can skip authentication,
organization resolution, the permission check or the scoping by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rest_framework.exceptions import MethodNotAllowed, NotAuthenticated, NotFound, Throttled
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer

from api import exceptions as api_exceptions
from api.authentication import ApiKeyAuthentication, CsrfSessionAuthentication
from api.permissions import HANDLED_METHODS, action_for_method, require_action
from tenancy.actors import Actor
from tenancy.apikeys import AuthenticatedKey
from tenancy.context import OrganizationNotFound, OrganizationRequired, resolve_membership
from tenancy.models import User
from tenancy.permissions import Action

# Names a subclass must not define: the security pipeline and the scoped accessors.
PROTECTED = frozenset({
    "initial",
    "initialize_request",
    "perform_authentication",
    "get_authenticators",
    "authentication_classes",
    "check_permissions",
    "check_object_permissions",
    "check_throttles",
    "throttled",
    "get_permissions",
    "permission_classes",
    "get_exception_handler",
    "get_queryset",
    "get_object",
    "queryset",
    "resolve_actor",
})


def validated_query(request, serializer_class) -> dict:
    """The request's query parameters validated by ``serializer_class`` (empty values
    count as absent). Raises ValidationError (a 400 naming the parameter) otherwise."""
    data = {k: v for k, v in request.query_params.items() if v != ""}
    filters = serializer_class(data=data)
    filters.is_valid(raise_exception=True)
    return filters.validated_data


def resolve_actor(request) -> Actor:
    """The Actor of an authenticated API request (channel "api").

    An API key fixes the organization and acts with its effective role. A session
    user acts through tenancy.context.resolve_membership: OrganizationRequired
    becomes a 400 that says how to choose, OrganizationNotFound a 404.
    """
    if isinstance(request.auth, AuthenticatedKey):
        key = request.auth
        return Actor(organization=key.organization, role=key.effective_role, api_key=key, channel="api")
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        raise NotAuthenticated()
    try:
        membership = resolve_membership(request, user)
    except OrganizationRequired as exc:
        raise api_exceptions.OrganizationRequired(str(exc)) from exc
    except OrganizationNotFound as exc:
        raise NotFound("No such organization.") from exc
    return Actor(organization=membership.organization, role=membership.role, user=user, channel="api")


class OrganizationAPIView(GenericAPIView):
    """Base of every FlowForge API view: see the module docstring."""

    authentication_classes = [ApiKeyAuthentication, CsrfSessionAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]
    # JSON bodies only: a form or multipart body is a 415, not silently parsed.
    parser_classes = [JSONParser]
    # No OPTIONS metadata: DRF's would describe serializers we do not declare (OPTIONS → 405).
    metadata_class = None
    # Upper-case HTTP method → the tenancy Action it needs. Every handler needs an entry.
    required_action: ClassVar[Mapping[str, Action]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        overridden = PROTECTED & set(vars(cls))
        if overridden:
            raise TypeError(
                f"{cls.__qualname__} may not define {', '.join(sorted(overridden))}: "
                "OrganizationAPIView owns authentication, organization resolution, permissions and scoping; "
                "implement get_scoped_queryset() and declare required_action instead"
            )
        missing = [m.upper() for m in HANDLED_METHODS if hasattr(cls, m) and m.upper() not in cls.required_action]
        if missing:
            raise TypeError(f"{cls.__qualname__}.required_action names no action for {', '.join(missing)}")

    # --- the pipeline (final: PROTECTED) -----------------------------------------------------

    def initial(self, request, *args, **kwargs):
        """Authenticate (401), require an authenticated caller, resolve ``request.actor``
        (400/404 for a session user who did not or could not choose an organization),
        apply the rate limits (429: the caller's and its organization's), then check the
        method's required action (403). Final by convention and by ``__init_subclass__``."""
        super().initial(request, *args, **kwargs)  # authentication, IsAuthenticated, check_throttles
        if not getattr(request, "_ff_actor_resolved", False):
            request.actor = resolve_actor(request)
        if not hasattr(self, request.method.lower()):
            # No handler: a 405 (after authentication), not a 403 for a missing action.
            raise MethodNotAllowed(request.method)
        require_action(request.actor, action_for_method(self.required_action, request.method))

    def check_throttles(self, request):
        """Resolve ``request.actor`` first: the rate limit counts per organization as well
        as per caller (api.throttling), and a session's organization is known only then.
        DRF calls this after authentication and the IsAuthenticated check."""
        request.actor = resolve_actor(request)
        request._ff_actor_resolved = True
        super().check_throttles(request)

    def throttled(self, request, wait):
        """A 429 whose detail says which budget was spent (api.throttling sets it)."""
        raise Throttled(wait=wait, detail=getattr(request, "throttle_detail", None))

    def get_exception_handler(self):
        return api_exceptions.problem_exception_handler

    def get_queryset(self):
        """The subclass's ``get_scoped_queryset()``; refuses to run without an actor."""
        if getattr(self.request, "actor", None) is None:
            raise RuntimeError("get_queryset() before the actor was resolved")
        return self.get_scoped_queryset()

    def get_object(self):
        """The object named by the URL among ``get_scoped_queryset()``; 404 (the same
        response) when it does not exist or belongs to another organization."""
        return super().get_object()

    # --- for subclasses -------------------------------------------------------------------------

    @property
    def actor(self) -> Actor:
        return self.request.actor

    @property
    def organization(self):
        return self.request.actor.organization

    def get_scoped_queryset(self):
        """The rows this view may show: start from ``Model.objects.for_organization(self.organization)``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement get_scoped_queryset()")
