"""The API client: ``Client(base_url, api_key)`` and its parts, ``client.workflows``,
``client.runs``, ``client.events``, ``client.secrets``, ``client.api_keys`` and
``client.worker`` (the worker protocol of docs/workers.md, which flowforge_sdk.Worker
speaks for you).

Every method sends one request (lists: one per page, fetched as you iterate) and
returns typed objects (flowforge_sdk.models) or raises a FlowForgeError
(flowforge_sdk.errors). Lists are iterators that follow the API's ``next`` links.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from flowforge_sdk._http import HttpTransport, PollChannel, segment
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.errors import WaitTimeout
from flowforge_sdk.models import (
    ApiKey,
    Event,
    FailResult,
    PollResult,
    Run,
    Secret,
    TaskRun,
    WorkerInfo,
    WorkerTask,
    WorkflowVersion,
    lease_end,
)
from flowforge_sdk.workflow import Workflow

#: Limits of the worker protocol (docs/workers.md).
MAX_POLL_TASKS = 100
MAX_POLL_WAIT_SECONDS = 30
MAX_LOG_LINES_PER_CALL = 100
MAX_LOG_MESSAGE_CHARS = 4000
MAX_ERROR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 100_000
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Characters of the ``reason`` a recovery action may carry (the server's limit).
MAX_REASON_CHARS = 500


class Client:
    """A FlowForge API client for one organization (the key's).

    ``base_url``: the server, e.g. ``http://127.0.0.1:8000`` (``/api/v1`` is added
    unless given). ``api_key``: ``ffk_<prefix>_<secret>``. ``timeout``: seconds per
    request. ``retries``: how many more times a request is tried when it could not be
    sent, was rate limited (429, after its ``Retry-After``), or, for a request that is
    safe to repeat, when the answer was lost or a 502/503/504. ``transport``: an httpx
    transport (tests pass ``httpx.MockTransport``).

    Thread-safe; use one per process and ``close()`` it (or use it as a context manager).
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0, retries: int = 2,
                 backoff: Backoff | None = None, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = None) -> None:
        self._http = HttpTransport(base_url, api_key, timeout=timeout, retries=retries, backoff=backoff,
                                   transport=transport, user_agent=user_agent)
        self.workflows = WorkflowsAPI(self._http)
        self.runs = RunsAPI(self._http)
        self.events = EventsAPI(self._http)
        self.secrets = SecretsAPI(self._http)
        self.api_keys = ApiKeysAPI(self._http)
        self.worker = WorkerAPI(self._http)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """A client for ``FLOWFORGE_URL`` (default ``http://127.0.0.1:8000``) with the key
        in ``FLOWFORGE_API_KEY``; ValueError when the key is not set."""
        key = os.environ.get("FLOWFORGE_API_KEY", "")
        if not key.strip():
            raise ValueError("FLOWFORGE_API_KEY is not set: export an API key (ffk_...)")
        return cls(os.environ.get("FLOWFORGE_URL", "http://127.0.0.1:8000"), key, **kwargs)

    @property
    def base_url(self) -> str:
        """The API's base URL (ending in ``/api/v1/``)."""
        return self._http.base_url

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never the key
        return f"Client({self._http.base_url!r})"


