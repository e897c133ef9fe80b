"""/healthz, /readyz and /metrics."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from engine import metrics
from engine.services import start_run


@pytest.mark.django_db
def test_healthz_answers_without_touching_anything():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ready_when_database_broker_and_migrations_agree():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] == "ok"
    assert body["checks"]["migrations"] == {"unapplied": [], "unknown_to_code": []}


@pytest.mark.django_db
def test_readyz_lists_unapplied_and_unknown_migrations_with_a_503():
    with connection.cursor() as cur:
        cur.execute("DELETE FROM django_migrations WHERE app = 'engine' AND name = '0007_run_subscriptions'")
        cur.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('engine', '9999_from_the_future', now())")
    response = Client().get("/readyz")
    assert response.status_code == 503
    migrations = response.json()["checks"]["migrations"]
    assert migrations == {"unapplied": ["engine.0007_run_subscriptions"], "unknown_to_code": ["engine.9999_from_the_future"]}


@pytest.mark.django_db
def test_readyz_says_which_broker_is_unreachable(settings):
    settings.BROKER_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("unreachable: ")


@pytest.mark.django_db
def test_metrics_exposes_gauges_from_the_database_and_counters_from_redis(org, make_workflow, settings):
    settings.FLOWFORGE_METRICS_PUBLIC = True  # tests run with DEBUG off: metrics are private by default
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    start_run(workflow=wf)
    metrics.incr("flowforge_task_attempts_total", "succeeded", amount=3)
    metrics.observe("flowforge_task_duration_seconds", 0.07)
    body = Client().get("/metrics").content.decode()
    assert "flowforge_ready_queue_depth" in body
    ready = int(next(line.split()[-1] for line in body.splitlines() if line.startswith("flowforge_ready_queue_depth ")))
    assert ready >= 1  # the run's root task is ready
    assert 'flowforge_runs_active{state="running"}' in body
    assert "# TYPE flowforge_task_attempts_total counter" in body
    assert 'flowforge_task_attempts_total{outcome="succeeded"}' in body
    assert 'flowforge_task_duration_seconds_bucket{le="0.1"}' in body
    assert "flowforge_outbox_backlog" in body and "flowforge_outbox_oldest_age_seconds" in body


@pytest.mark.django_db
def test_metrics_can_require_a_token(settings):
    settings.FLOWFORGE_METRICS_TOKEN = "s3cret-metrics-token"
    assert Client().get("/metrics").status_code == 401
    ok = Client().get("/metrics", headers={"Authorization": "Bearer s3cret-metrics-token"})
    assert ok.status_code == 200


@pytest.mark.django_db
def test_favicon_ico_redirects_to_the_static_icon():
    from django.contrib.staticfiles import finders

    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("frontend/favicon.svg")
    assert finders.find("frontend/favicon.svg") is not None
