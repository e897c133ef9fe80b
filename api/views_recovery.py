"""REST API v1: what a person does about a failed run (engine.recovery, issue 19) — resume
it in place, and retry, mark succeeded or skip one of its task runs.

Each view reads the run (or the task run of that run) through engine.access (a 404 alike
for a missing id and another organization's), needs ``run.operate`` (a viewer's call is a
403 before anything is read), calls the service and answers the run's detail as it is
after the action (200). A state that does not allow the action is a 409 whose detail
says why; a bad ``reason`` or ``output`` a 400 naming it. Outside ATOMIC_REQUESTS: the
services commit their own transaction (retried on a deadlock).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.examples import RUN_EXAMPLE
from api.exceptions import Conflict
from api.schema import problem, problem_example
from api.serializers import RejectUnknownFields, RunSerializer, storable_json_problem
from api.serializers_org import TextField
from api.views_runs import OwnTransactions, _run_detail
from engine import recovery
from engine.access import access_run, access_task_run
from engine.models import TaskRun, WorkflowRun
from tenancy.permissions import Action

REASON_HELP = (f"Why (at most {recovery.MAX_REASON_CHARS} characters): kept in the run's events and the audit "
               "log. Optional.")


class ReasonSerializer(RejectUnknownFields, serializers.Serializer):
    """Body of a resume, a retry or a skip: an optional ``reason``."""

    # Text only: DRF's CharField would store a number 12 as "12".
    reason = TextField(required=False, allow_blank=True, default="", trim_whitespace=True,
                       max_length=recovery.MAX_REASON_CHARS, help_text=REASON_HELP)


class MarkSucceededSerializer(ReasonSerializer):
    """Body of a mark as succeeded: the ``output`` to store and an optional ``reason``."""

    output = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="The task's output, any JSON value (default null), at most FLOWFORGE_MAX_OUTPUT_BYTES (256 KiB) "
        "of compact UTF-8 JSON text, as for a task's own output; its dependents are handed it. NUL characters "
        "in its strings are removed (PostgreSQL's jsonb cannot store them).")

    def validate_output(self, value: Any) -> Any:
        problem_text = storable_json_problem(value)
        if problem_text:
            raise serializers.ValidationError(problem_text)
        return value


def _body(request, serializer_class) -> dict[str, Any]:
    """The body validated, read after the object: an id not the caller's is a 404 whatever
    the body (tests/unit/test_isolation.py)."""
    payload = serializer_class(data=request.data)
    payload.is_valid(raise_exception=True)
    return payload.validated_data


def _answer(request, organization, run_id, call) -> Response:
    """Run the service ``call``; its refusals as a 409 or a 400, then the run's detail."""
    try:
        call()
    except recovery.ActionRefused as exc:
        raise Conflict(str(exc)) from exc
    except recovery.InvalidAction as exc:
        raise ValidationError({exc.field: [exc.message]}) from exc
    return Response(RunSerializer(_run_detail(organization, run_id), context={"request": request}).data)


def _task_run(actor, run_id, pk) -> TaskRun:
    return access_task_run(actor, run_id, pk, shape=lambda qs: qs.only(
        "id", "organization_id", "workflow_run_id", "task_id", "state"))


RESUMED_EXAMPLE = {**RUN_EXAMPLE, "state": "running", "finished_at": None, "task_runs": [
    {**RUN_EXAMPLE["task_runs"][0]},
    {**RUN_EXAMPLE["task_runs"][0], "id": "bb3f1d66-2e2f-4d5f-9a8b-3c4d5e6f7a81", "key": "load", "state": "ready",
     "attempt": 2, "output": None, "started_at": None, "finished_at": None, "concurrency_key": None},
]}
REFUSED_409 = problem(
    409, "The run's or the task run's state does not allow the action now; the detail says why (and what to do "
    "instead).",
    problem_example(409, "task load depends on task extract, which failed: retry extract (its downstream, load "
                    "included, runs again) or mark it succeeded", "conflict", name="not_allowed"),
)
ACTION_DOC = (
    " The run stays the same run: a finished one goes back to `running` (a `resumed` event names who, the action "
    "and the task runs reopened), each task run reopened becomes `pending` (`ready` once what it depends on has "
    "succeeded) as a new generation (its fencing token bumped: a late message or completion of an older one is "
    "refused) with the next attempt number and its whole `max_attempts` again. Needs `run.operate` (owner, admin, "
    "member). Answers the run as it is after the action."
)


class RunResumeView(OwnTransactions, OrganizationAPIView):
    """POST /runs/<id>/resume/ — re-run what did not succeed, in place."""

    required_action = {"POST": Action.RUN_OPERATE}

    def get_scoped_queryset(self):
        return WorkflowRun.objects.for_organization(self.organization)

    @extend_schema(
        operation_id="runs_resume",
        summary="Resume a failed or cancelled run",
        description="Run again every task run of a failed or cancelled run that did not succeed, and every task run "
        "downstream of one; succeeded task runs keep their outputs and are not run again." + ACTION_DOC
        + " A run still going, or one that succeeded, is a 409; so is a run whose workflow version is no longer "
        "active or whose workflow's run limit (`concurrency.max_running_runs`) is full. To start every task "
        "afresh as a new run instead, use `POST /runs/{id}/retry/`.",
        request=ReasonSerializer,
        responses={200: RunSerializer, **REFUSED_409},
        examples=[
            OpenApiExample("resume", request_only=True, value={"reason": "the upstream bucket is back"}),
            OpenApiExample("resumed", response_only=True, status_codes=["200"], value=RESUMED_EXAMPLE),
        ],
    )
    def post(self, request, pk):
        run = access_run(self.actor, pk, shape=lambda qs: qs.select_related("workflow"))
        data = _body(request, ReasonSerializer)
        return _answer(request, self.organization, run.pk,
                       lambda: recovery.resume_run(actor=self.actor, run=run, reason=data["reason"]))


