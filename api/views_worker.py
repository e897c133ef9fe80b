"""The worker API (issue 18; the protocol is docs/workers.md): the calls of the
organizations' own worker processes, made with a worker key (role ``worker``, which
allows ``worker.serve`` and nothing else; no other role is allowed these calls).

Every view is outside ATOMIC_REQUESTS (``OwnTransactions``): a long poll must not hold a
transaction open while it waits, and each call's service commits its own. Bodies are
validated whole before anything is written; an error answers with nothing changed.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import uuid
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.exceptions import FieldTooLarge
from api.schema import invalid, problem, problem_example
from api.serializers import storable_json_problem
from api.serializers_org import StrictBooleanField, TextField
from api.throttling import WorkerLeaseThrottle
from api.views_runs import OwnTransactions
from engine import worker_queues
from engine.handlers.worker import QUEUE_NAME_FORM, valid_queue_name
from engine.models import TaskLog
from flowforge.jsonb import stored_bytes, strip_nul
from tenancy import apikeys
from tenancy.permissions import Action

logger = logging.getLogger(__name__)

#: Bytes of JSON text a completion's output may hold.
MAX_OUTPUT_BYTES = 1024 * 1024
#: Log lines per call, and characters per message.
MAX_LOG_LINES = 100
MAX_LOG_MESSAGE_CHARS = 4000
#: Characters of a failure's error, and of its traceback (engine.repositories.task_runs.MAX_TRACEBACK_CHARS).
MAX_ERROR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 100_000


class WorkerRefusal(exceptions.APIException):
    """409: the worker does not hold the generation it names; ``code`` says why."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "stale_fencing_token"


class PollCapacityProblem(exceptions.APIException):
    """503 with Retry-After: the web process holds as many long polls as it may."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "poll_capacity"
    default_detail = ("This server holds as many waiting polls as it may and nothing is ready on this queue; "
                      "poll again after Retry-After seconds.")

    def __init__(self, wait: int):
        super().__init__()
        self.wait = wait  # DRF sends it as Retry-After


class FencingTokenField(serializers.IntegerField):
    """A generation's fencing token: a JSON integer of at least 0 (not a string or a float)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=0, max_value=2**63 - 1, **kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError(f"must be the integer fencing_token the poll handed out, got {data!r}")
        return super().to_internal_value(data)


class QueueNameField(TextField):
    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if not valid_queue_name(value):
            raise serializers.ValidationError(f"not a queue name: use {QUEUE_NAME_FORM}")
        return value


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError(f"must be a whole number, got {data!r}")
        return super().to_internal_value(data)


class StrictNumberField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise serializers.ValidationError(f"must be a number, got {data!r}")
        return super().to_internal_value(data)


class WorkerInfoSerializer(serializers.Serializer):
    id = TextField(min_length=1, max_length=64, help_text="The worker process's own id (a UUID), 1-64 characters.")
    name = TextField(required=False, allow_blank=True, max_length=200, default="")
    host = TextField(required=False, allow_blank=True, max_length=200, default="")
    sdk = TextField(required=False, allow_blank=True, max_length=200, default="")
    concurrency = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=10_000, default=None)


class PollSerializer(serializers.Serializer):
    queue = QueueNameField(max_length=64)
    max_tasks = StrictIntegerField(required=False, default=1, min_value=1, max_value=worker_queues.MAX_TASKS_PER_POLL)
    wait_seconds = StrictNumberField(required=False, default=20, min_value=0, max_value=worker_queues.MAX_WAIT_SECONDS)
    worker = WorkerInfoSerializer()


class TokenSerializer(serializers.Serializer):
    fencing_token = FencingTokenField()


class CompleteSerializer(TokenSerializer):
    output = serializers.JSONField(required=False, allow_null=True, default=None,
                                   help_text=f"Any JSON value, at most {MAX_OUTPUT_BYTES} bytes of compact "
                                             "UTF-8 JSON text. NUL characters in its strings are removed and "
                                             "unpaired surrogates become U+FFFD (PostgreSQL's jsonb cannot "
                                             "store them), as in a run's input.")

    def validate_output(self, value: Any) -> Any:
        problem = storable_json_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


