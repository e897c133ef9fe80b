"""Template filters of the product layout."""

from __future__ import annotations

from django import template

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
