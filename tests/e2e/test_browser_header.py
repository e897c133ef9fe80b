"""The header in real Chromium: at 1280 px an owner's header (every section, the organization,
the user menu; a member of two organizations, so the organization switcher too) is one line;
at 800 px and on a phone it may wrap, but nothing overlaps and nothing is wider than the window.

A fresh review found the user menu on a second line at 1280 px: the sections, the
organization and the signed-in address did not fit the header's 72rem. Screenshots:
test-artifacts/screenshots/header-1280.png, header-1280-menu.png, header-800.png, header-390.png.

No Dramatiq worker is needed: only the page's layout is looked at.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from tenancy.context import SESSION_KEY as ORGANIZATION_SESSION_KEY
from tenancy.models import Membership, Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

EMAIL = "ada.lovelace@acme-analytics.example"
SECTIONS = ["Workflows", "Runs", "Triggers", "Workers", "Members", "API keys", "Secrets", "Webhooks", "Audit",
            "Settings"]

# The header's parts, each as its bounding box {x, y, width, height, right, bottom}; "sections"
# is one box per link of the main navigation. Also the header's box and its vertical padding.
BOXES_JS = """(() => {
  const box = e => { const r = e.getBoundingClientRect();
    return {x: r.x, y: r.y, width: r.width, height: r.height, right: r.right, bottom: r.bottom}; };
  const one = s => box(document.querySelector(s));
  const bar = getComputedStyle(document.querySelector('.site-header .bar'));
  return {
    brand: one('.site-header .brand'), nav: one('.site-header nav.primary'), org: one('.site-header .org'),
    menu: one('.site-header .user-menu summary'), header: one('.site-header'),
    sections: [...document.querySelectorAll('.site-header nav.primary a')].map(box),
    padding: parseFloat(bar.paddingTop) + parseFloat(bar.paddingBottom),
    pageWidth: document.documentElement.scrollWidth,
  };
})()"""


def setup() -> dict:
    """An owner of "Acme Analytics", also a member of a second organization, with the first one
    chosen; the owner's session."""
    org, owner, _ = create_organization(slug="acme", name="Acme Analytics", owner_email=EMAIL)
    other, _other_owner, _ = create_organization(slug="beta", name="Beta Labs", owner_email="bo@beta.example")
    Membership.objects.create(organization=other, user=owner, role=Role.MEMBER)
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session[ORGANIZATION_SESSION_KEY] = str(org.pk)
    session.create()
    return {"session": session.session_key}


def overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["right"] and b["x"] < a["right"] and a["y"] < b["bottom"] and b["y"] < a["bottom"]


def test_the_header_is_one_line_at_1280_px_and_wraps_without_overlap_at_800(live_server, browser, screenshots):
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    page.goto(base + "/settings/")
    page.wait_for_load_state("load")
    assert page.locator(".site-header nav.primary a").all_inner_texts() == SECTIONS

    # 1280 px: one line. Every part shares one band, and the header is as tall as its tallest part.
    page.locator(".site-header").screenshot(path=str(screenshots / "header-1280.png"))
    b = page.evaluate(BOXES_JS)
    parts = [b["brand"], b["org"], b["menu"], *b["sections"]]
    assert max(p["y"] for p in parts) < min(p["bottom"] for p in parts), parts
    one_line = max(p["height"] for p in parts) + b["padding"]
    assert b["header"]["height"] <= one_line + 1, (b["header"], one_line)
    assert b["menu"]["right"] <= 1280 and b["pageWidth"] == 1280
    # The organization's name is shown whole, not cut down to make room.
    assert page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('.site-header .org-name'))")

    # The user menu opens inside the window and says who is signed in.
    page.locator(".site-header .user-menu summary").click()
    menu = page.locator(".site-header .user-menu .menu")
    assert EMAIL in menu.inner_text()
    opened = menu.bounding_box()
    assert opened["x"] >= 0 and opened["x"] + opened["width"] <= 1280
    page.screenshot(path=str(screenshots / "header-1280-menu.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 420})
    page.locator(".site-header .user-menu summary").click()

    # 800 px and a 390 px phone: it may wrap, but no part covers another and nothing is wider
    # than the window.
    for width in (800, 390):
        page.set_viewport_size({"width": width, "height": 800})
        page.locator(".site-header").screenshot(path=str(screenshots / f"header-{width}.png"))
        b = page.evaluate(BOXES_JS)
        parts = {"brand": b["brand"], "nav": b["nav"], "org": b["org"], "menu": b["menu"]}
        for name, part in parts.items():
            assert part["x"] >= 0 and part["right"] <= width, (width, name, part)
            for other, box in parts.items():
                assert other == name or not overlap(part, box), (width, name, other, part, box)
        assert b["pageWidth"] == width
    context.close()
