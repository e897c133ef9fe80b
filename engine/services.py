"""Engine actions that the commands, the API and the web UI all call.

Each ``do_*``/action validates, then changes data inside one transaction and
schedules its side effects (nudges to the scheduler) on commit.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from audit import services as audit
from engine import dispatch, input_schema, metrics, relay, secret_refs, sql, triggers
from engine.db import retry_transient
from engine.definitions import DEFAULT_TRIGGER_RULE, DefinitionError, validate_document
from engine.limit_keys import render_definition_keys
from engine.models import (
    RunLimitPolicy,
    Task,
    TaskDependency,
    TriggerSource,
    Workflow,
    WorkflowRun,
    WorkflowState,
)
from engine.repositories import driver, runs, task_runs
from engine.states import RUN_OPEN_STATES, RunSchedule, priority_problem
from flowforge.jsonb import jsonb_safe, stored_bytes, strip_nul
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded, effective_limits
from tenancy.permissions import Action, require

log = logging.getLogger(__name__)


class WorkflowNotStartable(Exception):
    """The workflow exists but cannot be started (draft or archived). The message says why."""


class ConfirmationRequired(ValueError):
    """A destructive action needs its confirmation field; the message says what to send."""


class RunNotFinished(Exception):
    """The run is still going (a retry needs a finished run)."""


class InvalidStart(ValueError):
    """A start was refused for one field of it: ``field`` is ``priority`` or ``input``
    (a concurrency key's placeholder that the input cannot fill); ``message`` says why.
    Nothing was stored."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class InvalidInput(InvalidStart):
    """The run input breaks the workflow version's ``input_schema`` (issue 19).
    ``violations`` lists each as {"path": JSON pointer into the input, "message",
    "keyword"} (``engine.input_schema.Violation``); ``field`` is ``input`` and ``message``
    names the version and summarizes the first few. Nothing was stored."""

    def __init__(self, violations: list[input_schema.Violation], *, workflow: Workflow):
        self.violations = violations
        count = len(violations)
        super().__init__("input", f"does not match the input schema of {workflow.name} v{workflow.version} "
                         f"({count} violation{'s' if count != 1 else ''}): {input_schema.summary(violations)}")


def check_input_size(run_input: Any, *, field: str = "input") -> None:
    """Raise ValueError when ``run_input`` is not storable JSON, and InvalidStart naming
    ``field`` when it is over FLOWFORGE_MAX_INPUT_BYTES as stored (``flowforge.jsonb.
    stored_bytes``: ``1e308`` is stored, and served, as 309 digits)."""
    try:
        text = json.dumps(run_input, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"run input is not storable JSON: {exc}") from exc
    size, limit = stored_bytes(text), settings.FLOWFORGE_MAX_INPUT_BYTES
    if size > limit:
        raise InvalidStart(field, f"is {size} bytes of JSON as stored (numbers are stored without an exponent: "
                                  f"1e308 is 309 digits); at most {limit} (FLOWFORGE_MAX_INPUT_BYTES)")


def checked_input(workflow: Workflow, run_input: dict[str, Any]) -> dict[str, Any]:
    """``run_input`` checked against ``workflow``'s input schema, with the schema's
    defaults filled in (``engine.input_schema``): what a run of it stores. The input as
    given (no copy) when the version has no schema. Raises InvalidInput listing every
    violation (at most ``input_schema.MAX_VIOLATIONS_LISTED``)."""
    if not workflow.input_schema_json:
        return run_input
    filled, violations = input_schema.check_input(workflow.input_schema_json, run_input,
                                                  organization_id=workflow.organization_id)
    if violations:
        raise InvalidInput(violations, workflow=workflow)
    return filled


# The start quota's window (tenancy.limits max_runs_per_minute).
RUNS_QUOTA_WINDOW_SECONDS = 60.0


def archive_workflow(*, actor: Actor, workflow: Workflow, confirm: str | None) -> tuple[Workflow, int]:
    """Archive one version of a workflow (seed 003: active -> archived): it refuses new
    runs, and its running runs are cancelled. ``confirm`` must equal the workflow's name.

    Returns (workflow, number of runs cancelled). Raises Forbidden, ConfirmationRequired.
    """
    require(actor.role, Action.WORKFLOW_EDIT)
    if confirm != workflow.name:
        raise ConfirmationRequired(
            f"archiving cancels the running runs of {workflow.name} v{workflow.version}; "
            f"send confirm={workflow.name!r} to proceed"
        )
    # One transaction (as in a request): the archive, its cancellations and their audit
    # records commit together, so no committed archive lacks its record.
    with transaction.atomic():
        wf = Workflow.objects.for_organization(actor.organization).select_for_update().get(pk=workflow.pk)
        before = wf.state
        if wf.state != WorkflowState.ARCHIVED:
            wf.state = WorkflowState.ARCHIVED
            wf.save(update_fields=["state"])
        cancelled = 0
        running = WorkflowRun.objects.for_organization(actor.organization).filter(
            workflow=wf, state__in=RUN_OPEN_STATES
        ).values_list("pk", flat=True)
        for run_id in list(running):
            run = WorkflowRun.objects.for_organization(actor.organization).get(pk=run_id)
            if _cancel_run_within(run=run, actor=actor, reason=f"workflow {wf.name} v{wf.version} was archived"):
                cancelled += 1
        if before != wf.state or cancelled:  # archiving an archived version again changes nothing
            audit.record("workflow.archived", actor=actor, target=wf, metadata={
                "name": wf.name, "version": wf.version, "state": {"before": before, "after": wf.state},
                "runs_cancelled": cancelled})
    return wf, cancelled


def check_definition(*, document: Any, organization, new: bool = True) -> dict[str, Any]:
    """``document`` validated (``engine.definitions.validate_document``, ``new`` as there)
    and normalized, with every secret it references checked to exist in ``organization``.

    Raises DefinitionError listing every problem; an unknown secret's entry names the
    field that references it (``tasks[fetch].config.headers.Authorization``) and the name.
    Writes nothing (one query for the secrets' names when the document references any).
    """
    normalized = validate_document(document, new=new)
    problems = secret_refs.check_references(getattr(organization, "pk", organization),
                                            secret_refs.definition_references(normalized))
    if problems:
        raise DefinitionError(problems)
    return normalized


def restore_workflow(*, actor: Actor, workflow: Workflow) -> Workflow:
    """Restore an archived (or draft) version to active after re-validating its
    definition against today's task types and the organization's secrets (a rule for new
    definitions only, such as the http task's refusal of literal credentials, is not
    applied to a stored version). Raises Forbidden or DefinitionError. Records
    ``workflow.restored`` and, as ``apply_definition`` does, ``trigger.input_rejected``."""
    require(actor.role, Action.WORKFLOW_EDIT)
    check_definition(document=workflow.definition, organization=actor.organization, new=False)
    with transaction.atomic():
        wf = Workflow.objects.for_organization(actor.organization).select_for_update().get(pk=workflow.pk)
        before = wf.state
        if wf.state != WorkflowState.ACTIVE:
            wf.state = WorkflowState.ACTIVE
            wf.save(update_fields=["state"])
            audit.record("workflow.restored", actor=actor, target=wf, metadata={
                "name": wf.name, "version": wf.version, "state": {"before": before, "after": wf.state}})
            triggers.record_rejected_inputs(actor=actor, workflow=wf)
    return wf


def retry_run(*, actor: Actor, run: WorkflowRun) -> WorkflowRun:
    """Start a new run of the same workflow version with the same input, linked to
    ``run`` (``retry_of``). Raises RunNotFinished while ``run`` is still going, and
    what start_run raises. Records ``run.retried`` and ``run.started``."""
    require(actor.role, Action.RUN_OPERATE)
    run.refresh_from_db(fields=["state"])
    if not run.is_terminal:
        raise RunNotFinished(f"run {run.pk} is {run.state}; only a finished run can be retried")
    with transaction.atomic():
        new = start_run(workflow=run.workflow, run_input=run.input, actor=actor,
                        trigger_source=TriggerSource.RETRY, retry_of=run, priority=run.priority, claim_roots=True,
                        schedule=run_schedule(run))
        audit.record("run.retried", actor=actor, target=run, metadata={"new_run": str(new.pk), "channel": actor.channel})
    return new


def run_schedule(run: WorkflowRun) -> RunSchedule | None:
    """The cron instant and data interval ``run`` was started for (None when it has none):
    a retry of a scheduled run is for the same instant."""
    if run.scheduled_for is None:
        return None
    return RunSchedule(scheduled_for=run.scheduled_for,
                       data_interval_start=run.data_interval_start or run.scheduled_for,
                       data_interval_end=run.data_interval_end or run.scheduled_for)


def _actor(actor: Actor | None, organization) -> Actor:
    if actor is not None:
        return actor
    if organization is None:
        raise ValueError("an actor or an organization is required")
    return Actor.system(organization)


def apply_definition(*, document: dict[str, Any], actor: Actor | None = None, organization=None,
                     created_by=None, state: str = WorkflowState.ACTIVE, if_changed: bool = False) -> Workflow:
    """Validate ``document`` and store it as the next version of its name in the
    actor's organization (version 1 for a new name). Returns the new Workflow, its
    ``unchanged`` attribute False.

    With ``if_changed`` (the web upload and the API, issue 20), a document identical to
    the name's latest version — the same normalized definition, the same input schema
    text (its key order is the start form's) and that version in ``state`` — stores
    nothing, records nothing and returns that latest version with ``unchanged`` True;
    decided under the name's lock, so two identical concurrent uploads make one version.
    An upload identical to an archived or draft latest version in another state makes a
    new version (restoring one is its own action).

    Without an ``actor`` the system acts for ``organization`` (commands, bootstrap).
    Raises Forbidden when the actor's role may not edit workflows,
    DefinitionError (storing nothing) when the document is invalid or references a secret
    the organization does not have (``check_definition``), and
    tenancy.limits.QuotaExceeded (``max_definition_bytes``, storing nothing) when the
    organization's stored definitions (the text of every version's definition) and this
    one would exceed its quota. Concurrent applies of one name are serialized by a
    transaction-scoped advisory lock, so each gets its own version number; concurrent
    applies of one organization by another, taken first, so two cannot both fit in the
    last bytes of the quota. Records ``workflow.version_created``, and for an active version
    ``trigger.input_rejected`` on each cron trigger of the name whose input its
    ``input_schema`` refuses (``triggers.record_rejected_inputs``: the version is stored
    anyway, and the trigger's firings fail, saying why, until its input is fixed).
    """
    actor = _actor(actor, organization)
    require(actor.role, Action.WORKFLOW_EDIT)
    organization = actor.organization
    created_by = created_by or actor.user
    normalized = check_definition(document=document, organization=organization)
    stored = strip_nul(normalized)
    concurrency = normalized.get("concurrency") or {}
    input_schema_json = (json.dumps(stored["input_schema"], ensure_ascii=False, separators=(",", ":"))
                         if "input_schema" in stored else None)
    with transaction.atomic():
        with connection.cursor() as cur:
            # Organization first, then name: every apply takes them in this order.
            cur.execute(sql.queries["workflow_version_lock"], {"key": f"definition-bytes:{organization.pk}"})
            cur.execute(sql.queries["workflow_version_lock"],
                        {"key": f"workflow-version:{organization.pk}:{normalized['name']}"})
        if if_changed:
            # Before the quota: an unchanged upload stores nothing, so no quota can refuse it.
            same = _unchanged_latest(organization, normalized["name"], stored, input_schema_json, state)
            if same is not None:
                return same
        with connection.cursor() as cur:
            cur.execute(sql.queries["workflow_definition_bytes"],
                        {"org": organization.pk, "doc": jsonb_safe(stored)})
            used, adding = cur.fetchone()
        allowed = effective_limits(organization).max_definition_bytes
        if used + adding > allowed:
            raise QuotaExceeded(
                f"stored definitions quota (max_definition_bytes) exceeded: the organization stores {used} bytes "
                f"of workflow definitions, this version adds {adding}, and the limit is {allowed} bytes; "
                "stored versions (archived ones too) keep counting, so ask staff to raise max_definition_bytes",
                limit="max_definition_bytes", allowed=allowed, used=used)
        latest = (
            Workflow.objects.for_organization(organization)
            .filter(name=normalized["name"])
            .order_by("-version")
            .values_list("version", flat=True)
            .first()
        )
        workflow = Workflow.objects.create(
            organization=organization,
            name=normalized["name"],
            version=(latest or 0) + 1,
            description=normalized["description"],
            run_timeout_seconds=normalized.get("timeout_seconds"),
            max_running_tasks=concurrency.get("max_running_tasks"),
            max_running_runs=concurrency.get("max_running_runs"),
            run_limit_policy=concurrency.get("policy", RunLimitPolicy.QUEUE),
            state=state,
            definition=stored,
            # Its input schema as written (key order kept: the start form follows it).
            input_schema_json=input_schema_json,
            created_by=created_by,
            # A key's version names the key (not its creator: the key did it).
            created_by_api_key_id=actor.api_key.id if created_by is None and actor.api_key is not None else None,
        )
        workflow.unchanged = False
        tasks = Task.objects.bulk_create(
            [
                Task(
                    organization=organization,
                    workflow=workflow,
                    key=t["key"],
                    type=t["type"],
                    config=strip_nul(t["config"]),
                    max_attempts=t["max_attempts"],
                    retry_backoff_seconds=t["retry_backoff_seconds"],
                    timeout_seconds=t["timeout_seconds"],
                    position_x=(t.get("position") or {}).get("x"),
                    position_y=(t.get("position") or {}).get("y"),
                    priority=t.get("priority", 0),
                    # The key as written, placeholders and all: rendered per run at start.
                    concurrency_key=(t.get("concurrency") or {}).get("key"),
                    concurrency_limit=(t.get("concurrency") or {}).get("limit"),
                    rate_key=(t.get("rate_limit") or {}).get("key"),
                    rate_limit=_rate(t)[0],
                    rate_window_seconds=_rate(t)[1],
                    # A worker task waits on its queue of the organization's own workers.
                    queue=t["config"]["queue"] if t["type"] == "worker" else "",
                    trigger_rule=t.get("trigger_rule", DEFAULT_TRIGGER_RULE),
                    condition=t.get("condition", ""),
                )
                for t in normalized["tasks"]
            ]
        )
        by_key = {t.key: t for t in tasks}
        TaskDependency.objects.bulk_create(
            [
                TaskDependency(
                    organization=organization,
                    workflow=workflow,
                    task=by_key[t["key"]],
                    depends_on=by_key[d],
                    label=t.get("edge_labels", {}).get(d, ""),
                )
                for t in normalized["tasks"]
                for d in t["depends_on"]
            ]
        )
        audit.record(
            "workflow.version_created",
            actor=actor,
            target=workflow,
            # The channel as run.started names it: without an actor the caller is a command (cli).
            metadata={"name": workflow.name, "version": workflow.version, "state": workflow.state,
                      "tasks": len(tasks), "channel": str(CHANNEL_SOURCES.get(actor.channel, TriggerSource.CLI))},
        )
        if workflow.state == WorkflowState.ACTIVE:
            triggers.record_rejected_inputs(actor=actor, workflow=workflow)
    return workflow


def _unchanged_latest(organization, name: str, stored: dict[str, Any], input_schema_json: str | None,
                      state: str) -> Workflow | None:
    """The latest version of ``name`` when it holds exactly this definition (compared as
    JSON values, as jsonb keeps them), input schema text and ``state``; else None.
    One query (uniq_workflow_name_version, backwards)."""
    latest = (Workflow.objects.for_organization(organization).filter(name=name).select_related("created_by")
              .order_by("-version").first())
    if latest is None or latest.state != state or latest.input_schema_json != input_schema_json:
        return None
    if latest.definition != json.loads(json.dumps(stored)):
        return None
    latest.unchanged = True
    return latest


def _rate(task: dict[str, Any]) -> tuple[int | None, int | None]:
    """(limit, window seconds) of a normalized task's rate_limit, or (None, None)."""
    rate = task.get("rate_limit")
    if not rate:
        return None, None
    if "per_second" in rate:
        return rate["per_second"], 1
    return rate["per_minute"], 60


def resolve_workflow(*, organization, workflow: str | uuid.UUID, version: int | None = None) -> Workflow:
    """Find a workflow of ``organization`` by id, or by name (the given version, else the
    latest active one). Raises Workflow.DoesNotExist with a message naming what was asked."""
    qs = Workflow.objects.for_organization(organization)
    try:
        wf_id = uuid.UUID(str(workflow))
    except ValueError:
        wf_id = None
    if wf_id is not None:
        found = qs.filter(pk=wf_id).first()
        if found:
            return found
    named = qs.filter(name=str(workflow))
    if version is not None:
        found = named.filter(version=version).first()
    else:
        found = named.filter(state=WorkflowState.ACTIVE).order_by("-version").first() or named.order_by(
            "-version"
        ).first()
    if found is None:
        what = f"{workflow!s} v{version}" if version is not None else str(workflow)
        raise Workflow.DoesNotExist(f"no workflow {what!r} in organization {organization.slug!r}")
    return found


CHANNEL_SOURCES = {"api": TriggerSource.API, "web": TriggerSource.WEB, "cli": TriggerSource.CLI}


def start_run(*, workflow: Workflow, run_input: dict[str, Any] | None = None, actor: Actor | None = None,
              trigger_source: str | None = None, triggered_by=None, retry_of=None, trigger=None,
              audit_metadata: dict[str, Any] | None = None, priority: int = 0,
              claim_roots: bool | None = None, schedule: RunSchedule | None = None) -> WorkflowRun:
    """Start a run of ``workflow``: the run and all its task runs in one transaction,
    roots ready. Records ``run.started`` with who started it and through which channel.

    With FLOWFORGE_CLAIM_ON_START (issue 17), the same transaction claims the roots (the
    fair claim: what the organization's room, permits and buckets let in) and the caller's
    process publishes them after the commit; roots left ready, and every root without
    it, are the scheduler's, nudged on commit. ``claim_roots`` None claims only when this
    is the outermost transaction: inside a caller's transaction, where a claim would hold
    the organization's claim lock until its end and each start would claim in turn (a
    cron catch-up firing up to 100 instants in one transaction is one), the fair claim
    for the organizations of every run it started runs once, right after its commit
    (``_claim_after_commit``); True (a caller whose transaction is short: the idempotent
    start, a retry, the web form) claims inside it anyway; False leaves the roots to the
    scheduler, nudged on commit.

    ``priority`` (PRIORITY_MIN..PRIORITY_MAX, default 0) is the run's; each task run's is
    it plus its task's. Each task's concurrency key is rendered with ``run_input``
    (``engine.limit_keys.render_concurrency_key``). ``schedule`` (a cron trigger's or a
    backfill's run, and their retries) is stored beside the input, never in it: the
    run's scheduled_for and data interval (``engine.states.RunSchedule``).

    The organization's start quota (``max_runs_per_minute``, every channel): its runs
    created in the last 60 s are counted under a per-organization advisory lock; at the
    quota the start raises QuotaExceeded with ``retry_after_seconds`` (when the oldest
    of them leaves the window).

    The workflow's run limit (``max_running_runs``, every version of the name, under a
    per-(organization, name) advisory lock), when its runs going (running + queued)
    reach it: ``queue`` stores the run ``pending`` with every task run pending and a
    ``waiting`` event (``runs.admit_queued`` starts it later); ``cancel_newest`` stores
    it and cancels it at once (the returned run is ``cancelled``, its error says why);
    ``cancel_oldest`` cancels the oldest runs going, then starts this one.

    Raises Forbidden when the actor may not operate runs, Workflow.DoesNotExist when
    the workflow is not the actor's organization's, WorkflowNotStartable for a draft
    or archived workflow, InvalidStart (a ValueError; ``field`` ``priority`` or
    ``input``) for a priority out of range or not a whole number and for an input that
    cannot fill a concurrency key's placeholder, InvalidInput (an InvalidStart) listing
    each violation of the version's ``input_schema``, ValueError when ``run_input`` is not a
    JSON object, and QuotaExceeded; nothing is stored when it raises.

    With an ``input_schema`` the stored run input is the one given with the schema's
    defaults filled in (``checked_input``); every channel (API, web form, trigger firing,
    idempotent start, retry) passes through here.
    """
    # (The workflow's organization is read only without an actor: a query saved per start.)
    actor = actor if actor is not None else _actor(None, workflow.organization)
    require(actor.role, Action.RUN_OPERATE)
    if workflow.organization_id != actor.organization.pk:
        raise Workflow.DoesNotExist("no such workflow")
    trigger_source = trigger_source or CHANNEL_SOURCES.get(actor.channel, TriggerSource.CLI)
    triggered_by = triggered_by or actor.user
    run_input = {} if run_input is None else run_input
    if not isinstance(run_input, dict):
        raise ValueError("run input must be a JSON object")
    check_input_size(run_input)
    validate_priority(priority)
    if workflow.state != WorkflowState.ACTIVE:
        raise WorkflowNotStartable(
            f"workflow {workflow.name} v{workflow.version} is {workflow.state}; only active workflows can start runs"
        )
    if workflow.input_schema_json:
        # What is stored (NULs stripped), with the schema's defaults: the run input.
        run_input = checked_input(workflow, strip_nul(run_input))
    keys = concurrency_keys(workflow, strip_nul(run_input))
    org_id = workflow.organization_id
    # Inside a caller's transaction the roots are claimed once it has committed, with the
    # roots of every other run it started (_claim_after_commit), unless the caller said no.
    after_commit = claim_roots is None and connection.in_atomic_block and settings.FLOWFORGE_CLAIM_ON_START
    if claim_roots is None:
        claim_roots = not connection.in_atomic_block
    claim_roots = claim_roots and settings.FLOWFORGE_CLAIM_ON_START
    with transaction.atomic():
        if claim_roots:
            # The organization's claim lock first, before any other lock or row (the
            # claimers' rule, engine/sql/task_runs.sql): no claim of the organization runs
            # between this run's insert and its commit, so none can take lower-priority
            # work it would not have taken had it seen this run's roots.
            task_runs.lock_organization_claims([org_id])
        _check_start_quota(actor.organization)
        run_id = uuid.uuid4()
        queued_reason = cancel_reason = None
        held = made_room = False
        limit = workflow.max_running_runs
        if limit is not None:
            runs.lock(runs.run_limit_lock_key(org_id, workflow.name))
            running, queued = runs.count_open_of_name(organization_id=org_id, workflow_name=workflow.name)
            going = running + queued
            if going >= limit:
                policy = workflow.run_limit_policy
                if policy == RunLimitPolicy.CANCEL_NEWEST:
                    cancel_reason = (f"cancelled: workflow {workflow.name} has {going}/{limit} runs going "
                                     "(run limit, policy cancel_newest)")
                    held = True  # stored with nothing ready, then cancelled below
                elif policy == RunLimitPolicy.CANCEL_OLDEST:
                    reason = (f"cancelled: workflow {workflow.name} reached its run limit of {limit} "
                              f"(policy cancel_oldest); making room for run {run_id}")
                    for old in runs.oldest_open_of_name(organization_id=org_id, workflow_name=workflow.name,
                                                        limit=going - limit + 1):
                        _cancel_run_within(run=WorkflowRun.objects.for_organization(org_id).get(pk=old),
                                           actor=actor, reason=reason)
                        made_room = True
                else:
                    # Running runs over the limit, as the run's wait reason says it
                    # (engine/sql/waiting.sql run_wait_reasons); queued runs ahead count too.
                    queued_reason = f"workflow run limit {running}/{limit}"
        runs.create_with_task_runs(
            workflow_id=workflow.pk,
            organization_id=org_id,
            run_input=run_input,
            trigger_source=trigger_source,
            triggered_by_id=getattr(triggered_by, "pk", None),
            # The key that started it, by whatever channel (a retry's: the retrying key).
            api_key_id=getattr(actor.api_key, "pk", None),
            retry_of_id=getattr(retry_of, "pk", None),
            trigger_id=getattr(trigger, "pk", None),
            priority=priority,
            concurrency_keys=keys,
            queued_reason=queued_reason,
            held=held,
            run_id=run_id,
            schedule=schedule,
        )
        audit.record(
            "run.started",
            actor=actor,
            target=("workflowrun", run_id),
            metadata={
                "workflow": workflow.name, "version": workflow.version, "channel": str(trigger_source),
                "retry_of": str(retry_of.pk) if retry_of is not None else None, **(audit_metadata or {}),
                **({"priority": priority} if priority else {}),
            },
        )
        if cancel_reason is not None:
            _cancel_run_within(run=WorkflowRun.objects.for_organization(org_id).get(pk=run_id), actor=actor,
                               reason=cancel_reason)
        elif queued_reason is None and not made_room and claim_roots:
            # Not after cancelling older runs: their rows are locked by this transaction
            # then, and a claimer must take its lock before any row lock.
            claimed, unclaimed = _claim_roots(run_id, org_id)
            transaction.on_commit(functools.partial(_publish_roots, claimed, nudge=unclaimed > 0))
        elif queued_reason is None and after_commit:
            _claim_after_commit(run_id, org_id)
        else:
            transaction.on_commit(nudge_scheduler)
        transaction.on_commit(lambda: metrics.incr("flowforge_runs_started_total", str(trigger_source)))
    return WorkflowRun.objects.for_organization(org_id).get(pk=run_id)


def _claim_roots(run_id: uuid.UUID, organization_id: uuid.UUID) -> tuple[list, int]:
    """Claim for the organization of the run just created, in the caller's transaction
    (the fair claim, ``task_runs.claim_ready_many`` for ``organization_id``: highest
    priority then oldest, within its room, permits and rate buckets, under its claim
    lock until the commit), as many generations as the run has ready roots, their outbox
    rows reserved for this process's publish (``dispatch.INLINE_PUBLISH_RESERVATION_SECONDS``).
    Not the roots by id: a stream of new starts would then take every place that opens
    ahead of the organization's older, higher-priority ready work. Returns (the claimed
    generations, how many of the run's roots were left ready, at least 1 when it has
    more than one claim batch of them)."""
    roots = task_runs.ready_ids_of_runs([run_id], limit=settings.FLOWFORGE_CLAIM_BATCH)
    if not roots:
        return [], 0
    claimed = task_runs.claim_ready_many(
        limit=len(roots), lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
        owner=dispatch.process_owner("start"), organizations=[organization_id],
        reserve_seconds=dispatch.INLINE_PUBLISH_RESERVATION_SECONDS,
    )
    taken = {d.task_run_id for d in claimed}
    left = sum(1 for root in roots if root not in taken)
    # A run with more roots than one claim batch leaves the rest to the scheduler too.
    return claimed, left + (1 if len(roots) >= settings.FLOWFORGE_CLAIM_BATCH else 0)


class _RootsAfterCommit:
    """The runs (run id, organization id) a transaction started whose roots its commit
    claims (``_claim_after_commit``), and the one on-commit callback that claims them."""

    def __init__(self) -> None:
        self.runs: list[tuple[uuid.UUID, uuid.UUID]] = []
        self.callback = functools.partial(_claim_pending_roots, self)


# The connection's current _RootsAfterCommit (per connection, so per thread).
_AFTER_COMMIT_ATTR = "_flowforge_roots_after_commit"


def _claim_after_commit(run_id: uuid.UUID, organization_id: uuid.UUID) -> None:
    """Have the roots of run ``run_id``, started inside a caller's transaction, claimed
    right after that transaction commits, by this process (``_claim_pending_roots``),
    not by the scheduler's next tick: a run started by a cron firing, a backfill or a
    script's transaction is not left waiting for a worker thread to run the tick (in
    make bench, under another organization's burst, that wait was 12 to 60 ms).

    One callback per transaction claims for all of its starts. A start joins the
    connection's current batch only while that batch's callback is still registered
    with this transaction: a rollback drops the callback (Django), and the next start
    begins a new batch, so no run id outlives the transaction that started it. (A
    savepoint rollback that drops the callback also rolls back every start that joined
    the batch after it was registered: those starts ran inside that savepoint.)"""
    batch = getattr(connection, _AFTER_COMMIT_ATTR, None)
    if batch is None or not any(func is batch.callback for _sids, func, _robust in connection.run_on_commit):
        batch = _RootsAfterCommit()
        setattr(connection, _AFTER_COMMIT_ATTR, batch)
        transaction.on_commit(batch.callback)
    batch.runs.append((run_id, organization_id))


def _claim_pending_roots(batch: _RootsAfterCommit) -> None:
    """After a commit: the fair claim for the organizations of the runs in ``batch``, in
    a transaction of its own (``task_runs.claim_ready_many`` with those organizations:
    highest priority then oldest within each, their room, permits and rate buckets
    decide, so a new run's roots never take an older higher-priority task run's place),
    published; then the scheduler is nudged when any of these runs' roots is still
    ready (no room, a limit, more than one claim batch). Never raises: the commit is
    done, so a failed claim is the scheduler's, nudged (the clock's next tick if that
    fails too)."""
    if getattr(connection, _AFTER_COMMIT_ATTR, None) is batch:
        delattr(connection, _AFTER_COMMIT_ATTR)
    if not batch.runs:
        return
    run_ids = [run_id for run_id, _org in batch.runs]
    organizations = sorted({org for _run, org in batch.runs})
    claimed: list = []
    try:
        claimed = driver.autocommit_retry(lambda: task_runs.claim_ready_many(
            limit=settings.FLOWFORGE_CLAIM_BATCH, lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
            owner=dispatch.process_owner("start"), organizations=organizations,
            reserve_seconds=dispatch.INLINE_PUBLISH_RESERVATION_SECONDS,
        ))
        left = bool(task_runs.ready_ids_of_runs(run_ids, limit=1))
    except Exception:  # noqa: BLE001 - committed already; the scheduler claims them
        log.exception("claiming the roots of %d runs after their start's commit failed; the scheduler claims them",
                      len(run_ids))
        left = True
    _publish_roots(claimed, nudge=left)


def _publish_roots(claimed: list, *, nudge: bool) -> None:
    """After the start's commit: publish the roots it claimed (``relay.publish_dispatches``;
    if this process dies first, the relay publishes them once their reservation has
    passed), and nudge the scheduler when roots were left ready (the organization had no
    room, or a limit held them). Never raises: a failed publish is the relay's, a failed
    nudge the clock's next tick."""
    relay.publish_dispatches(claimed, reserved=True)
    if nudge:
        nudge_scheduler()


def validate_priority(priority: Any, *, field: str = "priority") -> int:
    """``priority`` if it is a whole number from PRIORITY_MIN to PRIORITY_MAX (an int, not
    a bool or a float), else InvalidStart naming ``field``."""
    if (problem := priority_problem(priority)) is not None:
        raise InvalidStart(field, problem)
    return priority


def concurrency_keys(workflow: Workflow, run_input: dict[str, Any]) -> dict[str, str]:
    """{task key: its concurrency key rendered with ``run_input``} for the tasks of
    ``workflow`` that have one, read from the stored definition (no query). Raises
    InvalidStart('input', ...) naming the task and the field a placeholder needs, or the
    field whose string holds a control character, line break or bidirectional text
    control (``engine.limit_keys.render_concurrency_key``)."""
    try:
        return render_definition_keys(workflow.definition, run_input)
    except ValueError as exc:
        raise InvalidStart("input", str(exc)) from None


def _check_start_quota(organization) -> None:
    """Refuse a start over the organization's ``max_runs_per_minute`` (QuotaExceeded with
    ``retry_after_seconds``). Takes the organization's start lock for the rest of the
    caller's transaction, so concurrent starts count each other's runs (the lock is its
    own statement: the count's snapshot is taken after it is granted)."""
    allowed = effective_limits(organization).max_runs_per_minute
    runs.lock(f"runs-per-minute:{organization.pk}")
    used, free_in = runs.count_recent(organization_id=organization.pk, window_seconds=RUNS_QUOTA_WINDOW_SECONDS,
                                      limit=allowed)
    if used >= allowed:
        retry_after = max(0.001, free_in or 0.0)
        raise QuotaExceeded(
            f"runs per minute quota (max_runs_per_minute) reached: the organization started {used} runs in the "
            f"last {RUNS_QUOTA_WINDOW_SECONDS:g} s, its limit is {allowed}; retry in {retry_after:.1f} s",
            limit="max_runs_per_minute", allowed=allowed, used=used, retry_after_seconds=retry_after)


# Seconds an idempotency key is kept (at least 24 h, seed 001's IdempotencyKeys): a
# repeat within this window returns the first run; after it, the key starts afresh.
IDEMPOTENCY_TTL_SECONDS = 24 * 3600
# Longest client key; the stored key of an API key adds "<uuid>:" (37 characters) and
# must fit IdempotencyKey.key (255).
IDEMPOTENCY_KEY_MAX_LENGTH = 200


class IdempotencyConflict(Exception):
    """The idempotency key was already used with another request body. The message says so."""


def _idempotency_caller(actor: Actor, key: str) -> tuple[uuid.UUID | None, uuid.UUID | None, str]:
    """(user id, api key id, stored key) of ``actor``'s key: an API key's keys are
    namespaced by its id (see engine.models.IdempotencyKey)."""
    if actor.api_key is not None:
        return None, actor.api_key.pk, f"{actor.api_key.pk}:{key}"
    return getattr(actor.user, "pk", None), None, key


def start_run_idempotent(*, actor: Actor, key: str, request_hash: str, workflow: Workflow,
                         run_input: dict[str, Any] | None = None, priority: int = 0) -> tuple[WorkflowRun, bool]:
    """Start a run of ``workflow`` at most once per (organization, caller, ``key``) within
    IDEMPOTENCY_TTL_SECONDS (seed 000's ``uniq_idempotency_org_user_key``).

    Returns (run, True) for the call that started it and (first run, False) for a repeat
    with the same ``request_hash``. Raises IdempotencyConflict when the key was used
    with another ``request_hash``, and whatever ``start_run`` raises (then nothing is
    kept, not even the key, so the client may try again with it).

    The key row is inserted first, in the run's transaction, with ``ON CONFLICT DO
    NOTHING``: when concurrent calls share a key, PostgreSQL lets one insert and makes
    the others wait for its transaction; once it commits their insert finds the
    conflict, and the read that follows (a new snapshot under READ COMMITTED) sees the
    winner's row with its run. If the winner rolls back, a waiter's insert succeeds and
    it starts the run itself. An expired row still in the table is deleted and the
    insert tried again.
    """
    require(actor.role, Action.RUN_OPERATE)
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise ValueError(f"an idempotency key has 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} characters")
    user_id, api_key_id, stored_key = _idempotency_caller(actor, key)
    org_id = actor.organization.pk
    with transaction.atomic():
        for _attempt in range(3):
            with connection.cursor() as cur:
                cur.execute(sql.queries["idempotency_key_claim"],
                            {"id": uuid.uuid4(), "org": org_id, "user": user_id, "api_key": api_key_id,
                             "key": stored_key, "request_hash": request_hash, "ttl": IDEMPOTENCY_TTL_SECONDS})
                claimed = cur.fetchone()
                if claimed is not None:
                    run = start_run(workflow=workflow, run_input=run_input, actor=actor, priority=priority,
                                    claim_roots=True)
                    cur.execute(sql.queries["idempotency_key_set_run"], {"run": run.pk, "id": claimed[0]})
                    return run, True
                cur.execute(sql.queries["idempotency_key_get"], {"org": org_id, "user": user_id, "key": stored_key})
                existing = cur.fetchone()
                if existing is None:
                    continue  # purged between the two statements: insert again
                row_id, stored_hash, run_id, expired = existing
                if expired:
                    cur.execute(sql.queries["idempotency_key_delete_expired"], {"id": row_id})
                    continue
            if stored_hash != request_hash:
                raise IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request; "
                    "use a new key for a different request"
                )
            if run_id is None:  # not reachable: the winner sets the run before it commits
                raise IdempotencyConflict("the first request with this Idempotency-Key has not finished")
            return WorkflowRun.objects.for_organization(org_id).get(pk=run_id), False
    raise IdempotencyConflict("the Idempotency-Key could not be claimed; try again")


