"""Examples and shared parameters of the workflow and run endpoints' OpenAPI schema."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse

from api.exceptions import PROBLEM_CONTENT_TYPE
from api.serializers import DefinitionProblemSerializer

PAGE_PARAMETERS = [
    OpenApiParameter("cursor", str, description="The cursor of the next page: follow the `next` link."),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500},
                                     description="Rows per page, 1 to 500 (default 50)."),
]
DEFINITION_EXAMPLE = {
    "name": "etl",
    "description": "Nightly extract and load.",
    "tasks": [
        {"key": "extract", "type": "http", "config": {"url": "https://example.com/data.json"},
         "max_attempts": 3, "retry_backoff_seconds": 2, "position": {"x": 0, "y": 0},
         "priority": 2, "concurrency": {"key": "source-{{ input.source }}", "limit": 2},
         "rate_limit": {"key": "example-api", "per_second": 10}},
        {"key": "load", "type": "noop", "depends_on": ["extract"], "edge_labels": {"extract": "rows"},
         "position": {"x": 200, "y": 0}, "condition": "upstream.extract.status == 200"},
    ],
    "concurrency": {"max_running_tasks": 4},
    "input_schema": {"type": "object", "properties": {
        "date": {"type": "string", "format": "date", "title": "Day to load"},
        "source": {"enum": ["eu", "us"], "default": "eu"}}, "required": ["date"]},
}
WORKFLOW_EXAMPLE = {
    "id": "0b7c1f43-5a4e-4f7e-9a51-6f1b2f7f3d10", "name": "etl", "version": 2, "state": "active",
    "description": "Nightly extract and load.", "created_at": "2026-01-05T09:30:00.123456Z",
    "created_by": None, "created_by_api_key": "k3x9p2q7m4ta",
    "concurrency": {"max_running_tasks": 4, "max_running_runs": None, "policy": "queue"},
    "input_schema": DEFINITION_EXAMPLE["input_schema"],
    "tasks": [
        {"id": "5d6d3b5e-8e47-4a51-8f0c-0d6f1c2a9b01", "key": "extract", "type": "http",
         "config": {"url": "https://example.com/data.json", "method": "GET"}, "depends_on": [],
         "max_attempts": 3, "retry_backoff_seconds": 2.0, "timeout_seconds": None, "position": {"x": 0, "y": 0},
         "priority": 2, "concurrency": {"key": "source-{{ input.source }}", "limit": 2},
         "rate_limit": {"key": "example-api", "per_second": 10}, "trigger_rule": "all_success", "condition": ""},
        {"id": "9a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "key": "load", "type": "noop", "config": {},
         "depends_on": ["extract"], "max_attempts": 1, "retry_backoff_seconds": 1.0, "timeout_seconds": None,
         "position": {"x": 200, "y": 0}, "priority": 0, "concurrency": None, "rate_limit": None,
         "trigger_rule": "all_success", "condition": "upstream.extract.status == 200"},
    ],
    "edges": [{"from": "extract", "to": "load", "label": "rows"}],
}
WORKFLOW_SUMMARY_EXAMPLE = {k: WORKFLOW_EXAMPLE[k] for k in ("id", "name", "version", "state", "description")}
WORKFLOW_SUMMARY_EXAMPLE |= {"task_count": 2, **{k: WORKFLOW_EXAMPLE[k] for k in ("created_at", "created_by",
                                                                                    "created_by_api_key")}}
RUN_SUMMARY_EXAMPLE = {
    "id": "3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b",
    "workflow": {"id": WORKFLOW_EXAMPLE["id"], "name": "etl", "version": 2},
    "state": "succeeded", "priority": 0, "trigger_source": "api", "trigger": None, "scheduled_for": None,
    "data_interval_start": None, "data_interval_end": None, "triggered_by": None, "started_by_api_key": None, "retry_of": None,
    "error": "", "created_at": "2026-01-05T10:00:00.000001Z", "started_at": "2026-01-05T10:00:00.000001Z",
    "finished_at": "2026-01-05T10:00:03.250000Z", "resumed_at": None, "waiting_reason": None,
}
RUN_EXAMPLE = {
    **{k: v for k, v in RUN_SUMMARY_EXAMPLE.items() if k in ("id", "workflow", "state")},
    "input": {"date": "2026-01-04", "source": "eu"},
    **{k: v for k, v in RUN_SUMMARY_EXAMPLE.items() if k not in ("id", "workflow", "state")},
    "task_runs": [
        {"id": "aa2f0c55-1d1e-4c4e-8f7a-2b3c4d5e6f70", "key": "extract", "task_id": WORKFLOW_EXAMPLE["tasks"][0]["id"],
         "state": "succeeded", "attempt": 1, "priority": 2, "concurrency_key": "source-eu", "output": {"status": 200, "body": {"rows": 42}, "truncated": False},
         "error": "", "created_at": "2026-01-05T10:00:00.000001Z", "started_at": "2026-01-05T10:00:00.5Z",
         "finished_at": "2026-01-05T10:00:01.75Z", "waiting_reason": None, "queue": "", "queue_live_workers": None,
         "skip_reason": ""},
    ],
}
EVENT_EXAMPLE = {
    "seq": 4, "kind": "succeeded", "task_run": "aa2f0c55-1d1e-4c4e-8f7a-2b3c4d5e6f70", "task_key": "extract",
    "from_state": "running", "to_state": "succeeded", "attempt": 1, "fencing_token": 1, "detail": {},
    "created_at": "2026-01-05T10:00:01.750000Z",
}
DEFINITION_PROBLEM = {
    (400, PROBLEM_CONTENT_TYPE): OpenApiResponse(
        DefinitionProblemSerializer,
        description="The definition is invalid: `errors` lists every problem with the task and field it concerns.",
        examples=[OpenApiExample("invalid_definition", response_only=True, status_codes=["400"],
                                 media_type=PROBLEM_CONTENT_TYPE, value={
            "type": "about:blank", "title": "Bad Request", "status": 400,
            "detail": "The workflow definition is invalid; see errors.", "code": "invalid_definition",
            "errors": [{"path": "tasks[load].depends_on", "message": "unknown dependency 'extrakt'"},
                       {"path": "tasks[extract].type", "message": "unknown task type 'htp'; known types: fail, "
                        "http, noop, python, sleep"}]})],
    )
}
