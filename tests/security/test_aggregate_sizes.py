"""Issue 14, finding 3: bounded aggregate sizes.

The attack: a run of 400 task runs each holding a 255 KB output made a 102 MB API
response for GET /api/v1/runs/<id>/ (and a 472 MiB web process), and a task with many
large dependencies was handed all their outputs at once. Now an output over
FLOWFORGE_INLINE_OUTPUT_BYTES is summarized in a run's detail with the URL of the whole
output (tenant-scoped: another organization's member gets a 404), the web run page links
to it, and the upstream a task receives is at most FLOWFORGE_MAX_UPSTREAM_BYTES of whole
outputs, the rest summarized, as the real start statement builds it.
"""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings
from django.db import connection

from engine.models import TaskRun
from engine.repositories import task_runs
from engine.services import apply_definition, start_run
from tenancy.models import Role
from tests import engine_helpers
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_web_workflows import add_member, client_for

BLOB_CHARS = 255_000  # an output of 255 KB, as in the issue
BIG_OUTPUT = {"blob": "x" * BLOB_CHARS}
BIG_BYTES = len('{"blob": ""}') + BLOB_CHARS  # PostgreSQL's jsonb text: a space after the colon


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def run_with_big_outputs(org, n: int = 400):
    """A run of ``n`` tasks whose task runs all succeeded with a 255 KB output, written
    straight to core_taskrun (one UPDATE) to keep the test fast."""
    wf = apply_definition(organization=org, document={"name": "big", "tasks": [
        {"key": f"t{i:03d}", "type": "noop"} for i in range(n)]})
    run = start_run(workflow=wf)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE core_taskrun SET state = 'succeeded', output = jsonb_build_object('blob', repeat('x', %s)),"
            " started_at = clock_timestamp(), finished_at = clock_timestamp() WHERE workflow_run_id = %s",
            [BLOB_CHARS, run.pk])
        assert cur.rowcount == n
    return run


def test_a_run_detail_of_400_outputs_of_255_kb_is_under_1_mb_with_each_output_linked(api, api_factory):
    run = run_with_big_outputs(api.org)
    response = api.get(f"/api/v1/runs/{run.pk}/", role=Role.MEMBER)
    assert response.status_code == 200
    assert len(response.content) < 1_000_000, len(response.content)
    task_runs = response.json()["task_runs"]
    assert len(task_runs) == 400
    for tr in task_runs:
        output = tr["output"]
        assert output["truncated"] is True and output["bytes"] == BIG_BYTES, output
        assert output["url"] == f"http://testserver/api/v1/runs/{run.pk}/task-runs/{tr['id']}/output/"

    url = task_runs[7]["output"]["url"]
    whole = api.get(url, role=Role.VIEWER)  # a viewer may read it
    assert whole.status_code == 200
    assert whole.json() == {"id": task_runs[7]["id"], "key": task_runs[7]["key"], "state": "succeeded",
                            "output": BIG_OUTPUT, "offloaded": False}

    outsider = api_factory()
    assert_problem(outsider.get(url, role=Role.MEMBER), 404)
    # Nor through a run of the outsider's own: the task run must belong to the run named.
    theirs = run_with_big_outputs(outsider.org, n=1)
    assert_problem(outsider.get(f"/api/v1/runs/{theirs.pk}/task-runs/{task_runs[7]['id']}/output/"), 404)


def test_small_outputs_stay_inline_and_the_detail_takes_the_same_number_of_queries(api):
    from django.test.utils import CaptureQueriesContext

    from tests.unit.test_api_auth import data_queries

    run = run_with_big_outputs(api.org, n=3)
    small = TaskRun.objects.for_organization(api.org).filter(workflow_run=run).order_by("created_at", "id").first()
    with connection.cursor() as cur:
        cur.execute("UPDATE core_taskrun SET output = '{\"rows\": 12}'::jsonb WHERE id = %s", [small.pk])
    api.get(f"/api/v1/runs/{run.pk}/")
    with CaptureQueriesContext(connection) as queries:
        body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert len(data_queries(queries)) == 3  # as tests/unit/test_api_runs.py counts for any run
    outputs = {tr["id"]: tr["output"] for tr in body["task_runs"]}
    assert outputs.pop(str(small.pk)) == {"rows": 12}
    assert all(o["truncated"] for o in outputs.values())
    # The big outputs are not even read: only their sizes and the small ones are selected.
    detail_sql = next(q for q in data_queries(queries) if "core_taskrun" in q and "octet_length" in q)
    assert "CASE WHEN" in detail_sql


def test_the_web_run_page_of_400_big_outputs_is_under_2_mb_and_links_each_whole_output(make_org):
    org = make_org()
    run = run_with_big_outputs(org)
    member = client_for(add_member(org, Role.MEMBER))
    page = member.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    assert len(page.content) < 2_000_000, len(page.content)
    body = page.content.decode()
    ids = list(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("id", flat=True))
    assert "whole output (249.0\u00a0KiB)" in body
    # The task table shows 50 rows a page: each page links each of its task runs' whole output.
    first_page = re.findall(rf'href="/runs/{run.pk}/tasks/([0-9a-f-]+)/output/"', body)
    linked = set(first_page)
    assert len(linked) == 50
    for number in range(2, 9):
        more = member.get(f"/runs/{run.pk}/", {"task_page": number})
        assert more.status_code == 200 and len(more.content) < 2_000_000
        linked |= set(re.findall(rf'href="/runs/{run.pk}/tasks/([0-9a-f-]+)/output/"', more.content.decode()))
    assert linked == {str(i) for i in ids}

    whole = member.get(f"/runs/{run.pk}/tasks/{ids[0]}/output/")
    assert whole.status_code == 200 and whole["Content-Type"] == "application/json"
    assert json.loads(whole.content) == BIG_OUTPUT
    # The live fragment shows the same links (of the table's first page) and stays as small.
    live = member.get(f"/runs/{run.pk}/live/")
    assert live.status_code == 200 and len(live.content) < 2_000_000
    assert set(re.findall(rf'href="/runs/{run.pk}/tasks/([0-9a-f-]+)/output/"', live.content.decode())) == \
        set(first_page)

    outsider = client_for(add_member(make_org(), Role.OWNER))
    assert outsider.get(f"/runs/{run.pk}/tasks/{ids[0]}/output/").status_code == 404


