"""Keeps invitation tokens out of the logs.

The accept link ``/invitations/<token>/`` carries the raw token in its path, and
Django logs the path of every 4xx/5xx response ("Bad Request: /invitations/...")
and, under runserver, of every request. This filter rewrites such records before
any handler sees them. (A reverse proxy's access log is outside Django: redact
``/invitations/`` paths there too.)
"""

from __future__ import annotations

import logging
import re

TOKEN_IN_PATH = re.compile(r"(/invitations/)[A-Za-z0-9_-]{16,}")


def redact(text: str) -> str:
    """``text`` with every invitation token in a path replaced by ``[redacted]``."""
    return TOKEN_IN_PATH.sub(r"\1[redacted]", text)


class RedactInvitationTokens(logging.Filter):
    """A logging filter (for ``django.request`` and ``django.server``); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "/invitations/" in message:
            record.msg = redact(message)
            record.args = ()
        return True
