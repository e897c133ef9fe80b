"""The trigger rules decided in Python, for the callers that must know a rule's verdict
without changing anything: a person's retry of one task run (engine.recovery: allowed only
when the task's rule is met by its upstream outcomes) and the run page's buttons (which
offer only what the service would accept).

The engine itself decides in SQL (engine/sql/task_runs.sql, ``task_run_settle_dependents``);
``verdict`` is that statement's general branch, case for case (tests/unit/test_trigger_rules.py
checks both against the same table of every rule and every pair of outcomes). It is a
pure function: no query.

An upstream outcome is (``outcome``) a *success* (succeeded), a *failure* (failed, or
skipped with SkipReason.UPSTREAM_FAILED), a *skip* (any other skip, or cancelled), or
*open* (not finished).
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.states import SkipReason, TaskRunState, TriggerRule

SUCCESS, FAILURE, SKIP, OPEN = "success", "failure", "skip", "open"
#: The verdict that runs the task; the others are a SkipReason value, or None (it waits).
READY = "ready"

#: What each rule needs, in a sentence (the words of engine.states.TriggerRule).
RULE_NEEDS = {
    TriggerRule.ALL_SUCCESS.value: "every upstream task succeeded",
    TriggerRule.ALL_FAILED.value: "every upstream task failed",
    TriggerRule.ALL_DONE.value: "every upstream task finished, whatever its outcome",
    TriggerRule.ONE_FAILED.value: "at least one upstream task failed",
    TriggerRule.ONE_SUCCESS.value: "at least one upstream task succeeded",
    TriggerRule.NONE_FAILED.value: "every upstream task finished and none failed",
    TriggerRule.ALWAYS.value: "every upstream task finished, whatever its outcome",
}


def outcome(state: str, skip_reason: str = "") -> str:
    """The outcome (SUCCESS, FAILURE, SKIP or OPEN) a task run in ``state`` (with
    ``skip_reason`` when skipped) is for its dependents' trigger rules."""
    if state == TaskRunState.SUCCEEDED:
        return SUCCESS
    if state == TaskRunState.FAILED or (state == TaskRunState.SKIPPED and skip_reason == SkipReason.UPSTREAM_FAILED):
        return FAILURE
    if state in (TaskRunState.SKIPPED, TaskRunState.CANCELLED):
        return SKIP
    return OPEN


def verdict(rule: str, outcomes: Iterable[str]) -> str | None:
    """What ``rule`` decides for a task whose upstream task runs have ``outcomes`` (each
    SUCCESS, FAILURE, SKIP or OPEN; see ``outcome``): READY, a skip reason
    (``upstream_failed`` or ``trigger_rule``, SkipReason values), or None while it waits.
    Raises ValueError for an unknown rule or outcome. A task without upstream has no rule
    to meet: READY."""
    n = {SUCCESS: 0, FAILURE: 0, SKIP: 0, OPEN: 0}
    for o in outcomes:
        if o not in n:
            raise ValueError(f"unknown outcome {o!r}; one of {', '.join(n)}")
        n[o] += 1
    total = sum(n.values())
    if total == 0:
        return READY
    succeeded, failed, skipped, open_ = n[SUCCESS], n[FAILURE], n[SKIP], n[OPEN]
    if rule == TriggerRule.ALL_SUCCESS:
        if failed:
            return SkipReason.UPSTREAM_FAILED.value
        if skipped:
            return SkipReason.TRIGGER_RULE.value
        return READY if succeeded == total else None
    if rule == TriggerRule.ALL_FAILED:
        if succeeded + skipped:
            return SkipReason.TRIGGER_RULE.value
        return READY if failed == total else None
    if rule in (TriggerRule.ALL_DONE, TriggerRule.ALWAYS):
        return READY if open_ == 0 else None
    if rule == TriggerRule.ONE_FAILED:
        if failed:
            return READY
        return SkipReason.TRIGGER_RULE.value if open_ == 0 else None
    if rule == TriggerRule.ONE_SUCCESS:
        if succeeded:
            return READY
        if open_ == 0:
            return SkipReason.UPSTREAM_FAILED.value if failed else SkipReason.TRIGGER_RULE.value
        return None
    if rule == TriggerRule.NONE_FAILED:
        if failed:
            return SkipReason.UPSTREAM_FAILED.value
        return READY if open_ == 0 else None
    raise ValueError(f"unknown trigger rule {rule!r}; one of {', '.join(TriggerRule.values)}")


def skip_reason_label(skip_reason: str, *, trigger_rule: str = TriggerRule.ALL_SUCCESS.value) -> str:
    """``skip_reason_text`` in a few words (the run page's task rows): ``upstream failed``,
    ``trigger rule <rule> not met``, ``condition false``, ``skipped by hand``; '' for no reason."""
    if skip_reason == SkipReason.UPSTREAM_FAILED:
        return "upstream failed"
    if skip_reason == SkipReason.TRIGGER_RULE:
        return f"trigger rule {trigger_rule} not met"
    if skip_reason == SkipReason.CONDITION_FALSE:
        return "condition false"
    if skip_reason == SkipReason.MARKED:
        return "skipped by hand"
    return ""


def skip_reason_text(skip_reason: str, *, trigger_rule: str = TriggerRule.ALL_SUCCESS.value) -> str:
    """Why a skipped task run was skipped, in words for a person (the run page's task
    rows and panel): its SkipReason ``skip_reason`` read with its task's ``trigger_rule``.
    '' for no reason (a task run not skipped, or one skipped before reasons were kept)."""
    if skip_reason == SkipReason.UPSTREAM_FAILED:
        return f"upstream failed: its trigger rule {trigger_rule} needs {RULE_NEEDS.get(trigger_rule, '?')}"
    if skip_reason == SkipReason.TRIGGER_RULE:
        return f"trigger rule {trigger_rule} not met: it needs {RULE_NEEDS.get(trigger_rule, '?')}"
    if skip_reason == SkipReason.CONDITION_FALSE:
        return "condition false"
    if skip_reason == SkipReason.MARKED:
        return "a person marked it skipped (its events say who and why)"
    return ""


__all__ = ["FAILURE", "OPEN", "READY", "RULE_NEEDS", "SKIP", "SUCCESS", "outcome", "skip_reason_label",
           "skip_reason_text", "verdict"]
