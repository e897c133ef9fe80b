"""Trigger rules and conditions (issue 19) on real PostgreSQL: every rule against every
pair of upstream outcomes, the skip closure, a run's final state with handled and
unhandled failures, a false condition's skip, and the definitions that are refused.

The engine is driven one transition at a time through its production operations
(``engine.repositories.task_runs``), as tests/unit/test_transitions.py does; the workers'
path is tests/integration/test_trigger_rules.py's.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from django.db import connection, transaction

from engine import conditions, definitions
from engine.definitions import DefinitionError, validate_document
from engine.models import TASK_CONDITION_MAX_CHARS, Task, TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.repositories import runs, task_runs
from engine.repositories.types import SuccessRequest
from engine.services import start_run
from engine.states import SkipReason, TriggerRule
from tests import engine_helpers
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import Api, new_api_factory

LEASE = 60.0
NOOP = {"type": "noop"}

# --- the table ------------------------------------------------------------------------------------
#
# Upstream outcomes, one letter each:
#   S succeeded                          F failed
#   K skipped (its condition was false)  U skipped because a failure upstream of it (upstream_failed)
#   C cancelled (left behind a pending task only by a later action: see _cancel)
#   O open (claimed and running)
# What the dependent does:
#   ready  pending -> ready               wait  stays pending
#   uf     skipped, upstream_failed       tr    skipped, trigger_rule
#
# Per rule, the verdict for each unordered pair of outcomes of its two upstreams
# (docs/api.md, "Trigger rules and conditions").
PAIRS = ["SS", "SF", "SK", "SU", "SC", "SO", "FF", "FK", "FU", "FC", "FO", "KK", "KU", "KC", "KO", "UU", "UC",
         "UO", "CC", "CO", "OO"]
TABLE = {
    #               SS       SF      SK      SU      SC      SO       FF       FK      FU       FC      FO
    #               KK       KU      KC      KO      UU      UC       UO       CC      CO       OO
    "all_success": ["ready", "uf", "tr", "uf", "tr", "wait", "uf", "uf", "uf", "uf", "uf",
                    "tr", "uf", "tr", "tr", "uf", "uf", "uf", "tr", "tr", "wait"],
    "all_failed": ["tr", "tr", "tr", "tr", "tr", "tr", "ready", "tr", "ready", "tr", "wait",
                   "tr", "tr", "tr", "tr", "ready", "tr", "wait", "tr", "tr", "wait"],
    "all_done": ["ready", "ready", "ready", "ready", "ready", "wait", "ready", "ready", "ready", "ready", "wait",
                 "ready", "ready", "ready", "wait", "ready", "ready", "wait", "ready", "wait", "wait"],
    "always": ["ready", "ready", "ready", "ready", "ready", "wait", "ready", "ready", "ready", "ready", "wait",
               "ready", "ready", "ready", "wait", "ready", "ready", "wait", "ready", "wait", "wait"],
    "one_failed": ["tr", "ready", "tr", "ready", "tr", "wait", "ready", "ready", "ready", "ready", "ready",
                   "tr", "ready", "tr", "wait", "ready", "ready", "ready", "tr", "wait", "wait"],
    "one_success": ["ready", "ready", "ready", "ready", "ready", "ready", "uf", "uf", "uf", "uf", "wait",
                    "tr", "uf", "tr", "wait", "uf", "uf", "wait", "tr", "wait", "wait"],
    "none_failed": ["ready", "uf", "ready", "uf", "ready", "wait", "uf", "uf", "uf", "uf", "uf",
                    "ready", "uf", "ready", "wait", "uf", "uf", "uf", "ready", "wait", "wait"],
}
# A rule decides as soon as it can, so one verdict depends on the order of the outcomes:
# all_success is skipped at the first upstream that did not succeed, for that one's reason
# (a skip, then a failure: trigger_rule; the failure first: upstream_failed).
FIRST_DECIDES = {("all_success", "KF"): "tr", ("all_success", "KU"): "tr", ("all_success", "CF"): "tr",
                 ("all_success", "CU"): "tr"}


def expected(rule: str, first: str, second: str) -> str:
    ordered = FIRST_DECIDES.get((rule, first + second))
    if ordered:
        return ordered
    pair = first + second if first + second in PAIRS else second + first
    return TABLE[rule][PAIRS.index(pair)]


def test_the_table_covers_every_rule_and_every_pair_of_outcomes():
    assert sorted(TABLE) == sorted(TriggerRule.values) == sorted(definitions.TRIGGER_RULES)
    assert sorted(PAIRS) == sorted({"".join(sorted(p, key="SFKUCO".index))
                                    for p in itertools.product("SFKUCO", repeat=2)})
    assert all(len(v) == len(PAIRS) for v in TABLE.values())


# --- driving the engine ---------------------------------------------------------------------------


def task_run(run_id, key) -> TaskRun:
    return TaskRun.objects.unscoped().get(workflow_run_id=run_id, task__key=key)


def claim_and_start(run_id, key):
    """Claim and start task run ``key`` (it must be ready); returns its Dispatch."""
    (d,) = task_runs.claim_ready_many(limit=1, lease_seconds=LEASE, owner="test",
                                      task_run_ids=[task_run(run_id, key).pk])
    assert engine_helpers.start_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token, owner="w",
                                        lease_seconds=LEASE) is not None
    return d


def succeed(run_id, key, output=None):
    d = claim_and_start(run_id, key)
    # Without the batch's claim: the dependents it makes ready stay ready, to be looked at.
    (result,), _ = engine_helpers.complete_successes([SuccessRequest(d.task_run_id, d.fencing_token, output)],
                                                     lease_seconds=LEASE, owner="test", claim=False)
    assert result.accepted
    return result


def fail(run_id, key):
    d = claim_and_start(run_id, key)
    result = task_runs.fail_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token, error="boom",
                                    retryable=False)
    assert result.accepted and result.state == "failed"
    return result


def skip_by_condition(run_id, key):
    d = claim_and_start(run_id, key)
    result = task_runs.skip_for_condition(task_run_id=d.task_run_id, fencing_token=d.fencing_token)
    assert result.accepted and result.state == "skipped"
    return result


def _cancel(run_id, key):
    """A cancelled upstream behind a pending task: a run's cancel cancels every open task
    run at once, so only a later action (a per-task one) could leave this; written here
    as such an action would, then settled as it must."""
    with transaction.atomic():
        TaskRun.objects.unscoped().filter(pk=task_run(run_id, key).pk).update(
            state="cancelled", lease_owner=None, lease_expires_at=None, finished_at=_now())
        task_runs.settle_dependents(task_run_ids=[task_run(run_id, key).pk])


def _now():
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def apply_outcome(run_id, i: int, outcome: str):
    """Give upstream u<i> (below its own root p<i>) ``outcome``."""
    if outcome == "U":
        fail(run_id, f"p{i}")
        assert (task_run(run_id, f"u{i}").state, task_run(run_id, f"u{i}").skip_reason) == ("skipped",
                                                                                           "upstream_failed")
        return
    succeed(run_id, f"p{i}")
    {"S": lambda: succeed(run_id, f"u{i}"), "F": lambda: fail(run_id, f"u{i}"),
     "K": lambda: skip_by_condition(run_id, f"u{i}"), "C": lambda: _cancel(run_id, f"u{i}"),
     "O": lambda: claim_and_start(run_id, f"u{i}")}[outcome]()


@pytest.fixture
def rules_workflow(org, make_workflow):
    """p1 -> u1, p2 -> u2, and one dependent of (u1, u2) per trigger rule: d_<rule>."""
    tasks = [{"key": "p1", **NOOP}, {"key": "p2", **NOOP},
             {"key": "u1", **NOOP, "depends_on": ["p1"]}, {"key": "u2", **NOOP, "depends_on": ["p2"]}]
    tasks += [{"key": f"d_{rule}", **NOOP, "depends_on": ["u1", "u2"], "trigger_rule": rule}
              for rule in TriggerRule.values]
    return make_workflow(org, tasks, name="rules")


@pytest.mark.django_db
@pytest.mark.parametrize(("first", "second"), list(itertools.product("SFKUCO", repeat=2)),
                         ids=["".join(p) for p in itertools.product("SFKUCO", repeat=2)])
def test_each_trigger_rule_decides_by_its_upstream_outcomes(rules_workflow, first, second):
    """u1 gets ``first``, then u2 ``second``; every rule's dependent then is ready, skipped
    (with the table's reason) or still pending, with one event saying so."""
    run_id = start_run(workflow=rules_workflow).pk
    apply_outcome(run_id, 1, first)
    apply_outcome(run_id, 2, second)
    for rule in TriggerRule.values:
        want = expected(rule, first, second)
        row = task_run(run_id, f"d_{rule}")
        got = {"ready": "ready", "pending": "wait"}.get(row.state) or (
            {"upstream_failed": "uf", "trigger_rule": "tr"}[row.skip_reason] if row.state == "skipped" else row.state)
        assert got == want, (rule, first, second, row.state, row.skip_reason)
        decided = list(TaskRunEvent.objects.unscoped().filter(task_run=row, kind__in=["promoted", "skipped"])
                       .values_list("kind", "detail"))
        named = {} if rule == "all_success" else {"trigger_rule": rule}
        if want == "wait":
            assert decided == []
        elif want == "ready":
            assert decided == [("promoted", named)]
            assert row.ready_at is not None and row.finished_at is None and row.skip_reason == ""
        else:
            assert decided == [("skipped", {"reason": row.skip_reason, **named})]
            assert row.finished_at is not None


# --- the skip closure and chains ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failure_skips_a_deep_chain_in_one_statement_and_reaches_the_cleanup_at_its_end(org, make_workflow):
    """a fails: the 40 all_success tasks below it are skipped (upstream_failed) by one
    statement of the skip closure, and the always task at the end becomes ready."""
    tasks = [{"key": "a", **NOOP}] + [{"key": f"c{i}", **NOOP, "depends_on": [f"c{i - 1}" if i else "a"]}
                                      for i in range(40)]
    tasks.append({"key": "cleanup", **NOOP, "depends_on": ["c39"], "trigger_rule": "always"})
    run_id = start_run(workflow=make_workflow(org, tasks)).pk
    statements = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        result = fail(run_id, "a")
    assert result.promoted == 1 and result.run_state is None
    rows = {t.task.key: t for t in TaskRun.objects.unscoped().filter(workflow_run_id=run_id).select_related("task")}
    assert all((rows[f"c{i}"].state, rows[f"c{i}"].skip_reason) == ("skipped", "upstream_failed") for i in range(40))
    assert rows["cleanup"].state == "ready"
    # The fail statement, one closure, one promotion that readies the cleanup, then the next
    # round's closure and promotion (nothing left), the run's finish: not a statement per level.
    assert len([s for s in statements if "core_taskrun" in s]) <= 8, len(statements)


@pytest.mark.django_db
def test_a_failure_reaches_a_one_failed_handler_through_the_tasks_it_skipped(org, make_workflow):
    """a fails; b (all_success) is skipped for it (upstream_failed), which a one_failed
    handler below b hears as a failure: it runs. c (none_failed) below b is skipped too."""
    wf = make_workflow(org, [
        {"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"]},
        {"key": "handler", **NOOP, "depends_on": ["b"], "trigger_rule": "one_failed"},
        {"key": "c", **NOOP, "depends_on": ["b"], "trigger_rule": "none_failed"},
    ])
    run_id = start_run(workflow=wf).pk
    fail(run_id, "a")
    assert (task_run(run_id, "b").state, task_run(run_id, "b").skip_reason) == ("skipped", "upstream_failed")
    assert (task_run(run_id, "c").state, task_run(run_id, "c").skip_reason) == ("skipped", "upstream_failed")
    assert task_run(run_id, "handler").state == "ready"


