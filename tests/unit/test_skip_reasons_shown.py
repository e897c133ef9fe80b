"""A skipped task run says why (issue 19, SkipReason): on the run page's task rows, in its
task panel and in the API's task detail — upstream failed, its trigger rule not met (the
rule named), or its condition false (the condition shown, escaped). The run page offers
Retry where the task's trigger rule is met by its upstream outcomes (an ``always`` cleanup
below a failure), not where it is not."""

from __future__ import annotations

import html
import re

import pytest

from engine.models import TaskRun
from engine.recovery import skip_task_run
from engine.services import start_run
from tenancy.actors import Actor
from tenancy.models import Role
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_trigger_rules import fail, skip_by_condition, succeed, task_run
from tests.unit.test_web_runs import client_for, member

CONDITION = 'input.tag == "<b>go</b>"'


def _run(org, make_workflow):
    """a succeeds; f (below a) fails; c (all_success, below f) is skipped upstream_failed;
    k (below a, with a condition) is skipped for its condition; t (all_success, below k) is
    skipped by its rule; alert (one_failed, below a) is skipped by its rule; cleanup
    (always, below f) succeeds. The run fails (f's failure is not handled)."""
    wf = make_workflow(org, [
        {"key": "a", "type": "noop"},
        {"key": "f", "type": "noop", "depends_on": ["a"]},
        {"key": "c", "type": "noop", "depends_on": ["f"]},
        {"key": "k", "type": "noop", "depends_on": ["a"], "condition": CONDITION},
        {"key": "t", "type": "noop", "depends_on": ["k"]},
        {"key": "alert", "type": "noop", "depends_on": ["a"], "trigger_rule": "one_failed"},
        {"key": "cleanup", "type": "noop", "depends_on": ["f"], "trigger_rule": "always"},
    ], name="skips")
    run_id = start_run(workflow=wf).pk
    succeed(run_id, "a")
    fail(run_id, "f")
    skip_by_condition(run_id, "k")
    succeed(run_id, "cleanup")
    states = {tr.task.key: (tr.state, tr.skip_reason) for tr in
              TaskRun.objects.for_organization(org).filter(workflow_run_id=run_id).select_related("task")}
    assert states == {"a": ("succeeded", ""), "f": ("failed", ""), "c": ("skipped", "upstream_failed"),
                      "k": ("skipped", "condition_false"), "t": ("skipped", "trigger_rule"),
                      "alert": ("skipped", "trigger_rule"), "cleanup": ("succeeded", "")}
    return run_id


def row_html(body: str, key: str) -> str:
    return re.search(rf'<tr id="task-{key}".*?</tr>', body, flags=re.S).group(0)


def _reason(row: str) -> str | None:
    found = re.search(r'<span class="skip-reason" data-skip-reason="(\w+)" title="[^"]*">([^<]*)</span>', row)
    return None if found is None else f"{found.group(1)}: {html.unescape(found.group(2))}"


@pytest.mark.django_db
def test_the_run_pages_task_rows_say_why_each_skipped_task_was_skipped(org, make_workflow):
    run_id = _run(org, make_workflow)
    body = client_for(member(org, Role.VIEWER)).get(f"/runs/{run_id}/").content.decode()
    reasons = {k: _reason(row_html(body, k)) for k in ("a", "f", "c", "k", "t", "alert", "cleanup")}
    assert reasons == {
        "a": None, "f": None, "cleanup": None,
        "c": "upstream_failed: upstream failed",
        "k": "condition_false: condition false",
        "t": "trigger_rule: trigger rule all_success not met",
        "alert": "trigger_rule: trigger rule one_failed not met",
    }
    # The sentence is each reason's title.
    assert 'title="upstream failed: its trigger rule all_success needs every upstream task succeeded"' in \
        row_html(body, "c")
    assert 'title="trigger rule one_failed not met: it needs at least one upstream task failed"' in \
        row_html(body, "alert")
    # The condition is in the title of k's reason, escaped.
    assert 'title="condition false: input.tag == &quot;&lt;b&gt;go&lt;/b&gt;&quot;"' in row_html(body, "k")
    assert "<b>go</b>" not in body
    # k's attempt started and ended when its condition was false: a skipped bar, not a running one.
    k_bars = re.search(r'<g class="tl-row" data-task-key="k">.*?</g>', body, flags=re.S).group(0)
    assert re.findall(r'class="tl-bar outcome-(\w+)"', k_bars) == ["skipped"]