class _TaskRunActionView(OwnTransactions, OrganizationAPIView):
    required_action = {"POST": Action.RUN_OPERATE}

    def get_scoped_queryset(self):
        return TaskRun.objects.for_organization(self.organization).filter(workflow_run_id=self.kwargs["run_id"])


class TaskRunRetryView(_TaskRunActionView):
    """POST /runs/<run_id>/task-runs/<id>/retry/ — run one task again, and its downstream."""

    @extend_schema(
        operation_id="runs_task_retry",
        summary="Retry a task run and its downstream",
        description="Run a finished task run again, with every task run downstream of it; the rest of the run "
        "keeps its state and outputs. On a finished run any finished task run (a succeeded one too); on a run "
        "still going only a failed or skipped one whose downstream has finished." + ACTION_DOC
        + " 409 for a task run still going, one a task it depends on has not succeeded for (retry that one: its "
        "downstream runs again with it), and as for a resume.",
        request=ReasonSerializer,
        responses={200: RunSerializer, **REFUSED_409},
        examples=[
            OpenApiExample("retry", request_only=True, value={"reason": "deployed the fix"}),
            OpenApiExample("retried", response_only=True, status_codes=["200"], value=RESUMED_EXAMPLE),
        ],
    )
    def post(self, request, run_id, pk):
        task_run = _task_run(self.actor, run_id, pk)
        data = _body(request, ReasonSerializer)
        return _answer(request, self.organization, run_id,
                       lambda: recovery.retry_task_run(actor=self.actor, task_run=task_run, reason=data["reason"]))


class TaskRunMarkSucceededView(_TaskRunActionView):
    """POST /runs/<run_id>/task-runs/<id>/mark-succeeded/ — set a task's output by hand."""

    @extend_schema(
        operation_id="runs_task_mark_succeeded",
        summary="Mark a task run succeeded with an output",
        description="Mark a failed, skipped or cancelled task run succeeded with the given `output` (stored as a "
        "task's own output; recorded as a `marked_succeeded` event, its token bumped); its downstream task runs "
        "that did not succeed then run, handed that output. On a run still going, only a failed or skipped task "
        "run whose downstream has finished." + ACTION_DOC + " 409 for a task run that succeeded or is still "
        "going; 400 naming `output` for an output that is not storable JSON or is too large.",
        request=MarkSucceededSerializer,
        responses={200: RunSerializer, **REFUSED_409, **problem(
            400, "Invalid body: `output` is not storable JSON or is over FLOWFORGE_MAX_OUTPUT_BYTES, or `reason` is "
            "too long.", problem_example(400, "The request is invalid; see errors.", "invalid", errors={
                "output": ["is 300000 bytes of JSON text; at most 262144 (FLOWFORGE_MAX_OUTPUT_BYTES), as for a "
                           "task's own output"]}))},
        examples=[
            OpenApiExample("mark", request_only=True, value={"output": {"rows": 1200, "source": "backfilled by hand"},
                                                             "reason": "loaded from yesterday's export"}),
            OpenApiExample("marked", response_only=True, status_codes=["200"], value=RESUMED_EXAMPLE),
        ],
    )
    def post(self, request, run_id, pk):
        task_run = _task_run(self.actor, run_id, pk)
        data = _body(request, MarkSucceededSerializer)
        return _answer(request, self.organization, run_id, lambda: recovery.mark_task_run_succeeded(
            actor=self.actor, task_run=task_run, output=data["output"], reason=data["reason"]))


class TaskRunSkipView(_TaskRunActionView):
    """POST /runs/<run_id>/task-runs/<id>/skip/ — mark a failed task run skipped."""

    @extend_schema(
        operation_id="runs_task_skip",
        summary="Skip a failed task run",
        description="Mark a failed or cancelled task run skipped (a skipped task does not fail its run: a run "
        "whose only failure is skipped ends succeeded); its downstream task runs that did not succeed are "
        "decided again as below a skipped task. On a run still going, only a failed task run whose downstream "
        "has finished." + ACTION_DOC + " 409 for a task run that succeeded, was skipped or is still going.",
        request=ReasonSerializer,
        responses={200: RunSerializer, **REFUSED_409},
        examples=[
            OpenApiExample("skip", request_only=True, value={"reason": "the report is not needed today"}),
            OpenApiExample("skipped", response_only=True, status_codes=["200"], value={
                **RUN_EXAMPLE, "state": "succeeded"}),
        ],
    )
    def post(self, request, run_id, pk):
        task_run = _task_run(self.actor, run_id, pk)
        data = _body(request, ReasonSerializer)
        return _answer(request, self.organization, run_id,
                       lambda: recovery.skip_task_run(actor=self.actor, task_run=task_run, reason=data["reason"]))


__all__ = ["RunResumeView", "TaskRunMarkSucceededView", "TaskRunRetryView", "TaskRunSkipView"]