@pytest.mark.django_db
def test_a_skip_without_a_failure_lets_none_failed_and_all_done_run_and_skips_all_success(org, make_workflow):
    """gate's condition is false: below it an all_success task is skipped (trigger_rule,
    and so on down), while none_failed and all_done tasks run."""
    wf = make_workflow(org, [
        {"key": "gate", **NOOP, "condition": "input.go"},
        {"key": "work", **NOOP, "depends_on": ["gate"]}, {"key": "more", **NOOP, "depends_on": ["work"]},
        {"key": "report", **NOOP, "depends_on": ["more"], "trigger_rule": "none_failed"},
        {"key": "tidy", **NOOP, "depends_on": ["gate"], "trigger_rule": "all_done"},
    ])
    run_id = start_run(workflow=wf, run_input={"go": False}).pk
    skip_by_condition(run_id, "gate")
    assert [(task_run(run_id, k).state, task_run(run_id, k).skip_reason) for k in ("work", "more")] == [
        ("skipped", "trigger_rule"), ("skipped", "trigger_rule")]
    assert task_run(run_id, "report").state == "ready"
    assert task_run(run_id, "tidy").state == "ready"


@pytest.mark.django_db
def test_a_success_that_skips_a_failure_handler_settles_what_depends_on_the_handler(org, make_workflow):
    """a succeeds: its one_failed handler is skipped in the success's own transaction, and
    what depends on the handler is settled there too (an all_success task skipped below
    it, an always task made ready), so the run is not left waiting."""
    wf = make_workflow(org, [
        {"key": "a", **NOOP},
        {"key": "handler", **NOOP, "depends_on": ["a"], "trigger_rule": "one_failed"},
        {"key": "after_handler", **NOOP, "depends_on": ["handler"]},
        {"key": "finally", **NOOP, "depends_on": ["after_handler"], "trigger_rule": "always"},
    ])
    run_id = start_run(workflow=wf).pk
    succeed(run_id, "a")
    assert (task_run(run_id, "handler").state, task_run(run_id, "handler").skip_reason) == ("skipped",
                                                                                             "trigger_rule")
    assert (task_run(run_id, "after_handler").state,
            task_run(run_id, "after_handler").skip_reason) == ("skipped", "trigger_rule")
    assert task_run(run_id, "finally").state == "ready"
    succeed(run_id, "finally")
    assert WorkflowRun.objects.unscoped().get(pk=run_id).state == "succeeded"


