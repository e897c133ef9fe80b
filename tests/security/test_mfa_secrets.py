"""Finding 7d of issue 14: TOTP secrets (and the recovery codes' seed) were stored in
clear on allauth's Authenticator rows, so anyone holding a copy of the database (a
backup, a replica, the application role) could compute every user's second factor.

Afterwards they are Fernet tokens under FLOWFORGE_ENCRYPTION_KEYS (tenancy.mfa's
adapter through flowforge.crypto): the row holds no secret, codes computed from the
real secret still sign in, a rotated key list still decrypts, existing clear rows are
encrypted by a reversible migration, and a production start without keys is refused."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from allauth.mfa.models import Authenticator
from cryptography.fernet import Fernet, InvalidToken
from django.apps import apps

from audit import keys as audit_keys
from tests.unit.test_audit_actions import verified_user
from tests.unit.test_identity import (
    PASSWORD,
    current_totp_code,
    fresh_client,
    log_in,
    log_out,
    signed_in_user_id,
)

BASE_DIR = Path(__file__).resolve().parents[2]


def enrol(client, user) -> tuple[str, Authenticator]:
    """Sign in and enable TOTP through allauth's pages (re-authenticating when asked);
    (the secret the page showed, the stored row)."""
    assert log_in(client, user.email).status_code == 302
    resp = client.get("/accounts/2fa/totp/activate/")
    if resp.status_code == 302 and resp["Location"].startswith("/accounts/reauthenticate/"):
        assert client.post(resp["Location"], {"password": PASSWORD}).status_code == 302
    page = client.get("/accounts/2fa/totp/activate/")
    assert page.status_code == 200
    secret = page.context["form"].secret
    resp = client.post("/accounts/2fa/totp/activate/", {"code": current_totp_code(secret)})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/recovery-codes/"
    return secret, Authenticator.objects.get(user=user, type=Authenticator.Type.TOTP)


def sign_in_with_totp(client, user, secret) -> None:
    log_out(client)
    resp = log_in(client, user.email)
    assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/authenticate/"
    resp = client.post("/accounts/2fa/authenticate/", {"code": current_totp_code(secret)})
    assert resp.status_code == 302, resp.content.decode()[:500]
    assert signed_in_user_id(client) == str(user.pk)


def test_the_database_holds_no_totp_secret_and_the_real_secret_still_signs_in(db):
    user, client = verified_user(), fresh_client()
    secret, row = enrol(client, user)
    row.refresh_from_db()
    stored = json.dumps(row.data)
    assert secret not in stored, stored
    assert row.data["secret"] != secret
    # Nor the recovery codes' seed: their row holds a token, not 80 hex digits.
    codes = Authenticator.objects.get(user=user, type=Authenticator.Type.RECOVERY_CODES)
    assert codes.data["seed"].startswith("gAAAA"), codes.data
    # A copy of the database without the key cannot recover it.
    with pytest.raises(InvalidToken):
        Fernet(Fernet.generate_key()).decrypt(row.data["secret"].encode())
    sign_in_with_totp(client, user, secret)


def test_a_rotated_key_list_still_decrypts_and_encrypts_with_the_new_key(db, settings):
    user, client = verified_user(), fresh_client()
    old_keys = list(settings.FLOWFORGE_ENCRYPTION_KEYS)
    secret, row = enrol(client, user)
    new_key = Fernet.generate_key().decode()
    settings.FLOWFORGE_ENCRYPTION_KEYS = [new_key, *old_keys]
    sign_in_with_totp(client, user, secret)  # encrypted under the old key, read with the old key second
    from flowforge import crypto

    token = crypto.encrypt("fresh")
    assert Fernet(new_key).decrypt(token.encode()) == b"fresh"
    assert crypto.decrypt(crypto.reencrypt(row.data["secret"])) == secret
    settings.FLOWFORGE_ENCRYPTION_KEYS = old_keys  # the new key dropped: its tokens are unreadable
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(token)


def test_clear_secrets_of_earlier_versions_are_encrypted_by_a_reversible_migration(db):
    migration = importlib.import_module("tenancy.migrations.0003_encrypt_mfa_secrets")
    user = verified_user()
    clear_secret = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
    clear_seed = "ab" * 40
    # Rows as allauth wrote them before the encrypting adapter (bypassing it).
    totp = Authenticator.objects.create(user=user, type=Authenticator.Type.TOTP, data={"secret": clear_secret})
    codes = Authenticator.objects.create(user=user, type=Authenticator.Type.RECOVERY_CODES,
                                         data={"seed": clear_seed, "used_mask": 0})
    migration.encrypt_mfa_secrets(apps, None)
    totp.refresh_from_db(), codes.refresh_from_db()
    assert clear_secret not in json.dumps(totp.data) and clear_seed not in json.dumps(codes.data)
    assert totp.wrap().validate_code(current_totp_code(clear_secret))  # read through the adapter
    assert codes.data["used_mask"] == 0
    migration.encrypt_mfa_secrets(apps, None)  # a second run changes nothing
    totp.refresh_from_db()
    from flowforge import crypto

    assert crypto.decrypt(totp.data["secret"]) == clear_secret
    migration.decrypt_mfa_secrets(apps, None)
    totp.refresh_from_db(), codes.refresh_from_db()
    assert totp.data == {"secret": clear_secret} and codes.data == {"seed": clear_seed, "used_mask": 0}


def test_a_production_start_without_encryption_keys_is_refused():
    env = {k: v for k, v in os.environ.items() if k != "FLOWFORGE_ENCRYPTION_KEYS"}
    env.update(DEBUG="false", SECRET_KEY="a-real-looking-production-secret-" + "x" * 40,
               DJANGO_SETTINGS_MODULE="flowforge.settings",
               FLOWFORGE_AUDIT_KEYS=audit_keys.generate_key_spec("k1"))  # valid: only the encryption keys decide
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "ImproperlyConfigured: FLOWFORGE_ENCRYPTION_KEYS is not set" in result.stderr
    assert "Fernet.generate_key()" in result.stderr  # says how to make one
    env["FLOWFORGE_ENCRYPTION_KEYS"] = "not-a-key"
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "key 1 of 1 is not a Fernet key" in result.stderr
    assert "not-a-key" not in result.stderr.split("ImproperlyConfigured")[-1]

