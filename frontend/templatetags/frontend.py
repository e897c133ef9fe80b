"""Template filters of the product layout."""

from __future__ import annotations

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeData, mark_safe

register = template.Library()


@register.filter
def sentence(value: object) -> str:
    """``value`` with its first letter capitalised, unless it starts with an email
    address (tenancy's messages are lower-case clauses; "bob@x is already a member"
    must keep the address as typed)."""
    text = str(value)
    first_word = text.split(" ", 1)[0]
    if not text or "@" in first_word:
        return text
    return text[0].upper() + text[1:]


# After these characters a long identifier may wrap: a task key, a workflow name, a path.
_BREAK_AFTER = frozenset("_./-")


def _with_breaks(text: str) -> str:
    """``text`` escaped, with ``<wbr>`` after each of _BREAK_AFTER that has text after it."""
    out: list[str] = []
    for i, char in enumerate(text):
        out.append(escape(char))
        if char in _BREAK_AFTER and i + 1 < len(text):
            out.append("<wbr>")
    return "".join(out)


@register.filter
def breakable(value: object) -> str:
    """``value`` escaped, with a line-break opportunity (``<wbr>``) after each ``_ . / -``
    that has more text after it: in a narrow cell ``flaky_customer_sync`` wraps as
    ``flaky_customer_`` / ``sync`` instead of the browser cutting a word at its last letter.

    An email address is two ``.wrap-unit`` boxes, ``local@`` and the domain, so it wraps
    after its ``@`` first (``ada@`` / ``example.com``) and inside either part, at those
    characters, only when that part alone is wider than the cell. Text without any of them
    is only escaped; None is "". A value already marked safe is markup, returned as it is:
    escaping it again would show its tags as text, and a ``<wbr>`` could land inside one."""
    if value is None:
        return ""
    if isinstance(value, SafeData):
        return value
    text = str(value)
    local, at, domain = text.rpartition("@")
    if not (at and local and domain):
        return mark_safe(_with_breaks(text))  # noqa: S308 - escaped character by character
    return mark_safe(  # noqa: S308 - both parts escaped character by character
        f'<span class="wrap-unit">{_with_breaks(local + "@")}</span><wbr>'
        f'<span class="wrap-unit">{_with_breaks(domain)}</span>'
    )