@pytest.mark.django_db
def test_a_success_batch_that_skips_a_dependent_claims_what_that_made_ready(org, make_workflow):
    """With the worker's claim: a success skips its one_failed handler, the handler's
    always dependent becomes ready and the same batch claims it."""
    wf = make_workflow(org, [
        {"key": "a", **NOOP},
        {"key": "handler", **NOOP, "depends_on": ["a"], "trigger_rule": "one_failed"},
        {"key": "finally", **NOOP, "depends_on": ["handler"], "trigger_rule": "always"},
    ])
    run_id = start_run(workflow=wf).pk
    d = claim_and_start(run_id, "a")
    (result,), claimed = engine_helpers.complete_successes([SuccessRequest(d.task_run_id, d.fencing_token)],
                                                           lease_seconds=LEASE, owner="test")
    assert result.accepted
    assert [c.task_run_id for c in claimed] == [task_run(run_id, "finally").pk]
    assert task_run(run_id, "finally").state == "running"


# --- a run's final state --------------------------------------------------------------------------


def run_state(run_id):
    run = WorkflowRun.objects.unscoped().get(pk=run_id)
    return run.state, run.error


@pytest.mark.django_db
def test_an_always_cleanup_after_a_failure_runs_and_the_run_still_fails(org, make_workflow):
    wf = make_workflow(org, [
        {"key": "work", **NOOP}, {"key": "cleanup", **NOOP, "depends_on": ["work"], "trigger_rule": "always"},
    ])
    run_id = start_run(workflow=wf).pk
    fail(run_id, "work")
    assert task_run(run_id, "cleanup").state == "ready"
    assert run_state(run_id)[0] == "running"
    result = succeed(run_id, "cleanup")
    assert result.run_state == "failed"
    assert run_state(run_id) == ("failed", "task work failed")


