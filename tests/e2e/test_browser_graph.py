"""The DAG drawing at every size, in real Chromium (issue 20): the workflow page and the run
page of 7-, 20- (a chain), 37- (Airflow's example_complex), 60-, 300- and 5,000-task DAGs.

From the DOM, on each page: the graph is drawn inside its card on load; every node label
inside the viewport is at least 10 px high at the default zoom (every task is a node or in a
group node); the two pages place every node at the same spot; the zoom buttons, the wheel
and a drag zoom and pan; a fan-out group expands on a click (the 5,000-task one, too big to
draw, opens the task list on its members); the run page's nodes follow the task states
without a reload and keep the zoom. Screenshots: var/screenshots/graph-<n>-<page>.png.

The runs are started but not executed (no worker): their task states are set in the
database, which is all the page reads.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.models import TaskRun
from engine.services import apply_definition, start_run
from flowforge.stack import BASE_DIR
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 900}
SHOTS = BASE_DIR / "var" / "screenshots"
AIRFLOW = BASE_DIR.parent / "shared" / "data" / "dags" / "airflow_example_complex.json"
MIN_LABEL_PX = 10


def _airflow() -> list[dict]:
    for path in (AIRFLOW, BASE_DIR / "tests" / "e2e" / "data" / "airflow_example_complex.json"):
        if path.exists():
            return json.loads(path.read_text())["tasks"]
    raise AssertionError("airflow_example_complex.json not found")


def dag(n: int) -> list[dict]:
    """The definition's tasks of the n-task DAG of the issue."""
    t = lambda key, *deps, **kw: {"key": key, "type": "noop", "depends_on": list(deps), **kw}  # noqa: E731
    if n == 7:
        return [t("extract_orders"), t("extract_customers"),
                t("validate", "extract_orders", "extract_customers",
                  edge_labels={"extract_orders": "orders", "extract_customers": "customers"}),
                t("transform", "validate"), t("load_warehouse", "transform"),
                t("refresh_dashboards", "load_warehouse"), t("notify_team", "load_warehouse")]
    if n == 20:
        return [t("step_00")] + [t(f"step_{i:02}", f"step_{i - 1:02}") for i in range(1, 20)]
    if n == 37:
        return _airflow()
    if n == 60:  # a fan-out and fan-in: start, 58 shards, join
        return [t("start")] + [t(f"shard_{i:02}", "start") for i in range(58)] + \
            [t("join", *[f"shard_{i:02}" for i in range(58)])]
    if n == 300:  # start, 297 parallel items, merge, publish
        items = [f"item_{i:03}" for i in range(297)]
        return [t("start")] + [t(k, "start") for k in items] + [t("merge", *items), t("publish", "merge")]
    if n == 5000:  # start, 6 lanes of (prepare, 831 items, merge), publish
        out = [t("start")]
        for lane in range(6):
            items = [f"lane{lane}_item_{i:03}" for i in range(831)]
            out += [t(f"lane{lane}_prepare", "start")] + [t(k, f"lane{lane}_prepare") for k in items]
            out.append(t(f"lane{lane}_merge", *items))
        return out + [t("publish", *[f"lane{lane}_merge" for lane in range(6)])]
    raise ValueError(n)


