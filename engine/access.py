"""Reading one engine object by id for the API and the web UI: runs, workflow versions,
task runs, cron triggers and their backfills (tenancy.access explains the rule and holds the machinery).

Each helper returns the object only when it belongs to the caller's organization and
raises tenancy.access.ObjectNotFound otherwise — the same error, with the same message,
for a missing id, another organization's id and a malformed one. One query each;
``shape`` adds joins or column choices to the scoped queryset.
"""

from __future__ import annotations

from typing import Any

from engine.models import (
    NotificationDelivery,
    ScheduledTrigger,
    TaskRun,
    TriggerBackfill,
    WebhookEndpoint,
    Workflow,
    WorkflowRun,
)
from tenancy.access import ObjectNotFound, Shape, access_by_id, parse_id

__all__ = ["ObjectNotFound", "access_backfill", "access_delivery", "access_endpoint", "access_run", "access_task_run", "access_trigger",
           "access_workflow"]


def access_run(actor_or_org: Any, run_id: Any, *, shape: Shape | None = None) -> WorkflowRun:
    """The run ``run_id`` of the organization; ObjectNotFound("no such run") otherwise."""
    return access_by_id(WorkflowRun, actor_or_org, run_id, what="run", shape=shape)


def access_workflow(actor_or_org: Any, workflow_id: Any, *, shape: Shape | None = None) -> Workflow:
    """The workflow version ``workflow_id`` of the organization (any state);
    ObjectNotFound("no such workflow") otherwise."""
    return access_by_id(Workflow, actor_or_org, workflow_id, what="workflow", shape=shape)


def access_task_run(actor_or_org: Any, run_id: Any, task_run_id: Any, *, shape: Shape | None = None) -> TaskRun:
    """The task run ``task_run_id`` of the run ``run_id`` of the organization (one query,
    the run is not read); ObjectNotFound("no such task run") for any other task run."""
    run_pk = parse_id(run_id)
    if run_pk is None:
        raise ObjectNotFound("no such task run")
    return access_by_id(TaskRun, actor_or_org, task_run_id, what="task run", shape=shape,
                        workflow_run_id=run_pk)


def access_trigger(actor_or_org: Any, trigger_id: Any, *, shape: Shape | None = None) -> ScheduledTrigger:
    """The cron trigger ``trigger_id`` of the organization; ObjectNotFound("no such trigger") otherwise."""
    return access_by_id(ScheduledTrigger, actor_or_org, trigger_id, what="trigger", shape=shape)


def access_backfill(actor_or_org: Any, trigger_id: Any, backfill_id: Any, *, shape: Shape | None = None
                    ) -> TriggerBackfill:
    """The backfill ``backfill_id`` of the cron trigger ``trigger_id`` of the organization
    (one query, the trigger is not read); ObjectNotFound("no such backfill") otherwise."""
    trigger_pk = parse_id(trigger_id)
    if trigger_pk is None:
        raise ObjectNotFound("no such backfill")
    return access_by_id(TriggerBackfill, actor_or_org, backfill_id, what="backfill", shape=shape,
                        trigger_id=trigger_pk)


def access_endpoint(actor_or_org: Any, endpoint_id: Any, *, shape: Shape | None = None) -> WebhookEndpoint:
    """The webhook endpoint ``endpoint_id`` of the organization; ObjectNotFound("no such webhook") otherwise."""
    return access_by_id(WebhookEndpoint, actor_or_org, endpoint_id, what="webhook", shape=shape)


def access_delivery(actor_or_org: Any, endpoint_id: Any, delivery_id: Any, *,
                    shape: Shape | None = None) -> NotificationDelivery:
    """The delivery ``delivery_id`` to the webhook endpoint ``endpoint_id`` of the organization
    (one query, the endpoint is not read); ObjectNotFound("no such delivery") for any other."""
    endpoint_pk = parse_id(endpoint_id)
    if endpoint_pk is None:
        raise ObjectNotFound("no such delivery")
    return access_by_id(NotificationDelivery, actor_or_org, delivery_id, what="delivery", shape=shape,
                        endpoint_id=endpoint_pk)