@pytest.mark.django_db
def test_a_failed_runs_error_names_its_failed_tasks_first_failed_first_and_at_most_five(org, make_workflow):
    """The error names what failed (it used to say only "7 task(s) failed"): in the order
    they failed, not by key, five at most and then how many more."""
    keys = ["g", "f", "e", "d", "c", "b", "a"]
    wf = make_workflow(org, [{"key": key, **NOOP} for key in keys])
    run_id = start_run(workflow=wf).pk
    for key in keys:
        fail(run_id, key)
    assert run_state(run_id) == ("failed", "7 tasks failed: g, f, e, d, c and 2 more")


@pytest.mark.django_db
def test_a_failed_runs_error_lists_every_failed_task_up_to_five(org, make_workflow):
    wf = make_workflow(org, [{"key": key, **NOOP} for key in ("load", "extract", "notify", "audit", "zip")])
    run_id = start_run(workflow=wf).pk
    for key in ("extract", "load", "zip", "audit", "notify"):
        fail(run_id, key)
    assert run_state(run_id) == ("failed", "5 tasks failed: extract, load, zip, audit, notify")


@pytest.mark.django_db
@pytest.mark.parametrize("rule", ["one_failed", "all_failed"])
def test_a_failure_handled_by_a_succeeding_failure_handler_leaves_the_run_succeeded(org, make_workflow, rule):
    wf = make_workflow(org, [
        {"key": "work", **NOOP}, {"key": "b", **NOOP, "depends_on": ["work"]},
        {"key": "handler", **NOOP, "depends_on": ["b"], "trigger_rule": rule},
    ])
    run_id = start_run(workflow=wf).pk
    fail(run_id, "work")
    assert succeed(run_id, "handler").run_state == "succeeded"
    assert run_state(run_id) == ("succeeded", "")


@pytest.mark.django_db
def test_a_failure_whose_handler_fails_fails_the_run_with_both_counted(org, make_workflow):
    wf = make_workflow(org, [
        {"key": "work", **NOOP}, {"key": "handler", **NOOP, "depends_on": ["work"], "trigger_rule": "one_failed"},
    ])
    run_id = start_run(workflow=wf).pk
    fail(run_id, "work")
    assert fail(run_id, "handler").run_state == "failed"
    assert run_state(run_id) == ("failed", "2 tasks failed: work, handler")


@pytest.mark.django_db
def test_a_handler_that_started_before_a_failure_does_not_handle_it(org, make_workflow):
    """handler (one_failed on a and b) fires at b's failure and succeeds while a still runs;
    a's later failure happened after the handler started: nothing handled it."""
    wf = make_workflow(org, [
        {"key": "a", **NOOP}, {"key": "b", **NOOP},
        {"key": "handler", **NOOP, "depends_on": ["a", "b"], "trigger_rule": "one_failed"},
    ])
    run_id = start_run(workflow=wf).pk
    a = claim_and_start(run_id, "a")
    fail(run_id, "b")
    succeed(run_id, "handler")
    assert run_state(run_id)[0] == "running"
    result = task_runs.fail_attempt(task_run_id=a.task_run_id, fencing_token=a.fencing_token, error="late",
                                    retryable=False)
    assert result.run_state == "failed"
    assert run_state(run_id) == ("failed", "task a failed")


