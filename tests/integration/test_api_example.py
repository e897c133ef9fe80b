"""docs/examples/quickstart.py, run as a subprocess against a real gunicorn, a Dramatiq
worker and the clock: it defines a workflow, starts a run idempotently, follows the
run's server-sent events to the end and exits 0 with the run succeeded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine.models import IdempotencyKey, WorkflowRun
from flowforge.stack import BASE_DIR, wait_until
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCRIPT = Path(BASE_DIR) / "docs" / "examples" / "quickstart.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_quickstart_example_runs_to_success_against_a_real_server(stack, org):
    owner = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    _row, key = create_api_key(actor=actor_for_membership(owner, channel="cli"), name="quickstart", role=Role.MEMBER)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    stack.start_web(bind=f"127.0.0.1:{port}")

    def web_up():
        try:
            return httpx.get(f"{base_url}/api/v1/runs/", headers={"Authorization": f"Bearer {key}"},
                             timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(web_up, timeout=30, interval=0.2, what="gunicorn to serve the API")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_"))}
    env.update(FLOWFORGE_URL=base_url, FLOWFORGE_API_KEY=key, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=BASE_DIR)
    print(done.stdout)
    print(done.stderr, file=sys.stderr)

    assert done.returncode == 0, (done.stdout, done.stderr)
    (run,) = WorkflowRun.objects.for_organization(org)  # the idempotent retry started nothing more
    assert run.state == "succeeded"
    assert f"run {run.pk} finished: succeeded" in done.stdout
    assert "run_finished" in done.stdout
    assert IdempotencyKey.objects.for_organization(org).get().workflow_run_id == run.pk


def run_quickstart(**env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "FLOWFORGE_"))}
    env.update(env_vars)
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60,
                          cwd=BASE_DIR)


def test_the_quickstart_without_an_api_key_says_which_variable_to_set_and_exits_3():
    done = run_quickstart(FLOWFORGE_URL=f"http://127.0.0.1:{free_port()}")
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (
        "error: FLOWFORGE_API_KEY is not set; set it to an API key of the member role or higher "
        "(ffk_..., from 'manage.py createapikey <org> --name quickstart')\n"
    )


def test_the_quickstart_names_the_address_it_could_not_reach_and_exits_3():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = run_quickstart(FLOWFORGE_URL=url + "/", FLOWFORGE_API_KEY="ffk_aaaaaaaaaaaa_" + "b" * 43)
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (
        f"error: could not talk to FlowForge at {url} ([Errno 111] Connection refused); "
        "is the server running? Set FLOWFORGE_URL to its address\n"
    )
