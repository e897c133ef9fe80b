"""Retrying one task follows its trigger rule (engine.recovery.retry_task_run, issue 19):
a task whose rule is met by its upstream outcomes as they are now may be retried, whatever
those outcomes are (an ``all_done`` cleanup below a failure); one whose rule is not met is
refused with a 409-worthy reason naming the rule and each upstream.

Table-driven over every rule and every ordered pair of upstream outcomes: the verdicts are
tests/unit/test_trigger_rules.py's TABLE (what the engine decides for a dependent with those
upstream outcomes, checked there against the engine's SQL), so a retry is allowed exactly
where the engine would run the task.
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict

import pytest

from engine import recovery, trigger_rules
from engine.models import TaskRunEvent, WorkflowRun
from engine.recovery import ActionRefused, retry_task_run
from engine.repositories import task_runs
from engine.services import start_run
from engine.states import TriggerRule
from tenancy.models import Role
from tests.unit.test_recovery import actor_with
from tests.unit.test_trigger_rules import NOOP, PAIRS, TABLE, apply_outcome, claim_and_start, task_run

# The letters of tests/unit/test_trigger_rules.py as outcomes of engine.trigger_rules.
OUTCOME = {"S": trigger_rules.SUCCESS, "F": trigger_rules.FAILURE, "K": trigger_rules.SKIP,
           "U": trigger_rules.FAILURE, "C": trigger_rules.SKIP, "O": trigger_rules.OPEN}
VERDICT = {"ready": "ready", "wait": None, "uf": "upstream_failed", "tr": "trigger_rule"}
# The state each upstream letter leaves u<i> in, as a refusal names it.
SAID = {"S": "succeeded", "F": "failed", "K": "was skipped", "U": "was skipped", "C": "was cancelled",
        "O": "is running"}


@pytest.mark.parametrize("rule", TriggerRule.values)
def test_the_python_verdict_is_the_tables_for_every_rule_and_pair_of_outcomes(rule):
    for pair, want in zip(PAIRS, TABLE[rule], strict=True):
        for ordered in {pair, pair[::-1]}:
            assert trigger_rules.verdict(rule, [OUTCOME[c] for c in ordered]) == VERDICT[want], (rule, ordered)


def test_the_python_verdict_refuses_an_unknown_rule_or_outcome_and_runs_a_task_without_upstream():
    assert trigger_rules.verdict("all_success", []) == "ready"
    with pytest.raises(ValueError, match="unknown trigger rule 'sometimes'"):
        trigger_rules.verdict("sometimes", ["success"])
    with pytest.raises(ValueError, match="unknown outcome 'maybe'"):
        trigger_rules.verdict("all_done", ["maybe"])
    assert [trigger_rules.outcome(*o) for o in [("succeeded", ""), ("failed", ""), ("skipped", "upstream_failed"),
                                                ("skipped", "trigger_rule"), ("skipped", "condition_false"),
                                                ("cancelled", ""), ("running", ""), ("pending", "")]] == [
        "success", "failure", "failure", "skip", "skip", "skip", "open", "open"]


@pytest.fixture
def rules_workflow(org, make_workflow):
    """p1 -> u1, p2 -> u2, and one dependent of (u1, u2) per trigger rule: d_<rule>."""
    tasks = [{"key": "p1", **NOOP}, {"key": "p2", **NOOP},
             {"key": "u1", **NOOP, "depends_on": ["p1"]}, {"key": "u2", **NOOP, "depends_on": ["p2"]}]
    tasks += [{"key": f"d_{rule}", **NOOP, "depends_on": ["u1", "u2"], "trigger_rule": rule}
              for rule in TriggerRule.values]
    return make_workflow(org, tasks, name="retry-rules")


def _fail_ready(run_id, key):
    d = claim_and_start(run_id, key)
    result = task_runs.fail_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token, error="boom",
                                    retryable=False)
    assert result.accepted and result.state == "failed"


@pytest.mark.django_db
@pytest.mark.parametrize(("first", "second"), list(itertools.product("SFKUCO", repeat=2)),
                         ids=["".join(p) for p in itertools.product("SFKUCO", repeat=2)])
def test_retrying_a_task_is_allowed_exactly_when_its_trigger_rule_is_met_by_its_upstream_outcomes(
        org, rules_workflow, first, second):
    """u1 gets ``first``, u2 ``second``; each rule's dependent that the engine made ready
    then fails, so every dependent is finished (failed, or skipped by its rule) unless it
    waits for an upstream still running. Retrying each: allowed (back to ready, a reset
    event) where the table says the rule runs it, refused naming the rule and both
    upstreams where it skips it, refused as unfinished where it waits."""
    run_id = start_run(workflow=rules_workflow).pk
    apply_outcome(run_id, 1, first)
    apply_outcome(run_id, 2, second)
    pair = first + second if first + second in PAIRS else second + first
    wants = {rule: TABLE[rule][PAIRS.index(pair)] for rule in TriggerRule.values}
    for rule, want in wants.items():
        if want == "ready":
            _fail_ready(run_id, f"d_{rule}")
    run_state = WorkflowRun.objects.unscoped().get(pk=run_id).state
    assert run_state == ("running" if "O" in pair else "failed")

    actor = actor_with(rules_workflow.organization, Role.MEMBER)
    for rule, want in wants.items():
        target = task_run(run_id, f"d_{rule}")
        seq = WorkflowRun.objects.unscoped().get(pk=run_id).last_event_seq
        if want == "ready":
            assert target.state == "failed"
            result = retry_task_run(actor=actor, task_run=target)
            assert result.reopened == (f"d_{rule}",)
            again = task_run(run_id, f"d_{rule}")
            assert (again.state, again.attempt, again.fencing_token) == ("ready", 2, target.fencing_token + 1)
            # In the run's event order: without order_by the rows came back in whatever order
            # the scan found them (once 'promoted' before 'reset', in a CI run).
            assert list(TaskRunEvent.objects.unscoped().filter(task_run=again, seq__gt=seq).order_by("seq")
                        .values_list("kind", "from_state", "to_state")) == [
                ("reset", "failed", "pending"), ("promoted", "pending", "ready")]
            continue
        if want == "wait":
            assert target.state == "pending"
            message = f"task d_{rule} is pending; only a finished task can be acted on"
        else:
            assert target.state == "skipped"
            message = (f"task d_{rule} cannot be retried: its trigger rule {rule} "
                       f"(it runs once {trigger_rules.RULE_NEEDS[rule]}) is not met by its upstream tasks "
                       f"(u1 {SAID[first]}, u2 {SAID[second]})")
        with pytest.raises(ActionRefused) as refused:
            retry_task_run(actor=actor, task_run=target)
        assert str(refused.value).startswith(message), (rule, first, second, str(refused.value))
        assert WorkflowRun.objects.unscoped().get(pk=run_id).last_event_seq == seq  # nothing changed
        assert task_run(run_id, f"d_{rule}").state == target.state


def _graph(rule: str, *ups: tuple[str, str, str]):
    """A graph of task t (``rule``) below upstreams (key, state, skip_reason)."""
    rows = {uuid.uuid4(): recovery._Row(uuid.uuid4(), uuid.uuid4(), key, state, 1, reason, "all_success")
            for key, state, reason in ups}
    rows = {r.task_id: r for r in rows.values()}
    target = recovery._Row(uuid.uuid4(), uuid.uuid4(), "t", "failed", 1, "", rule)
    rows[target.task_id] = target
    upstream = defaultdict(list, {target.task_id: [r.task_id for r in rows.values() if r is not target]})
    return recovery._Graph(rows=rows, upstream=upstream, downstream=defaultdict(list)), target


@pytest.mark.parametrize(("rule", "ups", "message"), [
    # An upstream still going (a rule that fired early, then an action that changed its outcome):
    # the rule is not decided, so the retry waits for it.
    ("all_done", [("a", "failed", ""), ("b", "running", "")],
     "task t cannot be retried yet: its trigger rule all_done (it runs once every upstream task finished, "
     "whatever its outcome) is not decided while b has not finished (upstream: a failed, b is running); act once "
     "it has finished"),
    ("one_failed", [("a", "succeeded", ""), ("b", "skipped", "condition_false")],
     "task t cannot be retried: its trigger rule one_failed (it runs once at least one upstream task failed) is not "
     "met by its upstream tasks (a succeeded, b was skipped); retried now it would be skipped again"),
    ("none_failed", [("a", "skipped", "upstream_failed"), ("b", "skipped", "condition_false")],
     "task t cannot be retried: its trigger rule none_failed (it runs once every upstream task finished and none "
     "failed) is not met by its upstream tasks (a was skipped, b was skipped); retry a (its downstream, t included, "
     "runs again) or mark it succeeded"),
    ("one_success", [("a", "failed", ""), ("b", "cancelled", "")],
     "task t cannot be retried: its trigger rule one_success (it runs once at least one upstream task succeeded) is "
     "not met by its upstream tasks (a failed, b was cancelled); retry a or b (its downstream, t included, runs "
     "again) or mark them succeeded"),
])
def test_a_refusal_names_the_rule_each_upstreams_state_and_what_would_let_it_run(rule, ups, message):
    graph, target = _graph(rule, *ups)
    with pytest.raises(ActionRefused) as refused:
        recovery._refuse_rule_not_met(graph, target)
    assert str(refused.value) == message


def test_a_rule_met_by_failed_upstreams_is_not_refused():
    for rule in ("all_done", "always", "one_failed", "all_failed"):
        graph, target = _graph(rule, ("a", "failed", ""), ("b", "skipped", "upstream_failed"))
        recovery._refuse_rule_not_met(graph, target)  # no ActionRefused
    graph, target = _graph("all_success", ("a", "failed", ""))
    with pytest.raises(ActionRefused, match="its trigger rule all_success"):
        recovery._refuse_rule_not_met(graph, target)
