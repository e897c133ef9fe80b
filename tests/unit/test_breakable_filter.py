"""The ``breakable`` template filter (frontend/templatetags/frontend.py): line-break
opportunities after a key's separators and after an address's '@', and every character of
the value escaped (keys, names and addresses are a tenant's own text)."""

from __future__ import annotations

from django.template import Context, Template
from django.utils.safestring import SafeData, mark_safe

from frontend.templatetags.frontend import breakable


def test_a_key_may_break_after_each_separator_but_not_at_its_end():
    assert breakable("create_tag_template") == "create_<wbr>tag_<wbr>template"
    assert breakable("etl.load-v2/daily_") == "etl.<wbr>load-<wbr>v2/<wbr>daily_"
    assert breakable("plainword") == "plainword"
    assert breakable(None) == "" and breakable("") == ""


def test_an_address_is_two_boxes_split_after_its_at():
    assert breakable("ada@ops.example.com") == (
        '<span class="wrap-unit">ada@</span><wbr><span class="wrap-unit">ops.<wbr>example.<wbr>com</span>')
    # An '@' at an end is not an address.
    assert breakable("@home") == "@home" and breakable("team@") == "team@"


def test_every_character_is_escaped():
    hostile = '<img src=x onerror="alert(1)">_a@b.c'
    html = Template("{% load frontend %}{{ value|breakable }}").render(Context({"value": hostile}))
    assert "<img" not in html and "onerror=\"" not in html
    assert html.startswith('<span class="wrap-unit">&lt;img src=x onerror=&quot;alert(1)&quot;&gt;_<wbr>a@</span>')


def test_markup_already_marked_safe_is_returned_as_it_is():
    """It used to be escaped a second time: '<code>a_b</code>' showed its tags as text."""
    markup = mark_safe("<code>load_daily</code>")
    assert breakable(markup) == "<code>load_daily</code>" and isinstance(breakable(markup), SafeData)
    html = Template("{% load frontend %}{{ value|breakable }}").render(Context({"value": markup}))
    assert html == "<code>load_daily</code>"
