"""The organization's webhook endpoints (issue 19): list and create, one endpoint's settings and
delivery log (each attempt's status, latency, error and the start of the answer), a
delivery's detail with the body it sends, replay, secret rotation and deletion. Owners and
admins only (webhook.manage: a 403 for the others, whose header does not show the link, as
for API keys); another organization's endpoint or delivery is a 404.

The signing secret is shown once, on the response to the create or rotate request (marked
no-store), never put in the session, a message or a redirect. Each such form carries a
one-time token, so reloading that page does not create a second endpoint or rotate again.
Also here: the workflow page's "Email me when it fails" toggle (any member, for themselves).
"""

from __future__ import annotations

import json
import secrets
import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from engine import notifications
from engine.access import access_delivery, access_endpoint, access_workflow
from engine.models import WebhookEndpoint, Workflow
from engine.notifications import InvalidWebhook, ReplayRefused
from engine.webhooks import event_body
from frontend.forms_notifications import FailureEmailsForm, RotateSecretForm, WebhookForm
from frontend.organization import organization_required
from frontend.paging import BadCursor, newest_first_page, page_links
from frontend.views.workflows import authorize
from tenancy.limits import QuotaExceeded
from tenancy.models import without_credentials
from tenancy.permissions import Action, Forbidden

# Deliveries per page of an endpoint's log.
DELIVERY_PAGE_SIZE = 25
FORM_TOKENS_SESSION_KEY = "webhook_form_tokens"
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


def _endpoint_or_404(request: HttpRequest, endpoint_id: uuid.UUID) -> WebhookEndpoint:
    return access_endpoint(request.membership.organization, endpoint_id,
                           shape=lambda qs: without_credentials(qs.defer("secret_ciphertext", "previous_secret_ciphertext"),
                                                                 "created_by", "created_by_api_key"))


def _apply_error(form, exc: Exception) -> None:
    """Put a refused change on the form field it names."""
    if isinstance(exc, InvalidWebhook):
        field = exc.field if exc.field in form.fields else None
        text = exc.message
        form.add_error(field, text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."))
    else:
        form.add_error(None, str(exc))


def _shown_secret(request: HttpRequest, endpoint: WebhookEndpoint, secret: str, *, created: bool) -> HttpResponse:
    response = render(request, "frontend/webhooks/secret.html",
                      {"endpoint": endpoint, "secret": secret, "created": created}, status=201 if created else 200)
    response["Cache-Control"] = "no-store"
    return response


# How many of the organization's workflow names the form's filter offers as suggestions.
WORKFLOW_NAME_SUGGESTIONS = 500


def _offer_workflow_names(form: WebhookForm, organization) -> list[str]:
    """The organization's workflow names (any version or state, as the filter accepts), in
    order, for the filter's suggestion list; ties the field to that list. One query."""
    form.fields["workflow_name"].widget.attrs["list"] = "webhook-workflow-names"
    return list(Workflow.objects.for_organization(organization).order_by("name").values_list("name", flat=True)
                .distinct()[:WORKFLOW_NAME_SUGGESTIONS])


def _render_list(request: HttpRequest, form: WebhookForm, *, status: int = 200) -> HttpResponse:
    org = request.membership.organization
    context = {
        "workflow_names": _offer_workflow_names(form, org),
        "organization": org,
        "endpoints": list(without_credentials(notifications.endpoints_of(org), "created_by", "created_by_api_key")),
        "form": form,
        "form_token": _issue_form_token(request),
    }
    return render(request, "frontend/webhooks/list.html", context, status=status)


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def webhook_list(request: HttpRequest) -> HttpResponse:
    """GET: the endpoints and the create form. POST: create one and show its secret once."""
    actor = request.actor
    authorize(actor.role, Action.WEBHOOK_MANAGE)
    if request.method == "GET":
        return _render_list(request, WebhookForm())
    if not _use_form_token(request):
        messages.info(request, "That form was already sent or is no longer valid, so no endpoint was created now. "
                      "An endpoint it created before is listed here; its secret was shown once: rotate it to "
                      "get a new one.")
        return redirect("frontend:webhooks")
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            endpoint, secret = notifications.create_endpoint(actor=actor, **form.cleaned_data)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except (InvalidWebhook, QuotaExceeded) as exc:
            _apply_error(form, exc)
        else:
            return _shown_secret(request, endpoint, secret, created=True)
    return _render_list(request, form, status=400)


def _render_detail(request: HttpRequest, endpoint: WebhookEndpoint, form: WebhookForm | None = None, *,
                   status: int = 200) -> HttpResponse:
    org = request.membership.organization
    deliveries = notifications.deliveries_of(org, endpoint.pk)
    notice = None
    try:
        page = newest_first_page(deliveries, older_than=request.GET.get("older_than"),
                                 newer_than=request.GET.get("newer_than"), size=DELIVERY_PAGE_SIZE)
    except BadCursor:
        notice = "That page link is not valid any more; showing the newest deliveries."
        page = newest_first_page(deliveries, older_than=None, newer_than=None, size=DELIVERY_PAGE_SIZE)
    for delivery in page.rows:
        delivery.last_attempt = (list(delivery.attempt_log.all()) or [None])[-1]
    if form is None:
        form = WebhookForm(initial={"url": endpoint.url, "event_types": endpoint.event_types,
                                    "workflow_name": endpoint.workflow_name, "description": endpoint.description,
                                    "enabled": endpoint.enabled})
    context = {
        "workflow_names": _offer_workflow_names(form, org),
        "endpoint": endpoint,
        "form": form,
        "deliveries": page.rows,
        "links": page_links(request, page),
        "notice": notice,
    }
    return render(request, "frontend/webhooks/detail.html", context, status=status)


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def webhook_detail(request: HttpRequest, endpoint_id: uuid.UUID) -> HttpResponse:
    """GET: the endpoint's settings and its delivery log (newest first, keyset pages).
    POST: change its settings."""
    endpoint = _endpoint_or_404(request, endpoint_id)
    authorize(request.actor.role, Action.WEBHOOK_MANAGE)
    if request.method == "GET":
        return _render_detail(request, endpoint)
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            notifications.update_endpoint(actor=request.actor, endpoint=endpoint, data=form.cleaned_data)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except InvalidWebhook as exc:
            _apply_error(form, exc)
        else:
            messages.success(request, "Saved the endpoint's settings.")
            return redirect("frontend:webhook_detail", endpoint_id=endpoint.pk)
    return _render_detail(request, endpoint, form, status=400)


@never_cache
@require_http_methods(["GET", "POST"])
@organization_required
def webhook_rotate(request: HttpRequest, endpoint_id: uuid.UUID) -> HttpResponse:
    """GET: confirm, with how long the current secret keeps signing. POST: rotate and show
    the new secret once."""
    endpoint = _endpoint_or_404(request, endpoint_id)
    authorize(request.actor.role, Action.WEBHOOK_MANAGE)
    form = RotateSecretForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        if not _use_form_token(request):
            messages.info(request, "That form was already sent or is no longer valid, so the secret was not "
                          "rotated now. A rotation it made before showed the new secret once.")
            return redirect("frontend:webhook_detail", endpoint_id=endpoint.pk)
        if form.is_valid():
            try:
                endpoint, secret = notifications.rotate_secret(
                    actor=request.actor, endpoint=endpoint,
                    previous_valid_seconds=form.cleaned_data["previous_valid_seconds"])
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            return _shown_secret(request, endpoint, secret, created=False)
    return render(request, "frontend/webhooks/rotate.html",
                  {"endpoint": endpoint, "form": form, "form_token": _issue_form_token(request)},
                  status=400 if request.method == "POST" else 200)


@require_http_methods(["GET", "POST"])
@organization_required
def webhook_delete(request: HttpRequest, endpoint_id: uuid.UUID) -> HttpResponse:
    """GET: ask to confirm; POST: delete the endpoint and its delivery log."""
    endpoint = _endpoint_or_404(request, endpoint_id)
    authorize(request.actor.role, Action.WEBHOOK_MANAGE)
    if request.method == "GET":
        return render(request, "frontend/webhooks/delete.html", {"endpoint": endpoint})
    try:
        notifications.delete_endpoint(actor=request.actor, endpoint=endpoint)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, "Deleted the webhook endpoint and its delivery log.")
    return redirect("frontend:webhooks")