def _delete_in_batches(statement: str, *, batch_size: int, max_batches: int) -> int:
    """Run the batched DELETE ``statement`` (named in ``engine.sql``, taking ``limit``) in
    one short transaction per batch of ``batch_size`` rows, at most ``max_batches`` times,
    until a batch deletes fewer; returns how many rows were deleted."""
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql.queries[statement], {"limit": batch_size})
            deleted = cur.rowcount
        total += deleted
        if deleted < batch_size:
            break
    return total


def purge_forgotten_workers(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete the organizations' workers not seen polling for seven days
    (``worker_connection_purge_batch``), in batches. Returns how many rows were deleted. For
    the clock; a system sweep over every organization."""
    return _delete_in_batches("worker_connection_purge_batch", batch_size=batch_size, max_batches=max_batches)


def purge_finished_attempt_secrets(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete the secret values kept for worker task generations that are no longer
    running (``attempt_secrets_purge_batch``), in batches. Returns how many rows were
    deleted. For the clock; a system sweep over every organization."""
    return _delete_in_batches("attempt_secrets_purge_batch", batch_size=batch_size, max_batches=max_batches)


def purge_old_rate_limit_buckets(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete idle rate-limit buckets (``rate_limit_bucket_purge_batch``: whose last window
    opened more than two minutes ago, longer than any window), in batches of
    ``batch_size``, at most ``max_batches`` per call. Returns how many rows were deleted.
    For the clock; a system sweep over every organization."""
    return _delete_in_batches("rate_limit_bucket_purge_batch", batch_size=batch_size, max_batches=max_batches)


def purge_expired_idempotency_keys(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete idempotency keys whose ``expires_at`` has passed, in batches of
    ``batch_size`` (one short transaction each, ``idx_idempotency_expiry``), at most
    ``max_batches`` per call. Returns how many rows were deleted. For the clock.

    A system sweep over every organization, hence the unscoped SQL.
    """
    return _delete_in_batches("idempotency_key_purge_expired_batch", batch_size=batch_size,
                              max_batches=max_batches)


def cancel_run(*, run: WorkflowRun, actor: Actor | None = None, reason: str = "cancelled by request") -> bool:
    """Cancel ``run`` (see ``runs.cancel``) and record ``run.cancelled``, in a
    transaction of its own, retried on a deadlock.
    Returns False, recording nothing, if it had already finished.
    Raises Forbidden when the actor may not operate runs, and RuntimeError when called
    inside a transaction (a view that calls it is ``non_atomic_requests``; a service
    that cancels inside its own transaction uses ``_cancel_run_within``)."""
    actor = _actor(actor, run.organization)
    require(actor.role, Action.RUN_OPERATE)

    def cancel() -> bool:
        # Durable: the retry below repeats the whole transaction, which only works when it
        # is the outermost one; nested in a caller's (a request's) transaction it raises
        # RuntimeError instead of silently retrying inside someone else's transaction.
        with transaction.atomic(durable=True):
            return _cancel(run=run, actor=actor, reason=reason)

    # Cancelling locks every open task run of the run; a racing completion can deadlock
    # with it, and PostgreSQL then aborts one side: retry rather than lose the cancel.
    return retry_transient(cancel, atomic=False)


def _cancel_run_within(*, run: WorkflowRun, actor: Actor, reason: str) -> bool:
    """``cancel_run`` inside the caller's transaction (``archive_workflow``: the archive and
    its cancellations commit together), each try in a savepoint that a deadlock rolls
    back before the next one. Returns what ``cancel_run`` returns."""
    return retry_transient(lambda: _cancel(run=run, actor=actor, reason=reason), atomic=True)


def _cancel(*, run: WorkflowRun, actor: Actor, reason: str) -> bool:
    changed = runs.cancel(workflow_run_id=run.pk, reason=reason)
    if changed:
        audit.record("run.cancelled", actor=actor, target=run, metadata={"reason": reason, "channel": actor.channel})
        if run.workflow.max_running_runs is not None:
            # A place under the run limit came free: the scheduler's tick admits the next queued run.
            transaction.on_commit(nudge_scheduler)
    return changed


def nudge_scheduler() -> None:
    """Wake a scheduler now rather than at the clock's next tick. A failed nudge is
    logged, not raised: the clock's tick claims the work anyway."""
    try:
        dispatch.nudge_scheduler()
    except Exception as exc:  # broker down: the run is stored, the clock's tick claims it
        log.warning("could not nudge the scheduler (%s: %s); the clock will pick the work up",
                    type(exc).__name__, exc)


__all__ = [
    "IDEMPOTENCY_TTL_SECONDS",
    "DefinitionError",
    "IdempotencyConflict",
    "InvalidInput",
    "InvalidStart",
    "WorkflowNotStartable",
    "apply_definition",
    "cancel_run",
    "check_definition",
    "checked_input",
    "nudge_scheduler",
    "purge_expired_idempotency_keys",
    "resolve_workflow",
    "start_run",
    "start_run_idempotent",
]
