"""An in-process fake of the FlowForge API for the SDK's tests: a real HTTP server (in a
thread, on 127.0.0.1) that implements the worker protocol of docs/workers.md and the
slice of the REST API the client uses (docs/api.md), with their status codes and RFC
9457 problem bodies.

What it records for the tests to assert on: every call (``calls``), each task run's
state, token, output and log lines, and the most tasks each worker held at once
(``most_held``). What it lets a test do: hand tasks out (``enqueue``), cancel one,
expire a lease, answer the next matching call with a given status (``inject``), and go
down and come back on the same port (``go_down`` / ``come_back``).

As the real server does, a waiting poll claims nothing once its client has closed the
connection (or half-closed it): it looks when a task is ready, not before; and a heartbeat's answer says the lease it now runs
(``heartbeat_lease_seconds``, or no ``lease_seconds`` at all when
``heartbeat_sends_lease`` is off).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

MEMBER_KEY = "ffk_testmember_s3cr3tmemberkeyvalue"
WORKER_KEY = "ffk_testworker_s3cr3tworkerkeyvalue"
LOG_LEVELS = {"debug", "info", "warning", "error"}


def peer_connected(sock: socket.socket) -> bool:
    """False once the client closed its connection or half-closed it (a peek reads its
    end of file), as the real server checks before each claim of a waiting poll."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable or sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def now_iso(offset_seconds: float = 0.0) -> str:
    when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_seconds)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def problem(status: int, detail: str, code: str, errors: Any = None, **extra: Any) -> dict[str, Any]:
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
              413: "Request Entity Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests",
              500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
    body: dict[str, Any] = {"type": "about:blank", "title": titles.get(status, "Error"), "status": status,
                            "detail": detail, "code": code}
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return body


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    at: float


@dataclass
class Injection:
    method: str
    path: re.Pattern[str]
    reply: Reply
    times: int
    apply: bool  # run the real handler first (the call lands, its answer is replaced)


@dataclass
class FakeTaskRun:
    id: str
    queue: str
    name: str
    task_key: str
    input: dict[str, Any]
    run_input: dict[str, Any]
    upstream: dict[str, Any]
    max_attempts: int
    workflow_run_id: str
    run_task_key: str | None = None  # the run's task this worker task belongs to (engine mode)
    state: str = "ready"
    attempt: int = 0
    token: int = 0
    worker_id: str | None = None
    lease_until: float = 0.0
    output: Any = None
    error: str | None = None
    retryable: bool | None = None
    traceback: str = ""
    logs: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


