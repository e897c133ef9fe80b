"""The workflow grid (issue 20): a page of a version's runs × its tasks, each cell the
task run's state linking to its task panel; keyset pages of runs (older/newer), a query
count that does not grow with the runs shown, another organization's workflow a 404,
and bad parameters a 400 naming them (never a 500)."""

from __future__ import annotations

import html
import re

from engine.models import TaskRun, WorkflowRun
from engine.services import apply_definition, start_run
from frontend.presenters.workflow_grid import ordered_task_keys
from tests.unit.test_web_runs import actor_for, client_for, counted, drive_run, owner_of

DOC = {"name": "grid-flow", "tasks": [
    {"key": "load", "type": "noop", "depends_on": ["extract"]},
    {"key": "extract", "type": "noop"},
    {"key": "check", "type": "fail", "depends_on": ["extract"], "config": {"message": "bad rows"}},
    {"key": "report", "type": "noop", "depends_on": ["load", "check"], "trigger_rule": "all_done"},
]}


def version(org):
    return apply_definition(actor=actor_for(org), document=DOC)


def runs_of(org, wf, n: int) -> list[WorkflowRun]:
    return [start_run(workflow=wf, actor=actor_for(org)) for _ in range(n)]


def cells(body: str) -> list[tuple[str, str, str]]:
    """(state, run id, task run id) of every task cell, in document order (row by row)."""
    return re.findall(r'<a class="gc state-(\w+)" data-state="\w+" href="/runs/([0-9a-f-]{36})/tasks/([0-9a-f-]{36})/"',
                      body)


def run_headers(body: str) -> list[str]:
    return re.findall(r'<th scope="col" class="grid-run"><a class="gc state-\w+" href="/runs/([0-9a-f-]{36})/"', body)


def test_task_order_is_by_layer_then_as_written():
    assert ordered_task_keys(DOC) == ["extract", "load", "check", "report"]
    chain = {"tasks": [{"key": f"t{i}", "depends_on": [f"t{i + 1}"] if i < 2999 else []} for i in range(3000)]}
    assert ordered_task_keys(chain) == [f"t{i}" for i in range(2999, -1, -1)]  # deeper than recursion allows


def test_cells_are_colored_by_state_and_link_to_the_task_panel(org):
    wf = version(org)
    done = drive_run(runs_of(org, wf, 1)[0], fail={"check"})
    waiting = runs_of(org, wf, 1)[0]
    resp = client_for(owner_of(org)).get(f"/workflows/{wf.pk}/grid/")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert run_headers(body) == [str(done.pk), str(waiting.pk)]  # oldest left
    ids = {(tr.workflow_run_id, tr.task.key): str(tr.pk)
           for tr in TaskRun.objects.for_organization(org).filter(workflow_run__workflow=wf).select_related("task")}
    expected = []
    for key, states in (("extract", ("succeeded", "ready")), ("load", ("succeeded", "pending")),
                        ("check", ("failed", "pending")), ("report", ("succeeded", "pending"))):
        for run, state in zip((done, waiting), states, strict=True):
            expected.append((state, str(run.pk), ids[(run.pk, key)]))
    assert cells(body) == expected
    # Each cell's link opens that task run's panel.
    state, run_id, task_run_id = expected[4]  # check of the finished run
    panel = client_for(owner_of(org)).get(f"/runs/{run_id}/tasks/{task_run_id}/")
    assert panel.status_code == 200 and "bad rows" in html.unescape(panel.content.decode())


def test_older_and_newer_pages_walk_the_runs_by_keyset(org):
    wf = version(org)
    made = runs_of(org, wf, 5)  # oldest first
    client = client_for(owner_of(org))
    first = client.get(f"/workflows/{wf.pk}/grid/?runs=2").content.decode()
    assert run_headers(first) == [str(r.pk) for r in made[3:5]]
    older = html.unescape(re.search(r'rel="prev" href="([^"]+)"', first).group(1))
    assert "older_than=" in older and "runs=2" in older
    second = client.get(f"/workflows/{wf.pk}/grid/{older}").content.decode()
    assert run_headers(second) == [str(r.pk) for r in made[1:3]]
    third = client.get(f"/workflows/{wf.pk}/grid/" + html.unescape(
        re.search(r'rel="prev" href="([^"]+)"', second).group(1))).content.decode()
    assert run_headers(third) == [str(made[0].pk)]
    assert 'rel="prev"' not in third  # the oldest page: no older link
    newer = html.unescape(re.search(r'rel="next" href="([^"]+)"', third).group(1))
    assert run_headers(client.get(f"/workflows/{wf.pk}/grid/{newer}").content.decode()) == [
        str(r.pk) for r in made[1:3]]
    assert 'rel="next"' not in first  # the newest page: no newer link


def test_query_count_does_not_grow_with_the_runs_shown(org):
    wf = version(org)
    client = client_for(owner_of(org))
    runs_of(org, wf, 2)
    client.get(f"/workflows/{wf.pk}/grid/")  # warm the session
    small, small_sql = counted(client, f"/workflows/{wf.pk}/grid/?runs=2")
    runs_of(org, wf, 10)
    large, large_sql = counted(client, f"/workflows/{wf.pk}/grid/?runs=12")
    assert small.status_code == large.status_code == 200
    assert len(run_headers(large.content.decode())) == 12
    assert len(large_sql) == len(small_sql), "\n".join(large_sql)
    grid_sql = [q for q in large_sql if "core_workflowrun" in q or "core_taskrun" in q or "core_task" in q]
    assert not any("OFFSET" in q for q in grid_sql)


def test_another_organizations_workflow_is_a_404(make_org):
    mine, theirs = make_org(), make_org()
    foreign = version(theirs)
    runs_of(theirs, foreign, 1)
    client = client_for(owner_of(mine))
    assert client.get(f"/workflows/{foreign.pk}/grid/").status_code == 404
    # A cursor of their grid does not reach their runs through my workflow either.
    wf = version(mine)
    theirs_run = WorkflowRun.objects.for_organization(theirs).get(workflow=foreign)
    resp = client.get(f"/workflows/{wf.pk}/grid/")
    assert resp.status_code == 200 and str(theirs_run.pk) not in resp.content.decode()


def test_bad_parameters_are_a_400_naming_them(org):
    wf = version(org)
    runs_of(org, wf, 1)
    client = client_for(owner_of(org))
    for query, param in (("older_than=not-a-cursor", "older_than"), ("newer_than=eyJ0IjoxfQ", "newer_than"),
                         ("older_than=eyJ0IjoiMjAyNi0wMS0wMVQwMDowMDowMCIsImlkIjoiMSJ9", "older_than"),
                         ("runs=abc", "runs"), ("runs=0", "runs"), ("runs=101", "runs"),
                         ("task_from=-1", "task_from"), ("task_from=4", "task_from")):
        resp = client.get(f"/workflows/{wf.pk}/grid/?{query}")
        assert resp.status_code == 400, query
        body = html.unescape(resp.content.decode())
        assert f'data-param="{param}"' in body and param in body.split('role="alert"')[1], query
    assert client.get("/workflows/not-a-uuid/grid/").status_code == 404
