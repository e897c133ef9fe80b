"""Code-first workflows: the document they produce, and the mistakes caught before sending."""

from __future__ import annotations

import json

import pytest

from flowforge_sdk import DefinitionError, Workflow

# examples/diamond.json of the repository, written out by hand.
DIAMOND = {
    "name": "diamond",
    "description": "Smoke test: a diamond of built-in tasks (no Python code).",
    "tasks": [
        {"key": "start", "type": "noop", "max_attempts": 1, "timeout_seconds": 10, "position": {"x": 0, "y": 80}},
        {"key": "fast", "type": "sleep", "config": {"seconds": 0.2}, "depends_on": ["start"],
         "max_attempts": 2, "retry_backoff_seconds": 0.5, "timeout_seconds": 10, "position": {"x": 200, "y": 0}},
        {"key": "slow", "type": "sleep", "config": {"seconds": 1}, "depends_on": ["start"],
         "max_attempts": 2, "retry_backoff_seconds": 0.5, "timeout_seconds": 10, "position": {"x": 200, "y": 160}},
        {"key": "join", "type": "noop", "depends_on": ["fast", "slow"], "edge_labels": {"fast": "0.2 s", "slow": "1 s"},
         "max_attempts": 1, "timeout_seconds": 10, "position": {"x": 400, "y": 80}},
    ],
}


def test_the_diamond_built_in_code_is_the_example_document() -> None:
    wf = Workflow("diamond", description="Smoke test: a diamond of built-in tasks (no Python code).")
    start = wf.noop("start", max_attempts=1, timeout_seconds=10, position=(0, 80))
    fast = wf.sleep("fast", 0.2, depends_on=[start], max_attempts=2, retry_backoff_seconds=0.5, timeout_seconds=10,
                    position=(200, 0))
    slow = wf.sleep("slow", 1, depends_on=start, max_attempts=2, retry_backoff_seconds=0.5, timeout_seconds=10,
                    position={"x": 200, "y": 160})
    wf.noop("join", depends_on=[fast, slow], edge_labels={fast: "0.2 s", "slow": "1 s"}, max_attempts=1,
            timeout_seconds=10, position=(400, 80))
    assert wf.to_document() == DIAMOND
    assert json.loads(wf.to_json()) == DIAMOND


def test_worker_http_and_scheduling_fields_are_written_as_the_server_reads_them() -> None:
    wf = Workflow("thumbnails", timeout_seconds=600,
                  concurrency={"max_running_tasks": 10, "max_running_runs": 2, "policy": "queue"})
    fetch = wf.http_task("fetch", "https://cdn.example.com/list.json", headers={"Authorization": "{{ secrets.CDN }}"},
                         expected_status=[200], request_timeout_seconds=5, max_attempts=3)
    resize = wf.worker_task("resize", "images", name="resize-v2", input={"width": 640}, depends_on=[fetch],
                            max_attempts=3, retry_backoff_seconds=2, timeout_seconds=300, priority=5,
                            concurrency={"key": "customer-{{ input.customer_id }}", "limit": 1},
                            rate_limit={"key": "cdn", "per_second": 25})
    wf.task("publish", "python", config={"callable": "examples.penguins.tasks.report", "params": {"x": (1, 2)}},
            depends_on=["resize"])
    wf.worker_task("audit", "images", depends_on=resize)

    assert wf.to_document() == {
        "name": "thumbnails",
        "tasks": [
            {"key": "fetch", "type": "http",
             "config": {"url": "https://cdn.example.com/list.json", "headers": {"Authorization": "{{ secrets.CDN }}"},
                        "expected_status": [200], "timeout_seconds": 5},
             "max_attempts": 3},
            {"key": "resize", "type": "worker",
             "config": {"queue": "images", "name": "resize-v2", "input": {"width": 640}},
             "depends_on": ["fetch"], "max_attempts": 3, "retry_backoff_seconds": 2, "timeout_seconds": 300,
             "priority": 5, "concurrency": {"key": "customer-{{ input.customer_id }}", "limit": 1},
             "rate_limit": {"key": "cdn", "per_second": 25}},
            {"key": "publish", "type": "python",
             "config": {"callable": "examples.penguins.tasks.report", "params": {"x": [1, 2]}},
             "depends_on": ["resize"]},
            {"key": "audit", "type": "worker", "config": {"queue": "images"}, "depends_on": ["resize"]},
        ],
        "timeout_seconds": 600,
        "concurrency": {"max_running_tasks": 10, "max_running_runs": 2, "policy": "queue"},
    }
    assert [t.key for t in wf.tasks] == ["fetch", "resize", "publish", "audit"]
    assert "resize" in wf and resize in wf and wf["resize"] is resize and len(wf) == 4


