"""Issue 20 in real Chromium: a live run page that stays live and light, and a live home page.

- During a 10 s task the task's displayed duration (and the run's) advance by at least 5 s,
  and its running bar grows, without a page reload and without a request: the browser
  ticks from the start instants the server gave.
- Every live update of a 300-task run page transfers at most 20 KB (the sizes Chromium
  reports for each response: headers and encoded body); the page's first load is shown
  for comparison. Figures printed and written to test-artifacts/e2e-live-light.txt.
- The home page shows the run that ``make run`` starts (the demo organization's
  penguins-report, started through the code path flowforge.devstack uses), live; and a run
  that fails appears in its "Recently failed" section within a second of failing (from the
  run's finished_at, set in the failing transaction, to the DOM change).

Screenshots: test-artifacts/screenshots/home-live.png, run-300-live.png, run-live-ticking.png.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.models import WorkflowRun
from engine.services import apply_definition, resolve_workflow, start_run
from frontend import live_org
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import SCREENSHOTS, orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 900}
# Seconds, after the browser closed, for the live server to notice (a keep-alive write every
# second, below) and end the pages' streams, giving back their slots, and for the process's
# LISTEN hubs to close their connections (engine.queue_hub.IDLE_CLOSE_SECONDS), so that later
# tests of the session get their stream slots and the test database can be dropped.
HUB_IDLE_SECONDS = 8


@pytest.fixture(autouse=True)
def _quick_keep_alive(monkeypatch):
    """The organization streams never end on their own (the run pages' end with their run):
    a keep-alive every second makes the server notice a closed page quickly."""
    monkeypatch.setattr(live_org, "HEARTBEAT_SECONDS", 1.0)


def session_for(user) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def new_org(slug: str) -> dict:
    org, owner, _ = create_organization(slug=slug, name=slug.title(), owner_email=f"ada@{slug}.example")
    return {"org": org, "owner": owner, "actor": Actor(organization=org, role=Role.OWNER, user=owner, channel="web"),
            "session": session_for(owner)}


def page_for(browser, base: str, session: str):
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": base}])
    page = context.new_page()
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    return context, page, csp


def seconds_of(text: str) -> float:
    """A duration as the pages write it ("340 ms", "12.4 s", "3 m 05 s", each number joined to
    its unit by a no-break space) in seconds."""
    text = text.strip()
    if m := re.fullmatch(r"(\d+)\u00a0ms", text):
        return int(m[1]) / 1000
    if m := re.fullmatch(r"([\d.]+)\u00a0s", text):
        return float(m[1])
    if m := re.fullmatch(r"(\d+)\u00a0m (\d+)\u00a0s", text):
        return int(m[1]) * 60 + int(m[2])
    raise AssertionError(f"not a duration: {text!r}")


NO_RELOAD = "() => { window.__ffNoReload = true; }"


def test_durations_and_running_bars_advance_between_events_without_a_reload(live_server, e2e_stack, browser,
                                                                            screenshots):
    def setup():
        d = new_org("tick")
        wf = apply_definition(actor=d["actor"], document={"name": "ten-seconds", "tasks": [
            {"key": "warm_up", "type": "noop"},
            {"key": "crunch", "type": "sleep", "config": {"seconds": 10}, "depends_on": ["warm_up"]}]})
        d["run"] = start_run(workflow=wf, actor=d["actor"])
        return d

    data = orm(setup)
    base = live_server.url
    context, page, csp = page_for(browser, base, data["session"])
    try:
        page.goto(f"{base}/runs/{data['run'].pk}/")
        page.evaluate(NO_RELOAD)
        cell = page.locator("#task-crunch td.duration")
        page.wait_for_selector("#task-crunch td.duration[data-started]", timeout=30_000)
        # Its attempt's `started` event (after the claim): the last event of the 10 s.
        page.wait_for_function("() => [...document.querySelectorAll('.events-table tr.kind-started')]"
                               ".some(r => r.innerText.includes('crunch'))", timeout=30_000)
        page.wait_for_timeout(300)
        # Requests from here on: a 10 s sleep writes no event, so the page makes none, or only
        # a late one for a change it already showed (after=<the last seq>: no task row in it).
        seq_before = orm(lambda: WorkflowRun.objects.unscoped().get(pk=data["run"].pk).last_event_seq)
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        first_task, first_run = seconds_of(cell.inner_text()), seconds_of(page.locator(".run-duration").inner_text())
        read_at = time.monotonic()
        bar = page.locator("svg.timeline .tl-row[data-task-key='crunch'] .tl-bar.outcome-running")
        first_width = float(bar.get_attribute("width"))
        page.wait_for_timeout(6_000)
        later_task, later_run = seconds_of(cell.inner_text()), seconds_of(page.locator(".run-duration").inner_text())
        # The wall time between the two readings, less the display's own lag: it ticks about
        # once a second, and a loaded machine delays a tick (a CI run saw 4.9 s shown for 6 s).
        elapsed = time.monotonic() - read_at
        shown_at_least = elapsed - 2.0
        assert page.locator("#task-crunch .badge.state-running").count() == 1, (
            "the task is no longer running", requests, page.locator("#task-crunch").inner_text())
        later_width = float(bar.get_attribute("width", timeout=2000))
        page.screenshot(path=str(screenshots / "run-live-ticking.png"), full_page=True)
        assert page.evaluate("window.__ffNoReload === true"), "the page reloaded"
        assert later_task - first_task >= shown_at_least, (first_task, later_task, elapsed)
        assert later_run - first_run >= shown_at_least, (first_run, later_run, elapsed)
        # The bar grows on its scale (the chart rescales as the span grows: wider, not 0).
        assert later_width > first_width, (first_width, later_width)
        seq_after = orm(lambda: WorkflowRun.objects.unscoped().get(pk=data["run"].pk).last_event_seq)
        assert seq_after == seq_before, "an event came during the window: the test cannot tell who moved the time"
        assert all(f"after={seq_before}&" in u for u in requests if "/live/" in u), requests
        # Then the task finishes: the duration stops, the page follows live.
        page.wait_for_selector(".run-title .badge.state-succeeded", timeout=30_000)
        assert page.locator("#task-crunch td.duration[data-started]").count() == 0
        assert 9.5 <= seconds_of(cell.inner_text()) <= 14, cell.inner_text()
        assert page.evaluate("window.__ffNoReload === true")
        assert not csp, csp
    finally:
        context.close()
        time.sleep(HUB_IDLE_SECONDS)


FAN_OUT = 298


def test_a_live_update_of_a_300_task_run_transfers_at_most_20_kb(live_server, e2e_stack, browser, screenshots):
    def setup():
        d = new_org("wide")
        tasks = [{"key": "start", "type": "noop"}]
        tasks += [{"key": f"shard_{i:03d}", "type": "sleep", "config": {"seconds": 0.2}, "depends_on": ["start"]}
                  for i in range(FAN_OUT)]
        tasks.append({"key": "join", "type": "noop", "depends_on": [f"shard_{i:03d}" for i in range(FAN_OUT)]})
        wf = apply_definition(actor=d["actor"], document={"name": "fan-out-300", "tasks": tasks})
        d["run"] = start_run(workflow=wf, actor=d["actor"])
        return d

    data = orm(setup)
    base = live_server.url
    context, page, csp = page_for(browser, base, data["session"])
    updates: list[int] = []
    first: list[int] = []

    def finished(request):
        if "/live/" not in request.url and not request.url.rstrip("/").endswith(str(data["run"].pk)):
            return
        sizes = request.sizes()
        total = sizes["responseHeadersSize"] + sizes["responseBodySize"]
        (updates if "/live/" in request.url else first).append(total)

    page.on("requestfinished", finished)
    try:
        page.goto(f"{base}/runs/{data['run'].pk}/")
        page.evaluate(NO_RELOAD)
        assert page.locator(".tasks-table tbody tr").count() == 50  # the first page of 300
        page.wait_for_selector(".run-title .badge.state-succeeded", timeout=120_000)
        page.wait_for_timeout(500)
        page.screenshot(path=str(screenshots / "run-300-live.png"), full_page=False)
        assert page.evaluate("window.__ffNoReload === true"), "the page reloaded"
        # The live page shows the end state: every task node drawn succeeded (the 300-wide
        # fan-out is one group node: frontend/graph/graph.js), and every row.
        page.wait_for_function("() => document.querySelectorAll('svg.dag g.node[data-task-key]').length > 0",
                               timeout=30_000)
        assert page.locator("svg.dag g.node[data-task-key]:not([data-state='succeeded'])").count() == 0
        assert page.locator("svg.dag g.node[data-task-key][data-state='succeeded']").count() >= 2
        assert page.locator(".tasks-table .badge.state-succeeded").count() == 50
        assert len(updates) >= 3, updates
        line = (f"live updates of a 300-task run page: {len(updates)}; bytes transferred per update "
                f"(headers + encoded body): median {statistics.median(updates):.0f}, max {max(updates)}, "
                f"total {sum(updates)}; the page's first load: {first[0] if first else '?'}")
        print(line)
        (SCREENSHOTS.parent / "e2e-live-light.txt").write_text(line + "\n")
        assert max(updates) <= 20 * 1024, updates
        # Filter the table: the failed-or-not question answered in a request.
        page.select_option("select[name=task_state]", "succeeded")
        page.fill("input[name=task_key]", "shard_29")
        page.locator(".task-filter button[type=submit]").click()
        page.wait_for_url(re.compile(r"task_key=shard_29"))
        keys = page.locator(".tasks-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.taskKey)")
        assert keys == [f"shard_{i}" for i in range(290, 298)], keys
        assert not csp, csp
    finally:
        context.close()
        time.sleep(HUB_IDLE_SECONDS)


SEEN_ON_HOME = """() => {
  window.__ffSeen = {};
  const look = () => {
    for (const section of ["running", "failed", "finished"]) {
      document.querySelectorAll(`[data-section=${section}] tr[data-run-id]`).forEach(tr => {
        const key = section + ":" + tr.dataset.runId;
        if (!(key in window.__ffSeen)) window.__ffSeen[key] = Date.now();
      });
    }
  };
  look();
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
}"""


def test_home_shows_the_make_run_example_and_a_failed_run_within_a_second(live_server, e2e_stack, browser,
                                                                          screenshots):
    from django.core.management import call_command

    def setup():
        call_command("bootstrap_demo", verbosity=0)
        from tenancy.models import Organization, User
        org = Organization.objects.get(slug="demo")
        owner = User.objects.get(email="demo@flowforge.local")
        actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
        apply_definition(actor=actor, document={"name": "partner-sync", "tasks": [
            {"key": "fetch_feed", "type": "sleep", "config": {"seconds": 1.0}},
            {"key": "parse_feed", "type": "fail", "config": {"message": "row 1842: unexpected end of CSV record"},
             "depends_on": ["fetch_feed"]}]})
        return {"org": org, "actor": actor, "session": session_for(owner)}

    data = orm(setup)
    base = live_server.url
    context, page, csp = page_for(browser, base, data["session"])
    try:
        page.goto(base + "/")
        page.evaluate(NO_RELOAD)
        page.evaluate(SEEN_ON_HOME)
        assert page.locator("[data-section=running] tr[data-run-id]").count() == 0

        # What `make run` does once its processes are up (flowforge.devstack).
        def make_run_start():
            wf = resolve_workflow(organization=data["org"], workflow="penguins-report")
            return start_run(workflow=wf, run_input={})

        example = orm(make_run_start)
        page.wait_for_function(f"() => Object.keys(window.__ffSeen).some(k => k.endsWith(':{example.pk}'))",
                               timeout=10_000)
        seen = page.evaluate("window.__ffSeen")
        assert f"running:{example.pk}" in seen or f"finished:{example.pk}" in seen, seen
        page.screenshot(path=str(screenshots / "home-live.png"), full_page=True)
        page.wait_for_function(f"() => 'finished:{example.pk}' in window.__ffSeen", timeout=90_000)
        assert page.locator(f"[data-section=finished] tr[data-run-id='{example.pk}'] .badge.state-succeeded").count() == 1

        # A run that fails: on the home page within a second of failing, and on the run list.
        runs_page = context.new_page()
        runs_page.goto(base + "/runs/")
        runs_page.evaluate(NO_RELOAD)
        failing = orm(lambda: start_run(workflow=resolve_workflow(organization=data["org"], workflow="partner-sync"),
                                        actor=data["actor"]))
        page.wait_for_function(f"() => 'failed:{failing.pk}' in window.__ffSeen", timeout=60_000)
        shown_ms = page.evaluate(f"window.__ffSeen['failed:{failing.pk}']")
        finished_at = orm(lambda: WorkflowRun.objects.unscoped().get(pk=failing.pk).finished_at)
        latency_ms = shown_ms - finished_at.timestamp() * 1000
        line = f"home page: a failed run shown {latency_ms:.0f} ms after its finished_at"
        print(line)
        with open(SCREENSHOTS.parent / "e2e-live-light.txt", "a") as out:
            out.write(line + "\n")
        assert 0 <= latency_ms < 1000, latency_ms
        assert "partner-sync" in page.locator(f"[data-section=failed] tr[data-run-id='{failing.pk}']").inner_text()
        page.screenshot(path=str(screenshots / "home-failed.png"), full_page=True)
        assert page.evaluate("window.__ffNoReload === true"), "the page reloaded"
        runs_page.wait_for_selector(f"tr[data-run-id='{failing.pk}'] .badge.state-failed", timeout=10_000)
        assert runs_page.evaluate("window.__ffNoReload === true"), "the run list reloaded"
        assert not csp, csp
    finally:
        context.close()
        time.sleep(HUB_IDLE_SECONDS)
