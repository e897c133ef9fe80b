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


# Per element: its text and, for each line break inside it, the character before the break.
_BREAKS = """(sel) => [...document.querySelectorAll(sel)].map(el => {
  const before = []; let prev = null;
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
      const top = range.getBoundingClientRect().top;
      if (prev && top > prev.top + 2) before.push(prev.ch);
      prev = {ch: node.data[i], top};
    }
  }
  return [el.textContent, before];
})"""


def test_task_keys_and_a_creators_address_wrap_only_after_a_separator(org, browser, tmp_path):
    """A fresh review at 1280 px saw the 37-task workflow's 'Depends on' chips cut as 'create_' /
    'entry_gcs' beside a Key column that never wrapped, and the trigger page's 'flaky_customer_syn'
    / 'c' and 'demo@flowforge.loc' / 'al'. Now a key breaks only after '_', '.', '-' or '/', an
    address after its '@' first (the breakable filter), and the two columns share the width."""
    from engine.triggers import create_trigger
    from tenancy.actors import Actor

    email = "dorothea@operations.flowforge-customer.example"  # wider than its cell; "dorothea@" is not

    def render() -> tuple[str, str]:
        owner = member(org, Role.OWNER)
        owner.email = email
        owner.save(update_fields=["email"])
        wf = apply_definition(organization=org, document={"name": "airflow-example-complex", "tasks": _airflow()})
        trigger = create_trigger(actor=Actor(organization=org, role=Role.OWNER, user=owner, channel="web"),
                                 data={"name": "nightly", "workflow_name": "airflow-example-complex",
                                       "cron_expression": "0 6 * * *", "timezone": "UTC"})
        client = client_for(owner)
        return (client.get(f"/workflows/{wf.pk}/").content.decode(),
                client.get(f"/triggers/{trigger.pk}/").content.decode())

    workflow_html, trigger_html = orm(render)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(as_file(workflow_html, tmp_path / "workflow.html"))
    page.wait_for_load_state("load")
    keys = page.evaluate(_BREAKS, "table.tasks td[data-label='Key'] code, table.tasks td[data-label='Depends on'] code")
    assert len(keys) > 37 + 50  # every key, and every dependency chip
    assert [(text, before) for text, before in keys if set(before) - set("_.-/")] == []
    wrapped = sum(1 for _text, before in keys if before)
    assert wrapped < len(keys) / 2, f"{wrapped} of {len(keys)} keys wrap: a column is squeezed"

    page.goto(as_file(trigger_html, tmp_path / "trigger.html"))
    page.wait_for_load_state("load")
    facts = dict(page.evaluate(_BREAKS, "dl.run-facts dd"))
    assert facts["airflow-example-complex"] in ([], ["-"])
    # At its '@' first, then at a dot or dash of a part wider than the cell.
    assert facts[email][:1] == ["@"] and set(facts[email]) <= set("@.-"), facts[email]


def test_a_failed_runs_error_row_spans_its_columns_under_the_run(org, browser, tmp_path):
    """The dashboard's failed run and its error line read as one entry: a fresh review saw the
    error cell (display: -webkit-box, for its two-line clamp) only as wide as its text, its
    bottom line stopping under 'Workflow', and a line between the run and its own error."""
    def render() -> str:
        wf = apply_definition(organization=org, document={"name": "nightly", "tasks": [{"key": "load", "type": "noop"}]})
        drive_run(start_run(workflow=wf), fail={"load"})
        return client_for(member(org, Role.OWNER)).get("/").content.decode()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(as_file(orm(render), tmp_path / "home.html"))
    page.wait_for_load_state("load")
    rows = page.evaluate("""(() => {
      const error = document.querySelector('tr.run-error-row');
      const run = error.previousElementSibling;
      const cell = error.cells[1];
      return {display: getComputedStyle(cell).display, cellRight: cell.getBoundingClientRect().right,
              rowRight: error.getBoundingClientRect().right,
              lineBetween: [...run.cells].map(c => getComputedStyle(c).borderBottomWidth),
              text: cell.textContent.trim()};
    })()""")
    assert rows["text"] == "task load failed"
    assert rows["display"] == "table-cell"
    assert abs(rows["cellRight"] - rows["rowRight"]) < 1, rows
    assert set(rows["lineBetween"]) == {"0px"}, rows