class WorkflowsAPI:
    """Workflow versions: ``/workflows/``."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def list(self, *, name: str | None = None, state: str | None = None,
             page_size: int | None = None) -> Iterator[WorkflowVersion]:
        """The latest version of each workflow name, by name (``state`` filters before the
        latest is picked: ``state="active"`` gives the version a start by name runs)."""
        for item in self._http.pages("workflows/", params={"name": name, "state": state, "page_size": page_size}):
            yield WorkflowVersion.from_api(item)

    def latest(self, name: str, *, state: str | None = None) -> WorkflowVersion | None:
        """The latest version named ``name`` (in ``state`` when given), or None."""
        for version in self.list(name=name, state=state, page_size=1):
            return version
        return None

    def get(self, workflow_id: str) -> WorkflowVersion:
        """One version with its tasks and edges; NotFound when the organization has none with this id."""
        return WorkflowVersion.from_api(self._http.json("GET", f"workflows/{segment(workflow_id)}/"))

    def versions(self, workflow_id: str, *, page_size: int | None = None) -> Iterator[WorkflowVersion]:
        """Every version of that workflow's name, newest first."""
        for item in self._http.pages(f"workflows/{segment(workflow_id)}/versions/", params={"page_size": page_size}):
            yield WorkflowVersion.from_api(item)

    def apply(self, definition: Workflow | Mapping[str, Any]) -> WorkflowVersion:
        """Store ``definition`` (a Workflow built in code, or a definition document) as the
        next version of its name — version 1 for a new name — active; returns it with
        its tasks. A definition identical to the name's latest (active) version stores
        nothing: that version is returned with ``unchanged`` True (the server's 200), so
        applying the same workflow at every start makes no new versions.

        Raises flowforge_sdk.DefinitionError (nothing sent) for what Workflow checks
        locally, ValidationError (``code`` ``invalid_definition``, ``errors`` a list of
        ``{"path", "message"}``) when the server refuses it, PermissionDenied for a key
        below member, ApiError 422 ``quota_exceeded`` when the organization's stored
        definitions would pass its quota."""
        document = definition.to_document() if isinstance(definition, Workflow) else dict(definition)
        # Not retried after the request was sent: a retry could store a second version.
        return WorkflowVersion.from_api(self._http.json("POST", "workflows/", body=document, expect=(200, 201)))

    def validate(self, definition: Workflow | Mapping[str, Any]) -> dict[str, Any]:
        """Check a definition as ``apply`` would, storing nothing; returns the normalized
        document (defaults filled in). ValidationError when it is refused."""
        document = definition.to_document() if isinstance(definition, Workflow) else dict(definition)
        answer = self._http.json("POST", "workflows/validate/", body=document, idempotent=True)
        normalized = answer.get("normalized") if isinstance(answer, dict) else None
        return normalized if isinstance(normalized, dict) else {}

    def archive(self, workflow_id: str, *, confirm: str) -> WorkflowVersion:
        """Archive a version (``confirm``: the workflow's name); its pending and running runs are cancelled."""
        answer = self._http.json("POST", f"workflows/{segment(workflow_id)}/archive/", body={"confirm": confirm},
                                 idempotent=True)
        return WorkflowVersion.from_api(answer["workflow"])

    def restore(self, workflow_id: str) -> WorkflowVersion:
        """Make an archived version active again (after the server re-validates it)."""
        return WorkflowVersion.from_api(
            self._http.json("POST", f"workflows/{segment(workflow_id)}/restore/", idempotent=True))


