"""Issue 14, finding 6: configuration that is unsafe in production refuses to start.

With DEBUG off, every process (web, worker, clock, manage.py) loads flowforge/settings.py
first; a missing, default, placeholder or weak SECRET_KEY must stop it there with a message
that says what to set. /metrics is not for outsiders unless made public on purpose.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parents[2]
DEV_DEFAULT = "dev-insecure-flowforge-secret-key-change-me-in-production"
GOOD_KEY = "kX2v9Qz4Lm7Rt1Wy8Bn3Hc6Jd0Fs5Gp2Ae7Ui4Oo1Pl9Kj3Mh6Ng0Bv5Cx8Zq2W"
HOW_TO = 'python -c "import secrets; print(secrets.token_urlsafe(50))"'
# The other keys a process with DEBUG off refuses to start without (tests/security/test_audit_chain.py,
# test_mfa_secrets.py and below test their refusals); here they are valid, so only SECRET_KEY decides.
OTHER_PRODUCTION_KEYS = {
    "FLOWFORGE_AUDIT_KEYS": "k1:" + base64.b64encode(bytes(range(32))).decode(),
    "FLOWFORGE_ENCRYPTION_KEYS": base64.urlsafe_b64encode(bytes(range(32, 64))).decode(),
    "FLOWFORGE_SECRET_KEYS": base64.urlsafe_b64encode(bytes(range(64, 96))).decode(),
}


def start(argv: list[str], secret_key: str | None, *, debug: str = "false") -> subprocess.CompletedProcess:
    """Start ``argv`` as a deployment would: flowforge.settings, DEBUG as given, SECRET_KEY
    set to ``secret_key`` (absent when None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    env.update(DJANGO_SETTINGS_MODULE="flowforge.settings", DEBUG=debug, **OTHER_PRODUCTION_KEYS)
    if secret_key is not None:
        env["SECRET_KEY"] = secret_key
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


SETUP = [sys.executable, "-c", "import django; django.setup()"]
BAD_KEYS = {
    "missing": (None, "SECRET_KEY is not set"),
    "empty": ("", "SECRET_KEY is not set"),
    "settings-default": (DEV_DEFAULT, "SECRET_KEY is the development default"),
    "compose-change-me": ("change-me", "SECRET_KEY is the placeholder 'change-me'"),
    "short": ("x7Fq2LpW9zR4tB8n", "SECRET_KEY is 16 characters long; at least 50 are needed"),
    "few-distinct": ("ab" * 40, "SECRET_KEY has 2 distinct characters; at least 5 are needed"),
    "django-insecure": ("django-insecure-" + GOOD_KEY, "a key Django generated for development"),
}


@pytest.mark.parametrize("case", BAD_KEYS)
def test_a_production_start_with_an_unsafe_secret_key_stops_saying_what_to_set(case):
    key, why = BAD_KEYS[case]
    proc = start(SETUP, key)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: SECRET_KEY"), proc.stderr
    assert why in last and "DEBUG is off" in last and HOW_TO in last
    if key:
        assert key not in proc.stderr.replace(why, "")  # the refused key itself is never printed


@pytest.mark.parametrize("argv", [
    [sys.executable, "manage.py", "check"],  # also what run_clock and gunicorn's app loading go through
    [sys.executable, "-c", "import flowforge.worker"],  # the module `dramatiq flowforge.worker` imports
], ids=["manage.py", "worker"])
def test_the_clock_and_worker_entry_points_refuse_the_compose_placeholder(argv):
    proc = start(argv, "change-me")
    assert proc.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is the placeholder 'change-me'" in proc.stderr


def test_a_production_start_with_a_real_secret_key_starts():
    proc = start([sys.executable, "manage.py", "check"], GOOD_KEY)
    assert proc.returncode == 0, proc.stderr
    # Its one remark is the mail warning (no EMAIL_HOST here): nothing about SECRET_KEY.
    assert "System check identified 1 issue" in proc.stderr
    assert "frontend.W001" in proc.stderr and "SECRET_KEY" not in proc.stderr


def test_development_keeps_its_default_key():
    proc = start([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                  "print(settings.SECRET_KEY)"], None, debug="true")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == DEV_DEFAULT


# --- /metrics ---------------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(DEBUG=False, FLOWFORGE_METRICS_TOKEN="", FLOWFORGE_METRICS_PUBLIC=False)
def test_an_outsider_gets_403_from_metrics_when_no_token_is_configured():
    response = Client().get("/metrics")
    assert response.status_code == 403
    body = response.content.decode()
    assert "FLOWFORGE_METRICS_TOKEN" in body and "FLOWFORGE_METRICS_PUBLIC=true" in body
    assert "flowforge_" not in body


@pytest.mark.django_db
@override_settings(DEBUG=False, FLOWFORGE_METRICS_TOKEN="right-metrics-token-4f1c", FLOWFORGE_METRICS_PUBLIC=False)
def test_metrics_with_a_token_answer_only_the_right_bearer():
    assert Client().get("/metrics").status_code == 401
    wrong = Client().get("/metrics", headers={"Authorization": "Bearer wrong-metrics-token-0000"})
    assert wrong.status_code == 401 and b"flowforge_" not in wrong.content
    right = Client().get("/metrics", headers={"Authorization": "Bearer right-metrics-token-4f1c"})
    assert right.status_code == 200
    assert b"flowforge_ready_queue_depth" in right.content


@pytest.mark.django_db
@override_settings(DEBUG=False, FLOWFORGE_METRICS_TOKEN="", FLOWFORGE_METRICS_PUBLIC=True)
def test_metrics_made_public_explicitly_answer_anyone():
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert b"flowforge_ready_queue_depth" in response.content


def test_a_production_process_with_default_metrics_settings_refuses_an_outsider():
    env_free = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_METRICS_")}
    code = ("import django; django.setup(); from django.test import Client; "
            "r = Client().get('/metrics'); print(r.status_code)")
    env = dict(env_free, DJANGO_SETTINGS_MODULE="flowforge.settings", DEBUG="false", SECRET_KEY=GOOD_KEY,
               **OTHER_PRODUCTION_KEYS)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "403"
