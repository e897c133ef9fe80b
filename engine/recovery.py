"""What a person does about a failed run (issue 19): resume it, or act on one of its task
runs: retry it (and what depends on it), mark it succeeded with a given output, skip it.

**In the same run, with new generations** (not a linked new run). A resume or an action
sends a finished run back to ``running`` (a ``resumed`` event naming who, which action,
which task and which task runs it reopened; ``resumed_at``), and the task runs it re-runs
back to ``pending``/``ready`` with their fencing token bumped (a ``reset`` event each):
a message or a completion of any generation before the reset matches nothing and is
refused as ``stale_completion_rejected``, as for any stale worker. Why the same run:

- the succeeded task runs and their outputs stay where every dependent already reads
  them (a task's upstream outputs are read from its own run's task runs), nothing is
  copied, and nothing that succeeded runs again or is shown twice;
- per-task actions (mark succeeded, skip, retry one task) act on *this* run's history,
  which a linked run could only imitate by copying rows;
- one run, one event log (gap-free ``seq``), one URL: the history reads in order —
  attempt 1 failed, ``resumed`` by whom, attempt 2 succeeded — and the attempt numbers of
  a task run never repeat (``attempt`` counts on; ``attempt_base`` renews the retry
  budget, so a resumed task gets its ``max_attempts`` again).

A new run of the same version and input (every task again, ``retry_of`` linking it) is
still ``engine.services.retry_run`` ("re-run as a new run").

Every action: the permission ``run.operate`` (owner, admin, member; a viewer is refused),
one transaction (retried on a deadlock) holding the run's row lock first
(``recovery.lock_run``, which a cancel and the sweeper take too), an audit record (``run.resumed``,
``task_run.retried``, ``task_run.marked_succeeded``, ``task_run.skipped``), and the
scheduler nudged on commit: reopened task runs are claimed by the fair claim and
dispatched through the outbox exactly as a new run's. What runs next is decided by the
engine's own rules, as after a completion: each task run reopened waits ``pending`` until
``task_run_promote_dependents`` promotes it (it is run for the succeeded task runs just
upstream of those reopened, and for a task marked succeeded), and
``task_run_skip_descendants`` skips again what sits below a task that did not succeed;
``run_finish_if_done`` ends the run once nothing is open, so a run always reaches a
terminal state again.

Limits: ``reason`` at most MAX_REASON_CHARS characters; a marked output at most
FLOWFORGE_MAX_OUTPUT_BYTES of JSON (as a handler's) and MAX_OUTPUT_DEPTH levels deep; a run sent back to running counts
against its workflow's run limit (``max_running_runs``: refused while it is full) and its
version must be active. Every call is also one API request, under the API's rate limits.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.db import transaction

from audit import services as audit
from engine import dispatch, metrics, trigger_rules
from engine.db import retry_transient
from engine.models import TaskDependency, TaskRun, Workflow, WorkflowRun, WorkflowState
from engine.repositories import recovery as rows
from engine.repositories import runs, task_runs
from engine.states import (
    RUN_TERMINAL_STATES,
    TASK_TERMINAL_STATES,
    RunState,
    SkipReason,
    TaskRunState,
    TriggerRule,
)
from flowforge.jsonb import stored_bytes, strip_nul
from tenancy.actors import Actor
from tenancy.permissions import Action, require

log = logging.getLogger(__name__)

#: Characters of the ``reason`` an action may carry (kept in its events and audit record).
MAX_REASON_CHARS = 500
#: Task keys a ``resumed`` event and an audit record list (``reopened`` counts them all).
LISTED_TASKS = 100

RESUME, RETRY, MARK_SUCCEEDED, SKIP = "resume", "retry", "mark_succeeded", "skip"


class ActionRefused(Exception):
    """The run's or the task run's state does not allow the action now (the API's 409).
    The message says why and, where there is one, what to do instead."""


class InvalidAction(ValueError):
    """A bad argument (the API's 400): ``field`` (``reason`` or ``output``) and ``message``.
    Nothing was changed."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclasses.dataclass(frozen=True)
class ActionResult:
    """What an action did: ``run_state`` the run's state after it (``running`` while reopened
    task runs go, or its new final state when nothing was left to run), ``resumed_from``
    the finished state the run left (None if it was running), ``reopened`` the keys of the
    task runs it reopened, in key order."""

    run_state: str
    resumed_from: str | None
    reopened: tuple[str, ...]


# --- the public actions ----------------------------------------------------------------------------


def resume_run(*, actor: Actor, run: WorkflowRun, reason: str = "") -> ActionResult:
    """Resume a failed or cancelled run in place: every task run that failed, was cancelled
    or was skipped for a failure upstream, and everything downstream of one, runs again (new
    generations); succeeded task runs and their outputs are kept, and so are tasks skipped
    for a branch not taken (``_resume_roots``). Records ``run.resumed``.

    Raises Forbidden (no ``run.operate``), InvalidAction (``reason`` too long),
    ActionRefused for a run still going or one that succeeded (nothing to resume), for a
    workflow version no longer active, and for a workflow whose run limit is full.
    """

    def plan(graph: _Graph, run_state: str) -> _Plan:
        if run_state in (RunState.PENDING, RunState.RUNNING):
            raise ActionRefused(f"run {run.pk} is {run_state}; only a finished run can be resumed "
                                "(act on one of its failed tasks, or cancel it first)")
        if run_state == RunState.SUCCEEDED:
            handled = sorted(r.key for r in graph.rows.values() if r.state == TaskRunState.FAILED)
            if handled:
                raise ActionRefused(
                    f"run {run.pk} succeeded: the failure of {', '.join(handled)} was handled by a task whose "
                    f"trigger rule reacts to failures (one_failed, all_failed), so there is nothing to resume; "
                    f"retry task {handled[0]} to run it again")
            raise ActionRefused(f"run {run.pk} succeeded: every task succeeded and there is nothing to resume; "
                                "retry one of its tasks, or re-run it as a new run")
        return _Plan(reopen=graph.closure(_resume_roots(graph)))

    return _act(actor=actor, run=run, action=RESUME, reason=reason, target=None, plan=plan)


def _resume_roots(graph: _Graph) -> list:
    """The tasks a resume reopens from (everything below them reopens with them): those that
    failed or were cancelled (or, in a run a person stopped, never finished), and those
    skipped because of a failure upstream (``upstream_failed``). A task skipped because its
    condition was false or its trigger rule was not met for another reason (a branch not
    taken, a failure handler with nothing to handle) is an outcome of the run's successes:
    it is re-decided only when it lies below a reopened task, so the succeeded tasks below
    a branch not taken are kept."""
    return [t for t, r in graph.rows.items()
            if r.state not in (TaskRunState.SUCCEEDED, TaskRunState.SKIPPED)
            or (r.state == TaskRunState.SKIPPED and r.skip_reason == SkipReason.UPSTREAM_FAILED)]


def retry_task_run(*, actor: Actor, task_run: TaskRun, reason: str = "") -> ActionResult:
    """Run a finished task run again, and everything downstream of it (new generations, a
    fresh attempt budget); the rest of the run keeps its state and outputs. On a finished
    run any finished task run (a succeeded one too); on a running run a failed or skipped
    one whose downstream has finished. Records ``task_run.retried``.

    The task's trigger rule must be met by the outcomes of the task runs it depends on as
    they are now (engine.trigger_rules.verdict, the engine's own rule): a task whose rule
    is ``all_done``, ``always``, ``one_failed`` or ``all_failed`` can be retried below a
    failure, one whose rule is ``all_success`` only once every upstream succeeded.

    Raises Forbidden, InvalidAction (``reason``), and ActionRefused for a task run still
    going, one whose trigger rule its upstream outcomes do not meet (the message names the
    rule and each upstream's state: retry or mark succeeded that one instead, its
    downstream runs again with it) or do not decide yet (an upstream still going), one
    whose downstream is still going, and as ``resume_run`` for a finished run that cannot
    go back to running.
    """

    def plan(graph: _Graph, run_state: str) -> _Plan:
        row = graph.target(task_run)
        _refuse_unfinished(row)
        if run_state not in RUN_TERMINAL_STATES and row.state not in (TaskRunState.FAILED, TaskRunState.SKIPPED):
            raise ActionRefused(f"task {row.key} {row.state} and its run is still running: until the run "
                                "finishes only a failed or skipped task can be retried")
        _refuse_open_downstream(graph, row)
        _refuse_rule_not_met(graph, row)
        return _Plan(reopen=graph.closure([row.task_id]))

    return _act(actor=actor, run=_run_of(task_run), action=RETRY, reason=reason, target=task_run, plan=plan)


def mark_task_run_succeeded(*, actor: Actor, task_run: TaskRun, output: Any, reason: str = "") -> ActionResult:
    """Mark a failed, skipped or cancelled task run succeeded with ``output`` (any JSON value,
    stored as a handler's output is: NUL characters removed, at most
    FLOWFORGE_MAX_OUTPUT_BYTES of JSON text); its downstream task runs that did not succeed
    run again, handed this output. On a running run, a failed or skipped task run whose
    downstream has finished. Records ``task_run.marked_succeeded``.

    Raises Forbidden, InvalidAction (``output`` not storable JSON or too large, ``reason``),
    and ActionRefused for a task run that succeeded or is still going, one whose downstream
    is still going, and as ``resume_run`` for a finished run that cannot go back to running.
    """
    output_json = _output_json(output)

    def plan(graph: _Graph, run_state: str) -> _Plan:
        row = graph.target(task_run)
        _refuse_unfinished(row)
        if row.state == TaskRunState.SUCCEEDED:
            raise ActionRefused(f"task {row.key} already succeeded; retry it to run it again")
        _refuse_open_downstream(graph, row)
        below = [t for t in graph.descendants(row.task_id) if graph.rows[t].state != TaskRunState.SUCCEEDED]
        return _Plan(reopen=set(below), mark=(row, TaskRunState.SUCCEEDED.value), output_json=output_json)

    return _act(actor=actor, run=_run_of(task_run), action=MARK_SUCCEEDED, reason=reason, target=task_run,
                plan=plan, audit_extra={"output_bytes": len(output_json.encode())})


def skip_task_run(*, actor: Actor, task_run: TaskRun, reason: str = "") -> ActionResult:
    """Mark a failed or cancelled task run skipped (a skipped task does not fail its run);
    its downstream task runs that did not succeed are decided again as after a skipped
    upstream. On a running run, a failed task run whose downstream has finished. Records
    ``task_run.skipped``.

    Raises Forbidden, InvalidAction (``reason``), and ActionRefused for a task run that
    succeeded, was skipped already or is still going, one whose downstream is still going,
    and as ``resume_run`` for a finished run that cannot go back to running.
    """

    def plan(graph: _Graph, run_state: str) -> _Plan:
        row = graph.target(task_run)
        _refuse_unfinished(row)
        if row.state not in (TaskRunState.FAILED, TaskRunState.CANCELLED):
            raise ActionRefused(f"task {row.key} {_did(row.state)}; only a failed or cancelled task can be skipped")
        _refuse_open_downstream(graph, row)
        below = [t for t in graph.descendants(row.task_id) if graph.rows[t].state != TaskRunState.SUCCEEDED]
        return _Plan(reopen=set(below), mark=(row, TaskRunState.SKIPPED.value))

    return _act(actor=actor, run=_run_of(task_run), action=SKIP, reason=reason, target=task_run, plan=plan)


# --- the run's task runs as a graph ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Row:
    task_run_id: uuid.UUID
    task_id: uuid.UUID
    key: str
    state: str
    fencing_token: int
    skip_reason: str
    trigger_rule: str


@dataclasses.dataclass
class _Graph:
    """The run's task runs by task, read under the run's row lock, with the workflow's edges."""

    rows: dict[uuid.UUID, _Row]
    upstream: dict[uuid.UUID, list[uuid.UUID]]
    downstream: dict[uuid.UUID, list[uuid.UUID]]

    def target(self, task_run: TaskRun) -> _Row:
        row = self.rows.get(task_run.task_id)
        if row is None or row.task_run_id != task_run.pk:  # not reachable: access_task_run read it from this run
            raise ActionRefused(f"task run {task_run.pk} is not a task run of this run")
        return row

    def descendants(self, task_id: uuid.UUID) -> set[uuid.UUID]:
        """Every task below ``task_id`` (not itself)."""
        seen: set[uuid.UUID] = set()
        todo = list(self.downstream[task_id])
        while todo:
            t = todo.pop()
            if t not in seen:
                seen.add(t)
                todo.extend(self.downstream[t])
        return seen

    def closure(self, task_ids) -> set[uuid.UUID]:
        """``task_ids`` and everything below them."""
        out = set(task_ids)
        for t in task_ids:
            out |= self.descendants(t)
        return out


def _read_graph(run: WorkflowRun) -> _Graph:
    """Two queries: the run's task runs (idx_taskrun_run_state) and its version's edges."""
    got = TaskRun.objects.for_organization(run.organization_id).filter(workflow_run_id=run.pk).values_list(
        "id", "task_id", "task__key", "state", "fencing_token", "skip_reason", "task__trigger_rule")
    by_task = {r[1]: _Row(*r) for r in got}
    upstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    downstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    edges = TaskDependency.objects.for_organization(run.organization_id).filter(
        workflow_id=run.workflow_id).values_list("task_id", "depends_on_id")
    for task, dep in edges:
        upstream[task].append(dep)
        downstream[dep].append(task)
    return _Graph(rows=by_task, upstream=upstream, downstream=downstream)


@dataclasses.dataclass
class _Plan:
    """What an action changes: the tasks whose task runs it reopens, and the one it marks
    (the row and its new state) with the output a mark as succeeded stores."""

    reopen: set[uuid.UUID]
    mark: tuple[_Row, str] | None = None
    output_json: str = "null"


def _did(state: str) -> str:
    return {"succeeded": "succeeded", "failed": "failed", "skipped": "was skipped", "cancelled": "was cancelled",
            "pending": "is pending", "ready": "is ready", "running": "is running"}.get(state, f"is {state}")


def _refuse_unfinished(row: _Row) -> None:
    if row.state not in TASK_TERMINAL_STATES:
        raise ActionRefused(f"task {row.key} {_did(row.state)}; only a finished task can be acted on")


def _refuse_open_downstream(graph: _Graph, row: _Row) -> None:
    """On a running run a task downstream of the one acted on may still be going (or not
    yet decided): acting then would reopen it under the engine."""
    for t in sorted(graph.descendants(row.task_id), key=lambda t: graph.rows[t].key):
        below = graph.rows[t]
        if below.state not in TASK_TERMINAL_STATES:
            raise ActionRefused(f"task {below.key}, downstream of {row.key}, {_did(below.state)}; "
                                "act once it has finished")


def _refuse_rule_not_met(graph: _Graph, row: _Row) -> None:
    """Refuse to retry ``row`` unless its task's trigger rule is met by its upstream task
    runs' outcomes now: retried, it would be skipped (or left waiting) at once, the
    engine deciding by that rule (task_run_settle_dependents)."""
    ups = sorted((graph.rows[u] for u in graph.upstream[row.task_id]), key=lambda r: r.key)
    decided = trigger_rules.verdict(row.trigger_rule, [trigger_rules.outcome(u.state, u.skip_reason) for u in ups])
    if decided == trigger_rules.READY:
        return
    states = ", ".join(f"{u.key} {_did(u.state)}" for u in ups)
    needs = trigger_rules.RULE_NEEDS.get(row.trigger_rule, row.trigger_rule)
    if decided is None:
        going = [u.key for u in ups if trigger_rules.outcome(u.state, u.skip_reason) == trigger_rules.OPEN]
        raise ActionRefused(f"task {row.key} cannot be retried yet: its trigger rule {row.trigger_rule} (it runs "
                            f"once {needs}) is not decided while {' and '.join(going)} "
                            f"{'has' if len(going) == 1 else 'have'} not finished (upstream: {states}); act once "
                            f"{'it has' if len(going) == 1 else 'they have'} finished")
    if row.trigger_rule in (TriggerRule.ALL_FAILED, TriggerRule.ONE_FAILED):
        # It reacts to failures upstream: retried now, it would be skipped again at once.
        fix = "retried now it would be skipped again"
    else:
        # What would let it run: the upstream tasks that did not succeed, succeeding.
        bad = (lambda u: trigger_rules.outcome(u.state, u.skip_reason) == trigger_rules.FAILURE) \
            if row.trigger_rule == TriggerRule.NONE_FAILED else (lambda u: u.state != TaskRunState.SUCCEEDED)
        misfits = [u.key for u in ups if bad(u)]
        fix = (f"retry {' or '.join(misfits)} (its downstream, {row.key} included, runs again) or mark "
               f"{'it' if len(misfits) == 1 else 'them'} succeeded")
    raise ActionRefused(f"task {row.key} cannot be retried: its trigger rule {row.trigger_rule} (it runs once "
                        f"{needs}) is not met by its upstream tasks ({states}); {fix}")


def _run_of(task_run: TaskRun) -> WorkflowRun:
    return WorkflowRun.objects.for_organization(task_run.organization_id).select_related("workflow").get(
        pk=task_run.workflow_run_id)


# --- checks of the arguments -----------------------------------------------------------------------


def _check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise InvalidAction("reason", "must be a string")
    reason = strip_nul(reason).strip()
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidAction("reason", f"is {len(reason)} characters; at most {MAX_REASON_CHARS}")
    return reason


def max_output_bytes() -> int:
    """FLOWFORGE_MAX_OUTPUT_BYTES: the largest output (bytes of JSON text) a task may have,
    a handler's or a person's."""
    return int(settings.FLOWFORGE_MAX_OUTPUT_BYTES)


#: Levels of arrays and objects a marked output may nest (as the API's JSON bodies).
MAX_OUTPUT_DEPTH = 64


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests deeper than MAX_OUTPUT_DEPTH (iterative: any depth is safe to ask)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_OUTPUT_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _output_json(output: Any) -> str:
    """``output`` as the JSON text to store (NULs stripped, unpaired surrogates replaced), or
    InvalidAction naming ``output`` when it nests deeper than MAX_OUTPUT_DEPTH, JSON cannot
    hold it or it is over max_output_bytes()."""
    if _too_deep(output):
        raise InvalidAction("output", f"is nested deeper than {MAX_OUTPUT_DEPTH} levels")
    try:
        text = json.dumps(strip_nul(output), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidAction("output", f"is not storable JSON ({exc})") from None
    size = stored_bytes(text)
    if size > max_output_bytes():
        raise InvalidAction("output", f"is {size} bytes of JSON text; at most {max_output_bytes()} "
                                      "(FLOWFORGE_MAX_OUTPUT_BYTES), as for a task's own output")
    return text


# --- applying a plan -------------------------------------------------------------------------------


def who(actor: Actor) -> str:
    """The actor as a run's history names it: an email, ``API key <prefix>``, or ``system``."""
    if actor.api_key is not None:
        return f"API key {actor.api_key.prefix}"
    if actor.user is not None:
        return actor.user.email
    return "system"


def _act(*, actor: Actor, run: WorkflowRun, action: str, reason: Any, target: TaskRun | None, plan,
         audit_extra: dict[str, Any] | None = None) -> ActionResult:
    require(actor.role, Action.RUN_OPERATE)
    if run.organization_id != actor.organization.pk:  # the views read it scoped; a service checks again
        raise WorkflowRun.DoesNotExist("no such run")
    reason = _check_reason(reason)

    def attempt() -> ActionResult:
        # Durable: the retry below repeats the whole transaction, which only works as the
        # outermost one (a view that calls this is outside ATOMIC_REQUESTS).
        with transaction.atomic(durable=True):
            return _apply(actor=actor, run=run, action=action, reason=reason, target=target, plan=plan,
                          audit_extra=audit_extra or {})

    # The action locks the run's row, then task runs; a completion locks a task run, then the
    # run's row: a deadlock between them is possible, and PostgreSQL then aborts one side.
    result = retry_transient(attempt, atomic=False)
    log.info("run %s: %s by %s (%s); reopened %d task run(s); run %s", run.pk, action, who(actor),
             target.pk if target is not None else "whole run", len(result.reopened), result.run_state)
    return result


def _apply(*, actor: Actor, run: WorkflowRun, action: str, reason: str, target: TaskRun | None, plan,
           audit_extra: dict[str, Any]) -> ActionResult:
    # The version's row first (an archive takes it FOR UPDATE, then cancels the version's
    # running runs): a run is not sent back to running while its version is being archived.
    workflow = Workflow.objects.for_organization(run.organization_id).select_for_update(no_key=True).get(
        pk=run.workflow_id)
    limit = workflow.max_running_runs
    if limit is not None:
        # Before the run's row (advisory locks come before row locks, as in start_run): a run
        # sent back to running takes a place under its workflow's run limit.
        runs.lock(runs.run_limit_lock_key(run.organization_id, workflow.name))
    run_state = rows.lock_run(workflow_run_id=run.pk)
    if run_state is None:  # not reachable: a run with task runs is never deleted
        raise ActionRefused(f"run {run.pk} no longer exists")
    graph = _read_graph(run)
    p: _Plan = plan(graph, run_state)
    finished = run_state in RUN_TERMINAL_STATES
    if finished and p.reopen:
        if workflow.state != WorkflowState.ACTIVE:
            raise ActionRefused(f"workflow {workflow.name} v{workflow.version} is {workflow.state}; restore it "
                                "to run its tasks again, or re-run the run as a new run of an active version")
        if limit is not None:
            running, queued = runs.count_open_of_name(organization_id=run.organization_id,
                                                      workflow_name=workflow.name)
            if running + queued >= limit:
                raise ActionRefused(f"workflow {workflow.name} has {running + queued}/{limit} runs going (its run "
                                    "limit, concurrency.max_running_runs); try again once one has finished")
    reopened = sorted(graph.rows[t].key for t in p.reopen)
    by = who(actor)
    detail: dict[str, Any] = {"action": action, "by": by, **({"reason": reason} if reason else {})}
    target_key = p.mark[0].key if p.mark else (graph.target(target).key if target is not None else None)
    resumed_from = None
    if finished:
        resumed_from = rows.reopen_run(workflow_run_id=run.pk, detail={
            **detail, **({"task": target_key} if target_key else {}),
            "tasks": reopened[:LISTED_TASKS], "reopened": len(reopened)})

    current: dict[uuid.UUID, tuple[str, int]] = {t: (r.state, r.fencing_token) for t, r in graph.rows.items()}
    if p.mark is not None:
        row, new_state = p.mark
        if new_state == TaskRunState.SUCCEEDED:
            token = rows.mark_succeeded(task_run_id=row.task_run_id, fencing_token=row.fencing_token,
                                        from_state=row.state, output_json=p.output_json,
                                        detail={**detail, "output_bytes": len(p.output_json.encode())})
        else:
            token = rows.mark_skipped(task_run_id=row.task_run_id, fencing_token=row.fencing_token,
                                      from_state=row.state, detail=detail)
        if token is None:  # not reachable under the run's lock: a finished task run does not move on its own
            raise ActionRefused(f"task {row.key} changed while this action ran; look again and retry")
        current[row.task_id] = (new_state, token)

    changes = [
        rows.Reopen(graph.rows[t].task_run_id, graph.rows[t].fencing_token, graph.rows[t].state,
                    TaskRunState.PENDING.value if graph.upstream[t] else TaskRunState.READY.value)
        for t in sorted(p.reopen, key=lambda t: graph.rows[t].key)
    ]
    done = rows.reopen_task_runs(changes, detail=detail)
    if len(done) != len(changes):  # as above: not reachable under the run's lock
        raise ActionRefused("a task of this run changed while this action ran; look again and retry")

    # What runs next is the engine's to decide, as if each finished task just upstream of
    # what was reopened (and the task marked) had just finished: its dependents are promoted
    # when it succeeded, and what lies below it is skipped when it did not. A task upstream
    # still going (on a running run) decides for them itself when it finishes.
    frontier = {up for t in p.reopen for up in graph.upstream[t] if up not in p.reopen}
    if p.mark is not None:
        frontier.add(p.mark[0].task_id)
    # The trigger rules decide: each pending dependent of a finished task of the frontier
    # goes ready, is skipped, or waits (task_runs.settle_dependents, as after any finish).
    finished = sorted(graph.rows[t].task_run_id for t in frontier if current[t][0] in TASK_TERMINAL_STATES)
    if finished:
        task_runs.settle_dependents(task_run_ids=finished)
    end = runs.finish(workflow_run_id=run.pk)

    _audit(actor=actor, run=run, action=action, target=target, target_key=target_key, reason=reason,
           from_state=p.mark[0].state if p.mark else (graph.target(target).state if target is not None else run_state),
           resumed_from=resumed_from, reopened=reopened, extra=audit_extra)
    if done:
        transaction.on_commit(_nudge_scheduler)
    if end is not None:
        transaction.on_commit(lambda: metrics.incr("flowforge_runs_finished_total", end.state))
        if end.limited:
            transaction.on_commit(_nudge_scheduler)
    # Not finished now: it was running, or it went back to running for what was reopened.
    return ActionResult(run_state=end.state if end is not None else RunState.RUNNING.value,
                        resumed_from=resumed_from, reopened=tuple(reopened))


AUDIT_ACTIONS = {RESUME: "run.resumed", RETRY: "task_run.retried", MARK_SUCCEEDED: "task_run.marked_succeeded",
                 SKIP: "task_run.skipped"}


def _audit(*, actor: Actor, run: WorkflowRun, action: str, target: TaskRun | None, target_key: str | None,
           reason: str, from_state: str, resumed_from: str | None, reopened: list[str],
           extra: dict[str, Any]) -> None:
    metadata: dict[str, Any] = {
        "channel": actor.channel, "from_state": from_state, "reopened": len(reopened),
        "tasks": reopened[:LISTED_TASKS], **({"reason": reason} if reason else {}),
        **({"run_resumed_from": resumed_from} if resumed_from and target is not None else {}), **extra,
    }
    if target is None:
        audit.record(AUDIT_ACTIONS[action], actor=actor, target=run, metadata={"workflow": run.workflow.name,
                                                                               **metadata})
    else:
        audit.record(AUDIT_ACTIONS[action], actor=actor, target=target,
                     metadata={"run": str(run.pk), "task_key": target_key, **metadata})


def _nudge_scheduler() -> None:
    """Wake a scheduler now (the reopened task runs are ready); a failed nudge is logged,
    not raised: the clock's tick claims them anyway."""
    try:
        dispatch.nudge_scheduler()
    except Exception as exc:  # broker down: the task runs are stored, the clock's tick claims them
        log.warning("could not nudge the scheduler (%s: %s); the clock will pick the work up",
                    type(exc).__name__, exc)


__all__ = [
    "MAX_REASON_CHARS",
    "ActionRefused",
    "ActionResult",
    "InvalidAction",
    "mark_task_run_succeeded",
    "resume_run",
    "retry_task_run",
    "skip_task_run",
]