class RunsAPI:
    """Workflow runs: ``/runs/``."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def start(self, workflow: str | WorkflowVersion | Workflow, input: Mapping[str, Any] | None = None, *,
              idempotency_key: str | None = None, priority: int | None = None,
              version: int | None = None) -> Run:
        """Start a run of ``workflow`` (a name — its latest active version, or ``version`` —,
        a version's id, a WorkflowVersion, or a code-first Workflow by its name) with
        ``input`` (a JSON object). Returns the run with its task runs.

        Every start carries an ``Idempotency-Key``: ``idempotency_key`` when given, else a
        new UUID, so the SDK's own retries never start two runs. A repeat with the same
        key and body returns the first run (``run.replayed`` is True); the same key with
        another body is a Conflict. ValidationError names ``workflow``, ``input`` or
        ``priority``; Conflict for a draft or archived workflow; RateLimited (with
        ``retry_after``) over the organization's runs-per-minute quota.
        """
        if isinstance(workflow, WorkflowVersion):
            target = workflow.id
        elif isinstance(workflow, Workflow):
            target = workflow.name
        else:
            target = workflow
        body: dict[str, Any] = {"workflow": target, "input": dict(input or {})}
        if priority is not None:
            body["priority"] = priority
        if version is not None:
            body["version"] = version
        key = idempotency_key or str(uuid.uuid4())
        response = self._http.request("POST", "runs/", body=body, headers={"Idempotency-Key": key},
                                      idempotent=True, expect=(200, 201))
        return Run.from_api(response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true")

    def get(self, run_id: str) -> Run:
        """A run with its input and task runs."""
        return Run.from_api(self._http.json("GET", f"runs/{segment(run_id)}/"))

    def list(self, *, workflow: str | None = None, state: str | None = None, created_after: Any = None,
             created_before: Any = None, page_size: int | None = None) -> Iterator[Run]:
        """Runs, newest first (without input and task runs). ``workflow``: a name (every
        version) or a version's id; ``created_after``/``created_before``: datetimes or ISO
        8601 strings, exclusive."""
        params = {"workflow": workflow, "state": state, "created_after": created_after,
                  "created_before": created_before, "page_size": page_size}
        for item in self._http.pages("runs/", params=params):
            yield Run.from_api(item)

    def cancel(self, run_id: str) -> Run:
        """Cancel the run's open tasks and the run; Conflict when it had already finished."""
        return Run.from_api(self._http.json("POST", f"runs/{segment(run_id)}/cancel/", idempotent=False))

    def retry(self, run_id: str) -> Run:
        """A new run of the same version with the same input (``retry_of`` = this run);
        Conflict while this one is still going."""
        return Run.from_api(self._http.json("POST", f"runs/{segment(run_id)}/retry/", expect=(201,)))

    # --- when a run fails: resume it in place, or act on one task run (docs/recovery.md) ----------
    #
    # Each is one POST answered with the run as it is after the action, and is never sent twice
    # by the SDK's own retries once the request went out (a second retry of a task would run it
    # again). Every one needs a key of role member or above (PermissionDenied otherwise).

    def resume(self, run_id: str, *, reason: str | None = None) -> Run:
        """Resume a failed or cancelled run in place: every task run that did not succeed, and
        everything downstream of one, runs again (new attempts); succeeded task runs keep
        their outputs. Returns the run (``running`` again). ``reason`` (at most 500
        characters) is kept in its history and audit record.

        Raises Conflict (``detail`` says why) for a run still going or one that succeeded,
        a workflow version no longer active, or a workflow whose run limit is full;
        ValidationError naming ``reason``; NotFound for a run the key's organization does
        not have; PermissionDenied for a viewer's key. ValueError (nothing sent) for a
        ``reason`` over 500 characters."""
        return self._act(f"runs/{segment(run_id)}/resume/", reason=reason)

    def retry_task(self, run_id: str, task_run: str | TaskRun, *, reason: str | None = None) -> Run:
        """Run one finished task run again (a new attempt, a fresh retry budget), and
        everything downstream of it; the rest of the run keeps its state and outputs.
        ``task_run``: its id, or a TaskRun of ``run.task_runs`` (``run.task("key")``).

        Raises Conflict when the task's trigger rule is not met by the outcomes of the tasks
        it depends on (``detail`` names the rule and each upstream's state; an ``all_done``
        or ``always`` cleanup below a failure may be retried, an ``all_success`` task
        may not), when it is still going, or (on a running run) when its downstream is;
        otherwise as ``resume``."""
        return self._act(f"runs/{segment(run_id)}/task-runs/{segment(_task_run_id(task_run))}/retry/",
                         reason=reason)

    def mark_task_succeeded(self, run_id: str, task_run: str | TaskRun, output: Any = None, *,
                            reason: str | None = None) -> Run:
        """Mark a failed, skipped or cancelled task run succeeded with ``output`` (any JSON
        value, default null; at most the server's FLOWFORGE_MAX_OUTPUT_BYTES, 256 KiB by
        default); its downstream task runs that did not succeed then run, handed it.

        Raises ValidationError naming ``output`` (too large, nested deeper than 64 levels)
        or ``reason``; Conflict for a task run that succeeded or is still going, or (on a
        running run) whose downstream is; otherwise as ``resume``. ValueError (NaN,
        Infinity) or TypeError (what JSON cannot hold) before anything is sent."""
        return self._act(f"runs/{segment(run_id)}/task-runs/{segment(_task_run_id(task_run))}/mark-succeeded/",
                         reason=reason, body={"output": output})

    def skip_task(self, run_id: str, task_run: str | TaskRun, *, reason: str | None = None) -> Run:
        """Mark a failed or cancelled task run skipped (a skipped task does not fail its
        run: a run whose only failure is skipped ends ``succeeded``); its downstream task
        runs that did not succeed are decided again by their trigger rules.

        Raises Conflict for a task run that succeeded, was skipped or is still going, or
        (on a running run) whose downstream is; otherwise as ``resume``."""
        return self._act(f"runs/{segment(run_id)}/task-runs/{segment(_task_run_id(task_run))}/skip/",
                         reason=reason)

    def _act(self, path: str, *, reason: str | None, body: dict[str, Any] | None = None) -> Run:
        payload = dict(body or {})
        if reason is not None:
            if not isinstance(reason, str):
                raise TypeError(f"reason must be a string, got {type(reason).__name__}")
            kept = len(reason.replace("\x00", "").strip())  # as the server counts it
            if kept > MAX_REASON_CHARS:
                raise ValueError(f"reason is {kept} characters; at most {MAX_REASON_CHARS}")
            payload["reason"] = reason
        # Not idempotent: a request whose answer was lost is not sent again (the action may
        # have been done); a 429 (refused before anything was done) is still retried.
        return Run.from_api(self._http.json("POST", path, body=payload, idempotent=False, expect=(200,)))

    def task_output(self, run_id: str, task_run_id: str) -> Any:
        """The whole output of one task run (for an output too large to inline in the run)."""
        answer = self._http.json("GET", f"runs/{segment(run_id)}/task-runs/{segment(task_run_id)}/output/")
        return answer.get("output") if isinstance(answer, dict) else None

    def wait(self, run_id: str, timeout: float | None = None, *, poll_interval: float = 2.0) -> Run:
        """Poll the run until it has finished (succeeded, failed or cancelled) and return
        it. The first polls come quickly (0.2 s, growing), then every ``poll_interval``
        seconds. Raises WaitTimeout (``.run``: the last state seen) after ``timeout``
        seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.2
        while True:
            run = self.get(run_id)
            if run.finished:
                return run
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(f"run {run_id} is still {run.state} after {timeout} s", run=run)
                delay = min(delay, left)
            time.sleep(delay)
            delay = min(poll_interval, delay * 1.5)


def _task_run_id(task_run: str | TaskRun) -> str:
    """A task run's id, from its id or a TaskRun of a run's ``task_runs``."""
    if isinstance(task_run, TaskRun):
        return task_run.id
    if not isinstance(task_run, str) or not task_run.strip():
        raise ValueError(f"task_run must be a task run's id or a TaskRun, got {task_run!r}")
    return task_run


class EventsAPI:
    """A run's history: ``/runs/<id>/events/``."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def list(self, run_id: str, *, after: int | None = None, page_size: int | None = None) -> Iterator[Event]:
        """The run's events in ``seq`` order after ``after`` (default: from the first),
        page after page, up to the last one that exists now."""
        path = f"runs/{segment(run_id)}/events/"
        for item in self._http.pages(path, params={"after": after, "page_size": page_size}):
            yield Event.from_api(item)

    def follow(self, run_id: str, *, after: int | None = None, poll_interval: float = 1.0,
               timeout: float | None = None) -> Iterator[Event]:
        """The run's events as they happen, until its ``run_finished`` event (polling
        ``?after=`` every ``poll_interval`` seconds). WaitTimeout after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = after
        while True:
            for event in self.list(run_id, after=last):
                last = event.seq
                yield event
                if event.kind == "run_finished":
                    return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"run {run_id} has not finished after {timeout} s")
            time.sleep(poll_interval)


class SecretsAPI:
    """The organization's secrets: ``/secrets/``. Values go in, never come out."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def list(self, *, page_size: int | None = None) -> Iterator[Secret]:
        """Every secret's metadata (name, version, times), by page."""
        for item in self._http.pages("secrets/", params={"page_size": page_size}):
            yield Secret.from_api(item)

    def get(self, name: str) -> Secret:
        """One secret's metadata; NotFound when there is none by that name."""
        return Secret.from_api(self._http.json("GET", f"secrets/{segment(name)}/"))

    def set(self, name: str, value: str) -> Secret:
        """Create the secret ``name`` (``created`` True) or rotate it to ``value``
        (``created`` False, ``version`` bumped). Returns its metadata; the value is
        never returned nor logged."""
        if not isinstance(value, str):
            raise TypeError("a secret's value must be a string")
        response = self._http.request("PUT", f"secrets/{segment(name)}/", body={"value": value}, expect=(200, 201))
        return Secret.from_api(response.json(), created=response.status_code == 201)

    def delete(self, name: str) -> None:
        """Delete the secret; NotFound when there is none by that name."""
        self._http.request("DELETE", f"secrets/{segment(name)}/", expect=(204,))


class ApiKeysAPI:
    """The organization's API keys: ``/api-keys/`` (owners and admins). Keys are created
    by a signed-in user (the API keys page, or ``manage.py createapikey``), never by
    another API key, so the SDK lists and revokes them only."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def list(self, *, page_size: int | None = None) -> Iterator[ApiKey]:
        """Every key of the organization, newest first (revoked ones included), by page."""
        for item in self._http.pages("api-keys/", params={"page_size": page_size}):
            yield ApiKey.from_api(item)

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key (idempotent): its next call gets 401."""
        return ApiKey.from_api(self._http.json("POST", f"api-keys/{segment(key_id)}/revoke/", idempotent=True))


class WorkerAPI:
    """The five calls of the worker protocol (docs/workers.md), one request each and no
    retry of their own: flowforge_sdk.Worker decides what to retry. Needs a worker key."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def poll_channel(self, *, grace_seconds: float = 1.0) -> PollChannel:
        """A channel for ``poll(..., channel=)`` that another thread, or a signal handler,
        cuts off with ``channel.cancel()``: the poll in flight then returns within about
        ``grace_seconds`` (an answer the server already sent still arrives) instead of at
        the end of its wait. ``close()`` it when done (flowforge_sdk._http.PollChannel)."""
        return PollChannel(self._http, grace_seconds=grace_seconds)

    def poll(self, queue: str, *, worker: WorkerInfo | Mapping[str, Any], max_tasks: int = 1,
             wait_seconds: float = 20, channel: PollChannel | None = None) -> PollResult:
        """Up to ``max_tasks`` (1-100) tasks of ``queue``, waiting up to ``wait_seconds``
        (0-30) for one to be ready. Each task is started: the worker owns it from here.
        ``channel``: send it through a ``poll_channel()`` (NetworkError once it is cancelled).
        A 503 ``poll_capacity`` (ServerError) and a 429 (RateLimited) carry the seconds to
        wait before the next poll in ``retry_after``."""
        if not 1 <= max_tasks <= MAX_POLL_TASKS:
            raise ValueError(f"max_tasks must be from 1 to {MAX_POLL_TASKS}, got {max_tasks}")
        if not 0 <= wait_seconds <= MAX_POLL_WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be from 0 to {MAX_POLL_WAIT_SECONDS}, got {wait_seconds}")
        info = worker.to_api() if isinstance(worker, WorkerInfo) else dict(worker)
        body = {"queue": queue, "max_tasks": max_tasks, "wait_seconds": wait_seconds, "worker": info}
        send = channel.request if channel is not None else self._http.request
        answer = send("POST", "worker/poll/", body=body, retries=0, expect=(200,),
                      timeout=self._http.timeout + wait_seconds).json()
        tasks = [WorkerTask.from_api(t) for t in answer.get("tasks") or [] if isinstance(t, dict)]
        wait = answer.get("wait_seconds")
        return PollResult(tasks=tasks, wait_seconds=float(wait) if isinstance(wait, int | float) else None)

    def extend_lease(self, task_run_id: str, fencing_token: int, *, timeout: float | None = None) -> float | None:
        """Heartbeat: extend the lease; returns the seconds it now runs from this call, as the
        server answered (its ``lease_seconds``: at most the time left before the attempt's
        timeout), or None when the answer has none.
        Conflict (``code``: ``cancelled``, ``lease_expired``, ``stale_fencing_token``)
        when the generation is no longer this worker's. ``timeout``: seconds for this
        call (default: the client's)."""
        answer = self._http.json("POST", f"worker/tasks/{segment(task_run_id)}/heartbeat/",
                                 body={"fencing_token": fencing_token}, retries=0, expect=(200,), timeout=timeout)
        seconds = answer.get("lease_seconds") if isinstance(answer, dict) else None
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            return None
        return max(0.0, float(seconds))

    def heartbeat(self, task_run_id: str, fencing_token: int, *, timeout: float | None = None) -> Any:
        """``extend_lease``, returning when the lease now ends by this machine's clock
        (a datetime, or None when the answer has no ``lease_seconds``)."""
        seconds = self.extend_lease(task_run_id, fencing_token, timeout=timeout)
        return None if seconds is None else lease_end(seconds)

    def logs(self, task_run_id: str, fencing_token: int, lines: Sequence[Mapping[str, str]]) -> int:
        """Send up to 100 log lines (``{"level", "message"}``); returns how many were accepted."""
        if len(lines) > MAX_LOG_LINES_PER_CALL:
            raise ValueError(f"at most {MAX_LOG_LINES_PER_CALL} lines per call, got {len(lines)}")
        answer = self._http.json("POST", f"worker/tasks/{segment(task_run_id)}/logs/",
                                 body={"fencing_token": fencing_token, "lines": [dict(line) for line in lines]},
                                 retries=0, expect=(200,))
        accepted = answer.get("accepted") if isinstance(answer, dict) else None
        return accepted if isinstance(accepted, int) else len(lines)

    def complete(self, task_run_id: str, fencing_token: int, output: Any) -> str:
        """Report the task's ``output`` (any JSON value); returns the task's new state
        (``succeeded``). Conflict when the result was refused (recorded by the server as
        ``stale_completion_rejected``)."""
        answer = self._http.json("POST", f"worker/tasks/{segment(task_run_id)}/complete/",
                                 body={"fencing_token": fencing_token, "output": output}, retries=0, expect=(200,))
        return str(answer.get("state", "")) if isinstance(answer, dict) else ""

    def fail(self, task_run_id: str, fencing_token: int, error: str, *, retryable: bool = True,
             traceback: str = "") -> FailResult:
        """Report the attempt failed (``error`` cut to 10,000 characters). With
        ``retryable`` and attempts left the task is retried after its backoff. ``traceback``,
        when given, is kept beside the error (its last 100,000 characters are sent; the
        server keeps its start and end, FLOWFORGE_TASK_TRACEBACK_MAX_CHARS)."""
        body: dict[str, Any] = {"fencing_token": fencing_token, "error": error[:MAX_ERROR_CHARS],
                                "retryable": retryable}
        if traceback:
            body["traceback"] = (traceback if len(traceback) <= MAX_TRACEBACK_CHARS
                                 else "…" + traceback[-(MAX_TRACEBACK_CHARS - 1):])
        answer = self._http.json("POST", f"worker/tasks/{segment(task_run_id)}/fail/", body=body, retries=0,
                                 expect=(200,))
        answer = answer if isinstance(answer, dict) else {}
        retry_in = answer.get("retry_in_seconds")
        return FailResult(state=str(answer.get("state", "")),
                          retry_in_seconds=float(retry_in) if isinstance(retry_in, int | float) else None)