def test_the_email_pages_radio_buttons_sit_beside_their_addresses(org, browser, tmp_path):
    """A fresh review saw each address's radio button stretched across the form and drawn in its
    middle, a line above the address it selects, and "Add Email Address" pressed against the
    buttons above it."""
    from allauth.account.models import EmailAddress

    def render() -> str:
        owner = member(org, Role.OWNER)
        EmailAddress.objects.create(user=owner, email=owner.email, verified=True, primary=True)
        EmailAddress.objects.create(user=owner, email="second@radio.example", verified=False, primary=False)
        return client_for(owner).get("/accounts/email/").content.decode()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(as_file(orm(render), tmp_path / "email.html"))
    page.wait_for_load_state("load")
    rows = page.evaluate("""[...document.querySelectorAll('form.stack input[type=radio]')].map(radio => {
      const r = radio.getBoundingClientRect(), l = document.querySelector(`label[for="${radio.id}"]`).getBoundingClientRect();
      const form = radio.form.getBoundingClientRect();
      return {width: r.width, fromFormLeft: r.left - form.left, labelAfter: l.left - r.right,
              middles: Math.abs((r.top + r.bottom) / 2 - (l.top + l.bottom) / 2)};
    })""")
    assert len(rows) == 2
    for row in rows:
        assert row["width"] < 20 and row["fromFormLeft"] < 10, row  # before: 846 px wide, its dot in the middle
        assert 0 <= row["labelAfter"] < 16 and row["middles"] < 4, row  # before: a line above its label
    gap = page.evaluate("""(() => { const h = [...document.querySelectorAll('h2')].find(e => /Add Email/.test(e.textContent));
      return h.getBoundingClientRect().top - h.previousElementSibling.getBoundingClientRect().bottom; })()""")
    assert gap >= 24, gap


def test_the_dashboards_run_tables_scroll_on_a_phone(org, browser, tmp_path):
    """At 390 px the dashboard's run tables are wider than the phone: a fresh review found their
    cards clipping them (overflow hidden), the Finished and Duration columns out of reach. Each
    now scrolls inside its own box, as the other pages' tables do."""
    def render() -> str:
        wf = apply_definition(organization=org, document={"name": "nightly_customer_sync",
                                                          "tasks": [{"key": "load", "type": "noop"}]})
        drive_run(start_run(workflow=wf), fail={"load"})
        return client_for(member(org, Role.OWNER)).get("/").content.decode()

    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(as_file(orm(render), tmp_path / "home.html"))
    page.wait_for_load_state("load")
    assert page.evaluate("document.documentElement.scrollWidth") == 390
    boxes = page.evaluate("""[...document.querySelectorAll('table.home-runs')].map(t => {
      const box = t.parentElement; box.scrollLeft = box.scrollWidth;
      const last = t.querySelector('th:last-child').getBoundingClientRect(), shown = box.getBoundingClientRect();
      return {overflowX: getComputedStyle(box).overflowX, wider: t.offsetWidth > box.clientWidth,
              lastColumnShown: last.right <= shown.right + 1 && last.left >= shown.left - 1};
    })""")
    assert len(boxes) == 2  # failed, finished
    assert all(b == {"overflowX": "auto", "wider": True, "lastColumnShown": True} for b in boxes), boxes


def test_the_triggers_table_keeps_its_buttons_in_the_card(org, browser, tmp_path):
    """At 1,024 px a fresh look found the triggers table 1,116 px wide in its 990 px card: Edit and
    Delete scrolled out of sight. Names now wrap after a separator and the buttons may stack; at
    1,280 px a 21-character name takes at most two lines, broken after an underscore."""
    from engine.triggers import create_trigger
    from tenancy.actors import Actor

    def render() -> str:
        owner = member(org, Role.OWNER)
        apply_definition(organization=org, document={"name": "flaky_customer_sync", "tasks": [{"key": "a", "type": "noop"}]})
        create_trigger(actor=Actor(organization=org, role=Role.OWNER, user=owner, channel="web"),
                       data={"name": "nightly_customer_sync", "workflow_name": "flaky_customer_sync",
                             "cron_expression": "0 6 * * *", "timezone": "Europe/Amsterdam"})
        return client_for(owner).get("/triggers/").content.decode()

    url = as_file(orm(render), tmp_path / "triggers.html")
    for width in (1024, 1280):
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(url)
        page.wait_for_load_state("load")
        fit = page.evaluate("""(() => { const t = document.querySelector('table.triggers'), box = t.parentElement;
          const name = t.querySelector('td[data-label=Name] a'), range = document.createRange();
          range.selectNodeContents(name);
          return {table: Math.round(t.getBoundingClientRect().width), box: box.clientWidth,
                  nameLines: new Set([...range.getClientRects()].map(r => Math.round(r.top))).size}; })()""")
        assert fit["table"] <= fit["box"], (width, fit)
        assert fit["nameLines"] <= 2, (width, fit)
        breaks = dict(page.evaluate(_BREAKS, "table.triggers td[data-label=Name] a"))
        assert set(breaks["nightly_customer_sync"]) <= {"_"}, breaks
        page.close()