class FakeFlowForge:
    """The fake server. ``url`` is its base URL (``http://127.0.0.1:<port>``)."""

    def __init__(self, *, heartbeat_interval: float = 0.2, lease_seconds: float = 30.0) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.lease_seconds = lease_seconds
        self.cond = threading.Condition()
        self.calls: list[Call] = []
        self.injections: list[Injection] = []
        self.task_runs: dict[str, FakeTaskRun] = {}
        self.held: dict[str, set[str]] = {}
        self.most_held: dict[str, int] = {}
        self.workers_seen: dict[str, dict[str, Any]] = {}
        self.workflows: list[dict[str, Any]] = []
        self.runs: dict[str, dict[str, Any]] = {}
        self.run_events: dict[str, list[dict[str, Any]]] = {}
        self.finish_runs_after_gets: int | None = None
        self.run_gets: dict[str, int] = {}
        self.idempotency: dict[str, tuple[str, str]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        #: Run the DAG of started runs: noop and sleep tasks succeed at once, worker tasks
        #: become task runs of their queue once their dependencies succeeded (``_advance``).
        self.engine = False
        #: Refuse (400, naming ``queue``) a poll of a queue no worker task of a stored workflow
        #: names, as the real server does (a fresh organization has none).
        self.known_queues_only = False
        #: The lease a heartbeat answers (and grants), in seconds; None: ``lease_seconds``.
        self.heartbeat_lease_seconds: float | None = None
        #: Off: heartbeat answers carry no ``lease_seconds`` (the lease is still extended).
        self.heartbeat_sends_lease = True
        #: Seconds between a poll's claim and its answer (a slow claim, an answer in flight).
        self.poll_answer_delay = 0.0
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- the socket ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeFlowForge:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                connection = self.connection
                reply = fake.handle(self.command, self.path, dict(self.headers.items()), raw,
                                    connected=lambda: peer_connected(connection))
                payload = b"" if reply.body is None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                if reply.body is not None:
                    ctype = "application/problem+json" if reply.status >= 400 else "application/json"
                    self.send_header("Content-Type", ctype)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def go_down(self) -> None:
        """Stop listening: new connections are refused (the port stays ours to come back on)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def come_back(self) -> None:
        self.start()

    def stop(self) -> None:
        self.go_down()

    # --- test controls ----------------------------------------------------------------------------

    def enqueue(self, queue: str = "images", name: str = "resize", *, input: dict[str, Any] | None = None,
                max_attempts: int = 1, task_key: str | None = None, run_input: dict[str, Any] | None = None,
                upstream: dict[str, Any] | None = None) -> str:
        """A ready worker task on ``queue``; returns its task run id."""
        task = FakeTaskRun(id=str(uuid.uuid4()), queue=queue, name=name, task_key=task_key or name,
                           input=input or {}, run_input=run_input or {}, upstream=upstream or {},
                           max_attempts=max_attempts, workflow_run_id=str(uuid.uuid4()))
        with self.cond:
            self.task_runs[task.id] = task
            self.cond.notify_all()
        return task.id

    def cancel(self, task_run_id: str) -> None:
        """Cancel a task run (its run was cancelled): its next heartbeat gets 409 ``cancelled``."""
        with self.cond:
            task = self.task_runs[task_run_id]
            task.state = "cancelled"
            self._release(task)

    def expire_lease(self, task_run_id: str) -> None:
        with self.cond:
            self.task_runs[task_run_id].lease_until = 0.0

    def reap(self, task_run_id: str) -> None:
        """What the reaper does to a lease that ran out: the task goes back to its queue (a
        new generation is handed out at the next poll)."""
        with self.cond:
            task = self.task_runs[task_run_id]
            task.lease_until = 0.0
            task.events.append(f"lease_expired:{task.token}")
            self._release(task)
            task.state = "ready"
            self.cond.notify_all()

    def inject(self, method: str, path: str, status: int, body: Any = None, *, headers: dict[str, str] | None = None,
               times: int = 1, apply: bool = False) -> None:
        """Answer the next ``times`` calls matching ``method`` and the ``path`` regex with
        ``status``; ``apply``: the call is carried out first and only its answer replaced."""
        if body is None and status >= 400:
            body = problem(status, f"injected {status}", {503: "unavailable", 429: "throttled"}.get(status, "error"))
        with self.cond:
            self.injections.append(Injection(method, re.compile(path), Reply(status, body, headers or {}), times, apply))

    def calls_to(self, suffix: str, method: str = "POST") -> list[Call]:
        with self.cond:
            # The server's paths end in "/": a suffix matches with or without it.
            return [c for c in self.calls if c.method == method and c.path.rstrip("/").endswith(suffix.rstrip("/"))]

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Wait until ``predicate()`` (called under the lock) is true; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.05))
            return True

    # --- dispatch ---------------------------------------------------------------------------------

    ROUTES: list[tuple[str, str, str]] = [
        ("POST", r"/api/v1/worker/poll/", "poll"),
        ("POST", r"/api/v1/worker/tasks/(?P<id>[^/]+)/heartbeat/", "heartbeat"),
        ("POST", r"/api/v1/worker/tasks/(?P<id>[^/]+)/logs/", "logs"),
        ("POST", r"/api/v1/worker/tasks/(?P<id>[^/]+)/complete/", "complete"),
        ("POST", r"/api/v1/worker/tasks/(?P<id>[^/]+)/fail/", "fail"),
        ("GET", r"/api/v1/workflows/", "workflow_list"),
        ("POST", r"/api/v1/workflows/", "workflow_create"),
        ("GET", r"/api/v1/workflows/(?P<id>[^/]+)/", "workflow_get"),
        ("GET", r"/api/v1/workflows/(?P<id>[^/]+)/versions/", "workflow_versions"),
        ("POST", r"/api/v1/runs/", "run_start"),
        ("GET", r"/api/v1/runs/", "run_list"),
        ("GET", r"/api/v1/runs/(?P<id>[^/]+)/", "run_get"),
        ("POST", r"/api/v1/runs/(?P<id>[^/]+)/cancel/", "run_cancel"),
        ("GET", r"/api/v1/runs/(?P<id>[^/]+)/events/", "run_events"),
        ("GET", r"/api/v1/secrets/", "secret_list"),
        ("GET", r"/api/v1/secrets/(?P<name>[^/]+)/", "secret_get"),
        ("PUT", r"/api/v1/secrets/(?P<name>[^/]+)/", "secret_put"),
        ("DELETE", r"/api/v1/secrets/(?P<name>[^/]+)/", "secret_delete"),
    ]

    def handle(self, method: str, target: str, headers: dict[str, str], raw: bytes,
               connected: Any = lambda: True) -> Reply:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        body: Any = None
        if raw:
            try:
                body = json.loads(raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            except ValueError:
                return Reply(400, problem(400, "JSON parse error", "parse_error"))
        headers = {k.lower(): v for k, v in headers.items()}
        kept = {k: v for k, v in headers.items() if k in ("authorization", "idempotency-key", "content-type",
                                                          "user-agent")}
        with self.cond:
            self.calls.append(Call(method, parts.path, query, body, kept, time.monotonic()))
            self.cond.notify_all()
            injected = None
            for inj in self.injections:
                if inj.times > 0 and inj.method == method and inj.path.search(parts.path):
                    inj.times -= 1
                    injected = inj
                    break
        if injected is not None and not injected.apply:
            return injected.reply
        reply = self._route(method, parts.path, query, headers, body, connected)
        return injected.reply if injected is not None else reply

    def _route(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: Any,
               connected: Any) -> Reply:
        auth = headers.get("authorization", "")
        key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if key not in (MEMBER_KEY, WORKER_KEY):
            return Reply(401, problem(401, "Invalid API key.", "authentication_failed"),
                         {"WWW-Authenticate": 'Bearer realm="api"'})
        for route_method, pattern, name in self.ROUTES:
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                is_worker_route = name in ("poll", "heartbeat", "logs", "complete", "fail")
                if is_worker_route != (key == WORKER_KEY):
                    return Reply(403, problem(403, "You do not have permission to perform this action.",
                                              "permission_denied"))
                handler = getattr(self, f"_{name}")
                with self.cond:
                    reply: Reply = handler(body=body, query=query, headers=headers, connected=connected,
                                           **match.groupdict())
                    self.cond.notify_all()
                    return reply
        return Reply(404, problem(404, "There is no API endpoint at this path.", "not_found"))

    # --- the worker protocol ----------------------------------------------------------------------

    def _release(self, task: FakeTaskRun) -> None:
        if task.worker_id is not None:
            self.held.get(task.worker_id, set()).discard(task.id)

    def _owned(self, task_run_id: str, body: Any) -> FakeTaskRun | Reply:
        task = self.task_runs.get(task_run_id)
        if task is None:
            return Reply(404, problem(404, "Not found.", "not_found"))
        token = body.get("fencing_token") if isinstance(body, dict) else None
        if not isinstance(token, int) or isinstance(token, bool):
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"fencing_token": ["required: a whole number"]}))
        if token != task.token or task.state not in ("running", "cancelled"):
            return Reply(409, problem(409, f"fencing token {token} is not the task run's current one "
                                      f"({task.token})", "stale_fencing_token"))
        if task.state == "cancelled":
            return Reply(409, problem(409, "The task run was cancelled.", "cancelled"))
        if time.monotonic() > task.lease_until:
            return Reply(409, problem(409, "The lease ran out.", "lease_expired"))
        return task

    def _poll(self, body: Any, connected: Any, **_: Any) -> Reply:
        errors: dict[str, list[str]] = {}
        if not isinstance(body, dict):
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"non_field_errors": ["must be a JSON object"]}))
        queue = body.get("queue")
        if not isinstance(queue, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", queue):
            errors["queue"] = ["required: 1-64 letters, digits, '_', '-' or '.'"]
        max_tasks = body.get("max_tasks", 1)
        if not isinstance(max_tasks, int) or not 1 <= max_tasks <= 100:
            errors["max_tasks"] = ["must be a whole number from 1 to 100"]
        wait = body.get("wait_seconds", 20)
        if not isinstance(wait, int | float) or not 0 <= wait <= 30:
            errors["wait_seconds"] = ["must be from 0 to 30"]
        worker = body.get("worker")
        worker_id = worker.get("id") if isinstance(worker, dict) else None
        if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= 64:
            errors["worker.id"] = ["required: 1 to 64 characters"]
        if not errors and self.known_queues_only and not any(
                t.get("type") == "worker" and t.get("config", {}).get("queue") == queue
                for w in self.workflows for t in w["tasks"]):
            errors["queue"] = [f"no task of this organization's workflows waits on queue {queue!r}: check the name, "
                               "or apply a workflow with a worker task on it (config.queue) before starting its workers"]
        if errors:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid", errors))
        assert isinstance(worker, dict) and isinstance(worker_id, str)
        self.workers_seen[worker_id] = dict(worker)
        deadline = time.monotonic() + float(wait)
        while True:
            ready = [t for t in self.task_runs.values() if t.queue == queue and t.state == "ready"]
            if ready:
                if not connected():  # as the real server: a client gone (or going) gets no claim
                    return Reply(200, {"tasks": [], "wait_seconds": wait})
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return Reply(200, {"tasks": [], "wait_seconds": wait})
            self.cond.wait(left)  # as the real server, a closed connection does not end the wait
        handed = []
        for task in ready[:max_tasks]:
            task.state = "running"
            task.attempt += 1
            task.token += 1
            task.worker_id = worker_id
            task.lease_until = time.monotonic() + self.lease_seconds
            task.events.append(f"started:{task.token}")
            held = self.held.setdefault(worker_id, set())
            held.add(task.id)
            self.most_held[worker_id] = max(self.most_held.get(worker_id, 0), len(held))
            handed.append({
                "task_run_id": task.id, "fencing_token": task.token, "attempt": task.attempt,
                "max_attempts": task.max_attempts, "workflow_run_id": task.workflow_run_id, "workflow": "thumbnails",
                "task_key": task.task_key, "name": task.name, "queue": task.queue, "input": task.input,
                "run_input": task.run_input, "upstream": task.upstream, "timeout_seconds": self.lease_seconds,
                "lease_seconds": self.lease_seconds, "heartbeat_interval_seconds": self.heartbeat_interval,
            })
        answer_at = time.monotonic() + self.poll_answer_delay
        while time.monotonic() < answer_at:  # claimed (started), the answer not yet sent
            self.cond.wait(answer_at - time.monotonic())
        return Reply(200, {"tasks": handed, "wait_seconds": wait})

    def _heartbeat(self, id: str, body: Any, **_: Any) -> Reply:
        task = self._owned(id, body)
        if isinstance(task, Reply):
            return task
        lease = self.lease_seconds if self.heartbeat_lease_seconds is None else self.heartbeat_lease_seconds
        task.lease_until = time.monotonic() + lease
        task.events.append(f"heartbeat:{task.token}")
        return Reply(200, {"lease_seconds": lease} if self.heartbeat_sends_lease else {})

    def _logs(self, id: str, body: Any, **_: Any) -> Reply:
        lines = body.get("lines") if isinstance(body, dict) else None
        if not isinstance(lines, list) or not lines:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"lines": ["required: a list of 1 to 100 lines"]}))
        if len(lines) > 100:  # a 400 like any other malformed field (the body's own limit is a 413)
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"lines": ["Ensure this field has no more than 100 elements."]}))
        for i, line in enumerate(lines):
            if not isinstance(line, dict) or line.get("level") not in LOG_LEVELS:
                return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                          {f"lines[{i}].level": ["must be debug, info, warning or error"]}))
            if not isinstance(line.get("message"), str) or len(line["message"]) > 4000:
                return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                          {f"lines[{i}].message": ["a string of at most 4000 characters"]}))
        task = self._owned(id, body)
        if isinstance(task, Reply):
            return task
        for line in lines:
            task.logs.append({**line, "fencing_token": body["fencing_token"]})
        return Reply(200, {"accepted": len(lines)})

    def _complete(self, id: str, body: Any, **_: Any) -> Reply:
        task = self._owned(id, body)
        if isinstance(task, Reply):
            if id in self.task_runs and task.status == 409:
                self.task_runs[id].events.append("stale_completion_rejected")
            return task
        if "output" not in body:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"output": ["required"]}))
        task.state = "succeeded"
        task.output = body["output"]
        task.events.append(f"succeeded:{task.token}")
        self._release(task)
        self._task_settled(task)
        return Reply(200, {"state": "succeeded"})

    def _fail(self, id: str, body: Any, **_: Any) -> Reply:
        task = self._owned(id, body)
        if isinstance(task, Reply):
            if id in self.task_runs and task.status == 409:
                self.task_runs[id].events.append("stale_completion_rejected")
            return task
        error = body.get("error")
        if not isinstance(error, str) or len(error) > 10_000:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"error": ["a string of at most 10000 characters"]}))
        trace = body.get("traceback", "")
        if not isinstance(trace, str) or len(trace) > 100_000:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"traceback": ["a string of at most 100000 characters"]}))
        retryable = body.get("retryable", True)
        task.error = error
        task.traceback = trace
        task.retryable = retryable
        self._release(task)
        task.events.append(f"attempt_failed:{task.token}")
        if retryable and task.attempt < task.max_attempts:
            task.state = "ready"
            return Reply(200, {"state": "ready", "retry_in_seconds": 0.0})
        task.state = "failed"
        self._task_settled(task)
        return Reply(200, {"state": "failed"})

    # --- workflows ---------------------------------------------------------------------------------

    def _page(self, rows: list[dict[str, Any]], query: dict[str, str], path: str, param: str,
              value_of: Any) -> Reply:
        size = int(query.get("page_size") or 50)
        page, more = rows[:size], len(rows) > size
        next_url = None
        if more:
            # The server's next link: a full URL that keeps the other parameters. Its host is
            # another one on purpose: the client must only use its query string.
            params = {**query, param: value_of(page[-1])}
            next_url = f"http://testserver.invalid{path}?{urlencode(params)}"
        return Reply(200, {"results": page, "next": next_url})

    def _workflow_create(self, body: Any, **_: Any) -> Reply:
        errors = []
        if not isinstance(body, dict):
            return Reply(400, problem(400, "The workflow definition is invalid; see errors.", "invalid_definition",
                                      [{"path": "document", "message": "the body must be a JSON object"}]))
        if not isinstance(body.get("name"), str) or not body.get("name"):
            errors.append({"path": "name", "message": "required: the workflow's name"})
        if not isinstance(body.get("tasks"), list) or not body["tasks"]:
            errors.append({"path": "tasks", "message": "a workflow needs at least one task"})
        if errors:
            return Reply(400, problem(400, "The workflow definition is invalid; see errors.", "invalid_definition",
                                      errors))
        same_name = [w for w in self.workflows if w["name"] == body["name"]]
        if same_name and same_name[-1]["document"] == body:  # the server's "unchanged": nothing stored
            latest = same_name[-1]
            return Reply(200, {**self._workflow_detail(latest), "unchanged": True},
                         {"Location": f"/api/v1/workflows/{latest['id']}/"})
        version = 1 + len(same_name)
        workflow = {"id": str(uuid.uuid4()), "name": body["name"], "version": version, "state": "active",
                    "description": body.get("description", ""), "created_at": now_iso(), "concurrency": None,
                    "tasks": body["tasks"], "edges": [], "document": body}
        self.workflows.append(workflow)
        return Reply(201, {**self._workflow_detail(workflow), "unchanged": False},
                     {"Location": f"/api/v1/workflows/{workflow['id']}/"})

    @staticmethod
    def _workflow_detail(workflow: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in workflow.items() if k != "document"}

    @staticmethod
    def _workflow_summary(workflow: dict[str, Any]) -> dict[str, Any]:
        return {"id": workflow["id"], "name": workflow["name"], "version": workflow["version"],
                "state": workflow["state"], "description": workflow["description"],
                "task_count": len(workflow["tasks"]), "created_at": workflow["created_at"]}

    def _workflow_list(self, query: dict[str, str], **_: Any) -> Reply:
        latest: dict[str, dict[str, Any]] = {}
        for workflow in self.workflows:
            if query.get("state") and workflow["state"] != query["state"]:
                continue
            if workflow["name"] not in latest or workflow["version"] > latest[workflow["name"]]["version"]:
                latest[workflow["name"]] = workflow
        rows = [self._workflow_summary(w) for name, w in sorted(latest.items())
                if not query.get("name") or name == query["name"]]
        if query.get("cursor"):
            rows = [r for r in rows if r["name"] > query["cursor"]]
        return self._page(rows, query, "/api/v1/workflows/", "cursor", lambda r: r["name"])

    def _find_workflow(self, id: str) -> dict[str, Any] | None:
        return next((w for w in self.workflows if w["id"] == id), None)

    def _workflow_get(self, id: str, **_: Any) -> Reply:
        workflow = self._find_workflow(id)
        if workflow is None:
            return Reply(404, problem(404, "Not found.", "not_found"))
        return Reply(200, self._workflow_detail(workflow))

    def _workflow_versions(self, id: str, query: dict[str, str], **_: Any) -> Reply:
        workflow = self._find_workflow(id)
        if workflow is None:
            return Reply(404, problem(404, "Not found.", "not_found"))
        rows = sorted((self._workflow_summary(w) for w in self.workflows if w["name"] == workflow["name"]),
                      key=lambda r: -r["version"])
        if query.get("before"):
            rows = [r for r in rows if r["version"] < int(query["before"])]
        return self._page(rows, query, f"/api/v1/workflows/{id}/versions/", "before", lambda r: r["version"])

    # --- runs and events --------------------------------------------------------------------------

    def _event(self, run_id: str, kind: str, **fields: Any) -> None:
        events = self.run_events.setdefault(run_id, [])
        events.append({"seq": len(events) + 1, "kind": kind, "task_run": None, "task_key": None,
                       "from_state": None, "to_state": None, "attempt": None, "fencing_token": None,
                       "detail": {}, "created_at": now_iso(), **fields})

    def _run_start(self, body: Any, headers: dict[str, str], **_: Any) -> Reply:
        if not isinstance(body, dict):
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"non_field_errors": ["must be a JSON object"]}))
        name = body.get("workflow")
        candidates = [w for w in self.workflows if w["id"] == name or (w["name"] == name and w["state"] == "active")]
        if not candidates:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"workflow": [f"no workflow {name!r} in organization 'acme'"]}))
        if not isinstance(body.get("input", {}), dict):
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"input": ["must be a JSON object"]}))
        key = headers.get("idempotency-key")
        fingerprint = json.dumps(body, sort_keys=True)
        if key is not None and key in self.idempotency:
            first_fingerprint, run_id = self.idempotency[key]
            if first_fingerprint != fingerprint:
                return Reply(409, problem(409, "The Idempotency-Key was used with another body.", "conflict"))
            return Reply(200, self.runs[run_id], {"Idempotent-Replayed": "true"})
        workflow = max(candidates, key=lambda w: w["version"])
        run_id = str(uuid.uuid4())
        run = {"id": run_id, "workflow": {"id": workflow["id"], "name": workflow["name"],
                                          "version": workflow["version"]},
               "state": "running", "priority": body.get("priority", 0), "input": body.get("input", {}),
               "trigger_source": "api", "trigger": None, "triggered_by": None, "started_by_api_key": None, "retry_of": None, "error": None,
               "created_at": now_iso(), "started_at": now_iso(), "finished_at": None, "waiting_reason": None,
               "task_runs": [{"id": str(uuid.uuid4()), "key": t.get("key"), "state": "ready", "attempt": 0,
                              "output": None, "error": None} for t in workflow["tasks"]]}
        self.runs[run_id] = run
        if key is not None:
            self.idempotency[key] = (fingerprint, run_id)
        self._event(run_id, "run_started", to_state="running")
        if self.engine:
            self._advance(run, workflow)
        return Reply(201, run, {"Location": f"/api/v1/runs/{run_id}/"})

    # --- a small engine (engine mode) -------------------------------------------------------------

    def _advance(self, run: dict[str, Any], workflow: dict[str, Any]) -> None:
        """Start every task of ``run`` whose dependencies all succeeded; finish the run at the end."""
        by_key = {t["key"]: t for t in run["task_runs"]}
        progressed = True
        while progressed:
            progressed = False
            for task in workflow["tasks"]:
                task_run = by_key[task["key"]]
                if task_run["state"] != "ready" or task_run.get("queued"):
                    continue
                if not all(by_key[d]["state"] == "succeeded" for d in task.get("depends_on", [])):
                    continue
                config = task.get("config", {})
                if task["type"] == "worker":
                    task_run["queued"] = True
                    task_run["state"] = "running"
                    worker_task = FakeTaskRun(
                        id=str(uuid.uuid4()), queue=config["queue"], name=config.get("name", task["key"]),
                        task_key=task["key"], input=config.get("input", {}), run_input=run["input"],
                        upstream={d: by_key[d]["output"] for d in task.get("depends_on", [])},
                        max_attempts=task.get("max_attempts", 1), workflow_run_id=run["id"],
                        run_task_key=task["key"])
                    self.task_runs[worker_task.id] = worker_task
                else:
                    task_run.update(state="succeeded", attempt=1,
                                    output={"slept_seconds": config["seconds"]} if task["type"] == "sleep" else None)
                    progressed = True
        states = {t["state"] for t in run["task_runs"]}
        if states == {"succeeded"}:
            self._finish(run, "succeeded")
        elif "failed" in states and "running" not in states:
            self._finish(run, "failed")

    def _task_settled(self, task: FakeTaskRun) -> None:
        run = self.runs.get(task.workflow_run_id)
        if run is None or task.run_task_key is None:
            return
        task_run = next(t for t in run["task_runs"] if t["key"] == task.run_task_key)
        task_run.update(state=task.state, attempt=task.attempt, output=task.output, error=task.error)
        if task.state in ("succeeded", "failed"):
            workflow = next(w for w in self.workflows if w["id"] == run["workflow"]["id"])
            self._advance(run, workflow)

    def _run_get(self, id: str, **_: Any) -> Reply:
        run = self.runs.get(id)
        if run is None:
            return Reply(404, problem(404, "Not found.", "not_found"))
        self.run_gets[id] = self.run_gets.get(id, 0) + 1
        if (self.finish_runs_after_gets is not None and run["state"] == "running"
                and self.run_gets[id] >= self.finish_runs_after_gets):
            self._finish(run, "succeeded")
        return Reply(200, run)

    def _finish(self, run: dict[str, Any], state: str) -> None:
        run["state"] = state
        run["finished_at"] = now_iso()
        for task_run in run["task_runs"]:
            if task_run["state"] not in ("succeeded", "failed"):
                task_run["state"] = "succeeded" if state == "succeeded" else "cancelled"
        self._event(run["id"], "run_finished", from_state="running", to_state=state)

    def _run_list(self, query: dict[str, str], **_: Any) -> Reply:
        rows = [{k: v for k, v in r.items() if k not in ("input", "task_runs")} for r in reversed(self.runs.values())]
        if query.get("state"):
            rows = [r for r in rows if r["state"] == query["state"]]
        if query.get("cursor"):
            ids = [r["id"] for r in rows]
            rows = rows[ids.index(query["cursor"]) + 1:]
        return self._page(rows, query, "/api/v1/runs/", "cursor", lambda r: r["id"])

    def _run_cancel(self, id: str, **_: Any) -> Reply:
        run = self.runs.get(id)
        if run is None:
            return Reply(404, problem(404, "Not found.", "not_found"))
        if run["state"] != "running":
            return Reply(409, problem(409, f"The run has already finished ({run['state']}).", "conflict"))
        self._finish(run, "cancelled")
        return Reply(200, run)

    def _run_events(self, id: str, query: dict[str, str], **_: Any) -> Reply:
        if id not in self.runs:
            return Reply(404, problem(404, "Not found.", "not_found"))
        after = int(query.get("after") or 0)
        rows = [e for e in self.run_events.get(id, []) if e["seq"] > after]
        return self._page(rows, query, f"/api/v1/runs/{id}/events/", "after", lambda e: e["seq"])

    # --- secrets ------------------------------------------------------------------------------------

    def _secret_meta(self, name: str) -> dict[str, Any]:
        secret = self.secrets[name]
        return {"name": name, "version": secret["version"], "created_at": secret["created_at"],
                "updated_at": secret["updated_at"]}

    def _secret_list(self, query: dict[str, str], **_: Any) -> Reply:
        rows = [self._secret_meta(n) for n in sorted(self.secrets)]
        if query.get("cursor"):
            rows = [r for r in rows if r["name"] > query["cursor"]]
        return self._page(rows, query, "/api/v1/secrets/", "cursor", lambda r: r["name"])

    def _secret_get(self, name: str, **_: Any) -> Reply:
        if name not in self.secrets:
            return Reply(404, problem(404, "Not found.", "not_found"))
        return Reply(200, self._secret_meta(name))

    def _secret_put(self, name: str, body: Any, **_: Any) -> Reply:
        value = body.get("value") if isinstance(body, dict) else None
        if not isinstance(value, str) or not value:
            return Reply(400, problem(400, "The request is invalid; see errors.", "invalid",
                                      {"value": ["required: a non-empty string"]}))
        if name in self.secrets:
            secret = self.secrets[name]
            secret.update(value=value, version=secret["version"] + 1, updated_at=now_iso())
            return Reply(200, self._secret_meta(name))
        self.secrets[name] = {"value": value, "version": 1, "created_at": now_iso(), "updated_at": now_iso()}
        return Reply(201, self._secret_meta(name))

    def _secret_delete(self, name: str, **_: Any) -> Reply:
        if name not in self.secrets:
            return Reply(404, problem(404, "Not found.", "not_found"))
        del self.secrets[name]
        return Reply(204)