@pytest.mark.django_db
def test_the_run_page_offers_retry_where_the_tasks_trigger_rule_is_met_by_its_upstream_outcomes(org, make_workflow):
    run_id = _run(org, make_workflow)
    body = client_for(member(org, Role.MEMBER)).get(f"/runs/{run_id}/").content.decode()
    acts = {k: set(re.findall(r'data-action="(\w+)-task"', row_html(body, k)))
            for k in ("a", "f", "c", "k", "t", "alert", "cleanup")}
    # cleanup (always) below the failed f may run again; c (all_success) below it may not,
    # nor t below the skipped k, nor alert (one_failed) with no failure above it.
    assert acts == {"a": {"retry"}, "f": {"retry", "skip", "mark_succeeded"}, "c": {"mark_succeeded"},
                    "k": {"retry", "mark_succeeded"}, "t": {"mark_succeeded"}, "alert": {"mark_succeeded"},
                    "cleanup": {"retry"}}


@pytest.mark.django_db
def test_the_task_panel_says_why_the_task_was_skipped_with_its_rule_and_condition(org, make_workflow):
    run_id = _run(org, make_workflow)
    client = client_for(member(org, Role.VIEWER))

    def panel(key: str) -> str:
        return client.get(f"/runs/{run_id}/tasks/{task_run(run_id, key).pk}/",
                          headers={"HX-Request": "true"}).content.decode()

    k = panel("k")
    assert k.count('<section class="attempt attempt-') == 1 and 'data-outcome="skipped"' in k
    assert '<pre class="attempt-error">' not in k
    assert ('<p class="alert task-skip-reason" data-skip-reason="condition_false">Skipped: condition false '
            '(<code>input.tag == &quot;&lt;b&gt;go&lt;/b&gt;&quot;</code> was false).</p>') in k
    assert '<code class="task-condition">input.tag == &quot;&lt;b&gt;go&lt;/b&gt;&quot;</code>' in k
    alert = panel("alert")
    assert ('<p class="alert task-skip-reason" data-skip-reason="trigger_rule">Skipped: trigger rule one_failed '
            'not met: it needs at least one upstream task failed.</p>') in alert
    assert "<dt>Trigger rule</dt><dd><code>one_failed</code></dd>" in alert
    c = panel("c")
    assert ('data-skip-reason="upstream_failed">Skipped: upstream failed: its trigger rule all_success needs every '
            'upstream task succeeded.</p>') in c
    assert "<dt>Trigger rule</dt>" not in c  # the default rule is not worth a line
    for key in ("a", "f", "cleanup"):
        assert "task-skip-reason" not in panel(key), key


@pytest.mark.django_db
def test_a_task_a_person_skipped_says_so_on_its_row_in_its_panel_and_in_the_api(org, make_workflow):
    run_id = _run(org, make_workflow)
    owner = member(org, Role.OWNER)
    skip_task_run(actor=Actor(organization=org, role=Role.OWNER, user=owner, channel="web"),
                  task_run=task_run(run_id, "f"), reason="known outage")
    assert task_run(run_id, "f").skip_reason == "marked"
    client = client_for(owner)
    body = client.get(f"/runs/{run_id}/").content.decode()
    assert _reason(row_html(body, "f")) == "marked: skipped by hand"
    panel = client.get(f"/runs/{run_id}/tasks/{task_run(run_id, 'f').pk}/", headers={"HX-Request": "true"})
    assert ('<p class="alert task-skip-reason" data-skip-reason="marked">Skipped: a person marked it skipped (its '
            'events say who and why).</p>') in panel.content.decode()


@pytest.fixture
def api(make_org):
    yield from new_api_factory(make_org)


def test_the_api_task_detail_gives_the_skip_reason_rule_and_condition(api, make_workflow):
    a: Api = api()
    run_id = _run(a.org, make_workflow)
    got = {}
    for key in ("k", "alert", "c", "cleanup"):
        response = a.get(f"/api/v1/runs/{run_id}/task-runs/{task_run(run_id, key).pk}/", role=Role.VIEWER)
        assert response.status_code == 200, response.content
        body = response.json()
        got[key] = (body["state"], body["skip_reason"], body["trigger_rule"], body["condition"],
                    [(x["attempt"], x["outcome"], x["error"]) for x in body["attempts"]])
    # k's attempt started, then its condition was false (no error: nothing failed); c and
    # alert never started; cleanup's attempt succeeded.
    assert got == {"k": ("skipped", "condition_false", "all_success", CONDITION, [(1, "skipped", "")]),
                   "alert": ("skipped", "trigger_rule", "one_failed", "", []),
                   "c": ("skipped", "upstream_failed", "all_success", "", []),
                   "cleanup": ("succeeded", "", "always", "", [(1, "succeeded", "")])}
