"""Per-attempt logs and tracebacks with real Dramatiq worker processes (issue 19): what a
python task logs, prints and raises, attempt by attempt, through the API's task detail;
the cap and its truncation line; a secret's value redacted from every line; a running
attempt's lines readable before it ends; the http task's request summary."""

from __future__ import annotations

import re
import secrets as pysecrets

import pytest
from django.test import Client

from engine.models import TaskRun
from engine.services import apply_definition, start_run
from flowforge.stack import wait_until
from tenancy import vault
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tests.echo_server import echo_server
from tests.integration.conftest import wait_for_run_terminal
from tests.unit.test_api_auth import actor_of, bearer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Api:
    """The organization's API as a viewer key sees it (Django's test client in this process,
    on the database the workers write)."""

    def __init__(self, org):
        owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
        self.owner = owner
        _row, self.key = create_api_key(actor=owner, name="reader", role=Role.VIEWER)
        self.client = Client()

    def get(self, path: str):
        response = self.client.get(path, headers=bearer(self.key))
        assert response.status_code == 200, response.content
        return response.json()

    def task(self, run, key: str) -> dict:
        tr = TaskRun.objects.for_organization(run.organization_id).get(workflow_run=run, task__key=key)
        return self.get(f"/api/v1/runs/{run.pk}/task-runs/{tr.pk}/")


def lines(attempt: dict) -> list[tuple[str, str, str]]:
    return [(line["stream"], line["level"], line["message"]) for line in attempt["logs"]["lines"]]


def test_a_python_task_that_logs_prints_and_raises_shows_its_lines_and_full_traceback_through_the_api(stack, org):
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    api = Api(org)
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    vault.set_secret(actor=api.owner, name="WAREHOUSE", value=value)
    wf = apply_definition(organization=org, document={"name": "nightly", "tasks": [
        {"key": "extract", "type": "noop"},
        {"key": "load", "type": "python", "depends_on": ["extract"], "max_attempts": 2, "retry_backoff_seconds": 0,
         "config": {"callable": "tests.callables.log_print_raise", "params": {"secret": "{{ secrets.WAREHOUSE }}"}}},
    ]})
    run = start_run(workflow=wf, run_input={"rows": 31})
    assert wait_for_run_terminal(run, timeout=60) == "failed"

    detail = api.task(run, "load")
    assert (detail["state"], len(detail["attempts"])) == ("failed", 2)
    assert [a["outcome"] for a in detail["attempts"]] == ["retried", "failed"]
    for number, attempt in enumerate(detail["attempts"], start=1):
        assert attempt["attempt"] == number and attempt["worker"].startswith("worker@")
        assert lines(attempt) == [
            ("logging", "warning", "tests.callables: connecting with token [redacted]"),
            ("stdout", "info", f"attempt {number} printed this"),
            ("stderr", "warning", "to stderr"),
        ]
        assert attempt["error"] == "ValueError: no rows left after 31 tries"
        trace = attempt["traceback"]
        assert trace.startswith("Traceback (most recent call last):\n")
        # The whole stack, from the handler down to the frame that raised.
        assert re.findall(r", in (\w+)\n", trace) == ["log_print_raise", "_outer_step", "_inner_step"]
        assert 'raise ValueError(f"no rows left after {rows} tries")' in trace
        # The organization's frames only, their paths relative: no server path for a viewer.
        assert set(re.findall(r'File "([^"]+)"', trace)) == {"tests/callables.py"}
        assert trace.endswith("ValueError: no rows left after 31 tries\n")
    # The input as configured names the secret; its value is nowhere in the answer.
    assert detail["config"]["params"] == {"secret": "{{ secrets.WAREHOUSE }}"}
    assert detail["upstream"][0]["key"] == "extract" and detail["upstream"][0]["state"] == "succeeded"
    body = api.client.get(f"/api/v1/runs/{run.pk}/task-runs/{detail['id']}/", headers=bearer(api.key)).content
    assert value.encode() not in body
    logs = api.get(f"/api/v1/runs/{run.pk}/task-runs/{detail['id']}/logs/?attempt=2")["results"]
    assert [line["message"] for line in logs] == [m for _s, _l, m in lines(detail["attempts"][1])]