def setup(n: int) -> dict:
    """An organization with the n-task workflow and a run of it whose task states are a mix
    (the first half succeeded, two failed, two ready, the rest pending); the owner's session."""
    org, owner, _ = create_organization(slug=f"graph{n}", name=f"Graph {n}", owner_email=f"o{n}@graph.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    tasks = dag(n)
    assert len(tasks) == n
    workflow = apply_definition(actor=actor, document={"name": f"graph-{n}", "tasks": tasks})
    run = start_run(workflow=workflow, actor=actor, claim_roots=False)
    runs = list(TaskRun.objects.for_organization(org).filter(workflow_run=run).order_by("task__key")
                .values_list("id", flat=True))
    half = runs[: n // 2]
    TaskRun.objects.for_organization(org).filter(pk__in=half).update(state="succeeded")
    TaskRun.objects.for_organization(org).filter(pk__in=runs[n // 2: n // 2 + 2]).update(state="failed")
    TaskRun.objects.for_organization(org).filter(pk__in=runs[n // 2 + 2: n // 2 + 4]).update(state="ready")
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"workflow": str(workflow.pk), "run": str(run.pk), "session": session.session_key, "org": org.pk}


# Everything the assertions need, read from the DOM in one go.
MEASURE = """() => {
  const root = document.querySelector('[data-graph]');
  const vp = root.querySelector('[data-graph-viewport]').getBoundingClientRect();
  const card = root.closest('.card').getBoundingClientRect();
  const zoom = root.querySelector('svg.dag g.zoom').getBoundingClientRect();
  const inside = (r) => r.right > vp.left && r.left < vp.right && r.bottom > vp.top && r.top < vp.bottom;
  const nodes = [...root.querySelectorAll('svg.dag g.node')];
  const labels = nodes.map(g => {
    const r = g.querySelector('.node-key').getBoundingClientRect();
    const box = g.querySelector('.node-box:not(.group-shadow)').getBoundingClientRect();
    return {key: g.dataset.taskKey || ('group ' + g.dataset.group), h: r.height, visible: inside(box),
            x: Math.round(box.left - zoom.left), y: Math.round(box.top - zoom.top), group: g.dataset.group != null,
            size: Number(g.dataset.size || 1), counts: g.dataset.counts || null, state: g.dataset.state || null};
  });
  const ctm = root.querySelector('svg.dag g.zoom').getScreenCTM();
  return {vp: {l: vp.left, t: vp.top, r: vp.right, b: vp.bottom, w: vp.width, h: vp.height},
          card: {l: card.left, t: card.top, r: card.right, b: card.bottom},
          zoom: {l: zoom.left, t: zoom.top, r: zoom.right, b: zoom.bottom, w: zoom.width, h: zoom.height},
          scale: ctm.a, labels, innerHeight: window.innerHeight, tasks: Number(root.dataset.tasks)};
}"""


def no_stream(page) -> None:
    """Refuse the page's event stream as a server at its limit does (429): the page then polls
    its live fragment every 2 s. (A real stream's LISTEN connection would outlive the test
    and keep the test database from being dropped.)"""
    page.route("**/stream/**", lambda route: route.fulfill(status=429, body="busy", headers={"Retry-After": "60"}))


def measure(page) -> dict:
    return page.evaluate(MEASURE)


def open_graph(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_selector("[data-graph][data-ready='1']", timeout=60_000)
    return measure(page)


def check_default_view(m: dict, n: int, where: str) -> None:
    """The graph is in its card, inside the visible page, and legible; every task is shown."""
    vp, card, zoom = m["vp"], m["card"], m["zoom"]
    assert card["l"] <= vp["l"] and vp["r"] <= card["r"] and card["t"] <= vp["t"] and vp["b"] <= card["b"], where
    assert vp["t"] < m["innerHeight"], f"{where}: the graph card starts below the window"
    # The drawing overlaps the viewport; when it is smaller than the viewport it is wholly inside.
    assert zoom["r"] > vp["l"] and zoom["l"] < vp["r"] and zoom["b"] > vp["t"] and zoom["t"] < vp["b"], where
    if zoom["w"] <= vp["w"] and zoom["h"] <= vp["h"]:
        assert vp["l"] <= zoom["l"] + 0.5 and zoom["r"] <= vp["r"] + 0.5, where
        assert vp["t"] <= zoom["t"] + 0.5 and zoom["b"] <= vp["b"] + 0.5, where
    visible = [lab for lab in m["labels"] if lab["visible"]]
    assert visible, f"{where}: no node in the viewport"
    small = [lab for lab in visible if lab["h"] < MIN_LABEL_PX]
    assert not small, f"{where}: labels below {MIN_LABEL_PX} px: {small[:5]}"
    assert m["scale"] * 14 >= MIN_LABEL_PX, where  # every label, in view or not (14 px at scale 1)
    # Every task is drawn: as a node of its own or inside a group node.
    assert sum(lab["size"] for lab in m["labels"]) == n == m["tasks"], where


def check_zoom_and_pan(page, where: str) -> None:
    before = measure(page)["scale"]
    page.click("[data-graph-action=zoom-in]")
    after = measure(page)
    assert after["scale"] == pytest.approx(before * 1.25, rel=1e-3), where
    page.click("[data-graph-action=zoom-out]")
    assert measure(page)["scale"] == pytest.approx(before, rel=1e-3), where
    vp = measure(page)["vp"]
    cx, cy = vp["l"] + vp["w"] / 2, vp["t"] + vp["h"] / 2
    page.mouse.move(cx, cy)
    page.mouse.wheel(0, -300)
    assert measure(page)["scale"] > before * 1.3, where  # the wheel zooms in
    page.mouse.wheel(0, 300)
    assert measure(page)["scale"] == pytest.approx(before, rel=1e-2), where
    start = measure(page)["zoom"]
    page.mouse.move(cx, cy)
    page.mouse.down()
    page.mouse.move(cx - 60, cy - 30, steps=5)
    page.mouse.move(cx - 120, cy - 40, steps=5)
    page.mouse.up()
    moved = measure(page)["zoom"]
    assert moved["l"] == pytest.approx(start["l"] - 120, abs=1) and moved["t"] == pytest.approx(start["t"] - 40, abs=1), where
    page.click("[data-graph-action=fit]")
    assert measure(page)["scale"] == pytest.approx(before, rel=1e-3), where


# The 5,000-task DAG takes 20-180 s (most of it creating the run; 19 s on 2026-12-03): `make browser-large`
# runs it (pytest -m large), with 20 and 60, which add little to 7, 37 and 300 in `make test`.
SIZES = [7, pytest.param(20, marks=pytest.mark.large), 37, pytest.param(60, marks=pytest.mark.large), 300,
         pytest.param(5000, marks=pytest.mark.large)]


@pytest.mark.parametrize("n", SIZES)
def test_graph_is_legible_fits_its_card_zooms_pans_and_expands_groups(n, live_server, browser):
    data = orm(lambda: setup(n))
    base = live_server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    no_stream(page)
    problems: list[str] = []
    # (The refused stream is the one resource allowed to fail.)
    page.on("console", lambda m: problems.append(m.text)
            if m.type == "error" and "status of 429" not in m.text else None)
    page.on("pageerror", lambda e: problems.append(str(e)))

    positions = {}
    for where, url in (("workflow", f"{base}/workflows/{data['workflow']}/"), ("run", f"{base}/runs/{data['run']}/")):
        m = open_graph(page, url)
        page.locator("[data-graph]").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"graph-{n}-{where}.png"))
        m = measure(page)
        check_default_view(m, n, f"{n} tasks, {where} page")
        # At the legibility floor, part of the graph is outside the card: the note says so.
        clipped = page.locator("[data-graph]").get_attribute("data-clipped")
        note = page.locator("[data-graph-note]").inner_text()
        if n == 7:
            assert clipped == "0" and "outside the card" not in note, (where, note)
        if n == 37:
            assert clipped == "1" and "part of the graph is outside the card" in note, (where, note)
        # In the drawing's own units (the two cards may differ in width, so in scale).
        positions[where] = {lab["key"]: (round(lab["x"] / m["scale"]), round(lab["y"] / m["scale"]))
                            for lab in m["labels"]}
        check_zoom_and_pan(page, f"{n} tasks, {where} page")

        groups = [lab for lab in m["labels"] if lab["group"]]
        if n >= 60:
            assert groups, f"{n} tasks: the fan-out is not grouped"
        if where == "run" and groups:
            counts = json.loads(groups[0]["counts"])
            assert sum(counts.values()) == groups[0]["size"]
        if groups:
            group = groups[0]
            page.click(f"svg.dag g.node.group[data-group='{group['key'].split()[-1]}']")
            if group["size"] <= 400:  # expanded in place, then fitted legibly again
                page.wait_for_function(
                    f"() => document.querySelectorAll('svg.dag g.node').length === {len(m['labels']) - 1 + group['size']}",
                    timeout=30_000)
                page.wait_for_timeout(100)
                expanded = measure(page)
                check_default_view(expanded, n, f"{n} tasks, {where} page, group expanded")
                page.screenshot(path=str(SHOTS / f"graph-{n}-{where}-expanded.png"))
                page.click("[data-graph-action=collapse]")
                page.wait_for_function(
                    f"() => document.querySelectorAll('svg.dag g.node').length === {len(m['labels'])}", timeout=30_000)
            else:  # too big to draw: the task list on its members
                page.wait_for_selector("[data-graph-list]:not([hidden]) [data-list-count]")
                assert page.locator("[data-list-count]").get_attribute("data-list-count") == str(group["size"])
                assert page.locator(".graph-list-table tbody tr").count() == 200
                page.screenshot(path=str(SHOTS / f"graph-{n}-{where}-group-list.png"), full_page=False)
                page.click("[data-list-group]")  # every task
                assert page.locator("[data-list-count]").get_attribute("data-list-count") == str(n)
                page.fill("[data-list-filter]", "lane3_item_42")
                assert page.locator("[data-list-count]").get_attribute("data-list-count") == "10"

    # The same layout on both pages.
    assert positions["workflow"] == positions["run"]
    assert not problems, problems


def test_run_page_nodes_follow_task_states_keep_the_zoom_and_open_the_task_panel(live_server, browser):
    data = orm(lambda: setup(7))
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    no_stream(page)
    open_graph(page, f"{base}/runs/{data['run']}/")
    page.evaluate("window.__ffNoReload = true")
    page.click("[data-graph-action=zoom-in]")
    scale = measure(page)["scale"]
    key = "transform"
    assert page.locator(f"svg.dag #node-{key}").get_attribute("data-state") != "failed"

    def fail_it():
        from engine.models import TaskRun, WorkflowRun

        run = WorkflowRun.objects.unscoped().get(pk=data["run"])
        TaskRun.objects.unscoped().filter(workflow_run=run, task__key=key).update(state="failed")
        # A new event seq makes the page's poll fetch the fragment.
        WorkflowRun.objects.unscoped().filter(pk=run.pk).update(last_event_seq=run.last_event_seq + 1)

    orm(fail_it)
    page.wait_for_selector(f"svg.dag #node-{key}.state-failed", timeout=30_000)
    assert page.locator(f"svg.dag #node-{key} .node-state-label").text_content() == "failed"
    assert measure(page)["scale"] == pytest.approx(scale, rel=1e-3)
    # A node opens its task's panel, as its key in the task table does.
    page.click(f"svg.dag #node-{key} .node-box")
    page.wait_for_selector(f"#task-panel .task-panel[data-task-key='{key}']", timeout=30_000)
    assert page.evaluate("window.__ffNoReload === true")


def test_positions_given_in_the_definition_win(live_server, browser):
    # Canvas positions (seed 003) that no layered layout would choose: the first task on the
    # right, its dependents stacked to its left.
    placed = {"collect": (900, 0), "left": (0, 0), "middle": (0, 200), "bottom": (300, 400)}

    def make():
        data = setup(7)
        from engine.models import Workflow

        org = Workflow.objects.unscoped().get(pk=data["workflow"]).organization
        from tenancy.models import Membership

        owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
        actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
        wf = apply_definition(actor=actor, document={"name": "placed", "tasks": [
            {"key": key, "type": "noop", "position": {"x": x, "y": y},
             "depends_on": [] if key == "collect" else ["collect"]} for key, (x, y) in placed.items()]})
        return {**data, "placed": str(wf.pk)}

    data = orm(make)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    m = open_graph(page, f"{base}/workflows/{data['placed']}/")
    assert page.locator("svg.dag").get_attribute("data-layout") == "positions"
    check_default_view(m, 4, "positions")
    at = {lab["key"]: (lab["x"] / m["scale"], lab["y"] / m["scale"]) for lab in m["labels"]}
    # The drawing keeps the given places, up to a shift and a spread (at most 3 times) per axis.
    xs = sorted(placed, key=lambda k: placed[k][0])
    ys = sorted(placed, key=lambda k: placed[k][1])
    assert sorted(at, key=lambda k: at[k][0]) == xs and sorted(at, key=lambda k: at[k][1]) == ys
    assert at["left"][1] == pytest.approx(at["collect"][1], abs=1)  # same row given, same row drawn
    page.locator("[data-graph]").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "graph-positions-workflow.png"))