@pytest.mark.django_db
def test_a_run_whose_branches_were_skipped_by_conditions_succeeds(org, make_workflow):
    wf = make_workflow(org, [
        {"key": "check", **NOOP},
        {"key": "left", **NOOP, "depends_on": ["check"], "condition": 'upstream.check.route == "left"'},
        {"key": "right", **NOOP, "depends_on": ["check"], "condition": 'upstream.check.route == "right"'},
        {"key": "join", **NOOP, "depends_on": ["left", "right"], "trigger_rule": "none_failed"},
    ])
    run_id = start_run(workflow=wf).pk
    succeed(run_id, "check", output={"route": "left"})
    left, right = claim_and_start(run_id, "left"), claim_and_start(run_id, "right")
    # What the worker does with each started attempt's condition (engine.worker.execute._gate).
    for d in (left, right):
        (attempt,) = [a for a in _started_view(run_id) if a[0] == d.task_run_id]
        go = conditions.evaluate(attempt[1], run_input={}, upstream={"check": {"route": "left"}})
        if go:
            engine_helpers.complete_successes([SuccessRequest(d.task_run_id, d.fencing_token)], lease_seconds=LEASE,
                                              owner="test", claim=False)
        else:
            task_runs.skip_for_condition(task_run_id=d.task_run_id, fencing_token=d.fencing_token)
    assert task_run(run_id, "left").state == "succeeded"
    assert (task_run(run_id, "right").state, task_run(run_id, "right").skip_reason) == ("skipped",
                                                                                         "condition_false")
    assert succeed(run_id, "join").run_state == "succeeded"


def _started_view(run_id):
    return [(t.pk, t.task.condition) for t in TaskRun.objects.unscoped().filter(workflow_run_id=run_id)
            .select_related("task")]


# --- a false condition ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_false_condition_skips_the_task_run_with_an_event_naming_it_and_releases_its_lease(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", **NOOP, "condition": 'input.mode == "full"'}])
    run_id = start_run(workflow=wf, run_input={"mode": "quick"}).pk
    d = claim_and_start(run_id, "a")
    result = task_runs.skip_for_condition(task_run_id=d.task_run_id, fencing_token=d.fencing_token)
    assert (result.accepted, result.state, result.run_state) == (True, "skipped", "succeeded")
    row = task_run(run_id, "a")
    assert (row.state, row.skip_reason, row.lease_expires_at, row.lease_owner) == ("skipped", "condition_false",
                                                                                    None, None)
    (event,) = TaskRunEvent.objects.unscoped().filter(task_run=row, kind="skipped")
    assert (event.from_state, event.to_state) == ("running", "skipped")
    assert event.detail == {"reason": "condition_false", "condition": 'input.mode == "full"'}
    # A second skip of the same generation (a duplicate) matches nothing.
    assert not task_runs.skip_for_condition(task_run_id=d.task_run_id, fencing_token=d.fencing_token).accepted


@pytest.mark.django_db
def test_the_start_hands_the_worker_the_tasks_condition(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", **NOOP, "condition": "input.n > 1"}, {"key": "b", **NOOP}])
    run_id = start_run(workflow=wf, run_input={"n": 2}).pk
    by_key = {}
    for key in ("a", "b"):
        (d,) = task_runs.claim_ready_many(limit=1, lease_seconds=LEASE, owner="t",
                                          task_run_ids=[task_run(run_id, key).pk])
        by_key[key] = engine_helpers.start_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token,
                                                   owner="w", lease_seconds=LEASE)
    assert (by_key["a"].condition, by_key["b"].condition) == ("input.n > 1", "")


@pytest.mark.django_db
def test_a_stale_generations_condition_skip_changes_nothing(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", **NOOP, "condition": "false"}])
    run_id = start_run(workflow=wf).pk
    d = claim_and_start(run_id, "a")
    with transaction.atomic():
        assert runs.cancel(workflow_run_id=run_id, reason="test")
    assert not task_runs.skip_for_condition(task_run_id=d.task_run_id, fencing_token=d.fencing_token).accepted
    assert task_run(run_id, "a").state == "cancelled"


# --- definitions ----------------------------------------------------------------------------------


def doc(*tasks):
    return {"name": "wf", "tasks": list(tasks)}


def problems(document) -> list[dict]:
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(document)
    return excinfo.value.errors


def test_the_rule_names_and_limits_agree_with_the_database_vocabulary():
    assert tuple(TriggerRule.values) == definitions.TRIGGER_RULES
    assert TASK_CONDITION_MAX_CHARS == conditions.MAX_CONDITION_CHARS
    assert SkipReason.UPSTREAM_FAILED == "upstream_failed"


def test_an_unknown_trigger_rule_is_refused_naming_its_path_and_the_known_rules():
    errors = problems(doc({"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"],
                                                  "trigger_rule": "all_succeeded"}))
    assert errors == [{"path": "tasks[b].trigger_rule",
                       "message": "unknown trigger rule 'all_succeeded'; one of all_success, all_failed, all_done, "
                                  "one_failed, one_success, none_failed, always"}]


