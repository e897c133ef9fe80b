"""Database set-up shared by the standalone benches (``bench_api_pagination``,
``bench_pages``): point Django at the bench's own database, and create it when missing.
Imports nothing of Django, so it runs before ``django.setup()`` reads the settings."""

from __future__ import annotations

import os
import secrets
from urllib.parse import urlsplit


def throwaway_secret_key() -> str:
    """Set SECRET_KEY in this process's environment to a random 50+ character key unless one
    is set, and return it: benches run with DEBUG off, which refuses a missing or default key,
    and the processes a bench starts inherit the same key (sessions made here verify there)."""
    return os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))


def audit_key_spec() -> str:
    """A fresh FLOWFORGE_AUDIT_KEYS value ("bench:<base64 of 32 random bytes>") for a bench
    run with DEBUG off (the format of audit/keys.py; stdlib only, importable before Django)."""
    import base64
    import secrets

    return "bench:" + base64.b64encode(secrets.token_bytes(32)).decode()


def ensure_database(url: str) -> None:
    """Create the database of ``url`` when it does not exist (connecting to ``postgres``)."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')  # a name from our own configuration
            print(f"created database {name}")


def use_bench_database(default_url: str, **env_defaults: str) -> str:
    """Set DATABASE_URL to BENCH_DATABASE_URL (else ``default_url``), never the developer's
    database, plus ``env_defaults`` and the settings module where unset; create the
    database; return its URL."""
    url = os.environ.get("BENCH_DATABASE_URL", default_url)
    os.environ["DATABASE_URL"] = url  # settings read it at import
    defaults = {"DJANGO_SETTINGS_MODULE": "flowforge.settings", "DEBUG": "0",
                # DEBUG is off: the audit log needs a key (one per bench process is enough).
                "FLOWFORGE_AUDIT_KEYS": audit_key_spec(), **env_defaults}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    throwaway_secret_key()
    ensure_database(url)
    return url