def _check_output_size(value: Any) -> Any:
    """``value`` as it is stored (flowforge.jsonb.strip_nul: NUL characters removed and
    unpaired surrogates made U+FFFD, as for a run's input), or FieldTooLarge (413 naming
    ``output``) when that is over MAX_OUTPUT_BYTES of compact UTF-8 JSON text (checked
    after validation: a serializer turns any error it raises into a 400)."""
    value = strip_nul(value)
    size = stored_bytes(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    if size > MAX_OUTPUT_BYTES:
        raise FieldTooLarge({"output": [f"is {size} bytes of JSON text; at most {MAX_OUTPUT_BYTES}"]})
    return value


class FailSerializer(TokenSerializer):
    error = TextField(max_length=MAX_ERROR_CHARS, allow_blank=False)
    retryable = StrictBooleanField(required=False, default=True)
    traceback = TextField(required=False, allow_blank=True, default="", max_length=MAX_TRACEBACK_CHARS,
                          trim_whitespace=False,
                          help_text="The handler's traceback (optional), kept beside the error: redacted of the "
                          "attempt's secret values and cut to FLOWFORGE_TASK_TRACEBACK_MAX_CHARS (its start and end).")


class LogLineSerializer(serializers.Serializer):
    level = serializers.ChoiceField(choices=TaskLog.Level.choices, default="info")
    message = TextField(max_length=MAX_LOG_MESSAGE_CHARS, allow_blank=True)


class LogsSerializer(TokenSerializer):
    lines = LogLineSerializer(many=True, allow_empty=False, max_length=MAX_LOG_LINES)


def _client_connected(request):
    """A check that the poll's client is still connected: False once the peer closed the
    socket (gunicorn exposes it as ``gunicorn.socket``; elsewhere always True). Peeks, so
    nothing the client sent is consumed."""
    sock = request.META.get("gunicorn.socket")
    if sock is None:
        return lambda: True

    def connected() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return True
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False

    return connected


def _validated(serializer_class, request) -> dict:
    s = serializer_class(data=request.data)
    s.is_valid(raise_exception=True)
    return s.validated_data


class _WorkerView(OwnTransactions, OrganizationAPIView):
    """A call of a worker key (``worker.serve``)."""

    required_action = {"POST": Action.WORKER_SERVE}

    def get_scoped_queryset(self):  # pragma: no cover - the worker views list nothing
        return TaskLog.objects.none()

    def _api_key_id(self) -> uuid.UUID | None:
        key = getattr(self.actor, "api_key", None)
        return getattr(key, "id", None)

    def _still_wanted(self, request):
        """What a long poll checks before each claim after its first: the client is still
        connected (``_client_connected``) and the worker key still authenticates with the
        same role (``apikeys.still_valid``: a key revoked, expired or capped lower while
        the poll waited is handed no task, and so none of its resolved secrets)."""
        connected = _client_connected(request)
        key = getattr(self.actor, "api_key", None)

        def wanted() -> bool:
            return connected() and (key is None or apikeys.still_valid(key))

        return wanted

    def _call(self, fn, **kwargs):
        """``fn(**kwargs)`` with the engine's refusals as API errors (404, 409)."""
        try:
            return fn(organization_id=self.organization.pk, **kwargs)
        except worker_queues.NotAWorkerTask as exc:
            raise exceptions.NotFound() from exc
        except worker_queues.WorkerCallRefused as exc:
            raise WorkerRefusal(str(exc), code=exc.code) from exc


_TASK_SCHEMA = inline_serializer("WorkerTask", many=True, fields={
    "task_run_id": serializers.UUIDField(), "fencing_token": serializers.IntegerField(),
    "attempt": serializers.IntegerField(), "max_attempts": serializers.IntegerField(),
    "workflow_run_id": serializers.UUIDField(), "workflow": serializers.CharField(),
    "task_key": serializers.CharField(), "name": serializers.CharField(),
    "queue": serializers.CharField(), "input": serializers.JSONField(), "run_input": serializers.JSONField(),
    "upstream": serializers.JSONField(), "timeout_seconds": serializers.FloatField(allow_null=True),
    "lease_seconds": serializers.FloatField(), "heartbeat_interval_seconds": serializers.FloatField(),
})


TASK_EXAMPLE = {
    "task_run_id": "9b2e0c4e-3f41-4b8e-9a55-0c1d2e3f4a5b", "fencing_token": 1, "attempt": 1, "max_attempts": 3,
    "workflow_run_id": "41c0d2aa-5e6f-4a1b-8c9d-0e1f2a3b4c5d", "workflow": "thumbnails", "task_key": "resize",
    "name": "resize",
    "queue": "images", "input": {"width": 640}, "run_input": {"url": "https://example.com/a.png"},
    "upstream": {"fetch": {"bytes": 1024}}, "timeout_seconds": 300.0, "lease_seconds": 60.0,
    "heartbeat_interval_seconds": 20.0,
}


def _examples(request: dict, response: dict) -> list[OpenApiExample]:
    return [OpenApiExample("request", request_only=True, value=request),
            OpenApiExample("answer", response_only=True, value=response)]


# The refusals of a call on a held generation (docs/workers.md).
REFUSED = problem(409, "The worker does not hold the generation it names; `code` says why: `cancelled` (its run was "
                       "cancelled), `lease_expired` or `stale_fencing_token` (another generation, or finished).",
                  problem_example(409, "fencing token 1 is not the task run's current started generation (it moved "
                                       "on to another generation, or has finished)", "stale_fencing_token"),
                  problem_example(409, "the task run was cancelled (its run was cancelled or timed out); stop working "
                                       "on it", "cancelled"))
POLL_PROBLEMS = {
    **invalid("A field is missing or malformed, or no task of the organization waits on `queue`.",
              {"queue": ["no task of this organization's workflows waits on queue 'imagse': check the name, or "
                         "apply a workflow with a worker task on it (config.queue) before starting its workers"]}),
    **problem(503, "The web process holds as many waiting polls as it may and nothing is ready: poll again after "
                   "`Retry-After` seconds.",
              problem_example(503, PollCapacityProblem.default_detail, "poll_capacity")),
}


class WorkerPollView(_WorkerView):
    """POST /worker/poll: claim and start up to ``max_tasks`` tasks of ``queue``, waiting up
    to ``wait_seconds`` for the first (docs/workers.md, 1)."""

    @extend_schema(
        operation_id="worker_poll", request=PollSerializer,
        responses={200: inline_serializer("WorkerPollResult", {"tasks": _TASK_SCHEMA,
                                                               "wait_seconds": serializers.FloatField()}),
                   **POLL_PROBLEMS},
        description="Long poll of a worker key: the tasks handed out are started, leased to the worker.",
        examples=_examples({"queue": "images", "max_tasks": 4, "wait_seconds": 20,
                            "worker": {"id": "3f0c9b1e-7d1a-4c55-9a53-2c7a3f8e9d10", "name": "resizer-1",
                                       "host": "box-7", "sdk": "flowforge-python/0.1.0", "concurrency": 4}},
                           {"tasks": [TASK_EXAMPLE], "wait_seconds": 20}),
    )
    def post(self, request):
        data = _validated(PollSerializer, request)
        w = data["worker"]
        try:
            tasks = worker_queues.poll(
                organization_id=self.organization.pk, api_key_id=self._api_key_id(), queue=data["queue"],
                max_tasks=data["max_tasks"], wait_seconds=data["wait_seconds"],
                worker=worker_queues.WorkerInfo(id=w["id"], name=w["name"], host=w["host"], sdk=w["sdk"],
                                                concurrency=w["concurrency"]),
                still_wanted=self._still_wanted(request),
            )
        except worker_queues.PollCapacity as exc:
            logger.warning("poll of queue %r by worker %s refused: this process holds as many waiting polls as it "
                           "may; the worker is asked to retry after %s s", data["queue"], w["id"], exc.retry_after)
            raise PollCapacityProblem(exc.retry_after) from exc
        except worker_queues.UnknownQueue as exc:
            raise serializers.ValidationError({"queue": [str(exc)]}) from exc
        # The wait this server allowed (FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS may cut the one asked).
        waited = min(data["wait_seconds"], float(settings.FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS))
        return Response({"tasks": tasks, "wait_seconds": waited})

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(exc, PollCapacityProblem):
            # Logged once in post(), at WARNING: routine under load. Django's request log would
            # add an ERROR "Service Unavailable" line (twice under DEBUG: its console handler's
            # and the root's).
            response._has_been_logged = True
        return response


class WorkerHeartbeatView(_WorkerView):
    """POST /worker/tasks/{id}/heartbeat: extend the lease of the generation the worker holds."""

    throttle_classes = [WorkerLeaseThrottle]

    @extend_schema(operation_id="worker_heartbeat", request=TokenSerializer,
                   responses={200: inline_serializer("WorkerHeartbeatResult", {"lease_seconds": serializers.FloatField()}), **REFUSED},
                   examples=_examples({"fencing_token": 1}, {"lease_seconds": 60.0}))
    def post(self, request, pk):
        data = _validated(TokenSerializer, request)
        seconds = self._call(worker_queues.heartbeat, task_run_id=pk, fencing_token=data["fencing_token"])
        return Response({"lease_seconds": seconds})


class WorkerLogsView(_WorkerView):
    """POST /worker/tasks/{id}/logs: keep log lines of the generation the worker holds."""

    @extend_schema(operation_id="worker_logs", request=LogsSerializer,
                   responses={200: inline_serializer("WorkerLogsResult", {"accepted": serializers.IntegerField()}), **REFUSED},
                   examples=_examples({"fencing_token": 1, "lines": [{"level": "info", "message": "resized 1 of 3"}]},
                                      {"accepted": 1}))
    def post(self, request, pk):
        data = _validated(LogsSerializer, request)
        kept = self._call(worker_queues.append_logs, task_run_id=pk, fencing_token=data["fencing_token"],
                          lines=[(line["level"], line["message"]) for line in data["lines"]])
        return Response({"accepted": kept})


class WorkerCompleteView(_WorkerView):
    """POST /worker/tasks/{id}/complete: the generation the worker holds succeeded."""

    throttle_classes = [WorkerLeaseThrottle]

    @extend_schema(operation_id="worker_complete", request=CompleteSerializer,
                   responses={200: inline_serializer("WorkerCompleteResult", {"state": serializers.CharField()}), **REFUSED},
                   examples=_examples({"fencing_token": 1, "output": {"thumbnail": "s3://bucket/a.png"}},
                                      {"state": "succeeded"}))
    def post(self, request, pk):
        data = _validated(CompleteSerializer, request)
        output = _check_output_size(data["output"])
        state = self._call(worker_queues.complete, task_run_id=pk, fencing_token=data["fencing_token"],
                           output=output)
        return Response({"state": state})


class WorkerFailView(_WorkerView):
    """POST /worker/tasks/{id}/fail: the generation the worker holds failed."""

    throttle_classes = [WorkerLeaseThrottle]

    @extend_schema(operation_id="worker_fail", request=FailSerializer,
                   responses={200: inline_serializer("WorkerFailResult", {
                       "state": serializers.CharField(), "retry_in_seconds": serializers.FloatField(allow_null=True)}),
                   **REFUSED},
                   examples=_examples({"fencing_token": 1, "error": "ValueError: image too large", "retryable": True,
                                       "traceback": "Traceback (most recent call last):\n  File \"resize.py\", "
                                                    "line 12, in resize\n    raise ValueError(\"image too large\")\n"
                                                    "ValueError: image too large\n"},
                                      {"state": "ready", "retry_in_seconds": 2.0}))
    def post(self, request, pk):
        data = _validated(FailSerializer, request)
        state, retry_in = self._call(worker_queues.fail, task_run_id=pk, fencing_token=data["fencing_token"],
                                     error=data["error"], retryable=data["retryable"], traceback=data["traceback"])
        return Response({"state": state, "retry_in_seconds": retry_in})
