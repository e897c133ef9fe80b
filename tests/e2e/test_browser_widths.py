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
