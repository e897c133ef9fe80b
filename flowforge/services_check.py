"""``python -m flowforge.services_check [--create-database]``

Check that PostgreSQL and the broker (Redis or RabbitMQ) answer at the addresses
the settings use, and say which one does not, where, and how to start it — instead
of a traceback from deep inside a migration. With ``--create-database``, create the
database named in DATABASE_URL when the server answers but the database is missing.
Exit status 0 when everything answers, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from urllib.parse import urlsplit

import dj_database_url

HOW_TO_START = {
    "PostgreSQL": (
        "start it with `docker compose up -d postgres`, or your distribution's package "
        "(Debian: `apt-get install postgresql && pg_ctlcluster 15 main start`)"
    ),
    "Redis": (
        "start it with `docker compose up -d redis`, or your distribution's package "
        "(Debian: `apt-get install redis-server && redis-server --daemonize yes`)"
    ),
    "RabbitMQ": "start it with `rabbitmq-server -detached` (Debian: `apt-get install rabbitmq-server`)",
}


def _tcp_ok(host: str, port: int, timeout: float = 2.0) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def check_postgres(url: str, *, create: bool, server_only: bool = False) -> str | None:
    """Return None when PostgreSQL answers and the database exists (or was created, or
    ``server_only``: only the server must answer), else a message."""
    import psycopg
    from psycopg import sql

    cfg = dj_database_url.parse(url)
    host, port, name = cfg.get("HOST") or "127.0.0.1", int(cfg.get("PORT") or 5432), cfg["NAME"]
    where = f"{host}:{port}"
    err = _tcp_ok(host, port)
    if err:
        return f"PostgreSQL does not answer at {where} ({err}); {HOW_TO_START['PostgreSQL']}"
    params = {"host": host, "port": port, "user": cfg.get("USER") or "postgres", "connect_timeout": 5}
    if cfg.get("PASSWORD"):
        params["password"] = cfg["PASSWORD"]
    try:
        psycopg.connect(dbname="postgres" if server_only else name, **params).close()
        return None
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc) or not create:
            return f"PostgreSQL at {where} refused database {name!r}: {str(exc).strip()}"
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"created database {name!r} on {where}")
        return None
    except psycopg.Error as exc:
        return f"PostgreSQL at {where}: could not create database {name!r}: {str(exc).strip()}"


def check_broker(url: str) -> str | None:
    """Return None when the broker at ``url`` answers, else a message naming it and how to start it."""
    parts = urlsplit(url)
    if parts.scheme in ("amqp", "amqps"):
        kind, port = "RabbitMQ", parts.port or 5672
    else:
        kind, port = "Redis", parts.port or 6379
    host = parts.hostname or "127.0.0.1"
    err = _tcp_ok(host, port)
    if err:
        return f"{kind} does not answer at {host}:{port} ({err}); {HOW_TO_START[kind]}"
    if kind == "Redis":
        import redis

        try:
            redis.Redis.from_url(url, socket_timeout=3).ping()
        except redis.RedisError as exc:
            return f"Redis at {host}:{port} did not answer PING ({exc}); {HOW_TO_START['Redis']}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--create-database", action="store_true")
    parser.add_argument("--server-only", action="store_true",
                        help="only check that the servers answer (the test runner creates its own database)")
    args = parser.parse_args(argv)
    db_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/flowforge")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    broker_url = os.environ.get("BROKER_URL", redis_url)
    problems = [p for p in (check_postgres(db_url, create=args.create_database, server_only=args.server_only), check_broker(broker_url)) if p]
    if broker_url != redis_url:
        problem = check_broker(redis_url)
        if problem:
            problems.append(problem)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