def test_an_attempts_log_capped_at_the_limit_says_it_was_truncated(stack, org):
    stack.env["FLOWFORGE_TASK_LOG_MAX_LINES"] = "50"
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    api = Api(org)
    wf = apply_definition(organization=org, document={"name": "chatty", "tasks": [
        {"key": "talk", "type": "python", "config": {"callable": "tests.callables.chatty",
                                                      "params": {"lines": 300, "width": 30}}}]})
    run = start_run(workflow=wf)
    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    (attempt,) = api.task(run, "talk")["attempts"]
    kept = lines(attempt)
    assert [m[:6] for s, _l, m in kept if s == "stdout"] == [f"{i:06d}" for i in range(50)]
    assert [(s, lvl, m) for s, lvl, m in kept if s == "system"] == [
        ("system", "warning", "log truncated: this attempt's log reached its limit of 50 lines "
                              "(FLOWFORGE_TASK_LOG_MAX_LINES); later lines are dropped"),
        ("system", "warning", "log truncated: 250 more lines (7.3 KiB) of this attempt were dropped"),
    ]
    assert len(kept) == 52


def test_a_running_attempts_lines_can_be_read_before_it_ends(stack, org):
    stack.env["FLOWFORGE_TASK_LOG_FLUSH_SECONDS"] = "0.2"
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    api = Api(org)
    wf = apply_definition(organization=org, document={"name": "slow", "tasks": [
        {"key": "tick", "type": "python", "config": {"callable": "tests.callables.slow_logger",
                                                      "params": {"seconds": 4, "every": 0.1}}}]})
    run = start_run(workflow=wf)

    def lines_while_running():
        detail = api.task(run, "tick")
        attempts = detail["attempts"]
        if detail["state"] == "running" and attempts and len(attempts[0]["logs"]["lines"]) >= 3:
            return attempts[0]
        assert detail["state"] in ("ready", "running"), detail["state"]  # it must not have ended yet
        return None

    running = wait_until(lines_while_running, timeout=20, interval=0.1, what="lines of the running attempt")
    assert running["outcome"] == "running" and running["finished_at"] is None
    assert [m for _s, _l, m in lines(running)][:3] == [f"tests.callables.slow: tick {n}" for n in (1, 2, 3)]
    assert wait_for_run_terminal(run, timeout=30) == "succeeded"
    (attempt,) = api.task(run, "tick")["attempts"]
    ticks = [int(m.rsplit(" ", 1)[1]) for _s, _l, m in lines(attempt)]
    assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) >= 30  # every line, in order


def test_the_http_task_leaves_a_request_summary_with_its_secret_redacted(stack, org, settings):
    # The echo server is on loopback: allowed, as a deployment's own network would be.
    stack.env["FLOWFORGE_EGRESS_ALLOW"] = "127.0.0.1/32"
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    api = Api(org)
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    vault.set_secret(actor=api.owner, name="API_KEY", value=value)
    with echo_server() as echo:
        wf = apply_definition(organization=org, document={"name": "fetch", "tasks": [
            {"key": "get", "type": "http", "config": {"url": f"{echo.url}/items?api_key={{{{ secrets.API_KEY }}}}"}},
            {"key": "missing", "type": "http", "config": {"url": f"{echo.url}/status/404"}}]})
        run = start_run(workflow=wf)
        assert wait_for_run_terminal(run, timeout=60) == "failed"
        assert any(value in seen["path"] for seen in echo.received)  # the request carried the value
    ((stream, level, summary),) = lines(api.task(run, "get")["attempts"][0])
    assert (stream, level) == ("http", "info")
    assert re.fullmatch(rf"GET {re.escape(echo.url)}/items\?api_key=\[redacted\] -> 200 OK, \d+ bytes in \d+ ms",
                        summary), summary
    ((stream, level, summary),) = lines(api.task(run, "missing")["attempts"][0])
    assert (stream, level) == ("http", "warning")
    assert summary.startswith(f"GET {echo.url}/status/404 -> 404 Not Found, ")
