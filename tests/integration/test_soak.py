"""``make soak`` (bench/soak.py) at a size for ``make test``: 12,000 no-op tasks through real
workers and the clock with a retention of seconds, the baseline after 3,000, then a purge
of 10,000 bulk-loaded old runs beside live traffic.

It asserts what holds at any size: every run succeeded; the purge kept the history
bounded (runs, task runs and events at the end a fraction of what the soak produced, the
oldest finished run kept no older than the retention plus two housekeeping periods and a
little slack); the hot queries used their seed indexes at the baseline and at the end; the
purge phase loaded the old runs, removed some during the measured legs and the rest after,
leaving no task run or event behind. Throughput ratios and size ratios are printed by the
soak and judged there, never here (wall-clock figures on a shared two-core machine).
"""

from __future__ import annotations

import pytest
from django.db import connection

from bench import soak

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.django_db(transaction=True)]

CFG = {
    **soak.DEFAULTS,
    "tasks": 12_000,
    "baseline_tasks": 3_000,
    # Small runs: a run's task runs a few percent of the table, as at full size, so the
    # run-progress plan is an index's (a whole run a tenth of a small table is a seq scan's).
    "run_tasks": 100,
    "in_flight": 6,
    "retention_seconds": 5.0,
    "housekeeping_seconds": 1.0,
    "outbox_keep_seconds": 2.0,
    "vacuum_seconds": 5.0,
    "hot_reps": 3,
    "purge_runs": 10_000,
    "purge_rounds": 1,
    "leg_tasks": 1_000,
    "purge_drain_seconds": 60.0,
    "timeout": 60.0,
}
# How long past the retention the oldest finished run may still be there: two housekeeping
# periods, plus the pass itself and the clock's enqueue behind task messages.
SLACK_SECONDS = 2 * CFG["housekeeping_seconds"] + 3.0


def _scalar(sql: str, params=None):
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def test_soak_keeps_history_bounded_and_the_purge_removes_old_runs(stack, org):
    from tenancy.models import Organization

    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=1_000_000)
    org.refresh_from_db()
    results = soak.run(stack, org, dict(CFG), log=lambda *_: None)
    print(soak.table(results))  # shown with -s, and in a failure's report

    s = results["soak"]
    n, m = CFG["tasks"], CFG["baseline_tasks"]
    assert s["baseline_tasks"] == m and s["tasks"] == n
    assert s["run_states"] == {"succeeded": n // CFG["run_tasks"]}
    assert s["at_baseline"]["tasks"] == m and s["at_end"]["tasks"] == n
    end = s["at_end"]["sizes"]
    # The purge kept up: what is left is at most what the last retention plus slack
    # produced at the last stretch's rate (a fixed share of n would fail a faster engine:
    # at 811 tasks/s the last 6 s are 40% of 12,000 tasks), and less than all of it ...
    window = CFG["retention_seconds"] + SLACK_SECONDS
    kept = min(n, s["throughput"]["legs_tasks_per_s"][-1] * window)
    assert end["core_taskrun"]["rows"] <= kept and end["core_taskrun"]["rows"] < n
    # 3 events per task (claimed, started, succeeded) and 2 per run, plus those of runs
    # already purged whose event partition is not dropped yet (the partition manager's
    # period): at most a quarter more.
    assert end["core_taskrunevent"]["rows"] <= 1.25 * (3 + 2 / CFG["run_tasks"]) * kept
    assert end["core_workflowrun"]["rows"] <= kept / CFG["run_tasks"] + CFG["in_flight"]
    # ... and nothing older than the retention plus a couple of housekeeping periods is left.
    for snap in (s["at_baseline"], s["at_end"]):
        assert 0 < snap["history"]["oldest_finished_age_s"] <= CFG["retention_seconds"] + SLACK_SECONDS
    assert set(end) >= {"core_workflowrun", "core_taskrun", "core_taskrunevent", "core_outboxmessage"}
    assert all(t["bytes"] > 0 for t in end.values())
    for snap in (s["at_baseline"], s["at_end"]):
        for name, q in snap["hot_queries"].items():
            assert q["uses_index"], (name, q["indexes_used"], q["plan"])
            assert q["median_ms"] > 0 and q["cost"] > 0

    p = results["purge"]
    assert p["old_runs_loaded"] == CFG["purge_runs"]
    legs = p["legs"]
    assert [leg["with_purge"] for leg in legs] == [False, True]
    assert all(leg["tasks"] == CFG["leg_tasks"] for leg in legs)
    assert p["run_states"] == {"succeeded": p["warmup"]["runs"] + sum(leg["runs"] for leg in legs)}
    assert legs[0]["old_runs_removed"] == 0  # without: nothing removes runs
    assert p["old_runs_removed_during_legs"] == legs[1]["old_runs_removed"] > 0
    assert p["drain"]["old_runs_left"] == 0
    assert p["purge_runs_per_s"] > 0 and p["throughput_ratio"] > 0
    # The old runs went with everything they owned.
    old_task = _scalar("SELECT t.id FROM core_task t JOIN core_workflow w ON w.id = t.workflow_id "
                       "WHERE w.name = 'soak-old'")
    assert _scalar("SELECT count(*) FROM core_taskrun WHERE task_id = %s", [old_task]) == 0
    assert _scalar("SELECT count(*) FROM core_taskrunevent e WHERE NOT EXISTS "
                   "(SELECT 1 FROM core_workflowrun r WHERE r.id = e.workflow_run_id)") == 0
    assert set(results["verdicts"]) == {"sizes", "hot_queries_on_seed_index", "hot_queries_time",
                                        "soak_runs_succeeded", "purge_throughput", "purge_runs_succeeded"}
    assert results["verdicts"]["soak_runs_succeeded"] and results["verdicts"]["purge_runs_succeeded"]
