"""Keeps invitation tokens out of the logs.

The accept link ``/invitations/<token>/`` carries the raw token in its path, and
Django logs the path of every 4xx/5xx response ("Bad Request: /invitations/...")
and, under runserver, of every request. This filter rewrites such records before
any handler sees them. (A reverse proxy's access log is outside Django: redact
``/invitations/`` paths there too.)

Emails printed by the console mail backend (no EMAIL_HOST) carry the same links and
allauth's password-reset and email-confirmation keys: with DEBUG off they go through
``redact_links`` (frontend/mail_backends.py), which blanks every token-like part of
every URL in the text.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

TOKEN_IN_PATH = re.compile(r"(/invitations/)[A-Za-z0-9_-]{16,}")
# An absolute URL in a text (an email): up to whitespace or a character that ends it in prose.
URL_IN_TEXT = re.compile(r"https?://[^\s<>\"'()]+")
# A path segment or query value that may be a credential: 16 or more characters of the
# alphabets tokens use (base64url, hex, Django's signing ``value:timestamp:signature``,
# allauth's ``<uidb36>-<token>``). Words of a page's path are shorter or have other characters.
TOKEN_LIKE = re.compile(r"[A-Za-z0-9_\-:.=]{16,}")
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """``text`` with every invitation token in a path replaced by ``[redacted]``."""
    return TOKEN_IN_PATH.sub(r"\1[redacted]", text)


def _redact_url(match: re.Match) -> str:
    parts = urlsplit(match.group(0))
    path = "/".join(REDACTED if TOKEN_LIKE.fullmatch(segment) else segment for segment in parts.path.split("/"))
    query = urlencode([(name, REDACTED if TOKEN_LIKE.fullmatch(value) else value)
                       for name, value in parse_qsl(parts.query, keep_blank_values=True)], safe="[]")
    fragment = REDACTED if TOKEN_LIKE.fullmatch(parts.fragment) else parts.fragment
    return urlunsplit((parts.scheme, parts.netloc, path, query, fragment))


def redact_links(text: str) -> str:
    """``text`` with every token-like path segment, query value and fragment of every
    absolute URL (TOKEN_LIKE: 16+ characters of a token alphabet) and every invitation
    token in a path replaced by ``[redacted]``; everything else unchanged."""
    return redact(URL_IN_TEXT.sub(_redact_url, text))


class RedactInvitationTokens(logging.Filter):
    """A logging filter (for ``django.request`` and ``django.server``); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "/invitations/" in message:
            record.msg = redact(message)
            record.args = ()
        return True