def test_a_trigger_rule_on_a_task_without_dependencies_is_refused():
    (error,) = problems(doc({"key": "a", **NOOP, "trigger_rule": "always"}))
    assert error["path"] == "tasks[a].trigger_rule" and "needs depends_on" in error["message"]


def test_rules_and_conditions_are_kept_in_the_normalized_document_only_when_given():
    out = validate_document(doc({"key": "a", **NOOP, "condition": "input.go == true"},
                                {"key": "b", **NOOP, "depends_on": ["a"], "trigger_rule": "all_done"},
                                {"key": "c", **NOOP, "depends_on": ["a"], "trigger_rule": "all_success",
                                 "condition": ""},
                                {"key": "d", **NOOP, "trigger_rule": None, "condition": None}))
    tasks = {t["key"]: t for t in out["tasks"]}
    assert tasks["a"]["condition"] == "input.go == true" and "trigger_rule" not in tasks["a"]
    assert tasks["b"]["trigger_rule"] == "all_done" and "condition" not in tasks["b"]
    assert "trigger_rule" not in tasks["c"] and "condition" not in tasks["c"]
    assert "trigger_rule" not in tasks["d"] and "condition" not in tasks["d"]


@pytest.mark.parametrize(("condition", "message"), [
    ("upstream.a.ok ==", "not a valid CEL expression: syntax error at column 15 (near '==')"),
    ("upstream.a.ok &&& true", "not a valid CEL expression: syntax error at column 17 (near '& true')"),
    ("upstream.x.ok", "upstream.x: 'x' is not a dependency of this task (depends_on: a)"),
    ("secrets.token == 1", "unknown variable 'secrets'; a condition reads input, upstream and schedule"),
    ("input.items.reduce(r, i, 0, r + i) > 2", "unknown method .reduce()"),
    ("exec('ls')", "unknown function exec()"),
    ("input.l.exists(input, input > 1)", "exists(): 'input' names a variable of the condition; use another name"),
    ("x" * 2001, "at most 2000 characters, got 2001"),
    ("(" * 13 + "true" + ")" * 13, "nested too deeply (at most 120 levels)"),
    (" ", "must be a CEL expression, e.g. upstream.check.ok == true; leave it out (or '') for none"),
    (True, "must be a CEL expression (a string), got bool"),
])
def test_a_bad_condition_is_refused_naming_tasks_key_condition(condition, message):
    errors = problems(doc({"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"], "condition": condition}))
    assert errors == [{"path": "tasks[b].condition", "message": message}]


def test_a_workflows_distinct_conditions_are_limited_in_total_and_a_repeated_one_counts_once():
    cond = "input.n > " + "1" * 1990  # 2,000 characters
    same = [{"key": f"t{i}", **NOOP, "condition": cond} for i in range(30)]
    assert len(validate_document(doc(*same))["tasks"]) == 30
    distinct = [{"key": f"t{i}", **NOOP, "condition": f"input.n > {i:0>1990}"} for i in range(11)]
    errors = problems(doc(*distinct))
    assert errors == [{"path": "tasks[t10].condition",
                       "message": "the workflow's distinct conditions hold more than 20000 characters in all"}]


@pytest.mark.django_db
def test_applying_a_definition_stores_the_rule_and_the_condition_on_its_tasks(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", **NOOP},
                             {"key": "b", **NOOP, "depends_on": ["a"], "trigger_rule": "one_failed",
                              "condition": "has(upstream.a.x)"}])
    rows = {t.key: (t.trigger_rule, t.condition) for t in Task.objects.unscoped().filter(workflow=wf)}
    assert rows == {"a": ("all_success", ""), "b": ("one_failed", "has(upstream.a.x)")}


@pytest.fixture
def api(make_org) -> Api:
    factory = new_api_factory(make_org)
    yield next(factory)()
    factory.close()


def test_the_api_answers_a_bad_condition_with_a_400_naming_the_field(api):
    document = doc({"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"], "condition": "upstream.a.ok =="},
                   {"key": "c", **NOOP, "depends_on": ["a"], "trigger_rule": "sometimes"})
    body = assert_problem(api.post("/api/v1/workflows/", document), 400)
    assert body["code"] == "invalid_definition"
    assert {e["path"] for e in body["errors"]} == {"tasks[b].condition", "tasks[c].trigger_rule"}
    assert not Workflow.objects.for_organization(api.org).filter(name="wf").exists()


