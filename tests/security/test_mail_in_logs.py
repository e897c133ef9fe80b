"""Finding 7e of issue 14: with DEBUG off and no EMAIL_HOST, the console mail backend
printed whole emails to the web log — invitation accept links and password-reset keys
included — so anyone reading the logs could join an organization or take over an
account. Afterwards, in that configuration, the printed emails hold no usable token
and the web process warns at start-up (log line and system check ``frontend.W001``).

The mail configuration under test is the one flowforge/settings.py computes for a
DEBUG-off environment without EMAIL_HOST (read from a settings import in a child
process), so the tests exercise what production would run."""

from __future__ import annotations

import json
import logging
import os
import quopri
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from allauth.account.forms import default_token_generator
from allauth.account.utils import user_pk_to_url_str
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import Client, override_settings

from audit import keys as audit_keys
from tenancy.models import Role
from tests import secret_registry
from tests.unit.test_api_org import acme, org_factory, post  # noqa: F401 (fixtures)
from tests.unit.test_audit_actions import verified_user
from tests.unit.test_identity import fresh_client

BASE_DIR = Path(__file__).resolve().parents[2]


def production_mailers() -> dict:
    """MAILERS as settings.py computes it with DEBUG off and no EMAIL_HOST."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMAIL_")}
    env.update(DEBUG="false", SECRET_KEY="a-production-secret-key-" + "y" * 50,
               FLOWFORGE_ENCRYPTION_KEYS=Fernet.generate_key().decode(), DJANGO_SETTINGS_MODULE="flowforge.settings",
               FLOWFORGE_SECRET_KEYS=Fernet.generate_key().decode(),
               FLOWFORGE_AUDIT_KEYS=audit_keys.generate_key_spec("k1"))
    code = "import json, flowforge.settings as s; print(json.dumps(s.MAILERS))"
    out = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def readable(text: str) -> str:
    """What a reader of the log can reconstruct: quoted-printable soft line breaks and
    escapes undone (Django's console backend prints the encoded message)."""
    return quopri.decodestring(text.encode()).decode(errors="replace")


@pytest.fixture(scope="module")
def mailers() -> dict:
    return production_mailers()


def test_a_password_reset_link_is_not_usable_from_the_log(db, mailers, capsys):
    user = verified_user()
    client = fresh_client()
    with override_settings(DEBUG=False, MAILERS=mailers):
        resp = client.post("/accounts/password/reset/", {"email": user.email})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/password/reset/done/"
    logged = readable(capsys.readouterr().out)
    assert user.email in logged and "/accounts/password/reset/key/" in logged  # the email was printed
    # The real key the link carried: the user's id in base 36 and a token for the user now.
    uid = user_pk_to_url_str(user)
    assert f"/key/{uid}-" not in logged
    assert default_token_generator.make_token(user) not in logged
    # No string in the log is a token that would reset this user's password.
    for candidate in re.findall(r"[A-Za-z0-9]+-[A-Za-z0-9]+", logged):
        assert not default_token_generator.check_token(user, candidate), candidate
    assert "/accounts/password/reset/key/[redacted]/" in logged


def test_an_invitation_link_is_not_usable_from_the_log(acme, mailers, capsys,  # noqa: F811
                                                       django_capture_on_commit_callbacks):
    before = set(secret_registry.SECRETS)
    with override_settings(DEBUG=False, MAILERS=mailers), django_capture_on_commit_callbacks(execute=True):
        response = post(Client(), "/api/v1/invitations/", {"email": "mallory@example.com", "role": "admin"},
                        acme.as_(Role.ADMIN))
    assert response.status_code == 201, response.content
    logged = readable(capsys.readouterr().out)
    assert "mallory@example.com" in logged and "/invitations/" in logged  # the email was printed
    tokens = set(secret_registry.SECRETS) - before  # the invitation's raw token, as generated
    assert tokens
    for token in tokens:
        assert token not in logged
    assert "/invitations/[redacted]/" in logged


def test_with_debug_on_developers_still_get_the_whole_link(db, capsys):
    user = verified_user()
    with override_settings(DEBUG=True, MAILERS={"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}):
        fresh_client().post("/accounts/password/reset/", {"email": user.email})
    logged = readable(capsys.readouterr().out)
    assert f"/accounts/password/reset/key/{user_pk_to_url_str(user)}-" in logged


def test_production_without_email_host_warns_at_start_up(mailers, caplog):
    with override_settings(DEBUG=False, MAILERS=mailers):
        out, err = StringIO(), StringIO()
        call_command("check", stdout=out, stderr=err)
        assert "(frontend.W001) DEBUG is off and EMAIL_HOST is not set" in out.getvalue() + err.getvalue()
        from frontend import checks

        with caplog.at_level(logging.WARNING, logger="flowforge.mail"):
            assert checks.warn_if_mail_goes_to_console()
    assert any(r.levelno == logging.WARNING and "EMAIL_HOST is not set" in r.getMessage() for r in caplog.records)
    with override_settings(DEBUG=False, MAILERS={"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend"}}):
        out = StringIO()
        call_command("check", stdout=out, stderr=out)
        assert "frontend.W001" not in out.getvalue()
