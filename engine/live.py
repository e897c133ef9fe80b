"""Live listeners of a run's events: LISTEN plus a RunSubscription row that makes the
event trigger NOTIFY for that run (engine.models.RunSubscription explains why).

These are the statements; engine.live_hub is the one listener of each web process (it
holds the LISTEN connection and one subscription per watched run for every stream of
the process), and the clock's housekeeping calls ``purge_expired``."""

from __future__ import annotations

import uuid

import psycopg
from django.db import connection

from engine import sql

# The channel the core_taskrunevent trigger notifies (migrations 0006/0007).
CHANNEL = "flowforge_run_events"

# A subscription lives this long unless renewed; listeners renew it every RENEW_SECONDS.
SUBSCRIPTION_SECONDS = 60
RENEW_SECONDS = 20


def listen_connection(*, application_name: str, channel: str = CHANNEL) -> psycopg.Connection:
    """A new autocommit connection to the default database (Django's parameters), named
    ``application_name`` in pg_stat_activity and already LISTENing on ``channel`` (a
    constant identifier; default CHANNEL, the run events'). The caller closes it."""
    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    params["application_name"] = application_name
    conn = psycopg.connect(**params, autocommit=True)
    try:
        conn.execute(f"LISTEN {channel}")  # a constant identifier, not user input
    except Exception:
        conn.close()
        raise
    return conn


def subscribe(conn: psycopg.Connection, *, organization_id: uuid.UUID, run_id: uuid.UUID,
              sub_id: uuid.UUID | None = None) -> uuid.UUID:
    """Register a listener of ``run_id`` on an autocommit connection (it commits at once)
    for SUBSCRIPTION_SECONDS. Returns the row's id: ``sub_id`` if given, whose row is then
    extended if it still exists (a listener subscribing again after a reconnection).
    Raises psycopg.IntegrityError when the run does not exist (or is not committed yet)."""
    sub_id = sub_id or uuid.uuid4()
    conn.execute(sql.queries["subscription_upsert"],
                 {"id": sub_id, "org": organization_id, "run": run_id, "secs": SUBSCRIPTION_SECONDS})
    return sub_id


def renew(conn: psycopg.Connection, sub_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Extend the subscriptions ``sub_ids`` by SUBSCRIPTION_SECONDS, in one statement.
    Returns the ids that still existed (a missing one was purged: subscribe it again)."""
    if not sub_ids:
        return set()
    rows = conn.execute(sql.queries["subscription_renew_many"],
                        {"secs": SUBSCRIPTION_SECONDS, "ids": list(sub_ids)})
    return {row[0] for row in rows}


def unsubscribe(conn: psycopg.Connection, sub_ids: list[uuid.UUID]) -> None:
    """Delete the subscriptions ``sub_ids`` (one statement)."""
    if sub_ids:
        conn.execute(sql.queries["subscription_delete_many"], {"ids": list(sub_ids)})


def purge_expired() -> int:
    """Delete subscriptions abandoned by listeners that died. Returns how many."""
    with connection.cursor() as cur:
        cur.execute(sql.queries["subscription_purge_expired"])
        return cur.rowcount
