"""Database set-up shared by the standalone benches (``bench_api_pagination``,
``bench_pages``): point Django at the bench's own database, and create it when missing.
Imports nothing of Django, so it runs before ``django.setup()`` reads the settings."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from cryptography.fernet import Fernet


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
    # DEBUG off needs encryption keys (flowforge/crypto.py); a throwaway one (benches store no secrets).
    os.environ.setdefault("FLOWFORGE_ENCRYPTION_KEYS", Fernet.generate_key().decode())
    ensure_database(url)
    return url