def test_the_api_shows_each_tasks_rule_and_condition(api):
    created = api.post("/api/v1/workflows/", doc(
        {"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"], "trigger_rule": "all_done",
                                "condition": "upstream.a == null"}))
    assert created.status_code == 201, created.content
    tasks = {t["key"]: (t["trigger_rule"], t["condition"]) for t in created.json()["tasks"]}
    assert tasks == {"a": ("all_success", ""), "b": ("all_done", "upstream.a == null")}


# --- evaluation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "run_input", "upstream", "result"), [
    ('upstream.check.route == "left"', {}, {"check": {"route": "left"}}, True),
    ("upstream.check.rows > 10 && input.full", {"full": True}, {"check": {"rows": 3}}, False),
    ("has(upstream.check.rows)", {}, {"check": {}}, False),
    ("upstream.check == null", {}, {"check": None}, True),
    ("input.items.exists(i, i.ok)", {"items": [{"ok": False}, {"ok": True}]}, {}, True),
    ('input.name.matches("^a+$")', {"name": "aaa"}, {}, True),
    ("size(input.tags) == 2 && 'x' in input.tags", {"tags": ["x", "y"]}, {}, True),
])
def test_a_condition_evaluates_on_the_run_input_and_upstream_outputs(expression, run_input, upstream, result):
    assert conditions.check(expression, dependencies=upstream.keys()) is None
    assert conditions.evaluate(expression, run_input=run_input, upstream=upstream) is result


@pytest.mark.parametrize(("expression", "run_input", "upstream", "message"), [
    ("upstream.check.rows", {}, {"check": {"rows": 3}}, "condition must evaluate to a bool (true or false), got an int"),
    ("upstream.check.missing", {}, {"check": {}},
     "condition could not be evaluated: no such member in mapping: 'missing'"),
    # Each element of a long list is a step: a condition cannot keep a worker busy.
    ("input.l.exists(x, input.l.exists(y, x == y + 1000000))", {"l": list(range(3000))}, {},
     "condition stopped: it took more than 100000 steps"),
    # A doubling in a macro would build gigabytes before any time limit: + is metered.
    ("input.l.map(x, input.s + input.s).size() > 0", {"l": list(range(100)), "s": "x" * 100_000}, {},
     "condition stopped: it built more than 1000000 characters or items with +"),
])
def test_a_condition_that_cannot_be_evaluated_or_runs_out_of_budget_fails_saying_why(
        expression, run_input, upstream, message, monkeypatch):
    # The step and size limits are what is tested: the time limit is put out of their way
    # (the machine's load is not).
    monkeypatch.setattr(conditions, "CONDITION_TIME_LIMIT_SECONDS", 600.0)
    with pytest.raises(conditions.ConditionFailed) as excinfo:
        conditions.evaluate(expression, run_input=run_input, upstream=upstream)
    assert str(excinfo.value).startswith(message), str(excinfo.value)


def test_a_condition_reads_only_the_values_it_names(monkeypatch):
    """A condition on input.mode pays nothing for a large input.rows beside it."""
    seen = []
    real = conditions._to_cel

    def counting(value, budget):
        seen.append(value)
        return real(value, budget)

    monkeypatch.setattr(conditions, "_to_cel", counting)
    big = list(range(50_000))
    assert conditions.evaluate('input.mode == "x"', run_input={"mode": "x", "rows": big},
                               upstream={"a": {"rows": big}}) is True
    assert not any(v is big for v in seen)
    assert len(seen) < 10


def test_the_time_limit_stops_an_evaluation_that_spends_its_steps_slowly(monkeypatch):
    monkeypatch.setattr(conditions, "CONDITION_TIME_LIMIT_SECONDS", 0.0)
    with pytest.raises(conditions.ConditionFailed) as excinfo:
        conditions.evaluate("input.l.exists(x, x == 5)", run_input={"l": list(range(2000))}, upstream={})
    assert str(excinfo.value).startswith("condition stopped: it took longer than its time limit (0 s)")
    # A caller's lower limit (the worker API's poll: MAX_CONDITION_SECONDS_PER_POLL for all its tasks).
    monkeypatch.setattr(conditions, "CONDITION_TIME_LIMIT_SECONDS", 600.0)
    with pytest.raises(conditions.ConditionFailed) as excinfo:
        conditions.evaluate("input.l.exists(x, x == 5)", run_input={"l": list(range(2000))}, upstream={},
                            time_limit_seconds=-1.0)
    assert str(excinfo.value).startswith("condition stopped: it took longer than its time limit (0 s)")


