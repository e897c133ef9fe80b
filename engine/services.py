"""Engine actions that the commands, the API and the web UI all call.

Each ``do_*``/action validates, then changes data inside one transaction and
schedules its side effects (nudges to the scheduler) on commit.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from django.db import connection, transaction

from audit import services as audit
from engine import dispatch, metrics, sql
from engine.db import retry_transient
from engine.definitions import DefinitionError, validate_document
from engine.models import Task, TaskDependency, TriggerSource, Workflow, WorkflowRun, WorkflowState
from engine.repositories import runs
from engine.states import RUN_OPEN_STATES
from flowforge.jsonb import strip_nul
from tenancy.actors import Actor
from tenancy.permissions import Action, require

log = logging.getLogger(__name__)


class WorkflowNotStartable(Exception):
    """The workflow exists but cannot be started (draft or archived). The message says why."""


class ConfirmationRequired(ValueError):
    """A destructive action needs its confirmation field; the message says what to send."""


class RunNotFinished(Exception):
    """The run is still going (a retry needs a finished run)."""


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


def restore_workflow(*, actor: Actor, workflow: Workflow) -> Workflow:
    """Restore an archived (or draft) version to active after re-validating its
    definition against today's task types. Raises Forbidden or DefinitionError."""
    require(actor.role, Action.WORKFLOW_EDIT)
    validate_document(workflow.definition)
    with transaction.atomic():
        wf = Workflow.objects.for_organization(actor.organization).select_for_update().get(pk=workflow.pk)
        before = wf.state
        if wf.state != WorkflowState.ACTIVE:
            wf.state = WorkflowState.ACTIVE
            wf.save(update_fields=["state"])
            audit.record("workflow.restored", actor=actor, target=wf, metadata={
                "name": wf.name, "version": wf.version, "state": {"before": before, "after": wf.state}})
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
                        trigger_source=TriggerSource.RETRY, retry_of=run)
        audit.record("run.retried", actor=actor, target=run, metadata={"new_run": str(new.pk), "channel": actor.channel})
    return new


def _actor(actor: Actor | None, organization) -> Actor:
    if actor is not None:
        return actor
    if organization is None:
        raise ValueError("an actor or an organization is required")
    return Actor.system(organization)


def apply_definition(*, document: dict[str, Any], actor: Actor | None = None, organization=None,
                     created_by=None, state: str = WorkflowState.ACTIVE) -> Workflow:
    """Validate ``document`` and store it as the next version of its name in the
    actor's organization (version 1 for a new name). Returns the new Workflow.

    Without an ``actor`` the system acts for ``organization`` (commands, bootstrap).
    Raises Forbidden when the actor's role may not edit workflows, and
    DefinitionError (storing nothing) when the document is invalid. Concurrent
    applies of one name are serialized by a transaction-scoped advisory lock, so
    each gets its own version number. Records ``workflow.version_created``.
    """
    actor = _actor(actor, organization)
    require(actor.role, Action.WORKFLOW_EDIT)
    organization = actor.organization
    created_by = created_by or actor.user
    normalized = validate_document(document)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(sql.queries["workflow_version_lock"],
                        {"key": f"workflow-version:{organization.pk}:{normalized['name']}"})
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
            state=state,
            definition=strip_nul(normalized),
            created_by=created_by,
        )
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
    return workflow


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
              audit_metadata: dict[str, Any] | None = None) -> WorkflowRun:
    """Start a run of ``workflow``: the run and all its task runs in one transaction,
    roots ready, then a nudge to the scheduler on commit. Records ``run.started``
    with who started it and through which channel.

    Raises Forbidden when the actor may not operate runs, Workflow.DoesNotExist when
    the workflow is not the actor's organization's, WorkflowNotStartable for a draft
    or archived workflow, and ValueError when ``run_input`` is not a JSON object.
    """
    actor = _actor(actor, workflow.organization)
    require(actor.role, Action.RUN_OPERATE)
    if workflow.organization_id != actor.organization.pk:
        raise Workflow.DoesNotExist("no such workflow")
    trigger_source = trigger_source or CHANNEL_SOURCES.get(actor.channel, TriggerSource.CLI)
    triggered_by = triggered_by or actor.user
    run_input = {} if run_input is None else run_input
    if not isinstance(run_input, dict):
        raise ValueError("run input must be a JSON object")
    try:
        json.dumps(run_input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"run input is not storable JSON: {exc}") from exc
    if workflow.state != WorkflowState.ACTIVE:
        raise WorkflowNotStartable(
            f"workflow {workflow.name} v{workflow.version} is {workflow.state}; only active workflows can start runs"
        )
    with transaction.atomic():
        run_id = runs.create_with_task_runs(
            workflow_id=workflow.pk,
            organization_id=workflow.organization_id,
            run_input=run_input,
            trigger_source=trigger_source,
            triggered_by_id=getattr(triggered_by, "pk", None),
            retry_of_id=getattr(retry_of, "pk", None),
            trigger_id=getattr(trigger, "pk", None),
        )
        audit.record(
            "run.started",
            actor=actor,
            target=("workflowrun", run_id),
            metadata={
                "workflow": workflow.name, "version": workflow.version, "channel": str(trigger_source),
                "retry_of": str(retry_of.pk) if retry_of is not None else None, **(audit_metadata or {}),
            },
        )
        transaction.on_commit(nudge_scheduler)
        transaction.on_commit(lambda: metrics.incr("flowforge_runs_started_total", str(trigger_source)))
    return WorkflowRun.objects.for_organization(workflow.organization_id).get(pk=run_id)


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
                         run_input: dict[str, Any] | None = None) -> tuple[WorkflowRun, bool]:
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
                    run = start_run(workflow=workflow, run_input=run_input, actor=actor)
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


def purge_old_rate_limit_buckets(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete rate-limit buckets of windows that ended (``rate_limit_bucket_purge_batch``:
    windows that began more than two minutes ago, longer than any window), in batches of
    ``batch_size`` (one short transaction each), at most ``max_batches`` per call. Returns
    how many rows were deleted. For the clock; a system sweep over every organization."""
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql.queries["rate_limit_bucket_purge_batch"], {"limit": batch_size})
            deleted = cur.rowcount
        total += deleted
        if deleted < batch_size:
            break
    return total


def purge_expired_idempotency_keys(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete idempotency keys whose ``expires_at`` has passed, in batches of
    ``batch_size`` (one short transaction each, ``idx_idempotency_expiry``), at most
    ``max_batches`` per call. Returns how many rows were deleted. For the clock.

    A system sweep over every organization, hence the unscoped SQL.
    """
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql.queries["idempotency_key_purge_expired_batch"], {"limit": batch_size})
            deleted = cur.rowcount
        total += deleted
        if deleted < batch_size:
            break
    return total


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
    "WorkflowNotStartable",
    "apply_definition",
    "cancel_run",
    "nudge_scheduler",
    "purge_expired_idempotency_keys",
    "resolve_workflow",
    "start_run",
    "start_run_idempotent",
]
