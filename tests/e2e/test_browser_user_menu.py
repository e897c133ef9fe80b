"""The header's user menu in real Chromium behaves as a disclosure menu: Escape closes it and
gives the focus back to its button; a click outside it closes it; the focus leaving it (Tab
past "Sign out", Shift+Tab before its button) closes it, so it never covers the element the
focus went to. Without JavaScript the <details> element still opens and closes by click.

A review found it stayed open on Escape and on a click outside, and that tabbing past
"Sign out" moved the focus into the page under the open menu.
Screenshot: test-artifacts/screenshots/user-menu-open.png.

No Dramatiq worker is needed: only the header's behaviour is looked at.
"""

from __future__ import annotations

import pytest

from tenancy.models import Membership, Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm, session_for, signed_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MENU = ".site-header details.user-menu"
BUTTON = MENU + " > summary"
IS_OPEN = f"document.querySelector('{MENU}').open"
# Where the focus is: inside the menu's panel, on its button, or elsewhere (with the element).
FOCUS = f"""(() => {{
  const e = document.activeElement, menu = document.querySelector('{MENU}');
  if (e === menu.querySelector('summary')) return 'button';
  return menu.contains(e) ? 'menu' : 'outside:' + e.tagName + ':' + (e.textContent || '').trim().slice(0, 30);
}})()"""


def setup() -> str:
    """The owner of "Acme Analytics", also a member of "Beta Labs" (the menu has the
    organization switcher); the owner's session with Acme chosen."""
    org, owner, _ = create_organization(slug="acme", name="Acme Analytics", owner_email="ada@acme.example")
    other, _, _ = create_organization(slug="beta", name="Beta Labs", owner_email="bo@beta.example")
    Membership.objects.create(organization=other, user=owner, role=Role.MEMBER)
    return session_for(owner, org)


def test_escape_an_outside_click_and_the_focus_leaving_close_the_user_menu(live_server, browser, screenshots):
    base = live_server.url
    page = signed_in_page(browser, base, orm(setup))
    page.goto(base + "/settings/")
    page.wait_for_load_state("load")
    button = page.locator(BUTTON)

    # Opened by a click; Escape closes it and the focus is on its button again.
    button.click()
    assert page.evaluate(IS_OPEN)
    page.screenshot(path=str(screenshots / "user-menu-open.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 460})
    page.locator(MENU + " a", has_text="Organizations").focus()
    page.keyboard.press("Escape")
    assert not page.evaluate(IS_OPEN)
    assert page.evaluate(FOCUS) == "button"

    # Escape with the focus on the button itself (opened from the keyboard).
    page.keyboard.press("Enter")
    assert page.evaluate(IS_OPEN)
    page.keyboard.press("Escape")
    assert not page.evaluate(IS_OPEN)
    assert page.evaluate(FOCUS) == "button"

    # A click outside it (on the page's heading) closes it; a click inside it does not.
    button.click()
    page.locator(MENU + " .menu-head").click()
    assert page.evaluate(IS_OPEN)
    page.locator("main h1").click()
    assert not page.evaluate(IS_OPEN)

    # Tab past its last item ("Sign out"): the focus goes on into the page and the menu closes.
    button.click()
    page.locator(MENU + " button", has_text="Sign out").focus()
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUS).startswith("outside:")
    assert not page.evaluate(IS_OPEN)

    # Tabbing through the menu keeps it open: its first item, then back to its button.
    button.click()
    button.focus()
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUS) == "menu"
    assert page.evaluate(IS_OPEN)
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(FOCUS) == "button"
    assert page.evaluate(IS_OPEN)
    # Shift+Tab before its button (onto the organization's sections) closes it.
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(FOCUS).startswith("outside:")
    assert not page.evaluate(IS_OPEN)

    assert not [m for m in page.console_messages if "Content Security Policy" in m], page.console_messages
    page.context.close()


def test_the_user_menu_opens_and_closes_without_javascript(live_server, browser):
    base = live_server.url
    page = signed_in_page(browser, base, orm(setup), javascript=False)
    page.goto(base + "/settings/")
    page.wait_for_load_state("load")
    page.locator(BUTTON).click()
    assert page.locator(MENU + " .menu").is_visible()
    assert "ada@acme.example" in page.locator(MENU + " .menu").inner_text()
    page.locator(BUTTON).click()
    assert not page.locator(MENU + " .menu").is_visible()
    page.context.close()