@pytest.mark.django_db
def test_a_task_run_after_a_failure_is_handed_null_for_the_failed_tasks_output(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", **NOOP}, {"key": "b", **NOOP},
                             {"key": "c", **NOOP, "depends_on": ["a", "b"], "trigger_rule": "all_done"}])
    run_id = start_run(workflow=wf).pk
    fail(run_id, "a")
    succeed(run_id, "b", output={"n": 1})
    (d,) = task_runs.claim_ready_many(limit=1, lease_seconds=LEASE, owner="t", task_run_ids=[task_run(run_id, "c").pk])
    started = engine_helpers.start_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token, owner="w",
                                           lease_seconds=LEASE)
    assert started.upstream == {"a": None, "b": {"n": 1}}


# --- the organizations' own workers: the poll evaluates the condition ------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("condition", "state", "reason"), [
    ('input.size == "large"', "skipped", "condition_false"),
    ("input.size.width > 1", "failed", ""),
])
def test_a_worker_task_whose_condition_does_not_hold_is_not_handed_out(make_org, condition, state, reason):
    from tests.unit.test_worker_api import Org

    a = Org(make_org())
    tasks = [{"key": "resize", "type": "worker", "config": {"queue": "images", "name": "resize"},
              "condition": condition},
             {"key": "after", **NOOP, "depends_on": ["resize"], "trigger_rule": "all_done"}]
    run = a.start(tasks=tasks, run_input={"size": "small"})
    response = a.poll(max_tasks=5)
    assert response.status_code == 200, response.content
    assert response.json()["tasks"] == []
    resize, after = task_run(run.pk, "resize"), task_run(run.pk, "after")
    assert (resize.state, resize.skip_reason, resize.attempt) == (state, reason, 1)
    if state == "failed":
        assert resize.error.startswith("condition could not be evaluated: ")
    assert after.state == "ready"  # all_done: settled at once, for the shared workers to run


@pytest.mark.django_db
def test_a_worker_task_whose_condition_holds_is_handed_out(make_org):
    from tests.unit.test_worker_api import Org

    a = Org(make_org())
    run = a.start(tasks=[{"key": "resize", "type": "worker", "config": {"queue": "images", "name": "resize"},
                          "condition": 'input.size == "small"'}], run_input={"size": "small"})
    tasks = a.poll(max_tasks=5).json()["tasks"]
    assert [t["task_run_id"] for t in tasks] == [str(task_run(run.pk, "resize").pk)]


# --- the workflow page ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_workflow_page_shows_each_tasks_rule_and_condition_escaped(org, make_workflow):
    from tests.unit.test_web_workflows import client_for, make_team

    team = make_team(org)
    wf = make_workflow(org, [
        {"key": "a", **NOOP},
        {"key": "b", **NOOP, "depends_on": ["a"], "trigger_rule": "one_failed",
         "condition": 'upstream.a == null || input.note == "<script>alert(1)</script>"'},
        {"key": "c", **NOOP, "depends_on": ["a"]},
    ])
    body = client_for(team["viewer"]).get(f"/workflows/{wf.pk}/").content.decode()
    assert "<script>alert(1)" not in body
    assert ('<span class="muted small">if</span> <code>upstream.a == null || input.note == '
            '&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;</code>') in body
    assert body.count('class="setting trigger-rule"') == 1  # b's; the default rule is not shown
    assert '<span class="muted small">runs</span> <code>one_failed</code>' in body


# --- a lost settle ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_sweeper_settles_a_run_whose_settle_was_lost(org, make_workflow):
    """The success that skipped the handler committed, and its process died before the
    settle of the handler's dependents (a transaction of its own): the run has a pending
    task and nothing ready or running. The sweeper settles it: the cleanup becomes ready."""
    from engine.sweeper import SETTLE_SECONDS, sweep_runs

    wf = make_workflow(org, [
        {"key": "a", **NOOP},
        {"key": "handler", **NOOP, "depends_on": ["a"], "trigger_rule": "one_failed"},
        {"key": "cleanup", **NOOP, "depends_on": ["handler"], "trigger_rule": "always"},
    ])
    run_id = start_run(workflow=wf).pk
    succeed(run_id, "a")
    # As the lost transaction left it: the handler skipped by the success, its dependent not settled.
    with transaction.atomic():
        TaskRun.objects.unscoped().filter(pk=task_run(run_id, "cleanup").pk).update(state="pending", ready_at=None)
    WorkflowRun.objects.unscoped().filter(pk=run_id).update(
        created_at=_now() - dt.timedelta(seconds=SETTLE_SECONDS + 5))
    assert task_run(run_id, "handler").state == "skipped" and task_run(run_id, "cleanup").state == "pending"

    assert sweep_runs() == {"finished": 0, "settled": 1, "timed_out": 0}
    assert task_run(run_id, "cleanup").state == "ready"
    assert sweep_runs()["settled"] == 0  # nothing stalled any more
