"""Workflow definitions: a bad document gets a clear error naming the task and the
problem and stores nothing, through ``engine.services.apply_definition`` and through
``manage.py apply_workflow``; good JSON and YAML documents are stored as versions
with their dependencies, edge labels and positions."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.utils import DataError

from engine.definitions import DefinitionError, parse_document, validate_document
from engine.models import Task, TaskDependency, Workflow
from engine.services import apply_definition

pytestmark = pytest.mark.django_db


def counts() -> dict[str, int]:
    return {
        "core_workflow": Workflow.objects.unscoped().count(),
        "core_task": Task.objects.unscoped().count(),
        "core_taskdependency": TaskDependency.objects.unscoped().count(),
    }


@pytest.fixture
def existing(org, make_workflow):
    """A valid workflow already stored, so the counts compared below are not all zero."""
    return make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop", "depends_on": ["x"]}],
                         name="existing")


def noop(key: str, **kw) -> dict:
    return {"key": key, "type": "noop", **kw}


# Each case: (id, document, expected path, fragments the message must contain).
BAD_DEFINITIONS = [
    (
        "duplicate-task-keys",
        {"name": "dup", "tasks": [noop("a"), noop("b"), noop("a")]},
        "tasks[a]",
        ["duplicate task key 'a'", "tasks 0 and 2"],
    ),
    (
        "unknown-dependency",
        {"name": "unk", "tasks": [noop("a"), noop("b", depends_on=["a", "zzz"])]},
        "tasks[b].depends_on",
        ["unknown dependency 'zzz'"],
    ),
    (
        "self-dependency",
        {"name": "selfdep", "tasks": [noop("a"), noop("b", depends_on=["b"])]},
        "tasks[b].depends_on",
        ["a task cannot depend on itself"],
    ),
    (
        "unknown-task-type",
        {"name": "unktype", "tasks": [noop("a"), {"key": "b", "type": "shell"}]},
        "tasks[b].type",
        ["unknown task type 'shell'", "known types: fail, http, noop, python, sleep"],
    ),
    (
        "missing-task-type",
        {"name": "notype", "tasks": [{"key": "b"}]},
        "tasks[b].type",
        ["unknown task type None", "known types: fail, http, noop, python, sleep"],
    ),
    (
        "sleep-seconds-not-a-number",
        {"name": "sleepx", "tasks": [{"key": "b", "type": "sleep", "config": {"seconds": "x"}}]},
        "tasks[b].config",
        ["sleep task", "'seconds' must be a number, got str"],
    ),
    (
        "sleep-seconds-negative",
        {"name": "sleepneg", "tasks": [{"key": "b", "type": "sleep", "config": {"seconds": -1}}]},
        "tasks[b].config",
        ["sleep task", "'seconds' must be at least 0, got -1"],
    ),
    (
        "sleep-seconds-missing",
        {"name": "sleepnone", "tasks": [{"key": "b", "type": "sleep", "config": {}}]},
        "tasks[b].config",
        ["sleep task", "'seconds' is required"],
    ),
    (
        "http-non-http-url",
        {"name": "httpftp", "tasks": [{"key": "b", "type": "http", "config": {"url": "ftp://example.com/f"}}]},
        "tasks[b].config",
        ["http task", "'url' must be an absolute http(s) URL, got 'ftp://example.com/f'"],
    ),
    (
        "http-relative-url",
        {"name": "httprel", "tasks": [{"key": "b", "type": "http", "config": {"url": "/api/x"}}]},
        "tasks[b].config",
        ["http task", "'url' must be an absolute http(s) URL, got '/api/x'"],
    ),
    (
        "python-callable-not-registered",
        {"name": "pyos", "tasks": [{"key": "b", "type": "python", "config": {"callable": "os.system"}}]},
        "tasks[b].config",
        ["python task", "'callable' 'os.system' is not a registered task callable", "FLOWFORGE_TASK_CALLABLES"],
    ),
    (
        "fail-unknown-field",
        {"name": "failx", "tasks": [{"key": "b", "type": "fail", "config": {"mesage": "typo"}}]},
        "tasks[b].config",
        ["fail task", "unknown field(s) 'mesage'", "allowed: fail_attempts, message"],
    ),
    (
        "unknown-task-field",
        {"name": "taskfield", "tasks": [noop("b", retries=3)]},
        "tasks[b].retries",
        ["unknown field"],
    ),
    (
        "max-attempts-zero",
        {"name": "attempts", "tasks": [noop("b", max_attempts=0)]},
        "tasks[b].max_attempts",
        ["must be at least 1, got 0"],
    ),
    (
        "edge-label-for-a-non-dependency",
        {"name": "labels", "tasks": [noop("a"), noop("b", edge_labels={"a": "on success"})]},
        "tasks[b].edge_labels",
        ["'a' is not a dependency"],
    ),
    (
        "empty-workflow",
        {"name": "empty", "tasks": []},
        "tasks",
        ["a workflow needs at least one task"],
    ),
    (
        "no-tasks-field",
        {"name": "empty"},
        "tasks",
        ["a workflow needs at least one task"],
    ),
    (
        "missing-name",
        {"tasks": [noop("a")]},
        "name",
        ["required"],
    ),
    (
        "malformed-name",
        {"name": "has spaces", "tasks": [noop("a")]},
        "name",
        ["'has spaces': use 1-200 letters, digits"],
    ),
    (
        "name-read-as-a-boolean",  # name: yes in YAML
        {"name": True, "tasks": [noop("a")]},
        "name",
        ["must be text, not a boolean (True); in YAML, quote a name such as 'yes' or '1.10'"],
    ),
    (
        "name-read-as-a-number",  # name: 1.10 in YAML
        {"name": 1.1, "tasks": [noop("a")]},
        "name",
        ["must be text, not a number (1.1); in YAML"],
    ),
    (
        "tasks-not-a-list",
        {"name": "obj", "tasks": {"a": {"type": "noop"}}},
        "tasks",
        ["must be a list of tasks, got dict"],
    ),
    (
        "sleep-longer-than-a-week",
        {"name": "long", "tasks": [{"key": "nap", "type": "sleep", "config": {"seconds": 1e12}}]},
        "tasks[nap].config",
        ["'seconds' must be at most 604800"],
    ),
    (
        "task-timeout-past-30-days",
        {"name": "t", "tasks": [{"key": "a", "type": "noop", "timeout_seconds": 1e20}]},
        "tasks[a].timeout_seconds",
        ["must be at most 2592000 (30 days), got 1e+20"],
    ),
    (
        "retry-backoff-past-a-day",
        {"name": "t", "tasks": [{"key": "a", "type": "fail", "max_attempts": 3, "retry_backoff_seconds": 1e308}]},
        "tasks[a].retry_backoff_seconds",
        ["must be at most 86400 (a day), got 1e+308"],
    ),
    (
        "run-timeout-past-a-year",
        {"name": "t", "timeout_seconds": 4e7, "tasks": [{"key": "a", "type": "noop"}]},
        "timeout_seconds",
        ["must be at most 31536000 (365 days), got 40000000.0"],
    ),
]


def _error_for(errors: list[dict[str, str]], path: str) -> dict[str, str]:
    matching = [e for e in errors if e["path"] == path]
    assert matching, f"no error at {path!r}; errors were {errors}"
    return matching[0]


@pytest.mark.parametrize("doc, path, fragments", [c[1:] for c in BAD_DEFINITIONS], ids=[c[0] for c in BAD_DEFINITIONS])
def test_apply_definition_rejects_a_bad_document_naming_the_task_and_problem_and_stores_nothing(
    org, existing, doc, path, fragments
):
    before = counts()
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document=doc)
    error = _error_for(excinfo.value.errors, path)
    for fragment in fragments:
        assert fragment in error["message"], f"{fragment!r} not in {error['message']!r}"
    # The exception's text carries the same "path: message" line.
    assert f"{path}: {error['message']}" in str(excinfo.value)
    assert counts() == before


def _is_rotation_of_dependency_cycle(cycle: list[str], deps: dict[str, list[str]]) -> bool:
    return cycle[0] == cycle[-1] and all(b in deps[a] for a, b in zip(cycle, cycle[1:], strict=False))


def test_a_cycle_is_rejected_with_the_keys_on_it_in_order(org, existing):
    tasks = [
        noop("a", depends_on=["c"]),
        noop("b", depends_on=["a"]),
        noop("c", depends_on=["b"]),
        noop("d", depends_on=["a"]),  # downstream of the cycle, not on it
        noop("e"),
    ]
    deps = {t["key"]: t.get("depends_on", []) for t in tasks}
    before = counts()
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document={"name": "cyclic", "tasks": tasks})
    (error,) = excinfo.value.errors
    assert error["path"] == "tasks"
    prefix = "dependency cycle: "
    assert error["message"].startswith(prefix)
    cycle = error["message"][len(prefix):].split(" -> ")
    assert len(cycle) == 4
    assert set(cycle) == {"a", "b", "c"}
    assert _is_rotation_of_dependency_cycle(cycle, deps), cycle
    assert " -> ".join(cycle) in {"a -> c -> b -> a", "c -> b -> a -> c", "b -> a -> c -> b"}
    assert counts() == before


def test_a_two_task_cycle_names_both_keys(org, existing):
    before = counts()
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(
            organization=org, document={"name": "pair", "tasks": [noop("p", depends_on=["q"]), noop("q", depends_on=["p"])]}
        )
    assert excinfo.value.errors == [{"path": "tasks", "message": "dependency cycle: p -> q -> p"}]
    assert counts() == before


def test_every_problem_of_a_document_is_reported_at_once(org, existing):
    before = counts()
    doc = {
        "name": "many",
        "tasks": [
            {"key": "a", "type": "shell"},
            {"key": "b", "type": "sleep", "config": {"seconds": "x"}, "depends_on": ["nope"]},
        ],
    }
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document=doc)
    paths = sorted(e["path"] for e in excinfo.value.errors)
    assert paths == ["tasks[a].type", "tasks[b].config", "tasks[b].depends_on"]
    assert counts() == before


def test_a_rejected_document_does_not_consume_a_version_number(org, existing):
    with pytest.raises(DefinitionError):
        apply_definition(organization=org, document={"name": "existing", "tasks": [noop("a", depends_on=["a"])]})
    wf = apply_definition(organization=org, document={"name": "existing", "tasks": [noop("a")]})
    assert wf.version == 2


# --- the management command ---------------------------------------------------------------------


def _write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    if name.endswith((".yaml", ".yml")):
        path.write_text(yaml.safe_dump(doc))
    else:
        path.write_text(json.dumps(doc, indent=2))
    return str(path)


@pytest.mark.parametrize("doc, path, fragments", [c[1:] for c in BAD_DEFINITIONS], ids=[c[0] for c in BAD_DEFINITIONS])
def test_apply_workflow_command_rejects_a_bad_file_with_stderr_naming_the_problem(
    tmp_path, org, existing, doc, path, fragments
):
    filename = _write(tmp_path, "bad.json", doc)
    before = counts()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("apply_workflow", filename, org=org.slug, stdout=out, stderr=err)
    assert str(excinfo.value) == "some definitions were rejected"
    stderr = err.getvalue()
    assert f"{filename}: rejected, nothing stored:" in stderr
    line = next((ln.strip() for ln in stderr.splitlines() if ln.strip().startswith(f"{path}: ")), None)
    assert line is not None, f"no line for {path!r} in stderr:\n{stderr}"
    for fragment in fragments:
        assert fragment in line
    assert out.getvalue() == ""
    assert counts() == before


def test_apply_workflow_command_reports_the_cycle_in_yaml(tmp_path, org, existing):
    filename = _write(
        tmp_path,
        "cycle.yaml",
        {"name": "cyc", "tasks": [noop("a", depends_on=["c"]), noop("b", depends_on=["a"]), noop("c", depends_on=["b"])]},
    )
    before = counts()
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("apply_workflow", filename, org=org.slug, stdout=io.StringIO(), stderr=err)
    assert "tasks: dependency cycle: a -> c -> b -> a" in err.getvalue()
    assert counts() == before


def test_apply_workflow_command_reports_invalid_json_with_line_and_column(tmp_path, org, existing):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  "tasks": [}\n}\n')
    before = counts()
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("apply_workflow", str(path), org=org.slug, stdout=io.StringIO(), stderr=err)
    assert "document: invalid JSON at line 3 column 13" in err.getvalue()
    assert counts() == before


def test_apply_workflow_command_names_an_unknown_organization(tmp_path, existing):
    filename = _write(tmp_path, "ok.json", {"name": "fine", "tasks": [noop("a")]})
    before = counts()
    with pytest.raises(CommandError) as excinfo:
        call_command("apply_workflow", filename, org="no-such-org", stdout=io.StringIO(), stderr=io.StringIO())
    assert "no organization 'no-such-org'" in str(excinfo.value)
    assert counts() == before


def test_apply_workflow_command_names_an_unreadable_file(tmp_path, org, existing):
    missing = str(tmp_path / "missing.json")
    with pytest.raises(CommandError) as excinfo:
        call_command("apply_workflow", missing, org=org.slug, stdout=io.StringIO(), stderr=io.StringIO())
    assert str(excinfo.value).startswith(f"{missing}: cannot read")
    assert "No such file or directory" in str(excinfo.value)


def test_apply_workflow_command_stores_good_files_and_rejects_only_the_bad_one(tmp_path, org, existing):
    good = _write(tmp_path, "good.yaml", {"name": "good", "tasks": [noop("a"), noop("b", depends_on=["a"])]})
    bad = _write(tmp_path, "bad.json", {"name": "bad", "tasks": [noop("a", depends_on=["zzz"])]})
    before = counts()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError):
        call_command("apply_workflow", good, bad, org=org.slug, stdout=out, stderr=err)
    assert f"{good}: good v1" in out.getvalue()
    assert "2 tasks, active" in out.getvalue()
    assert f"{bad}: rejected, nothing stored:" in err.getvalue()
    assert "tasks[a].depends_on: unknown dependency 'zzz'" in err.getvalue()
    assert counts() == {
        "core_workflow": before["core_workflow"] + 1,
        "core_task": before["core_task"] + 2,
        "core_taskdependency": before["core_taskdependency"] + 1,
    }
    assert not Workflow.objects.for_organization(org).filter(name="bad").exists()


def test_apply_workflow_command_applies_a_draft(tmp_path, org):
    filename = _write(tmp_path, "draft.json", {"name": "drafty", "tasks": [noop("a")]})
    out = io.StringIO()
    call_command("apply_workflow", filename, org=org.slug, draft=True, stdout=out, stderr=io.StringIO())
    wf = Workflow.objects.for_organization(org).get(name="drafty")
    assert (wf.version, wf.state) == (1, "draft")
    assert f"drafty v1 ({wf.pk}), 1 tasks, draft" in out.getvalue()


# --- parsing and storing good documents ---------------------------------------------------------


DOC = {
    "name": "etl",
    "description": "extract, transform, load",
    "tasks": [
        {"key": "extract", "type": "noop", "position": {"x": 0, "y": 10}},
        {"key": "clean", "type": "sleep", "config": {"seconds": 0.5}, "depends_on": ["extract"],
         "edge_labels": {"extract": "raw rows"}, "position": {"x": 200, "y": 10}},
        {"key": "load", "type": "noop", "depends_on": ["extract", "clean"], "max_attempts": 3,
         "retry_backoff_seconds": 2, "timeout_seconds": 30, "edge_labels": {"clean": "clean rows"}},
    ],
}


def test_parse_document_reads_json():
    assert parse_document(json.dumps(DOC), filename="etl.json") == DOC
    assert parse_document(json.dumps(DOC)) == DOC


def test_parse_document_reads_yaml_by_extension_and_by_fallback():
    text = yaml.safe_dump(DOC)
    assert not text.lstrip().startswith("{")
    assert parse_document(text, filename="etl.yaml") == DOC
    assert parse_document(text, filename="etl.yml") == DOC
    assert parse_document(text) == DOC  # not JSON, so read as YAML


def test_parse_document_reports_invalid_json_line_and_column():
    with pytest.raises(DefinitionError) as excinfo:
        parse_document('{\n  "name": "x",\n  "tasks": [}\n}\n', filename="wf.json")
    assert excinfo.value.errors == [
        {"path": "document", "message": "invalid JSON at line 3 column 13: Expecting value"}
    ]


def test_parse_document_reports_invalid_yaml():
    with pytest.raises(DefinitionError) as excinfo:
        parse_document("name: x\ntasks: [a, b\n", filename="wf.yaml")
    (error,) = excinfo.value.errors
    assert error["path"] == "document"
    assert error["message"].startswith("invalid YAML:")
    assert "line" in error["message"]


@pytest.mark.parametrize("text", ["[1, 2]", '"just a string"', "42"])
def test_parse_document_rejects_a_non_object(text):
    with pytest.raises(DefinitionError) as excinfo:
        parse_document(text, filename="wf.json")
    assert excinfo.value.errors == [
        {"path": "document", "message": "a definition must be an object with name and tasks"}
    ]


def test_validate_document_writes_nothing_and_normalizes(existing):
    before = counts()
    normalized = validate_document(DOC)
    assert counts() == before
    load = normalized["tasks"][2]
    assert load == {
        "key": "load", "type": "noop", "config": {}, "depends_on": ["extract", "clean"], "max_attempts": 3,
        "retry_backoff_seconds": 2.0, "timeout_seconds": 30.0, "edge_labels": {"clean": "clean rows"},
    }
    assert normalized["tasks"][1]["config"] == {"seconds": 0.5}


def test_applying_stores_tasks_dependencies_edge_labels_and_positions(org):
    wf = apply_definition(organization=org, document=DOC)
    assert (wf.name, wf.version, wf.state, wf.description) == ("etl", 1, "active", "extract, transform, load")
    tasks = {t.key: t for t in Task.objects.for_organization(org).filter(workflow=wf)}
    assert sorted(tasks) == ["clean", "extract", "load"]
    assert (tasks["extract"].position_x, tasks["extract"].position_y) == (0, 10)
    assert (tasks["clean"].position_x, tasks["clean"].position_y) == (200, 10)
    assert (tasks["load"].position_x, tasks["load"].position_y) == (None, None)
    assert tasks["clean"].type == "sleep" and tasks["clean"].config == {"seconds": 0.5}
    assert (tasks["load"].max_attempts, tasks["load"].retry_backoff_seconds, tasks["load"].timeout_seconds) == (
        3, 2.0, 30.0
    )
    assert all(t.organization_id == org.pk for t in tasks.values())
    edges = sorted(
        TaskDependency.objects.for_organization(org)
        .filter(workflow=wf)
        .values_list("depends_on__key", "task__key", "label")
    )
    assert edges == [
        ("clean", "load", "clean rows"),
        ("extract", "clean", "raw rows"),
        ("extract", "load", ""),
    ]
    assert wf.definition["name"] == "etl"
    assert [t["key"] for t in wf.definition["tasks"]] == ["extract", "clean", "load"]


def test_applying_the_same_name_twice_creates_version_two_and_keeps_version_one(org):
    v1 = apply_definition(organization=org, document=DOC)
    changed = {**DOC, "tasks": [*DOC["tasks"], {"key": "report", "type": "noop", "depends_on": ["load"]}]}
    v2 = apply_definition(organization=org, document=changed)
    assert (v1.version, v2.version) == (1, 2)
    assert v1.pk != v2.pk
    assert Task.objects.for_organization(org).filter(workflow=v1).count() == 3
    assert Task.objects.for_organization(org).filter(workflow=v2).count() == 4
    assert TaskDependency.objects.for_organization(org).filter(workflow=v1).count() == 3
    assert TaskDependency.objects.for_organization(org).filter(workflow=v2).count() == 4
    assert list(Workflow.objects.for_organization(org).filter(name="etl").order_by("version").values_list("version", flat=True)) == [1, 2]


def test_versions_are_numbered_per_organization(make_org):
    a, b = make_org(), make_org()
    apply_definition(organization=a, document=DOC)
    apply_definition(organization=a, document=DOC)
    assert apply_definition(organization=b, document=DOC).version == 1


def test_apply_workflow_command_applies_yaml_and_json_files_as_versions(tmp_path, org):
    first = _write(tmp_path, "etl.yaml", DOC)
    second = _write(tmp_path, "etl.json", DOC)
    out = io.StringIO()
    call_command("apply_workflow", first, second, org=org.slug, stdout=out, stderr=io.StringIO())
    versions = list(Workflow.objects.for_organization(org).filter(name="etl").order_by("version").values_list("version", flat=True))
    assert versions == [1, 2]
    assert f"{first}: etl v1" in out.getvalue()
    assert f"{second}: etl v2" in out.getvalue()



# --- values validate_document accepts but the database refuses ----------------------------------
#
# Each of these once passed validate_document() and then failed inside apply_definition()
# with a DataError from the INSERT. They are a DefinitionError naming the field now (NULs
# in text are stripped instead, as seed 001 asks), and nothing is stored either way.

DB_REFUSED = [
    ("sleep-seconds-nan", {"name": "nan", "tasks": [{"key": "a", "type": "sleep", "config": {"seconds": float("nan")}}]},
     "tasks[a].config"),
    ("retry-backoff-nan", {"name": "nanb", "tasks": [noop("a", retry_backoff_seconds=float("nan"))]},
     "tasks[a].retry_backoff_seconds"),
    ("timeout-infinity", {"name": "inf", "tasks": [noop("a", timeout_seconds=float("inf"))]},
     "tasks[a].timeout_seconds"),
    ("edge-label-over-100-chars",
     {"name": "lbl", "tasks": [noop("a"), noop("b", depends_on=["a"], edge_labels={"a": "x" * 101})]},
     "tasks[b].edge_labels"),
    ("position-beyond-int32", {"name": "pos", "tasks": [noop("a", position={"x": 2**40, "y": 0})]},
     "tasks[a].position"),
]


def test_nul_in_description_and_edge_label_is_stripped_and_stored(org):
    wf = apply_definition(
        organization=org,
        document={
            "name": "nul",
            "description": "a\x00b",
            "tasks": [noop("a"), noop("b", depends_on=["a"], edge_labels={"a": "x\x00y"})],
        },
    )
    assert wf.description == "ab"
    assert wf.definition["description"] == "ab"
    assert TaskDependency.objects.for_organization(org).get(workflow=wf).label == "xy"


@pytest.mark.parametrize("doc, path", [c[1:] for c in DB_REFUSED], ids=[c[0] for c in DB_REFUSED])
def test_values_the_database_refuses_store_nothing(org, existing, doc, path):
    before = counts()
    with pytest.raises((DefinitionError, DataError)):
        apply_definition(organization=org, document=doc)
    assert counts() == before
    assert not Workflow.objects.for_organization(org).filter(name=doc["name"]).exists()


@pytest.mark.parametrize("doc, path", [c[1:] for c in DB_REFUSED], ids=[c[0] for c in DB_REFUSED])
def test_values_the_database_refuses_are_a_definition_error_naming_the_field(org, doc, path):
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document=doc)
    assert path in [e["path"] for e in excinfo.value.errors]


def test_apply_workflow_command_rejects_nan_in_a_json_file(tmp_path, org):
    path = tmp_path / "nan.json"
    path.write_text('{"name": "nan", "tasks": [{"key": "a", "type": "sleep", "config": {"seconds": NaN}}]}')
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("apply_workflow", str(path), org=org.slug, stdout=io.StringIO(), stderr=err)
    assert "tasks[a].config" in err.getvalue()


def test_nan_inside_a_python_tasks_params_is_a_definition_error(org):
    before = counts()
    doc = {"name": "nanp", "tasks": [{"key": "a", "type": "python", "config": {
        "callable": "tests.callables.echo", "params": {"x": float("nan")}}}]}
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document=doc)
    assert excinfo.value.errors == [
        {"path": "tasks[a].config", "message": "contains NaN or Infinity, which JSON cannot store"}
    ]
    assert counts() == before


def test_start_run_refuses_nan_input_with_a_clear_error(org, make_workflow):
    from engine.services import start_run

    wf = make_workflow(org, [noop("a")], name="naninput")
    with pytest.raises(ValueError, match="run input is not storable JSON"):
        start_run(workflow=wf, run_input={"x": float("inf")})
    assert not wf.runs.exists()


@pytest.mark.parametrize(
    ("text", "filename"),
    [
        ('{"name": "dup", "tasks": [{"key": "a", "type": "noop", "type": "sleep"}]}', "dup.json"),
        ("name: dup\ntasks:\n  - key: a\n    type: noop\n    type: sleep\n", "dup.yaml"),
    ],
    ids=["json", "yaml"],
)
def test_a_repeated_key_is_an_error_not_last_wins(text, filename):
    with pytest.raises(DefinitionError) as excinfo:
        parse_document(text, filename=filename)
    assert "duplicate key 'type'" in str(excinfo.value)


def test_yaml_aliases_are_refused_so_a_billion_laughs_cannot_expand():
    text = "name: lol\na: &a ['lol', 'lol']\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\ntasks: []\n"
    with pytest.raises(DefinitionError) as excinfo:
        parse_document(text, filename="lol.yaml")
    assert "aliases (*name) are not allowed" in str(excinfo.value)


def test_a_document_nested_too_deeply_is_a_definition_error():
    with pytest.raises(DefinitionError) as excinfo:
        parse_document("[" * 100_000 + "]" * 100_000, filename="deep.json")
    assert "nested too deeply" in str(excinfo.value)
    with pytest.raises(DefinitionError):
        parse_document("a: " + "[" * 100_000, filename="deep.yaml")


def _errors_of(doc) -> list[dict[str, str]]:
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(doc)
    return excinfo.value.errors


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("has space", "'has space' is not a valid key: use 1-100 letters, digits, '_', '-' or '.'"),
        ("x" * 101, f"{'x' * 101!r} is not a valid key: use 1-100 letters, digits, '_', '-' or '.'"),
        (5, "5 is not a valid key: use 1-100 letters, digits, '_', '-' or '.'"),
    ],
    ids=["space", "too-long", "not-a-string"],
)
def test_an_invalid_task_key_is_shown_and_not_called_required(key, message):
    errors = _errors_of({"name": "keys", "tasks": [noop("a"), {"key": key, "type": "noop"}]})
    assert errors == [{"path": "tasks[1].key", "message": message}]


@pytest.mark.parametrize("task", [{"type": "noop"}, {"key": "", "type": "noop"}, {"key": None, "type": "noop"}],
                         ids=["absent", "empty", "null"])
def test_a_missing_task_key_is_reported_as_required(task):
    errors = _errors_of({"name": "keys", "tasks": [noop("a"), task]})
    assert errors == [{"path": "tasks[1].key", "message": "required: 1-100 letters, digits, '_', '-' or '.'"}]


def test_a_dependency_listed_twice_is_named():
    errors = _errors_of({"name": "deps", "tasks": [noop("n"), noop("m"), noop("a", depends_on=["n", "m", "n"])]})
    assert errors == [{"path": "tasks[a].depends_on", "message": "lists dependency 'n' twice"}]


def test_every_repeated_dependency_is_named_with_its_count():
    errors = _errors_of(
        {"name": "deps", "tasks": [noop("n"), noop("m"), noop("a", depends_on=["m", "n", "m", "n", "m"])]}
    )
    assert errors == [
        {"path": "tasks[a].depends_on", "message": "lists dependency 'm' 3 times"},
        {"path": "tasks[a].depends_on", "message": "lists dependency 'n' twice"},
    ]


def test_config_for_a_type_that_takes_none_says_so():
    errors = _errors_of({"name": "noopcfg", "tasks": [noop("a", config={"x": 1})]})
    assert errors == [
        {"path": "tasks[a].config", "message": "noop task: unknown field(s) 'x'; this task type takes no config"}
    ]