@never_cache
@require_http_methods(["GET"])
@organization_required
def webhook_delivery(request: HttpRequest, endpoint_id: uuid.UUID, delivery_id: uuid.UUID) -> HttpResponse:
    """One delivery: its attempts and the JSON body it sends."""
    authorize(request.actor.role, Action.WEBHOOK_MANAGE)
    org = request.membership.organization
    found = access_delivery(org, endpoint_id, delivery_id)
    delivery = notifications.deliveries_of(org, endpoint_id).select_related("endpoint").get(pk=found.pk)
    event = delivery.event
    body = event_body(event_id=event.pk, event_type=event.type, created_at=event.created_at, payload=event.payload)
    pretty = json.dumps(json.loads(body), indent=2, sort_keys=True, ensure_ascii=False)
    return render(request, "frontend/webhooks/delivery.html",
                  {"endpoint": delivery.endpoint, "delivery": delivery, "body": pretty})


@require_POST
@organization_required
def webhook_delivery_replay(request: HttpRequest, endpoint_id: uuid.UUID, delivery_id: uuid.UUID) -> HttpResponse:
    """Deliver a finished delivery's event again (a new delivery), then back to the log."""
    delivery = access_delivery(request.membership.organization, endpoint_id, delivery_id)
    authorize(request.actor.role, Action.WEBHOOK_MANAGE)
    try:
        notifications.replay_delivery(actor=request.actor, delivery=delivery)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except ReplayRefused as exc:
        messages.error(request, f"Not replayed: {exc}.")
    else:
        messages.success(request, "Replaying the delivery: the event is sent again with the same id.")
    return redirect("frontend:webhook_detail", endpoint_id=endpoint_id)


@require_POST
@organization_required
def workflow_failure_emails(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """The workflow page's toggle: email the signed-in member when a run of this workflow
    (any version) fails, or stop."""
    workflow = access_workflow(request.membership.organization, workflow_id)
    form = FailureEmailsForm(request.POST)
    if form.is_valid():
        on = form.cleaned_data["subscribe"]
        try:
            notifications.set_failure_subscription(actor=request.actor, workflow_name=workflow.name, subscribed=on)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except QuotaExceeded as exc:
            messages.error(request, str(exc))
        else:
            if on:
                messages.success(request, f"You will get an email at {request.user.email} when a run of "
                                 f"{workflow.name} fails.")
            else:
                messages.success(request, f"You will no longer get emails about failed runs of {workflow.name}.")
    return redirect("frontend:workflow_detail", workflow_id=workflow.pk)