def test_to_document_returns_a_copy() -> None:
    wf = Workflow("w")
    wf.worker_task("a", "q", input={"nested": {"n": 1}})
    doc = wf.to_document()
    doc["tasks"][0]["config"]["input"]["nested"]["n"] = 2
    assert wf.to_document()["tasks"][0]["config"]["input"] == {"nested": {"n": 1}}


@pytest.mark.parametrize(("build", "path", "message"), [
    (lambda wf: (wf.noop("a"), wf.noop("a")), "tasks[a]", "duplicate task key 'a'"),
    (lambda wf: wf.noop("bad key"), "tasks['bad key'].key", "'bad key' is not a valid key"),
    (lambda wf: wf.noop("a", depends_on=["a"]), "tasks[a].depends_on", "a task cannot depend on itself"),
    (lambda wf: (wf.noop("a"), wf.noop("b", depends_on=["a", "a"])), "tasks[b].depends_on",
     "lists dependency 'a' twice"),
    (lambda wf: wf.worker_task("a", "bad queue!"), "tasks[a].config.queue", "'bad queue!'"),
    (lambda wf: wf.worker_task("a", "q", input={"blob": "x" * 70_000}), "tasks[a].config.input",
     "is 70012 bytes of JSON; at most 65536"),
    (lambda wf: wf.sleep("a", float("nan")), "tasks[a].config.seconds", "must be a finite number"),
    (lambda wf: wf.noop("a", max_attempts=2.0), "tasks[a].max_attempts", "must be a whole number"),
    (lambda wf: wf.http_task("a", "ftp://x"), "tasks[a].config.url", "must be an absolute http(s) URL"),
    (lambda wf: (wf.noop("a"), wf.noop("b", depends_on=["a"], edge_labels={"c": "x"})), "tasks[b].edge_labels",
     "'c' is not a dependency"),
])
def test_cheap_mistakes_are_refused_when_the_task_is_added(build, path: str, message: str) -> None:
    wf = Workflow("w")
    with pytest.raises(DefinitionError) as caught:
        build(wf)
    (error,) = caught.value.errors
    assert error["path"] == path
    assert message in error["message"]


def test_unknown_dependencies_and_cycles_are_refused_by_to_document() -> None:
    wf = Workflow("w")
    wf.noop("a", depends_on=["b"])
    with pytest.raises(DefinitionError) as caught:
        wf.to_document()
    assert caught.value.errors == [{"path": "tasks[a].depends_on", "message": "unknown dependency 'b'"}]
    wf.noop("b", depends_on=["c"])
    wf.noop("c", depends_on=["a"])
    with pytest.raises(DefinitionError, match=r"dependency cycle: a -> b -> c -> a"):
        wf.to_document()


def test_a_task_of_another_workflow_is_not_a_dependency() -> None:
    other = Workflow("other")
    foreign = other.noop("x")
    wf = Workflow("w")
    with pytest.raises(DefinitionError, match="task 'x' belongs to workflow 'other', not 'w'"):
        wf.noop("a", depends_on=[foreign])


def test_names_and_empty_workflows_are_checked() -> None:
    with pytest.raises(DefinitionError, match="name: 'no spaces please'"):
        Workflow("no spaces please")
    with pytest.raises(DefinitionError, match="tasks: a workflow needs at least one task"):
        Workflow("empty").to_document()


def test_an_input_schema_is_written_as_given_and_must_be_json() -> None:
    schema = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]}
    wf = Workflow("orders", input_schema=schema)
    wf.task("load", "noop")
    assert wf.to_document() == {"name": "orders", "tasks": [{"key": "load", "type": "noop"}], "input_schema": schema}
    bad = Workflow("orders", input_schema={"default": float("nan")})
    bad.task("load", "noop")
    with pytest.raises(DefinitionError) as excinfo:
        bad.to_document()
    assert excinfo.value.errors[0]["path"] == "input_schema"
