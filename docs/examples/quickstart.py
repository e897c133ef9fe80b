"""FlowForge REST API quickstart: define a workflow, start a run idempotently and follow
its events to the end.

    FLOWFORGE_URL=http://127.0.0.1:8000 FLOWFORGE_API_KEY=ffk_... python docs/examples/quickstart.py

Needs only httpx. The key needs the member role or higher (it creates a workflow
version and starts a run). Exits 0 when the run succeeded, 1 when it finished
otherwise, 2 when the API refused a request (the problem document is printed), 3
when it could not talk to the server or is not configured (FLOWFORGE_API_KEY unset,
or nothing answering at FLOWFORGE_URL): one line on stderr says which.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

import httpx

DEFINITION = {
    "name": "quickstart",
    "description": "Extract, transform, load — the FlowForge quickstart.",
    "tasks": [
        {"key": "extract", "type": "noop", "position": {"x": 0, "y": 0}},
        {"key": "transform", "type": "sleep", "config": {"seconds": 0.5}, "depends_on": ["extract"],
         "max_attempts": 3, "retry_backoff_seconds": 1, "position": {"x": 200, "y": 0}},
        {"key": "load", "type": "noop", "depends_on": ["transform"], "edge_labels": {"transform": "rows"},
         "position": {"x": 400, "y": 0}},
    ],
}


class ApiError(Exception):
    pass


def check(response: httpx.Response, *expected: int) -> dict:
    """The JSON body of ``response``; ApiError with the problem document otherwise."""
    if response.status_code not in expected:
        raise ApiError(f"{response.request.method} {response.request.url} -> {response.status_code}\n{response.text}")
    return response.json()


def sse_events(lines):
    """Parse a text/event-stream into (id, data) pairs; comments (heartbeats) are skipped."""
    event_id, data = None, []
    for line in lines:
        if line == "":
            if data:
                yield event_id, json.loads("\n".join(data))
            event_id, data = None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "id":
                event_id = value
            elif field == "data":
                data.append(value)


def follow(api: httpx.Client, run_id: str) -> None:
    """Print the run's events as they happen, until its run_finished event. A dropped
    connection is resumed where it stopped (Last-Event-ID), as EventSource would."""
    last_id = "0"
    for _attempt in range(10):
        headers = {"Accept": "text/event-stream", "Last-Event-ID": last_id}
        try:
            with api.stream("GET", f"/runs/{run_id}/events/stream/", headers=headers,
                            timeout=httpx.Timeout(10.0, read=60.0)) as response:
                if response.status_code != 200:
                    response.read()
                    check(response, 200)
                for event_id, event in sse_events(response.iter_lines()):
                    last_id = event_id or last_id
                    task = f" {event['task_key']}" if event["task_key"] else ""
                    print(f"  #{event['seq']:<3} {event['kind']:<12}{task} {event['from_state']} -> {event['to_state']}")
                    if event["kind"] == "run_finished":
                        return
        except httpx.TransportError as exc:
            print(f"  (stream interrupted: {exc}; resuming after event {last_id})")
    raise ApiError("the event stream kept failing")


def main() -> int:
    """Run the walk-through; the exit status is the one the module docstring lists."""
    server = os.environ.get("FLOWFORGE_URL", "http://127.0.0.1:8000").rstrip("/")
    base_url = server + "/api/v1"
    key = os.environ.get("FLOWFORGE_API_KEY", "").strip()
    if not key:
        print("error: FLOWFORGE_API_KEY is not set; set it to an API key of the member role or higher "
              "(ffk_..., from 'manage.py createapikey <org> --name quickstart')", file=sys.stderr)
        return 3
    try:
        return walk_through(base_url, key)
    except httpx.TransportError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: could not talk to FlowForge at {server} ({reason}); "
              "is the server running? Set FLOWFORGE_URL to its address", file=sys.stderr)
        return 3


def walk_through(base_url: str, key: str) -> int:
    """Define the workflow, start a run, follow it to the end; the exit status of main()."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0) as api:
        try:
            # 1. Define the workflow: validate first (stores nothing), then create a version.
            check(api.post("/workflows/validate/", json=DEFINITION), 200)
            workflow = check(api.post("/workflows/", json=DEFINITION), 201)
            print(f"workflow {workflow['name']} v{workflow['version']} ({workflow['id']}): "
                  f"{', '.join(t['key'] for t in workflow['tasks'])}")

            # 2. Start a run with an Idempotency-Key; sending the same request again (a retry
            #    after a timeout, say) returns the same run instead of starting a second one.
            idempotency_key = str(uuid.uuid4())
            body = {"workflow": workflow["id"], "input": {"source": "quickstart"}}
            run = check(api.post("/runs/", json=body, headers={"Idempotency-Key": idempotency_key}), 201)
            again = check(api.post("/runs/", json=body, headers={"Idempotency-Key": idempotency_key}), 200)
            assert again["id"] == run["id"], "an idempotent retry must return the first run"
            print(f"run {run['id']} started (a retry with the same Idempotency-Key returned it again)")

            # 3. Follow its events live until it finishes, then read its final state.
            follow(api, run["id"])
            final = check(api.get(f"/runs/{run['id']}/"), 200)
        except ApiError as exc:
            print(exc, file=sys.stderr)
            return 2
    for task_run in final["task_runs"]:
        print(f"  {task_run['key']:<10} {task_run['state']:<10} attempt {task_run['attempt']}")
    print(f"run {final['id']} finished: {final['state']}")
    return 0 if final["state"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
