"""The organization's secrets (issue 18): every member sees their names, versions and
who changed them when; owners and admins (secret.manage) also create, rotate and delete
them. No page ever shows a value: it is typed into a form, encrypted (tenancy.vault),
and only task attempts read it back. A form sent back with errors does not carry the
value either (``SecretValueInput``).

A name in the URL that the active organization has no secret of — another
organization's, or no secret name at all — is a 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from frontend.forms_workflows import SecretCreateForm, SecretRotateForm
from frontend.organization import organization_required
from frontend.views.workflows import authorize
from tenancy import vault
from tenancy.limits import QuotaExceeded
from tenancy.models import Secret, without_credentials
from tenancy.permissions import Action, Forbidden, can

SHAPE = ("created_by", "updated_by", "created_by_api_key", "updated_by_api_key")


def _secret_or_404(request: HttpRequest, name: str) -> Secret:
    """The active organization's secret ``name`` (tenancy.vault: a 404 otherwise)."""
    return vault.get_secret(request.membership.organization, name)


def _render_list(request: HttpRequest, form: SecretCreateForm | None, *, status: int = 200) -> HttpResponse:
    org = request.membership.organization
    rows = list(without_credentials(vault.secrets_of(org), *SHAPE))
    context = {
        "organization": org,
        "secrets": rows,
        "form": form,
        "can_manage": can(request.actor.role, Action.SECRET_MANAGE),
    }
    return render(request, "frontend/secrets/list.html", context, status=status)


def _apply_error(form, exc: Exception) -> None:
    """Put a refused change on the form field it concerns (never echoing the value)."""
    if isinstance(exc, vault.InvalidSecret):
        field = exc.field if exc.field in form.fields else None
        form.add_error(field, exc.message[:1].upper() + exc.message[1:] + ("" if exc.message.endswith(".") else "."))
    else:
        form.add_error(None, str(exc))


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def secret_list(request: HttpRequest) -> HttpResponse:
    """GET: the secrets (names and metadata) and, for secret.manage, the create form.
    POST (secret.manage): create a secret; a name the organization already has is
    refused here (rotating is its own page), then back to the list."""
    actor = request.actor
    authorize(actor.role, Action.READ)
    if request.method == "GET":
        return _render_list(request, SecretCreateForm() if can(actor.role, Action.SECRET_MANAGE) else None)
    authorize(actor.role, Action.SECRET_MANAGE)
    form = SecretCreateForm(request.POST)
    if form.is_valid():
        name = form.cleaned_data["name"]
        if vault.secrets_of(actor.organization).filter(name=name).exists():
            form.add_error("name", f"A secret named {name} exists already; rotate its value from the list.")
        else:
            try:
                secret, _created = vault.set_secret(actor=actor, name=name, value=form.cleaned_data["value"])
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            except (vault.InvalidSecret, QuotaExceeded) as exc:
                _apply_error(form, exc)
            else:
                messages.success(request, f"Created the secret {secret.name}. Reference it in a task's config as "
                                 f"{{{{ secrets.{secret.name} }}}}.")
                return redirect("frontend:secrets")
    return _render_list(request, form, status=400)


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def secret_rotate(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the form for a new value; POST: store it (version + 1). secret.manage."""
    secret = _secret_or_404(request, name)
    authorize(request.actor.role, Action.SECRET_MANAGE)
    form = SecretRotateForm(request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                secret, _created = vault.set_secret(actor=request.actor, name=secret.name,
                                                    value=form.cleaned_data["value"])
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            except (vault.InvalidSecret, QuotaExceeded) as exc:
                _apply_error(form, exc)
            else:
                messages.success(request, f"Rotated the secret {secret.name}: version {secret.version}. Attempts "
                                 "that start from now on use the new value.")
                return redirect("frontend:secrets")
    return render(request, "frontend/secrets/rotate.html", {"secret": secret, "form": form}, status=status)


@require_http_methods(["GET", "POST"])
@organization_required
def secret_delete(request: HttpRequest, name: str) -> HttpResponse:
    """GET: ask to confirm; POST: delete the secret. secret.manage."""
    secret = _secret_or_404(request, name)
    authorize(request.actor.role, Action.SECRET_MANAGE)
    if request.method == "GET":
        return render(request, "frontend/secrets/delete.html", {"secret": secret})
    try:
        vault.delete_secret(actor=request.actor, name=secret.name)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, f"Deleted the secret {secret.name}. Tasks that reference it fail until it is set again.")
    return redirect("frontend:secrets")
