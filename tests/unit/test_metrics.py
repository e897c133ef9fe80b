"""engine.metrics: increments are summed in the process and sent to Redis in one flush."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import redis
from django.utils import timezone

from engine import metrics


def _hash(name: str) -> dict[str, float]:
    raw = metrics._client().hgetall(metrics._key(name))
    return {k.decode(): float(v) for k, v in raw.items()}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0) - before.get(k, 0), 9) for k in set(before) | set(after)
            if round(after.get(k, 0) - before.get(k, 0), 9)}


def test_an_observation_counts_in_every_bucket_at_or_above_it_and_in_the_sum():
    metrics.flush()
    before = _hash("flowforge_task_duration_seconds")
    metrics.observe("flowforge_task_duration_seconds", 0.07)
    metrics.observe("flowforge_task_duration_seconds", 0.5)  # exactly on a bound: le=0.5 counts it
    metrics.flush()
    delta = _delta(before, _hash("flowforge_task_duration_seconds"))
    assert delta == {
        "le=0.1": 1, "le=0.5": 2, "le=1.0": 2, "le=5.0": 2, "le=10.0": 2, "le=30.0": 2, "le=60.0": 2,
        "le=300.0": 2, "le=900.0": 2, "le=3600.0": 2, "le=+Inf": 2, "sum": 0.57,
    }


def test_observations_past_the_last_bound_and_across_a_failed_flush_count_once_each():
    metrics.flush()
    good = metrics._client()
    before = _hash("flowforge_dispatch_latency_seconds")
    metrics.observe("flowforge_dispatch_latency_seconds", 61.0)  # past le=60.0: only +Inf
    metrics.observe("flowforge_dispatch_latency_seconds", 0.001)  # below the first bound: every bucket
    metrics._local.client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        metrics.flush()  # fails: the folded sums are kept for the next flush
    finally:
        metrics._local.client = good
    metrics.observe("flowforge_dispatch_latency_seconds", 0.02)
    metrics.flush()
    finite = {f"le={b}": 2 for b in metrics.DISPATCH_BUCKETS}
    finite["le=0.005"] = 1  # 0.02 is above 0.005 and 0.01
    finite["le=0.01"] = 1
    assert _delta(before, _hash("flowforge_dispatch_latency_seconds")) == {
        **finite, "le=+Inf": 3, "sum": 61.021}


def test_increments_between_flushes_are_summed_into_one_field():
    metrics.flush()
    before = _hash("flowforge_task_attempts_total")
    metrics.incr("flowforge_task_attempts_total", "succeeded", amount=2)
    metrics.incr("flowforge_task_attempts_total", "succeeded", amount=3)
    metrics.incr("flowforge_task_attempts_total", "failed")
    assert _delta(before, _hash("flowforge_task_attempts_total")) == {}  # nothing sent yet
    metrics.flush()
    assert _delta(before, _hash("flowforge_task_attempts_total")) == {"succeeded": 5, "failed": 1}


def test_sums_are_kept_when_redis_does_not_answer_and_sent_with_the_next_flush():
    metrics.flush()
    good = metrics._client()
    before = _hash("flowforge_runs_finished_total")
    metrics.incr("flowforge_runs_finished_total", "succeeded", amount=4)
    metrics._local.client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        metrics.flush()  # fails quietly: a metric never fails the operation it measures
    finally:
        metrics._local.client = good
    assert _delta(before, _hash("flowforge_runs_finished_total")) == {}
    metrics.incr("flowforge_runs_finished_total", "succeeded", amount=1)
    metrics.flush()
    assert _delta(before, _hash("flowforge_runs_finished_total")) == {"succeeded": 5}


def test_the_flush_thread_sends_without_an_explicit_flush():
    import time

    metrics.flush()
    before = _hash("flowforge_lease_reaps_total")
    metrics.incr("flowforge_lease_reaps_total", "requeued")
    deadline = time.monotonic() + metrics.FLUSH_INTERVAL_SECONDS * 5
    while time.monotonic() < deadline and not _delta(before, _hash("flowforge_lease_reaps_total")):
        time.sleep(0.05)
    assert _delta(before, _hash("flowforge_lease_reaps_total")) == {"requeued": 1}


# --- per-organization gauges and the claim-wait histogram (issue 16) ---------------------------------


def _series(body: str, name: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(rf'^{name}{{org="([^"]+)"}} (\d+)$', body, re.M)}


@pytest.mark.django_db
def test_per_organization_gauges_keep_the_top_organizations_and_sum_the_rest(make_org, make_workflow, settings):
    """11 organizations with work: the 10 with the most ready + running by slug, the 11th
    (the least) under org="(others)"; each count right, one query for all."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from engine.models import TaskRun
    from engine.services import start_run

    settings.FLOWFORGE_METRICS_TOP_ORGS = 10
    orgs = []
    for i in range(11):
        org = make_org()
        wf = make_workflow(org, [{"key": f"t{j}", "type": "noop"} for j in range(i + 2)])
        start_run(workflow=wf, trigger_source="api")  # i + 2 ready task runs
        running = list(TaskRun.objects.for_organization(org).values_list("pk", flat=True)[:1])
        TaskRun.objects.for_organization(org).filter(pk__in=running).update(
            state="running", fencing_token=1, lease_expires_at=timezone.now() + dt.timedelta(minutes=1))
        orgs.append(org)
    with CaptureQueriesContext(connection) as ctx:
        body = "\n".join(metrics._db_gauges())
    # One query for the per-organization gauges (no query per organization), one for the
    # retention lag (its own single statement over every organization).
    assert sum("core_organization" in q["sql"] for q in ctx.captured_queries) == 2
    assert len(ctx.captured_queries) == len(set(q["sql"] for q in ctx.captured_queries))
    ready = _series(body, "flowforge_org_task_runs_ready")
    running = _series(body, "flowforge_org_task_runs_running")
    smallest = orgs[0]  # 2 task runs: the fewest
    assert smallest.slug not in ready
    for i, org in enumerate(orgs[1:], start=1):
        assert (ready[org.slug], running[org.slug]) == (i + 1, 1), org.slug
    # Other organizations of the test database (none have work here) and the smallest one.
    assert (ready["(others)"], running["(others)"]) == (1, 1)
    assert len(ready) == len(running) == 11  # 10 + other, whatever the number of tenants
    assert "# TYPE flowforge_org_task_runs_ready gauge" in body and "# HELP flowforge_org_task_runs_running" in body


