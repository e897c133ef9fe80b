"""Mail backends of the web process: the console mailers used when there is no EMAIL_HOST.

Django's console backend prints each message as its MIME source: bodies in
quoted-printable, cut into lines of 76 characters with ``=`` soft line breaks, so the
sign-up confirmation link printed to ``var/log/web.log`` arrives broken across lines and
copying it gives a 404 (issue 20). Both backends here print each message's headers
(decoded) and its text parts decoded and whole, one link per line as written:

- ``DecodedConsoleEmailBackend`` (DEBUG on, ``make run``): the links whole, since a
  developer needs them;
- ``RedactingConsoleEmailBackend`` (DEBUG off): every credential in a URL replaced by
  ``[redacted]`` (frontend.log_redaction.redact_links) — invitation links, password-reset
  and email-confirmation keys in a production log could be used by anyone who reads logs.
"""

from __future__ import annotations

from email.header import decode_header, make_header

from django.core.mail.backends.console import EmailBackend as ConsoleEmailBackend

from frontend.log_redaction import redact_links

SEPARATOR = "-" * 79


def readable(message) -> str:
    """``message`` (a Django EmailMessage) as text: each header decoded (RFC 2047), a blank
    line, then each text part's body decoded from its transfer encoding and charset,
    unwrapped (quoted-printable soft line breaks removed), parts separated by blank lines."""
    msg = message.message()
    lines = []
    for name, value in msg.items():
        try:
            value = str(make_header(decode_header(value)))
        except (ValueError, LookupError):  # a header that is not RFC 2047: as it was
            pass
        lines.append(f"{name}: {value}")
    for part in msg.walk():
        if part.get_content_maintype() != "text":
            continue
        payload = part.get_payload(decode=True) or b""
        lines += ["", payload.decode(part.get_content_charset() or "utf-8", errors="replace").rstrip("\n")]
    return "\n".join(lines)


class DecodedConsoleEmailBackend(ConsoleEmailBackend):
    """Django's console backend printing each email decoded and whole (``readable``)."""

    def write_message(self, message) -> None:
        self.stream.write(readable(message) + "\n" + SEPARATOR + "\n")


class RedactingConsoleEmailBackend(ConsoleEmailBackend):
    """The console backend for DEBUG off: ``readable`` with links' tokens redacted (decoded
    first: a quoted-printable or base64 body could otherwise hide a token from the redaction)."""

    def write_message(self, message) -> None:
        self.stream.write(redact_links(readable(message)) + "\n" + SEPARATOR + "\n")
