"""API keys of the active organization: list, create (the full key is shown once,
on the response to the create request, and never again), revoke after a
confirmation step. Only roles with apikey.manage see or use these pages (403 for
the others); another organization's key id is a 404.
"""

from __future__ import annotations

import secrets
import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from frontend.forms_workflows import ApiKeyForm
from frontend.organization import organization_required
from frontend.views.workflows import authorize
from tenancy.access import access_api_key
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.models import ApiKey, without_credentials
from tenancy.permissions import Action, Forbidden
from tenancy.services import TenancyError


def _key_or_404(request: HttpRequest, key_id: uuid.UUID) -> ApiKey:
    """The active organization's API key (tenancy.access: a 404 for a missing or foreign id)."""
    return access_api_key(request.membership.organization, key_id)


# Session key of the create form's one-time tokens: a form is used once, so reloading the
# page that shows a new key (which re-sends the POST) does not create a second key.
FORM_TOKENS_SESSION_KEY = "apikey_form_tokens"
MAX_FORM_TOKENS = 10


def _issue_form_token(request: HttpRequest) -> str:
    token = secrets.token_urlsafe(16)
    tokens = request.session.get(FORM_TOKENS_SESSION_KEY, [])
    request.session[FORM_TOKENS_SESSION_KEY] = [*tokens, token][-MAX_FORM_TOKENS:]
    return token


def _use_form_token(request: HttpRequest) -> bool:
    """Consume the POSTed form token; False when it was never issued or already used."""
    token = request.POST.get("form_token", "")
    tokens = request.session.get(FORM_TOKENS_SESSION_KEY, [])
    if not token or token not in tokens:
        return False
    request.session[FORM_TOKENS_SESSION_KEY] = [t for t in tokens if t != token]
    return True


def _render_list(request: HttpRequest, form: ApiKeyForm, *, status: int = 200) -> HttpResponse:
    org = request.membership.organization
    keys = list(
        without_credentials(ApiKey.objects.for_organization(org), "created_by", "revoked_by")
        .order_by("-created_at")
    )
    context = {
        "organization": org,
        "keys": keys,
        "form": form,
        "now": timezone.now(),
        "form_token": _issue_form_token(request),
    }
    return render(request, "frontend/apikeys/list.html", context, status=status)


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def apikey_list(request: HttpRequest) -> HttpResponse:
    """GET: the keys and the create form. POST: create a key and show it once.

    The full key is only in this response (marked no-store): it is not put in the
    session, a message or a redirect, so reloading or going back cannot show it again.
    Each form carries a one-time token: sending it again (a reload of that page) creates
    no second key and leads back to the list.
    """
    actor = request.actor
    authorize(actor.role, Action.APIKEY_MANAGE)
    if request.method == "GET":
        return _render_list(request, ApiKeyForm(actor_role=actor.role))
    if not _use_form_token(request):
        messages.info(
            request,
            # A token never issued (a forged or stale form) reads the same as a used one.
            "That form was already sent or is no longer valid, so no key was created now. A key "
            "it created before is listed here; its secret was shown once and cannot be shown again.",
        )
        return redirect("frontend:apikeys")
    form = ApiKeyForm(request.POST, actor_role=actor.role)
    if form.is_valid():
        try:
            api_key, full_key = create_api_key(
                actor=actor,
                name=form.cleaned_data["name"],
                role=form.cleaned_data["role"],
                expires_at=form.expires_at,
            )
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except TenancyError as exc:
            text = str(exc)
            field = next(
                (f for f in ("name", "role") if text.startswith(f)),
                "expires_on" if "expires" in text else None,
            )
            form.add_error(field, text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."))
        else:
            response = render(
                request,
                "frontend/apikeys/created.html",
                {"api_key": api_key, "full_key": full_key},
                status=201,
            )
            response["Cache-Control"] = "no-store"
            return response
    return _render_list(request, form, status=400)


@require_http_methods(["GET", "POST"])
@organization_required
def apikey_revoke(request: HttpRequest, key_id: uuid.UUID) -> HttpResponse:
    """GET: ask to confirm; POST: revoke (idempotent). Requests with the key fail at once."""
    api_key = _key_or_404(request, key_id)
    authorize(request.actor.role, Action.APIKEY_MANAGE)
    if request.method == "GET":
        return render(request, "frontend/apikeys/revoke.html", {"api_key": api_key})
    if api_key.revoked_at is not None:
        messages.info(request, f"The key {api_key.name} was already revoked.")
        return redirect("frontend:apikeys")
    try:
        revoke_api_key(actor=request.actor, api_key=api_key)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, f"Revoked the key {api_key.name} (ffk_{api_key.prefix}_…); it no longer works.")
    return redirect("frontend:apikeys")
