"""Page widths in Chromium: nothing pushes a page wider than the screen, and the workflow
page's task table fits its card (a fresh review found the run page 1,068 px wide on a
390 px phone: the task table's visually hidden 'Actions' header, absolutely positioned,
escaped its scrolling box; and the 37-task workflow's table scrolled inside its card,
cutting the 'Depends on' chips).

The pages are rendered by Django's test client and opened from a file with the project's
own CSS and scripts: layout needs no server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

from engine.services import apply_definition, start_run
from tenancy.models import Role
from tests.e2e.conftest import orm
from tests.e2e.test_browser_graph import _airflow
from tests.unit.test_web_runs import client_for, drive_run, member

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STATIC = Path(settings.BASE_DIR) / "frontend" / "static"


def as_file(html: str, path: Path) -> str:
    """``html`` written to ``path`` with its /static/ URLs pointing at the checkout's files."""
    path.write_text(re.sub(r'(href|src)="/static/', lambda m: f'{m.group(1)}="file://{STATIC.resolve()}/', html))
    return f"file://{path}"


def test_a_failed_runs_page_is_no_wider_than_a_phone(org, browser, tmp_path):
    def render() -> str:
        tasks = [{"key": "start", "type": "noop"}] + [
            {"key": f"fan_{i:02d}_with_a_longer_name", "type": "noop", "depends_on": ["start"]} for i in range(54)]
        wf = apply_definition(organization=org, document={"name": "wide", "tasks": tasks})
        run = drive_run(start_run(workflow=wf), fail={"fan_03_with_a_longer_name"})
        return client_for(member(org, Role.OWNER)).get(f"/runs/{run.pk}/").content.decode()

    url = as_file(orm(render), tmp_path / "run.html")
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(url)
    page.wait_for_load_state("load")
    assert page.evaluate("document.documentElement.scrollWidth") == 390
    # The task table scrolls inside its own box instead.
    box = page.evaluate("(() => { const w = document.querySelector('table.tasks-table').parentElement; "
                        "return [w.scrollWidth > w.clientWidth, getComputedStyle(w).overflowX]; })()")
    assert box == [True, "auto"]


def test_the_37_task_workflows_table_fits_its_card_at_1440_px(org, browser, tmp_path):
    def render() -> str:
        wf = apply_definition(organization=org, document={"name": "airflow-example-complex", "tasks": _airflow()})
        return client_for(member(org, Role.OWNER)).get(f"/workflows/{wf.pk}/").content.decode()

    url = as_file(orm(render), tmp_path / "workflow.html")
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(url)
    page.wait_for_load_state("load")
    wrap = page.evaluate("(() => { const w = document.querySelector('table.tasks').parentElement; "
                         "return [w.scrollWidth, w.clientWidth]; })()")
    assert wrap[0] == wrap[1], f"the task table is {wrap[0]} px wide in a {wrap[1]} px card"


# Per label: its text, the lines it takes, and the lines it takes with words kept whole
# (overflow-wrap: normal set on it): more lines as laid out means a word was broken.
_LINES = """(sel) => [...document.querySelectorAll(sel)].map(el => {
  const lines = () => { const range = document.createRange(); range.selectNodeContents(el);
    return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; };
  const shown = lines(); el.style.overflowWrap = "normal"; const whole = lines(); el.style.overflowWrap = "";
  return [el.textContent.trim(), shown, whole];
})"""


def test_checkbox_labels_badges_and_the_new_workflow_form_fit_a_phone(org, browser, tmp_path):
    """A fresh review at 390 px saw "Enab|led" beside the trigger form's checkbox and "En|abl|ed"
    on the webhook form (flex labels shrunk by the long-word rule), and /workflows/new/ 509 px
    wide (the definition format's <pre> widened the one-column grid)."""
    def render() -> dict[str, str]:
        owner = client_for(member(org, Role.OWNER))
        apply_definition(organization=org, document={"name": "daily", "tasks": [{"key": "a", "type": "noop"}]})
        return {name: owner.get(path).content.decode()
                for name, path in (("trigger", "/triggers/new/"), ("webhook", "/webhooks/"),
                                   ("workflow", "/workflows/new/"))}

    pages = orm(render)
    page = browser.new_page(viewport={"width": 390, "height": 844})
    for name in ("trigger", "webhook"):
        page.goto(as_file(pages[name], tmp_path / f"{name}.html"))
        page.wait_for_load_state("load")
        labels = page.evaluate(_LINES, ".field.checkbox label, label.check")
        assert labels, f"no checkbox label on the {name} form"
        assert all(shown == whole for _, shown, whole in labels), (name, labels)
    page.goto(as_file(pages["workflow"], tmp_path / "workflow.html"))
    page.wait_for_load_state("load")
    assert page.evaluate("document.documentElement.scrollWidth") == 390
    # A state badge keeps its dot and word on one line in a narrow cell (it wrapped into a tall
    # pill beside "1 minute ago" at 1280 px and on the dashboard at 390 px).
    lines = page.evaluate("""() => { const cell = document.createElement("div"); cell.style.width = "3rem";
      cell.innerHTML = '<span class="badge">Running now</span>'; document.body.append(cell);
      const range = document.createRange(); range.selectNodeContents(cell.firstChild);
      return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; }""")
    assert lines == 1
