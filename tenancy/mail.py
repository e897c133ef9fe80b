"""The invitation email, sent by the web UI and the API alike. The raw token goes into
the accept link of this one email and nowhere else: it is not logged, not stored and
not shown on a page. The accept page is the web UI's; it is named by its URL name
(``frontend:invitation_accept``), not imported."""

from __future__ import annotations

import logging

from django.core.mail import send_mail
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse

from tenancy.models import Invitation

logger = logging.getLogger(__name__)


def invitation_accept_url(request: HttpRequest, token: str) -> str:
    """The absolute URL of the accept page for ``token`` (host from the request,
    which ALLOWED_HOSTS has vetted)."""
    return request.build_absolute_uri(reverse("frontend:invitation_accept", kwargs={"token": token}))


def send_invitation_email(request: HttpRequest, *, invitation: Invitation, token: str, inviter=None) -> bool:
    """Mail the accept link of ``invitation`` to the invited address, from ``inviter``
    (default ``request.user``; for an API key, the key's creator, on whose behalf it acts).

    Returns True when the mailer accepted the message, False when it failed (the
    failure is logged with the invitation id, never the token).
    """
    context = {
        "invitation": invitation,
        "organization": invitation.organization,
        "inviter": inviter if inviter is not None else request.user,
        "accept_url": invitation_accept_url(request, token),
        "role": invitation.get_role_display(),
    }
    # One line whatever the name holds (names stored before control characters were refused).
    subject = " ".join(f"You are invited to join {invitation.organization.name} on FlowForge".split())
    try:
        body = render_to_string("tenancy/email/invitation.txt", context, request=request)
        send_mail(subject, body, None, [invitation.email])
    except Exception as exc:  # noqa: BLE001 - the invitation is committed: the caller says the mail failed
        logger.warning("invitation email for invitation %s failed: %s", invitation.pk, type(exc).__name__)
        return False
    return True
