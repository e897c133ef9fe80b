"""Every link a member is shown opens for them: the header's navigation and user menu, the
dashboard and the pages the navigation leads to show no link that answers 403 (or any
answer but 200) to the member's role, and each role is shown the sections it may open.

The pages themselves keep refusing: a role that is not shown a link still gets a 403.
"""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlencode, urljoin, urlsplit

import pytest
from allauth.account.models import EmailAddress
from django.test import Client
from django.urls import reverse

from engine.notifications import create_endpoint
from engine.services import apply_definition, start_run
from engine.triggers import create_trigger
from tenancy import vault
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tests.unit.test_api_webhooks import URL
from tests.unit.test_identity import fresh_client
from tests.unit.test_web_workflows import DIAMOND, actor_of, client_for, make_team

# The sections of the header's main navigation each role may open (tenancy.permissions'
# matrix: API keys need apikey.manage, webhooks webhook.manage, the audit log audit.read).
EVERY_MEMBER = {"/workflows/", "/runs/", "/triggers/", "/workers/", "/members/", "/secrets/", "/settings/"}
OWNERS_AND_ADMINS = {"/api-keys/", "/webhooks/", "/audit/"}
NAV_OF_ROLE = {
    Role.OWNER: EVERY_MEMBER | OWNERS_AND_ADMINS,
    Role.ADMIN: EVERY_MEMBER | OWNERS_AND_ADMINS,
    Role.MEMBER: EVERY_MEMBER,
    Role.VIEWER: EVERY_MEMBER,
}


class _Links(HTMLParser):
    """The targets a page offers to open with a GET: ``<a href>`` and ``<form method="get" action>``,
    and separately the ``<a href>`` of the header's main navigation (``nav.primary``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.targets: list[str] = []
        self.nav: list[str] = []
        self._nav_depth = 0  # > 0 inside <nav class="primary">

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "nav":
            if self._nav_depth or "primary" in (a.get("class") or "").split():
                self._nav_depth += 1
        elif tag == "a" and a.get("href"):
            self.targets.append(a["href"])
            if self._nav_depth:
                self.nav.append(a["href"])
        elif tag == "form" and (a.get("method") or "get").lower() == "get" and a.get("action"):
            self.targets.append(a["action"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav" and self._nav_depth:
            self._nav_depth -= 1


def links_of(page_url: str, body: str) -> tuple[list[str], list[str]]:
    """(every same-site target of the page, the main navigation's targets), as paths with
    their query string and without a fragment; static files left out."""
    parser = _Links()
    parser.feed(body)

    def local(href: str) -> str | None:
        url = urlsplit(urljoin(f"http://testserver{page_url}", href))
        if url.netloc != "testserver" or url.path.startswith("/static/"):
            return None
        return url.path + (f"?{url.query}" if url.query else "")

    targets = [t for t in map(local, parser.targets) if t]
    nav = [t for t in map(local, parser.nav) if t]
    return list(dict.fromkeys(targets)), nav


def reauthenticate(url: str) -> str:
    """Where allauth sends a request for ``url`` that needs the password again."""
    return f"{reverse('account_reauthenticate')}?{urlencode({'next': url})}"


def signed_in(user) -> Client:
    """A client signed in as ``user`` through the sign-in form, as a person is: with a
    password and a verified address, and the session allauth keeps of that sign-in (its
    two-factor page, for one, asks a session without it to sign in again)."""
    password = "correct horse battery staple"
    user.set_password(password)
    user.save(update_fields=["password"])
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    client = fresh_client()
    resp = client.post(reverse("account_login"), {"login": user.email, "password": password})
    assert resp.status_code == 302 and resp["Location"] == "/", resp.status_code
    return client


@pytest.fixture
def team(org):
    """One member of each role in an organization with something on every page: a workflow
    and a run of it, a cron trigger, a secret, a webhook endpoint and an API key."""
    team = make_team(org)
    owner = actor_of(team["owner"])
    workflow = apply_definition(organization=org, document=DIAMOND)
    start_run(workflow=workflow, actor=owner)
    create_trigger(actor=owner, data={"name": "nightly", "workflow_name": "diamond",
                                      "cron_expression": "30 2 * * *", "timezone": "UTC"})
    vault.set_secret(actor=owner, name="DB_PASSWORD", value="hunter2")
    create_endpoint(actor=owner, url=URL, event_types=["run.failed"])
    create_api_key(actor=owner, name="ci", role=Role.MEMBER)
    return team


@pytest.mark.parametrize("role", [Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER])
def test_every_link_shown_to_a_role_opens_for_it(team, role):
    """Every link on the dashboard (the header's sections and user menu included), on the
    pages those lead to and on the pages these lead to answers 200 to the role; and the
    role is shown each section it may open, on every one of those pages."""
    client = signed_in(team[role].user)
    status: dict[str, int] = {}  # every link followed -> its answer
    navs: dict[str, list[str]] = {}  # every page read -> its main navigation
    refused: list[tuple[str, str, int]] = []  # (page, link, answer)

    def get(url: str) -> tuple[int, str]:
        resp = client.get(url)
        status[url] = resp.status_code
        if resp.status_code == 302 and resp["Location"] == reauthenticate(url):
            # allauth asks for the password again before a sensitive account page (turning
            # on two-factor authentication), however recent the sign-in: the page opens then.
            status[url] = 200
        html = resp.status_code == 200 and resp["Content-Type"].startswith("text/html") and not resp.streaming
        return status[url], resp.content.decode() if html else ""

    code, home = get("/")
    assert code == 200
    pages = ["/"]
    bodies = {"/": home}
    for _depth in range(3):
        found = []
        for page in pages:
            body = bodies.pop(page)
            links, nav = links_of(page, body)
            if '<header class="site-header">' in body:  # a page, not a fragment
                navs[page] = nav
            for link in links:
                if link in status:
                    code = status[link]
                else:
                    code, bodies[link] = get(link)
                    found.append(link)
                if code != 200:
                    refused.append((page, link, code))
        pages = [p for p in found if bodies.get(p)]
    assert not refused, refused

    for page, nav in navs.items():
        assert set(nav) == NAV_OF_ROLE[role], (page, sorted(set(nav) ^ NAV_OF_ROLE[role]))
    user_menu = {reverse("frontend:orgs"), reverse("frontend:org_new"), reverse("account_email"),
                 reverse("account_change_password"), reverse("mfa_index")}
    assert user_menu <= set(links_of("/", home)[0])


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_the_pages_not_shown_to_a_role_still_refuse_it(team, role):
    client = client_for(team[role])
    for url in sorted(OWNERS_AND_ADMINS):
        assert client.get(url).status_code == 403, url


def test_without_an_organization_chosen_no_section_is_linked(make_org):
    """A member of two organizations who has not chosen one: every section would send them to
    the organization picker, so the header links none; once chosen, the role's sections."""
    first, second = make_org(), make_org()
    user = make_team(first)["viewer"].user
    Membership.objects.create(organization=second, user=user, role=Role.ADMIN)
    client = client_for(Membership.objects.for_organization(first).get(user=user))

    _links, nav = links_of("/orgs/", client.get("/orgs/").content.decode())
    assert nav == []
    for section in sorted(NAV_OF_ROLE[Role.ADMIN]):
        assert client.get(section)["Location"].startswith("/orgs/?next="), section

    client.post("/orgs/", {"organization": str(second.pk)})
    _links, nav = links_of("/orgs/", client.get("/orgs/").content.decode())
    assert set(nav) == NAV_OF_ROLE[Role.ADMIN]
