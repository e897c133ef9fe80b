"""Start-up warnings of the web process about unsafe mail configuration (issue 14, finding 7).

With DEBUG off and no EMAIL_HOST, every email (invitations, password resets, address
confirmations) goes to the process's standard output instead of its recipient: users
receive nothing, and although the links' tokens are redacted there
(frontend/mail_backends.py), the deployment is almost certainly misconfigured.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.core.checks import Tags, Warning, register

logger = logging.getLogger("flowforge.mail")

CONSOLE_BACKENDS = ("django.core.mail.backends.console.EmailBackend",
                    "frontend.mail_backends.RedactingConsoleEmailBackend")
MAIL_TO_CONSOLE_ID = "frontend.W001"
MAIL_TO_CONSOLE_MESSAGE = (
    "DEBUG is off and EMAIL_HOST is not set: emails (invitations, password resets, address "
    "confirmations) are printed to the web log, with their links' tokens redacted, and never delivered."
)
MAIL_TO_CONSOLE_HINT = "Set EMAIL_HOST (and EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS)."


def mail_goes_to_console() -> bool:
    """True when DEBUG is off and the default mailer prints to the console."""
    mailers = getattr(settings, "MAILERS", None) or {}
    backend = mailers.get("default", {}).get("BACKEND", "")
    return not settings.DEBUG and backend in CONSOLE_BACKENDS


@register(Tags.security)
def check_mail_delivery(app_configs=None, **kwargs) -> list[Warning]:
    """System check ``frontend.W001`` (``manage.py check``, runserver, migrate): mail goes to the console in production."""
    if not mail_goes_to_console():
        return []
    return [Warning(MAIL_TO_CONSOLE_MESSAGE, hint=MAIL_TO_CONSOLE_HINT, id=MAIL_TO_CONSOLE_ID)]


def warn_if_mail_goes_to_console() -> bool:
    """Log MAIL_TO_CONSOLE_MESSAGE at WARNING (gunicorn runs no system checks, so the web
    process says it at start-up too). Returns True when it warned."""
    if not mail_goes_to_console():
        return False
    logger.warning("%s %s (%s)", MAIL_TO_CONSOLE_MESSAGE, MAIL_TO_CONSOLE_HINT, MAIL_TO_CONSOLE_ID)
    return True


GRAPH_BUNDLE = Path(__file__).resolve().parent / "static" / "frontend" / "dist" / "graph.js"
GRAPH_BUNDLE_MISSING_ID = "frontend.W002"


@register()
def check_graph_bundle(app_configs=None, **kwargs) -> list[Warning]:
    """System check ``frontend.W002``: the DAG drawing's bundle (frontend/graph/graph.js built by
    ``make install``: npm ci, npm run build) is missing, so workflow and run pages draw no graph."""
    if GRAPH_BUNDLE.exists():
        return []
    return [Warning(f"{GRAPH_BUNDLE} is missing: workflow and run pages will show no graph.",
                    hint="Run `make install` (npm ci and npm run build).", id=GRAPH_BUNDLE_MISSING_ID)]