@pytest.mark.django_db
def test_without_work_the_other_series_is_still_there():
    body = "\n".join(metrics._db_gauges())
    assert _series(body, "flowforge_org_task_runs_ready") == {"(others)": 0}
    assert _series(body, "flowforge_org_task_runs_running") == {"(others)": 0}


def test_the_claim_wait_histogram_is_declared_and_rendered_with_its_help():
    metrics.flush()
    before = _hash("flowforge_claim_wait_seconds")
    metrics.observe("flowforge_claim_wait_seconds", 0.3)
    metrics.flush()
    assert _delta(before, _hash("flowforge_claim_wait_seconds"))["le=0.5"] == 1
    assert metrics.HISTOGRAMS["flowforge_claim_wait_seconds"][1][-1] == 3600.0  # waits behind limits can be long
    body = "\n".join(metrics._redis_series())
    assert "# HELP flowforge_claim_wait_seconds From ready (past any retry backoff) to claimed" in body
    assert "# TYPE flowforge_claim_wait_seconds histogram" in body
    assert 'flowforge_claim_wait_seconds_bucket{le="+Inf"}' in body and "flowforge_claim_wait_seconds_count" in body


@pytest.mark.django_db
def test_a_tenant_slugged_other_keeps_its_own_series(make_org, make_workflow, settings):
    """A slug of "other" (or "others") is a tenant like any other: its series is its own,
    never merged into the rest's, whose label no slug can take."""
    from engine.services import start_run
    from tenancy.models import Organization

    settings.FLOWFORGE_METRICS_TOP_ORGS = 1
    busy = make_org()
    Organization.objects.filter(pk=busy.pk).update(slug="other")
    start_run(workflow=make_workflow(busy, [{"key": f"t{j}", "type": "noop"} for j in range(3)]))
    quiet = make_org()
    start_run(workflow=make_workflow(quiet, [{"key": "t", "type": "noop"}]))
    ready = _series("\n".join(metrics._db_gauges()), "flowforge_org_task_runs_ready")
    assert ready == {"other": 3, "(others)": 1}


@pytest.mark.django_db
def test_history_gauges_show_table_sizes_the_oldest_run_and_the_retention_lag(make_org, make_workflow, settings):
    from django.db import connection

    from engine.services import start_run
    from tests.unit.test_web_runs import drive_run

    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org = make_org()
    run = drive_run(start_run(workflow=make_workflow(org, [{"key": "a", "type": "noop"}], name="old")))
    assert run.state == "succeeded"

    def gauges() -> dict[str, str]:
        body = "\n".join(metrics._db_gauges())
        return dict(line.rsplit(" ", 1) for line in body.splitlines() if line and not line.startswith("#"))

    now = gauges()
    assert float(now['flowforge_table_bytes{table="core_taskrunevent"}']) > 0
    # Plain and partitioned tables alike (a partitioned one: its partitions summed).
    sizes = {k: v for k, v in now.items() if k.startswith("flowforge_table_bytes")}
    assert len(sizes) == 10 and all(float(v) > 0 for v in sizes.values()), sizes
    assert float(now["flowforge_retention_lag_seconds"]) == 0  # nothing past its retention
    assert 0 <= float(now["flowforge_oldest_run_age_seconds"]) < 3600
    # The run finished 32 days ago: 2 days past the 30-day retention, not yet purged.
    with connection.cursor() as cur:
        cur.execute("UPDATE core_workflowrun SET created_at = now() - interval '33 days', "
                    "finished_at = now() - interval '32 days' WHERE id = %s", [run.pk])
    later = gauges()
    assert 2 * 86400 - 60 < float(later["flowforge_retention_lag_seconds"]) < 2 * 86400 + 60
    assert float(later["flowforge_oldest_run_age_seconds"]) > 33 * 86400 - 60