def test_a_task_with_20_dependencies_of_255_kb_receives_at_most_the_upstream_cap(org):
    deps = [f"d{i:02d}" for i in range(20)]
    wf = apply_definition(organization=org, document={"name": "fanin", "tasks": [
        *({"key": k, "type": "noop"} for k in deps), {"key": "sink", "type": "noop", "depends_on": deps}]})
    run = start_run(workflow=wf)
    sink = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="sink")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE core_taskrun SET state = 'succeeded', output = jsonb_build_object('blob', repeat('x', %s))"
            " WHERE workflow_run_id = %s AND id <> %s", [BLOB_CHARS, run.pk, sink.pk])
        cur.execute("UPDATE core_taskrun SET state = 'ready' WHERE id = %s", [sink.pk])
    # The real claim and start statements, as a worker runs them.
    (claimed,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="test", task_run_ids=[sink.pk])
    started = engine_helpers.start_attempt(task_run_id=sink.pk, fencing_token=claimed.fencing_token, owner="w",
                                        lease_seconds=60)
    assert started is not None
    upstream = started.upstream
    cap = settings.FLOWFORGE_MAX_UPSTREAM_BYTES
    whole = sorted(k for k, v in upstream.items() if v == BIG_OUTPUT)
    fits = cap // BIG_BYTES  # 4 with the default 1 MiB
    assert whole == deps[:fits]  # by key, while the running total fits
    summaries = {k: v for k, v in upstream.items() if k not in whole}
    assert sorted(summaries) == deps[fits:]
    for key, summary in summaries.items():
        assert summary == {"$ref": "task_output", "task": key, "bytes": BIG_BYTES, "truncated": True}
    overhead = 100 * len(summaries)
    assert len(json.dumps(upstream, separators=(",", ":"))) <= cap + overhead


def test_the_upstream_cap_is_a_setting(org, settings):
    settings.FLOWFORGE_MAX_UPSTREAM_BYTES = 10
    wf = apply_definition(organization=org, document={"name": "pair", "tasks": [
        {"key": "a", "type": "noop"}, {"key": "b", "type": "noop"},
        {"key": "c", "type": "noop", "depends_on": ["a", "b"]}]})
    run = start_run(workflow=wf)
    c = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="c")
    with connection.cursor() as cur:
        cur.execute("UPDATE core_taskrun SET state = 'succeeded', output = '[1, 2]'::jsonb"
                    " WHERE workflow_run_id = %s AND id <> %s", [run.pk, c.pk])
        cur.execute("UPDATE core_taskrun SET state = 'ready' WHERE id = %s", [c.pk])
    (claimed,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="test", task_run_ids=[c.pk])
    started = engine_helpers.start_attempt(task_run_id=c.pk, fencing_token=claimed.fencing_token, owner="w",
                                        lease_seconds=60)
    # "[1, 2]" is 6 bytes: a fits (6 <= 10), b does not (12 > 10).
    assert started.upstream == {"a": [1, 2], "b": {"$ref": "task_output", "task": "b", "bytes": 6, "truncated": True}}


@pytest.mark.django_db(transaction=True)
def test_a_handler_failing_with_a_1_mb_message_stores_and_serves_a_bounded_error(api, monkeypatch):
    """An exception's message is the other unbounded thing a task hands back: it is stored
    on the task run and in its event's detail, which the run detail, the event pages and
    the event stream all serve. A task raising 1 MB leaves at most MAX_ERROR_CHARS."""
    from engine.handlers import REGISTRY
    from engine.worker import heartbeat
    from engine.worker.output import MAX_ERROR_CHARS
    from tests.unit.test_runtime_inprocess import drive

    monkeypatch.setattr(heartbeat, "_heartbeater", heartbeat.Heartbeater(interval_seconds=3600, lease_seconds=30))

    def explode(context):
        raise RuntimeError("y" * 1_000_000)

    monkeypatch.setattr(REGISTRY["noop"], "run", explode)
    wf = apply_definition(organization=api.org, document={"name": "boom", "tasks": [{"key": "a", "type": "noop"}]})
    run = start_run(workflow=wf)
    drive(run.pk)
    (task_run,) = TaskRun.objects.for_organization(api.org).filter(workflow_run=run)
    assert task_run.state == "failed"
    assert len(task_run.error) <= MAX_ERROR_CHARS and task_run.error.startswith("RuntimeError: yyy")
    assert "more characters cut)" in task_run.error
    detail = api.get(f"/api/v1/runs/{run.pk}/", role=Role.VIEWER)
    events = api.get(f"/api/v1/runs/{run.pk}/events/", role=Role.VIEWER)
    assert detail.status_code == events.status_code == 200
    assert len(detail.content) < 20_000 and len(events.content) < 20_000, (len(detail.content), len(events.content))
