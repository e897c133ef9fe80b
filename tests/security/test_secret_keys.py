"""Issue 18: the organizations' secrets are encrypted under FLOWFORGE_SECRET_KEYS, a key ring
of its own. With DEBUG off a process refuses to start without a usable one, naming the
variable and saying how to make a key; with DEBUG on a development key is derived, which
is not the key of FLOWFORGE_ENCRYPTION_KEYS."""

from __future__ import annotations

import os
import subprocess
import sys

from cryptography.fernet import Fernet
from django.conf import settings

from tests.security.test_production_config import GOOD_KEY, OTHER_PRODUCTION_KEYS, ROOT


def start_without_debug(secret_keys: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FLOWFORGE_SECRET_KEYS", "DEBUG", "SECRET_KEY")}
    env.update(OTHER_PRODUCTION_KEYS, DEBUG="false", SECRET_KEY=GOOD_KEY, DJANGO_SETTINGS_MODULE="flowforge.settings")
    if secret_keys is None:
        env.pop("FLOWFORGE_SECRET_KEYS")
    else:
        env["FLOWFORGE_SECRET_KEYS"] = secret_keys
    code = "import django; django.setup(); from django.conf import settings; print(len(settings.FLOWFORGE_SECRET_KEYS))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_production_start_without_secret_keys_is_refused_naming_the_variable():
    proc = start_without_debug(None)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: FLOWFORGE_SECRET_KEYS is not set"), last
    assert "Fernet.generate_key()" in last and "the organizations' secrets" in last


def test_a_production_start_with_a_malformed_secret_key_is_refused_without_echoing_it():
    good = Fernet.generate_key().decode()
    proc = start_without_debug(f"{good},not-a-fernet-key-0123")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "FLOWFORGE_SECRET_KEYS: key 2 of 2 is not a Fernet key" in last
    assert "not-a-fernet-key-0123" not in last and good not in last


def test_a_production_start_with_two_secret_keys_starts():
    proc = start_without_debug(f"{Fernet.generate_key().decode()}, {Fernet.generate_key().decode()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "2"


def test_the_development_key_is_not_the_encryption_key():
    from flowforge.crypto import keys_from_environment

    derived = keys_from_environment("", debug=True, secret_key=settings.SECRET_KEY, variable="FLOWFORGE_SECRET_KEYS",
                                    dev_context=b"flowforge.vault development key v1\x00")
    assert derived != keys_from_environment("", debug=True, secret_key=settings.SECRET_KEY)
    if not os.environ.get("FLOWFORGE_SECRET_KEYS"):  # this suite runs on the derived key (DEBUG's default)
        assert settings.FLOWFORGE_SECRET_KEYS == derived
