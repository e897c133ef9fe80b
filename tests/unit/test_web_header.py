"""The header's organization name: cut with an ellipsis when long, its tooltip (``title``)
is the whole name, followed by the slug in parentheses.

A review found the tooltip was the slug alone: hovering a cut name showed "acme-holdings",
never the rest of the name."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tenancy.services import create_organization
from tests.unit.test_members_web import client_for

pytestmark = pytest.mark.django_db

LONG_NAME = "Acme Analytics & Robotics \"International\" Holdings <Europe> of the Northern Hemisphere"


class _OrgName(HTMLParser):
    """The attributes and text of the header's ``<span class="org-name">``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.attrs: dict[str, str | None] | None = None
        self.text = ""
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "span" and "org-name" in (a.get("class") or "").split():
            self.attrs, self._inside = a, True

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.text += data


@pytest.mark.parametrize("path", ["/", "/runs/", "/settings/"])
def test_the_org_names_tooltip_is_its_whole_name_and_slug(path):
    org, owner, _ = create_organization(slug="acme-holdings", name=LONG_NAME, owner_email="ada@acme.example")
    body = client_for(owner).get(path).content.decode()
    parser = _OrgName()
    parser.feed(body)
    assert parser.attrs is not None, "no organization name in the header"
    assert parser.text == LONG_NAME
    assert parser.attrs["title"] == f"{LONG_NAME} (acme-holdings)"


def test_a_signed_in_page_loads_the_user_menus_script_with_the_csp_nonce():
    _org, owner, _ = create_organization(slug="acme", name="Acme", owner_email="ada@acme.example")
    resp = client_for(owner).get("/settings/")
    nonce = re.search(r"'nonce-([^']+)'", resp["Content-Security-Policy"]).group(1)
    assert f'<script src="/static/frontend/user-menu.js" nonce="{nonce}" defer></script>' in resp.content.decode()
