"""engine.live_hub: one LISTEN connection per process that survives its connection being
killed (reconnects, subscribes again, and the streams stay live), and one subscription
row per watched run, deleted when its last stream ends."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from api import streaming
from engine import live_hub
from engine.repositories import events
from engine.services import cancel_run
from tenancy.models import Role
from tests.security.test_event_streams import Consumer, api_stream, hub_connections, running_run, wait_for
from tests.unit.test_api_workflows import new_api_factory


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


def hub_pids() -> list[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                    [live_hub.APPLICATION_NAME])
        return [row[0] for row in cur.fetchall()]


def subscriptions_of(run) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM core_runsubscription WHERE workflow_run_id = %s", [run.pk])
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_the_hub_reconnects_after_its_connection_is_killed_and_its_streams_stay_live(api_factory, monkeypatch,
                                                                                     settings):
    monkeypatch.setattr(streaming, "POLL_SECONDS", 60.0)  # only a notification can wake the streams in time
    monkeypatch.setattr(streaming, "HEARTBEAT_SECONDS", 60.0)
    settings.FLOWFORGE_SSE_PER_PROCESS = 10
    api = api_factory()
    run = running_run(api.org)
    consumers = [Consumer(lambda role=role: api_stream(api.client, run, api.keys[role]))
                 for role in (Role.VIEWER, Role.MEMBER)]
    try:
        assert wait_for(lambda: all("id: 1\n" in c.text() for c in consumers))
        assert subscriptions_of(run) == 1  # one row for the process, however many streams watch the run
        (old,) = hub_pids()
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [old])
        assert wait_for(lambda: len(pids := hub_pids()) == 1 and pids[0] != old), hub_pids()
        assert wait_for(lambda: subscriptions_of(run) == 1)
        with transaction.atomic():
            seq = events.append(workflow_run_id=run.pk, kind="duplicate_delivery_ignored")
        assert wait_for(lambda: all(f"id: {seq}\n" in c.text() for c in consumers), timeout=5), [
            c.text() for c in consumers]
    finally:
        cancel_run(run=run)
        for c in consumers:
            assert c.finished.wait(10)
    # The last stream ended: the row is deleted and the hub closes its connection.
    assert wait_for(lambda: hub_connections() == 0)
    assert subscriptions_of(run) == 0
