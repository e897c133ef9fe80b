"""Mail backends of the web process.

``RedactingConsoleEmailBackend`` is the mailer settings.py picks when there is no
EMAIL_HOST and DEBUG is off: Django's console backend would print whole emails —
invitation links, password-reset and email-confirmation keys — into the web log, where
anyone who reads logs could use them. This one prints each message's headers and its
decoded text parts with every credential in a URL replaced by ``[redacted]``
(frontend.log_redaction.redact_links). With DEBUG on, Django's own console backend
prints the links whole, since a developer needs them.
"""

from __future__ import annotations

from django.core.mail.backends.console import EmailBackend as ConsoleEmailBackend

from frontend.log_redaction import redact_links

SEPARATOR = "-" * 79


class RedactingConsoleEmailBackend(ConsoleEmailBackend):
    """Django's console backend, with links' tokens redacted and text parts decoded
    (a quoted-printable or base64 body could otherwise hide a token from the redaction)."""

    def write_message(self, message) -> None:
        msg = message.message()
        lines = [f"{name}: {value}" for name, value in msg.items()]
        for part in msg.walk():
            if part.get_content_maintype() != "text":
                continue
            payload = part.get_payload(decode=True) or b""
            lines += ["", payload.decode(part.get_content_charset() or "utf-8", errors="replace")]
        self.stream.write(redact_links("\n".join(lines)) + "\n" + SEPARATOR + "\n")
