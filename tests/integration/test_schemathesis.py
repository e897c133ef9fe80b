"""Property-based testing of the whole REST API against its own OpenAPI document.

A real gunicorn (flowforge.stack, the command a deployment runs) serves the test
database; organizations with data and owner API keys are created first; then
schemathesis (CLI, fixed seed, a bounded number of examples per operation, the
examples, coverage and fuzzing phases) calls every operation of /api/schema/ with
generated valid and invalid input and checks that no response is a 5xx and that
every response matches the schema documented for its status.

Excluded, with the reason (nothing else is):

- ``GET /api/v1/runs/{id}/events/stream/`` (``runs_events_stream``): a server-sent
  event stream that stays open until the run finishes — up to an hour, and the runs
  here never finish (no worker runs) — while schemathesis reads a response to its
  end; a stream held open would also occupy one of gunicorn's two sync workers.
  The stream has its own tests.

Run in passes of their own after the main one, each with a fresh organization
(SEPARATE_PASSES), because they take the run's credentials away: schemathesis reuses
ids it saw in earlier responses, so it revokes the very key it authenticates with
(``GET /api-keys/`` lists it), or promotes a colleague and then demotes or removes
the key's creator, and from then on every request is a 401 or 403 that tests
nothing (a first version of this test lost 5,700 of its 6,500 requests that way):

- ``members_partial_update`` and ``members_destroy``, with an owner API key, each
  beside ``members_list`` to learn real ids from;
- ``api_keys_revoke`` (beside ``api_keys_list``) with the owner's browser session
  (cookie and CSRF token), which revoking keys cannot end;
- ``api_keys_create`` with that session too: an API key may not create keys, so with
  a key it would only ever be a 403;
- the worker API (``worker_*``) with a worker key, the only kind it serves (every other
  key gets 403), beside runs of a workflow with worker tasks on the examples' queue;
  polls wait at most FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS, 0.2 s here.

The stateful phase is not run: the document declares no OpenAPI links, and the
inferred ones would chain the same self-destruction.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engine.services import apply_definition, start_run
from engine.triggers import create_trigger
from flowforge.stack import bin_path, wait_until
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role, User
from tenancy.services import create_organization, invite_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SEED = 20260115
# Per operation, in each of the coverage and fuzzing phases: 30 in make test (its time
# budget), more with `make fuzz` (SCHEMATHESIS_EXAMPLES, 300 there).
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "30"))
PHASES = "examples,coverage,fuzzing"
CHECKS = "not_a_server_error,response_schema_conformance"
EXCLUDED_OPERATIONS = {
    "runs_events_stream": "server-sent events: open until the run finishes (see the module docstring)",
}
# Operations run in passes of their own, after the main one, each with a fresh organization:
# name -> (the operations of the pass, "key" or "session" authentication). A pass includes the
# list its operation learns real ids from. Why each is separate: see the module docstring.
SEPARATE_PASSES: dict[str, tuple[tuple[str, ...], str]] = {
    "members_partial_update": (("members_partial_update", "members_list"), "key"),
    "members_destroy": (("members_destroy", "members_list"), "key"),
    "api_keys_create": (("api_keys_create",), "session"),
    "api_keys_revoke": (("api_keys_revoke", "api_keys_list"), "session"),
    "worker_poll": (("worker_poll", "worker_heartbeat", "worker_logs", "worker_complete", "worker_fail"), "worker"),
}
# The worker API's operations: only in their pass (with any other key they are a 403 each).
WORKER_OPERATIONS = set(SEPARATE_PASSES["worker_poll"][0])
# Seconds any one schemathesis invocation may take before the test gives up on it (not a speed
# target: the figures it prints are its timing).
INVOCATION_TIMEOUT_SECONDS = 600  # a hang guard: a loaded 2-core machine took over 240 s for the main pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_organization(slug: str) -> str:
    """An organization with workflows (one named as in the schema's examples), a run,
    a trigger, a member, a pending invitation and a second key; returns the owner's
    full API key."""
    org, owner, _ = create_organization(slug=slug, name=slug.title(), owner_email=f"owner@{slug}.example")
    owner_m = Membership.objects.for_organization(org).select_related("organization", "user").get(user=owner)
    actor = actor_for_membership(owner_m, channel="cli")
    colleague = User.objects.create_user(email=f"colleague@{slug}.example")
    Membership.objects.create(organization=org, user=colleague, role=Role.MEMBER)
    for name in ("nightly-report", "etl"):
        workflow = apply_definition(actor=actor, document={
            "name": name, "tasks": [{"key": "extract", "type": "noop"},
                                    {"key": "load", "type": "noop", "depends_on": ["extract"]}]})
    start_run(workflow=workflow, actor=actor)
    create_trigger(actor=actor, data={"name": "hourly", "workflow_name": "etl", "cron_expression": "0 * * * *"})
    invite_member(actor=actor, email=f"invitee@{slug}.example", role=Role.VIEWER)
    create_api_key(actor=actor, name="spare", role=Role.MEMBER)
    _row, full_key = create_api_key(actor=actor, name="fuzz", role=Role.OWNER)
    return full_key


def seed_worker_tasks(slug: str) -> str:
    """Runs of a workflow whose worker tasks wait on the queue the schema's examples poll
    ("images") in ``slug``'s organization; returns a new worker key of it."""
    from tenancy.models import KeyRole

    org = Membership.objects.unscoped().select_related("organization").filter(
        organization__slug=slug, role=Role.OWNER).first().organization
    owner_m = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    actor = actor_for_membership(owner_m, channel="cli")
    workflow = apply_definition(actor=actor, document={"name": "thumbnails", "tasks": [
        {"key": f"resize{i}", "type": "worker", "config": {"queue": "images", "name": "resize"}} for i in range(5)]})
    for _ in range(20):
        start_run(workflow=workflow, actor=actor)
    return create_api_key(actor=actor, name="fuzz workers", role=KeyRole.WORKER)[1]


def session_headers(slug: str) -> list[str]:
    """Headers of a signed-in browser session of ``slug``'s owner (session row in the
    database, CSRF cookie and header), as ``--header`` arguments."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    user = User.objects.get(email=f"owner@{slug}.example")
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    csrf = "c" * 32
    return ["--header", f"Cookie: {settings.SESSION_COOKIE_NAME}={session.session_key}; "
            f"{settings.CSRF_COOKIE_NAME}={csrf}", "--header", f"X-CSRFToken: {csrf}"]


def run_schemathesis(schema_url: str, auth: list[str], report: Path, selection: list[str]) -> tuple[int, str, dict]:
    """Run the CLI over the operations ``selection`` picks; returns (exit code, output, JSON report)."""
    argv = [
        bin_path("schemathesis"), "run", schema_url,
        *auth,
        "--checks", CHECKS,
        "--phases", PHASES,
        "--seed", str(SEED),
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-database", "none",
        "--workers", "2",
        "--request-timeout", "20",
        "--suppress-health-check", "all",
        "--no-color",
        "--report", "json", "--report-json-path", str(report),
        *selection,
    ]
    # cwd: schemathesis keeps a cache of past failures in ./.schemathesis, which would make runs
    # depend on earlier ones (and litter the checkout).
    result = subprocess.run(argv, capture_output=True, text=True, timeout=INVOCATION_TIMEOUT_SECONDS, check=False,
                            cwd=report.parent)
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, result.stdout + result.stderr, data


def test_every_operation_survives_schemathesis_without_5xx_or_schema_violations(stack, tmp_path):
    auth = {}
    for i, name in enumerate(("main", *SEPARATE_PASSES)):
        slug = f"fuzz-{i}"
        full_key = seed_organization(slug)
        kind = SEPARATE_PASSES[name][1] if name in SEPARATE_PASSES else "key"
        if kind == "worker":
            full_key = seed_worker_tasks(slug)
        auth[name] = (["--header", f"Authorization: Bearer {full_key}"] if kind in ("key", "worker")
                      else session_headers(slug))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # A run would otherwise spend an owner key's per-minute budget in seconds.
    stack.env["FLOWFORGE_API_RATE_LIMIT_PER_MINUTE"] = "1000000"
    stack.env["FLOWFORGE_API_KEY_FAILURES_PER_MINUTE"] = "0"  # fuzzed auth headers fail on purpose
    stack.env["FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS"] = "0.2"  # a fuzzed poll waits for nothing long
    web = stack.start_web(bind=f"127.0.0.1:{port}")

    def schema_served():
        if not web.alive():
            raise RuntimeError(f"gunicorn exited: {web.log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{base}/api/schema/?format=json", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(schema_served, timeout=30, interval=0.2, what="gunicorn to serve /api/schema/")
    schema_url = f"{base}/api/schema/?format=json"
    operation_ids = {
        op["operationId"]
        for item in httpx.get(schema_url).json()["paths"].values()
        for op in item.values() if isinstance(op, dict) and "operationId" in op
    }
    separately = {op for ops, _kind in SEPARATE_PASSES.values() for op in ops}
    main_excludes = {*EXCLUDED_OPERATIONS, *SEPARATE_PASSES, *WORKER_OPERATIONS}
    assert separately | main_excludes <= operation_ids, "an operation named here no longer exists"

    passes = {"main": [arg for op in sorted(main_excludes) for arg in ("--exclude-operation-id", op)]}
    for name, (ops, _kind) in SEPARATE_PASSES.items():
        passes[name] = [arg for op in ops for arg in ("--include-operation-id", op)]
    started = time.monotonic()
    outcomes = {}
    for name, selection in passes.items():
        code, output, data = run_schemathesis(schema_url, auth[name], Path(tmp_path) / f"{name}.json", selection)
        outcomes[name] = (code, output, data)
        if code != 0:
            print(output[-8000:])
        cases = data.get("test_cases", {})
        print(f"[{name}] exit {code}: {data.get('operations', {}).get('tested')} operations, "
              f"{cases.get('generated')} test cases, {cases.get('unique_failures')} unique failures, "
              f"{data.get('running_time', 0):.0f} s; warnings: "
              f"{ {k: v for k, v in data.get('warnings', {}).items() if v} }")
    print(f"schemathesis took {time.monotonic() - started:.0f} s in all")

    failed = {name: output[-6000:] for name, (code, output, _d) in outcomes.items() if code != 0}
    assert not failed, "\n\n".join(f"==== {name} ====\n{out}" for name, out in failed.items())
    tested = {name: data.get("operations", {}).get("tested") for name, (_c, _o, data) in outcomes.items()}
    assert tested == {"main": len(operation_ids) - len(main_excludes),
                      **{name: len(ops) for name, (ops, _kind) in SEPARATE_PASSES.items()}}, tested
    # Every pass kept its credentials long enough to test something (not only 401/403).
    for name, (_c, _o, data) in outcomes.items():
        assert not data.get("warnings", {}).get("missing_auth"), (name, data["warnings"]["missing_auth"])
    assert "Traceback" not in web.log_path.read_text(), "the web process logged a traceback"
