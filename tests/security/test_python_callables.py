"""Issue 14, finding 1: a ``python`` task may call only functions the deployment registered.

Each test is the attack: a member applying a definition through the API, a viewer sending it
to /api/v1/workflows/validate/, a stored task run after the registry shrank, a deployment
started with default settings. Unless a test says otherwise, the registry is the deployment
default (the callables of the shipped examples/ workflows), not the suite's own additions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import TaskRun, Workflow
from engine.services import start_run
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import new_api_factory
from tests.unit.test_runtime_inprocess import broker, drive, quiet_heartbeater  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]

# What a deployment registers by default: exactly the callables the shipped examples name.
EXAMPLE_CALLABLES = sorted(
    {m for f in (ROOT / "examples").glob("*.y*ml") for m in re.findall(r"callable:\s*([\w.]+)", f.read_text())}
)

ATTACKS = [
    # A test helper that SIGKILLs the worker running it (took the whole pool down).
    "tests.faults.tasks.kill_own_worker",
    # A pytest hook that deletes the broker namespace's keys.
    "tests.conftest.pytest_sessionfinish",
    # Attributes of an allowed module that are not its task functions.
    "examples.penguins.tasks.Path",
    "examples.penguins.tasks.__class__",
    # A real function of the examples' module that nobody registered.
    "examples.penguins.tasks.render_report",
    "os.system",
]


@pytest.fixture
def deployment_callables(settings):
    """The registry a deployment has with default settings."""
    settings.FLOWFORGE_TASK_CALLABLES = list(EXAMPLE_CALLABLES)


@pytest.fixture
def api(make_org, deployment_callables):
    yield from new_api_factory(make_org)


def python_task(name: str) -> dict:
    return {"name": "attack", "tasks": [{"key": "t", "type": "python", "config": {"callable": name}}]}


def assert_refused(response, name: str) -> None:
    body = assert_problem(response, 400)
    assert body["errors"] == [{
        "path": "tasks[t].config",
        "message": f"python task: 'callable' {name!r} is not a registered task callable; the deployment's "
                   f"operator registers functions by full dotted name in FLOWFORGE_TASK_CALLABLES",
    }], body


def test_the_example_callables_are_what_the_default_registry_holds():
    assert EXAMPLE_CALLABLES and all(n.startswith("examples.penguins.tasks.") for n in EXAMPLE_CALLABLES)


@pytest.mark.parametrize("name", ATTACKS)
def test_a_member_cannot_apply_a_definition_calling_an_unregistered_name(api, name):
    member_api = api()
    response = member_api.post("/api/v1/workflows/", python_task(name), role=Role.MEMBER)
    assert_refused(response, name)
    assert not Workflow.objects.for_organization(member_api.org).exists()


@pytest.mark.parametrize("name", ATTACKS)
def test_a_viewer_validating_a_definition_is_refused_the_unregistered_name(api, name):
    response = api().post("/api/v1/workflows/validate/", python_task(name), role=Role.VIEWER)
    assert_refused(response, name)


def test_a_registered_example_callable_is_accepted(api):
    name = "examples.penguins.tasks.extract"
    response = api().post("/api/v1/workflows/validate/", python_task(name), role=Role.VIEWER)
    assert response.status_code == 200, response.content
    assert response.json()["normalized"]["tasks"][0]["config"] == {"callable": name, "params": {}}


def test_validation_imports_nothing(api):
    module = "tests.security.never_imported"
    assert module not in sys.modules
    name = f"{module}.tripwire"
    assert_refused(api().post("/api/v1/workflows/validate/", python_task(name), role=Role.VIEWER), name)
    assert module not in sys.modules, "validating a definition imported the module it names"


def test_a_callable_name_of_any_length_is_not_echoed_unbounded(api):
    name = "examples." + "a" * 5000
    body = assert_problem(api().post("/api/v1/workflows/validate/", python_task(name), role=Role.VIEWER), 400)
    assert body["errors"] == [{"path": "tasks[t].config",
                               "message": "python task: 'callable' is 5009 characters long; at most 255"}]


@pytest.mark.django_db(transaction=True)
def test_a_stored_task_whose_callable_was_unregistered_fails_at_once_without_running(
        org, make_workflow, broker, settings):  # noqa: F811  (fixture)
    # Registered by the suite when the definition is stored, then a deployment without it runs it.
    wf = make_workflow(org, [{"key": "t", "type": "python", "config": {"callable": "tests.callables.echo"},
                              "max_attempts": 3, "retry_backoff_seconds": 0}], name="shrunk")
    settings.FLOWFORGE_TASK_CALLABLES = list(EXAMPLE_CALLABLES)
    run = start_run(workflow=wf)
    assert drive(run.pk) == [("t", 1, "failed")]  # permanent: no second attempt
    task_run = TaskRun.objects.unscoped().get(workflow_run_id=run.pk)
    assert task_run.state == "failed" and task_run.output is None
    assert "'tests.callables.echo' is no longer a registered task callable" in task_run.error


def _start(env_overrides: dict[str, str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the DEPLOYMENT's settings (flowforge.settings),
    the environment of this suite minus any registry override, plus ``env_overrides``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLOWFORGE_TASK_CALLABLES", "FLOWFORGE_PYTHON_TASK_ALLOWLIST", "DEBUG")}
    env.update(DJANGO_SETTINGS_MODULE="flowforge.settings", **env_overrides)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_with_default_settings_nothing_under_tests_is_registered_or_imported():
    code = (
        "import json, sys, django; django.setup()\n"
        "from engine.handlers import callables\n"
        "print(json.dumps({'registered': callables.registered_names(),\n"
        "  'tests_modules': sorted(m for m in sys.modules if m == 'tests' or m.startswith('tests.'))}))\n"
    )
    proc = _start({}, code)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["registered"] == EXAMPLE_CALLABLES
    assert not [n for n in out["registered"] if n.startswith("tests.")]
    assert out["tests_modules"] == []


@pytest.mark.parametrize(("entry", "why"), [
    ("examples.penguins.tasks.Path", "is a class"),
    ("examples.penguins.tasks.__class__", "is a class"),
    ("os.system", "is a builtin"),
    ("examples.penguins.tasks.os", "is a module"),
    ("os.path.join", "is the function posixpath.join; register it under that name"),
    ("examples.penguins.tasks.no_such_function", "has no 'no_such_function'"),
])
def test_a_deployment_registering_something_other_than_a_plain_function_does_not_start(entry, why):
    proc = _start({"FLOWFORGE_TASK_CALLABLES": f"examples.penguins.tasks.extract,{entry}"},
                  "import django; django.setup()")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: FLOWFORGE_TASK_CALLABLES entry "
                           f"{entry!r}"), proc.stderr
    assert why in last


def test_the_former_prefix_allowlist_stops_start_up_saying_what_to_set_instead():
    proc = _start({"FLOWFORGE_PYTHON_TASK_ALLOWLIST": "examples.,tests."}, "import django; django.setup()")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "FLOWFORGE_PYTHON_TASK_ALLOWLIST is no longer supported" in last
    assert "FLOWFORGE_TASK_CALLABLES" in last
