"""FlowForge's Python SDK.

- ``Client(base_url, api_key)``: workflows, runs, events, secrets, API keys, and the
  worker protocol (flowforge_sdk.client);
- ``Worker(client, queue)`` with ``@worker.task("name")`` handlers receiving a
  ``TaskContext`` (flowforge_sdk.worker);
- ``Workflow(name)``: code-first definitions, ``client.workflows.apply(workflow)``
  (flowforge_sdk.workflow);
- the errors: ``FlowForgeError`` and its subclasses, and ``NonRetryableError`` for a
  handler to fail without a retry (flowforge_sdk.errors).
"""

from flowforge_sdk._version import __version__
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.client import Client
from flowforge_sdk.errors import (
    ApiError,
    AuthenticationError,
    Conflict,
    DefinitionError,
    FlowForgeError,
    NetworkError,
    NonRetryableError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    TaskCancelled,
    ValidationError,
    WaitTimeout,
)
from flowforge_sdk.models import (
    ApiKey,
    Event,
    Run,
    Secret,
    TaskRun,
    WorkerTask,
    WorkflowRef,
    WorkflowVersion,
)
from flowforge_sdk.worker import TaskContext, Worker
from flowforge_sdk.workflow import TaskRef, Workflow

__all__ = [
    "ApiError",
    "ApiKey",
    "AuthenticationError",
    "Backoff",
    "Client",
    "Conflict",
    "DefinitionError",
    "Event",
    "FlowForgeError",
    "NetworkError",
    "NonRetryableError",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Run",
    "Secret",
    "ServerError",
    "TaskCancelled",
    "TaskContext",
    "TaskRef",
    "TaskRun",
    "ValidationError",
    "WaitTimeout",
    "Worker",
    "WorkerTask",
    "Workflow",
    "WorkflowRef",
    "WorkflowVersion",
    "__version__",
]
