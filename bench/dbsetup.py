"""Database set-up shared by the standalone benches (``bench_api_pagination``,
``bench_pages``): point Django at the bench's own database, and create it when missing.
Imports nothing of Django, so it runs before ``django.setup()`` reads the settings."""

from __future__ import annotations

import base64
import os
import secrets
from urllib.parse import urlsplit

from cryptography.fernet import Fernet


def throwaway_production_keys() -> dict[str, str]:
    """Set, in this process's environment where unset, the keys a process with DEBUG off
    refuses to start without — SECRET_KEY (50+ random characters), FLOWFORGE_AUDIT_KEYS
    ("bench:<base64 of 32 random bytes>", audit/keys.py's format), FLOWFORGE_ENCRYPTION_KEYS and
    FLOWFORGE_SECRET_KEYS
    (one Fernet key) — and return them. They are made per bench run and never kept: a bench
    database holds nothing worth signing or encrypting, and the processes a bench starts
    inherit the same keys (sessions made here verify there)."""
    fresh = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "FLOWFORGE_AUDIT_KEYS": "bench:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "FLOWFORGE_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "FLOWFORGE_SECRET_KEYS": Fernet.generate_key().decode(),
    }
    return {name: os.environ.setdefault(name, value) for name, value in fresh.items()}


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
    for key, value in {"DJANGO_SETTINGS_MODULE": "flowforge.settings", "DEBUG": "0", **env_defaults}.items():
        os.environ.setdefault(key, value)
    throwaway_production_keys()  # DEBUG is off
    ensure_database(url)
    return url
