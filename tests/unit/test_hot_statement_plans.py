"""Each hot statement, planned as the hot path plans it, reaches its rows through the seed
index (or primary key) its comment in ``engine/sql`` names.

The plan is a prepared statement's generic plan (``plan_cache_mode = force_generic_plan``:
what a connection keeps after its first executions) under the driver's planner settings
(``driver.INDEX_PROBES_ONLY``), explained with ANALYZE inside a transaction that is rolled
back, on a small seeded database: a few runs with ready, running, started, succeeded and
expired task runs and unpublished outbox rows.
"""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection, transaction

from bench import hot_queries
from engine.models import TaskRun
from engine.repositories import driver, task_runs
from engine.repositories.types import StartRequest, SuccessRequest
from engine.services import start_run
from engine.sql import descriptions, queries
from engine.states import TASK_OPEN_STATES, TASK_QUEUE, TaskRunState
from tests import engine_helpers

# The SQL type of each parameter the hot statements take.
TYPES = {
    "limit": "bigint", "owner": "text", "lease": "float8", "queue": "text", "reserve": "float8", "ids": "uuid[]",
    "tokens": "bigint[]", "outputs": "text[]", "start_ids": "uuid[]", "start_tokens": "bigint[]",
    "owners": "text[]", "start_outbox": "uuid[]", "worker_lease": "float8", "upstream_bytes": "bigint",
    "id": "uuid", "token": "bigint", "error": "text", "retryable": "boolean", "kind": "text",
    "after": "uuid", "max_orgs": "bigint", "orgs": "uuid[]", "org_of": "uuid[]", "only_ids": "uuid[]",
    "lock_ids": "uuid[]", "ahead": "int", "lookahead": "int", "plan_names": "text[]", "plan_weights": "int[]",
    "plan_max_running": "int[]", "first": "int", "first_queue": "text", "refill": "int", "claim_queue": "text",
    "org": "uuid", "levels": "text[]", "messages": "text[]",
    # Issue 19: a failure's traceback; the worker log lines' caps; the shared workers' lines.
    "traceback": "text", "max_lines": "bigint", "max_bytes": "bigint", "marker": "text", "runs": "uuid[]",
    "task_runs": "uuid[]", "attempts": "int[]", "streams": "text[]", "ats": "timestamptz[]",
}

# The two indexes that find a task run by (run, task) in one entry (migration 0036).
RUN_TASK_INDEXES = ("uniq_taskrun_per_run_task", "idx_taskrun_task_run")

# (statement, what runs it, the index its plan must use: a name, or a tuple of names of which one)
HOT = [
    ("task_run_ready_orgs_after", "scheduler: organizations with ready work", "idx_taskrun_ready_claim"),
    ("task_run_lock_orgs_of", "worker: its organizations' claim locks", "core_taskrun_pkey"),
    ("task_run_claim_fair", "scheduler and worker: the fair claim", "idx_taskrun_ready_claim"),
    ("task_run_claim_fair", "scheduler and worker: the fair claim's room and permits", "idx_taskrun_running_org"),
    ("task_run_start_many", "worker: start", "core_taskrun_pkey"),
    ("task_run_succeed_many", "worker: succeed", "core_taskrun_pkey"),
    ("task_run_start_and_succeed_many", "worker: start + succeed", "core_taskrun_pkey"),
    ("task_run_promote_dependents", "worker: promote", RUN_TASK_INDEXES),
    ("run_finish_if_done_many", "worker: finish", "idx_taskrun_run_state"),
    ("task_run_heartbeat_many", "worker: heartbeat", "core_taskrun_pkey"),
    ("task_run_fail_attempt", "worker: fail", "core_taskrun_pkey"),
    ("task_run_get_expired_leases", "lease reaper", "idx_taskrun_lease_expiry"),
    ("task_run_fail_expired_lease", "lease reaper", "core_taskrun_pkey"),
    ("task_run_requeue_never_started", "lease reaper", "core_taskrun_pkey"),
    ("outbox_get_pending", "relay: outbox drain", "idx_outbox_pending"),
    # The organizations' own workers (issue 18): a waiting poll's next due time, and the
    # scoping and log lines of each call on a held generation.
    ("worker_queue_next_due", "worker API: poll", "idx_taskrun_ready_claim"),
    ("worker_queue_known", "worker API: poll", "idx_task_org_queue"),
    ("worker_task_run_generation", "worker API: heartbeat, logs, complete, fail", "core_taskrun_pkey"),
    ("task_log_append", "worker API: logs", "core_taskrun_pkey"),
    ("task_log_append", "worker API: logs (the generation's lines so far, for the cap)", "idx_tasklog_taskrun"),
    # Issue 19: the task detail's (and the task panel's, polled) lines of each attempt.
    ("task_log_attempt_tails", "task detail: each attempt's last lines", "idx_tasklog_taskrun"),
]

_SCAN = re.compile(r"(?:Index|Index Only|Bitmap Index) Scan(?: Backward)? (?:using|on) (\w+)")
# A history partition's index is named <partition>_<its table's index> (engine migration 0033).
_PARTITION_PREFIX = re.compile(r"^core_\w+?_p\d{8}t\d{6}_")


def generic_plan(sql: str, params: dict) -> str:
    """EXPLAIN (ANALYZE) of ``sql``'s generic plan as the driver prepares it, under the
    driver's planner settings, in a transaction rolled back."""
    name, text, order = driver.prepared_form(sql)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(driver.INDEX_PROBES_ONLY)
            cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cur.execute(f"PREPARE ff_plan_probe({', '.join(TYPES[n] for n in order)}) AS {text}")
            try:
                cur.execute(f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE ff_plan_probe({', '.join(['%s'] * len(order))})",
                            [params[n] for n in order])
                plan = "\n".join(r[0] for r in cur.fetchall())
            finally:
                cur.execute("DEALLOCATE ff_plan_probe")
        transaction.set_rollback(True)
    return plan


@pytest.fixture
def seeded(org, make_workflow):
    """Parameters for every hot statement, naming rows of a small seeded database."""
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"},
                             {"key": "c", "type": "noop", "depends_on": ["a", "b"]}])
    runs = [start_run(workflow=wf) for _ in range(4)]
    claimed = task_runs.claim_ready_many(limit=4, lease_seconds=60, owner="test")
    started = engine_helpers.start_attempts([StartRequest(d.task_run_id, d.fencing_token, "w") for d in claimed],
                                            lease_seconds=60)
    assert all(started)
    done = claimed[:2]
    engine_helpers.complete_successes([SuccessRequest(d.task_run_id, d.fencing_token, None)
                                       for d in done], lease_seconds=60, owner="test")
    with connection.cursor() as cur:  # one running lease expired
        cur.execute("UPDATE core_taskrun SET lease_expires_at = clock_timestamp() - interval '1 minute' WHERE id = %s",
                    [claimed[2].task_run_id])
    with connection.cursor() as cur:
        cur.execute("ANALYZE core_taskrun")
        cur.execute("ANALYZE core_outboxmessage")
    ready = list(TaskRun.objects.unscoped().filter(workflow_run__in=runs, state="ready").values_list("id", flat=True))
    ids, tokens = [d.task_run_id for d in done], [d.fencing_token for d in done]
    s_ids, s_tokens = [d.task_run_id for d in claimed[2:]], [d.fencing_token for d in claimed[2:]]
    return {
        "limit": 200, "owner": "test", "lease": 60.0, "queue": TASK_QUEUE, "reserve": 0.0, "ids": ready,
        "tokens": tokens, "outputs": ["null"] * len(ids), "start_ids": s_ids, "start_tokens": s_tokens,
        "owners": ["w"] * len(s_ids), "start_outbox": [None] * len(s_ids), "worker_lease": 60.0,
        "upstream_bytes": 1024 * 1024, "id": claimed[2].task_run_id, "token": claimed[2].fencing_token,
        "error": "boom", "retryable": True, "kind": "attempt_failed",
        "after": uuid.UUID(int=0), "max_orgs": 100, "orgs": [org.pk], "org_of": [], "only_ids": None,
        "lock_ids": s_ids, **task_runs.claim_params(limit=200, lease_seconds=60.0, owner="test"),
        "org": org.pk, "levels": ["info"], "messages": ["a line"],
        "traceback": "", "max_lines": 2000, "max_bytes": 512 * 1024, "marker": "log truncated",
        # The statements that address succeeded or started generations by id get those.
        "_done_ids": ids, "_started_ids": s_ids, "_run_ids": [r.pk for r in runs],
    }


def _params_for(name: str, seeded: dict) -> dict:
    params = dict(seeded)
    if name in ("task_run_succeed_many", "task_run_start_and_succeed_many", "task_run_promote_dependents",
                "run_finish_if_done_many"):
        params["ids"] = seeded["_done_ids"]
    elif name == "task_run_heartbeat_many":
        params["ids"], params["tokens"] = seeded["_started_ids"], seeded["start_tokens"]
    return params


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("name", "runner", "index"), HOT,
                         ids=[f"{h[0]}-{h[2] if isinstance(h[2], str) else 'by-run-and-task'}" for h in HOT])
def test_each_hot_statement_uses_the_index_its_comment_names(seeded, name, runner, index):
    names = (index,) if isinstance(index, str) else index
    assert all(n in descriptions[name] for n in names), f"{name}'s comment does not name {names}"
    plan = generic_plan(queries[name], _params_for(name, seeded))
    used = {_PARTITION_PREFIX.sub("", n) for n in _SCAN.findall(plan)}
    assert used & set(names), (name, runner, plan)
    # No statement reads a whole execution table.
    for table in ("core_taskrun", "core_outboxmessage", "core_workflowrun", "core_taskrunevent"):
        assert f"Seq Scan on {table} " not in plan, (name, plan)


@pytest.mark.django_db(transaction=True)
def test_the_benchmarks_hot_queries_use_their_indexes_under_the_drivers_planner_settings(seeded):
    """``bench.hot_queries`` measures these statements by name; each one's plan uses the
    index the bench expects (run progress: the API's per-run count by state)."""
    for key, spec in hot_queries.QUERIES.items():
        params = spec["params"]({"run_sample": seeded["_run_ids"], "org_ids": seeded["orgs"]})
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(driver.INDEX_PROBES_ONLY)
                cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + spec["sql"], params)
                plan = "\n".join(r[0] for r in cur.fetchall())
            transaction.set_rollback(True)
        assert spec["index"] in set(_SCAN.findall(plan)), (key, plan)


_UPSTREAM_SCAN = re.compile(r"Index Scan using (?:uniq_taskrun_per_run_task|idx_taskrun_task_run) on core_taskrun \w+ "
                            r"\(actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)\)")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["task_run_start_many", "task_run_start_and_succeed_many"])
def test_a_start_reads_its_dependencies_outputs_one_probe_per_edge_in_a_wide_run(seeded, org, make_workflow,
                                                                                  name):
    """The upstream outputs a start hands its worker are read one index probe per
    dependency edge, not by walking every task run of the run: planned with statistics
    gathered while runs were small (``seeded`` analyzed four runs of three tasks), the
    join form it replaced read all 400 task runs of this run for each start (measured in
    make bench: 3.8 ms and 12,000 buffers per start in a run of 2,000)."""
    tasks = [{"key": f"t{i:03d}", "type": "noop"} for i in range(400)]
    tasks.append({"key": "z", "type": "noop", "depends_on": ["t000"]})
    run = start_run(workflow=make_workflow(org, tasks, name="wide"))
    with connection.cursor() as cur:
        # t000 succeeded with an output; z's generation 1 claimed and not started.
        cur.execute("""UPDATE core_taskrun t SET state = 'succeeded', output = '{"n": 1}'::jsonb
                       FROM core_task k WHERE k.id = t.task_id AND k.key = 't000' AND t.workflow_run_id = %s""",
                    [run.pk])
        cur.execute("""UPDATE core_taskrun t SET state = 'running', fencing_token = 1, started_fencing_token = NULL,
                              lease_owner = 'test', lease_expires_at = clock_timestamp() + interval '1 minute'
                       FROM core_task k WHERE k.id = t.task_id AND k.key = 'z' AND t.workflow_run_id = %s
                       RETURNING t.id""", [run.pk])
        (z_id,) = cur.fetchone()
    params = _params_for(name, seeded)
    params.update(start_ids=[z_id], start_tokens=[1], owners=["w"], start_outbox=[None])
    if name == "task_run_start_and_succeed_many":
        params.update(ids=[], tokens=[], outputs=[])
    plan = generic_plan(queries[name], params)
    scans = [(int(rows), int(loops)) for rows, loops in _UPSTREAM_SCAN.findall(plan)]
    assert scans, plan  # the probe is there: z has one dependency
    # One edge, one probe, one row (rows is per loop).
    assert all(rows <= 1 and loops <= 1 for rows, loops in scans), plan


def taskrun_scans(plan: str, alias: str = r"\w+") -> list[tuple[str, str, int, int, int, str]]:
    """(node, index or '', rows per loop, loops, rows removed by its filter, index condition)
    of each executed scan of core_taskrun in an EXPLAIN ANALYZE: under ``alias`` (``u``, or
    ``u_1``, ``u_2`` ... as the planner renames it), or under any alias. Rows removed, like
    rows, are per loop (rounded: under half a row per loop reads as 0)."""
    lines, found = plan.splitlines(), []
    for i, line in enumerate(lines):
        m = re.search(rf"(\w[\w ]*Scan(?: Backward)?)(?: using (\w+))? on core_taskrun {alias}(?:_\d+)? "
                      r"\(actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)\)", line)
        if not m:
            continue
        depth = len(line) - len(line.lstrip())
        below = []
        for nxt in lines[i + 1:]:
            if len(nxt) - len(nxt.lstrip()) <= depth or nxt.lstrip().startswith("->"):
                break
            below.append(nxt.strip())
        cond = next((b for b in below if b.startswith("Index Cond:")), "")
        removed = next((int(b.rsplit(" ", 1)[1]) for b in below if b.startswith("Rows Removed by Filter:")), 0)
        found.append((m.group(1).strip(), m.group(2) or "", int(m.group(3)), int(m.group(4)), removed, cond))
    return found


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rule", ["all_success", "all_done"])
def test_a_success_decides_a_wide_fan_out_one_probe_per_dependency_edge(seeded, org, make_workflow, rule):
    """A success with 300 dependents: their check of their upstreams reads one task run per
    dependency edge (uniq_taskrun_per_run_task), not every task run of the run for each
    dependent (all_success: task_run_promote_dependents; other rules:
    task_run_settle_dependents). The join form it replaced was planned that way under some
    statistics (a review's 4,999-way fan-out held its success's transaction 20 s, seen with
    auto_explain; this test caught it once here, under statistics it does not pin): the
    probe form's plan does not depend on them. tests/integration/test_scheduling.py runs
    the fan-out itself."""
    tasks = [{"key": "root", "type": "noop"}] + [
        {"key": f"c{i:03d}", "type": "noop", "depends_on": ["root"], "trigger_rule": rule} for i in range(300)]
    run = start_run(workflow=make_workflow(org, tasks, name="fan"))
    with connection.cursor() as cur:
        cur.execute("""UPDATE core_taskrun t SET state = 'succeeded', fencing_token = 1, started_fencing_token = 1
                       FROM core_task k WHERE k.id = t.task_id AND k.key = 'root' AND t.workflow_run_id = %s
                       RETURNING t.id""", [run.pk])
        (root_id,) = cur.fetchone()
    name = "task_run_promote_dependents" if rule == "all_success" else "task_run_settle_dependents"
    params = dict(_params_for(name, seeded), ids=[root_id], tokens=[1])
    plan = generic_plan(queries[name], params)
    scans = taskrun_scans(plan, "u")
    assert scans, plan  # the upstream check is there
    for node, index, rows, _loops, _removed, _cond in scans:
        assert node == "Index Scan" and index in RUN_TASK_INDEXES, plan
        assert rows <= 1, plan  # per loop: one edge, one task run


@pytest.mark.django_db(transaction=True)
def test_a_failure_skips_a_wide_fan_out_one_probe_per_dependency_edge(seeded, org, make_workflow):
    """A failed task with 300 pending dependents: task_run_skip_descendants finds each by
    (run, task), one probe of uniq_taskrun_per_run_task per dependency edge. The join form
    it replaced read the run's pending task runs for each row of the closure's level under
    the statistics a bench database had (a failed root with 4,999 dependents: 16.7 s, seen
    with auto_explain); this test's statistics did not lead the join form there, so it
    pins the probe form's plan rather than reproducing that one."""
    tasks = [{"key": "root", "type": "noop"}] + [
        {"key": f"c{i:03d}", "type": "noop", "depends_on": ["root"]} for i in range(300)]
    fan = make_workflow(org, tasks, name="fan")
    # Statistics of small runs (a review: 20 runs of a 2-task workflow) made the lock of the
    # skipped task runs, joined by (run, task), probe by the run alone and filter by task:
    # 150 entries for each of the 300 (this test failed so on 3848491: idx_taskrun_run_state,
    # 150 rows filtered per loop).
    small = make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop"}], name="small")
    for _ in range(20):
        start_run(workflow=small, claim_roots=False)
    with connection.cursor() as cur:
        cur.execute("ANALYZE core_taskrun")
    run = start_run(workflow=fan)
    with connection.cursor() as cur:
        cur.execute("""UPDATE core_taskrun t SET state = 'failed'
                       FROM core_task k WHERE k.id = t.task_id AND k.key = 'root' AND t.workflow_run_id = %s
                       RETURNING t.id""", [run.pk])
        (root_id,) = cur.fetchone()
    plan = generic_plan(queries["task_run_skip_descendants"],
                        dict(_params_for("task_run_skip_descendants", seeded), ids=[root_id]))
    assert "rows=300" in plan, plan  # all 300 skipped
    scans = taskrun_scans(plan, "d")
    assert scans, plan
    for node, _index, rows, loops, _removed, _cond in scans:
        # A probe by (run, task) or by id reads one row; a scan of the run's task runs runs
        # once per statement, never once per dependent.
        assert node == "Index Scan" and (rows <= 1 or loops == 1), plan
    for node, index, rows, _loops, removed, cond in taskrun_scans(plan):  # and none filters
        assert node != "Seq Scan" and removed == 0, (node, index, rows, removed, cond, plan)
    # As it runs (engine.repositories.driver.fetch: planned for its values, default planner
    # settings), in a transaction rolled back.
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + queries["task_run_skip_descendants"], {"ids": [root_id]})
            plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    assert "rows=300" in plan, plan
    for node, index, rows, _loops, removed, cond in taskrun_scans(plan):
        assert node != "Seq Scan" and removed == 0, (node, index, rows, removed, cond, plan)


def unseen_outbox_backlog(org, make_workflow) -> list:
    """Claims of a run of 300 tasks (as many as the organization has room for, at least 50)
    whose outbox rows are unpublished, behind statistics gathered while every outbox row was
    published: what a drained deployment's plans expect (next to nothing in
    idx_outbox_pending) against a backlog they have not seen. Returns the Dispatches."""
    run = start_run(workflow=make_workflow(org, [{"key": f"t{i:03d}", "type": "noop"} for i in range(300)],
                                           name="backlog"), claim_roots=False)
    claimed = task_runs.claim_ready_many(limit=300, lease_seconds=60, owner="test", task_run_ids=list(
        TaskRun.objects.unscoped().filter(workflow_run=run).values_list("id", flat=True)))
    assert len(claimed) >= 50
    with connection.cursor() as cur:
        cur.execute("UPDATE core_outboxmessage SET published_at = clock_timestamp() WHERE published_at IS NULL")
        cur.execute("ANALYZE core_outboxmessage")
        cur.execute("UPDATE core_outboxmessage SET published_at = NULL WHERE task_run_id = ANY(%s)",
                    [[d.task_run_id for d in claimed]])
    return claimed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["task_run_start_many", "task_run_start_and_succeed_many"])
def test_a_start_stamps_a_continuations_outbox_row_by_primary_key_past_a_pending_backlog(seeded, org,
                                                                                         make_workflow, name):
    """A start stamps its continuation's outbox row (``delivered``) through the outbox's
    primary key. Written plainly, its ``published_at IS NULL`` matched idx_outbox_pending's
    predicate, and the generic plan read every unpublished row (and every index entry a
    stamp had left dead) once per worker batch, whether the batch held a continuation or
    not: EXPLAIN ANALYZE, 7.7 of a batch's 9.4 ms beside 4,000 pending rows."""
    first = unseen_outbox_backlog(org, make_workflow)[0]
    params = _params_for(name, seeded)
    params.update(start_ids=[first.task_run_id], start_tokens=[first.fencing_token], owners=["w"],
                  start_outbox=[first.outbox_id])
    if name == "task_run_start_and_succeed_many":
        params.update(ids=[], tokens=[], outputs=[])
    plan = generic_plan(queries[name], params)
    assert "core_outboxmessage_pkey" in set(_SCAN.findall(plan)), plan
    assert "idx_outbox_pending" not in plan, plan
    # The continuation's row was stamped (its start went through).
    assert re.search(r"Update on core_outboxmessage o \(actual time=[\d.]+\.\.[\d.]+ rows=0 loops=1\)", plan), plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["outbox_stamp_published", "outbox_stamp_published_commit",
                                  "outbox_stamp_published_async"])
def test_a_publish_stamp_reaches_its_rows_by_primary_key_past_a_pending_backlog(org, make_workflow, name):
    """The relay's and a claimer's stamp (``engine.relay``) finds the rows it published by
    primary key, as its comment says, and not by reading the pending index: with statistics
    that saw no pending row, its ``published_at IS NULL`` had the planner read every
    unpublished row (3,000: 1.5 ms per stamp of 27 rows, 2,973 rows filtered out)."""
    ok = [d.outbox_id for d in unseen_outbox_backlog(org, make_workflow)[:5]]
    # The UPDATE of the statement (its BEGIN, SET LOCAL and COMMIT around it are not planned).
    update = next(part for part in queries[name].split(";") if "UPDATE core_outboxmessage" in part)
    with transaction.atomic():
        with connection.cursor() as cur:
            # As on a deployment's outbox of many rows, where reading the whole table is never
            # the cheapest way to a few rows (this one holds a few hundred).
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + update, {"ok": ok})
            plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    assert "core_outboxmessage_pkey" in set(_SCAN.findall(plan)), plan
    assert "idx_outbox_pending" not in plan, plan
    assert re.search(r"Update on core_outboxmessage .*rows=0 loops=1\)", plan), plan


def _finish_probe(plan: str) -> tuple[str, str, int, int, str]:
    """(node, index, rows per loop, loops, index condition) of run_finish_if_done_many's
    open-task-run probe (core_taskrun under the alias ``t``) in an EXPLAIN ANALYZE."""
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"(\w[\w ]*Scan) using (\w+) on core_taskrun t \(actual time=[\d.]+\.\.[\d.]+ "
                      r"rows=(\d+) loops=(\d+)\)", line)
        if m:
            cond = next((c.strip() for c in lines[i + 1:i + 3] if "Index Cond:" in c), "")
            return m.group(1).strip(), m.group(2), int(m.group(3)), int(m.group(4)), cond
    raise AssertionError(f"no probe in the plan:\n{plan}")


# Each scenario: (statistics the plan is made under, the data it then runs on).
FINISH_SCENARIOS = ["idle-statistics-beside-another-runs-backlog", "never-analyzed-big-run-mostly-finished",
                    "big-runs-analyzed-big-run-mostly-finished", "many-failed-one-open"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scenario", FINISH_SCENARIOS)
def test_a_finish_probe_reads_only_its_own_run_under_any_statistics(org, make_workflow, scenario):
    """run_finish_if_done_many asks, per run of a batch's successes, whether the run still
    has an open task run. Its probe reads only its own run's entries, through
    idx_taskrun_run_state, with no sort, whatever the statistics its generic plan was made
    under.
    - Before: "state IN (...) ORDER BY state", planned under the statistics of an idle table
      (nothing open), used idx_taskrun_state_age (state first) filtered by run, and read all
      400 open entries of another run's backlog (the first scenario failed).
    - 4a3ce25's row comparison alone, planned on a table never analyzed, took
      uniq_taskrun_per_run_task and read the whole run (the second failed: a review's
      reproduction; in make bench's throughput scenario, 1,963 entries and 2 ms a batch).
    - 4d8f3c4's "state > 'failed'" beside the run equality took idx_taskrun_state_age again
      in about half the runs of the first scenario (a review: the choice turned on the
      order the random run ids were written in)."""
    wide = make_workflow(org, [{"key": f"t{i:03d}", "type": "noop"} for i in range(400)], name="wide")
    with connection.cursor() as cur:
        if scenario == "never-analyzed-big-run-mostly-finished":
            cur.execute("DELETE FROM pg_statistic WHERE starelid = 'core_taskrun'::regclass")
            cur.execute("UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'core_taskrun'::regclass")
        else:
            history = [start_run(workflow=wide) for _ in range(3)]  # few big runs: the closest call
            cur.execute("UPDATE core_taskrun SET state = 'succeeded' WHERE workflow_run_id = ANY(%s)",
                        [[r.pk for r in history]])
            cur.execute("ANALYZE core_taskrun")  # nothing open: the idle statistics
    run = start_run(workflow=wide)
    with connection.cursor() as cur:
        if scenario == "idle-statistics-beside-another-runs-backlog":
            start_run(workflow=wide)  # 400 ready task runs of another run
            cur.execute("UPDATE core_taskrun SET state = 'succeeded' WHERE workflow_run_id = %s", [run.pk])
        elif scenario == "many-failed-one-open":
            cur.execute("""UPDATE core_taskrun t SET state = 'failed' FROM core_task k
                           WHERE k.id = t.task_id AND t.workflow_run_id = %s AND k.key < 't399'""", [run.pk])
        else:  # 390 of 400 finished, 10 still ready
            cur.execute("""UPDATE core_taskrun t SET state = 'succeeded' FROM core_task k
                           WHERE k.id = t.task_id AND t.workflow_run_id = %s AND k.key < 't390'""", [run.pk])
        cur.execute("SELECT id FROM core_taskrun WHERE workflow_run_id = %s LIMIT 1", [run.pk])
        (any_id,) = cur.fetchone()
    try:
        plan = generic_plan(queries["run_finish_if_done_many"], {"ids": [any_id]})
    finally:
        if scenario == "never-analyzed-big-run-mostly-finished":
            with connection.cursor() as cur:
                cur.execute("ANALYZE core_taskrun")  # statistics again, for the tests after this one
    assert "idx_taskrun_state_age" not in plan and "uniq_taskrun_per_run_task" not in plan, plan
    _node, index, rows, loops, cond = _finish_probe(plan)
    assert index == "idx_taskrun_run_state" and "(workflow_run_id = " in cond, plan  # its own run only
    assert rows * loops <= 1, plan
    assert "Sort" not in plan.split("core_taskrun t (")[0].rsplit("Limit", 1)[-1], plan  # nothing sorted


@pytest.mark.django_db
def test_the_open_task_run_states_are_the_ones_between_failed_and_skipped():
    """run_finish_if_done(_many) reads "open" as the range ('failed', 'skipped') of
    idx_taskrun_run_state: true of the states the check constraint allows, as the database
    orders them (a new state must be placed, or that range rewritten)."""
    with connection.cursor() as cur:
        cur.execute("SELECT array_agg(s ORDER BY s) FROM unnest(%s::varchar[]) s WHERE s > 'failed' AND s < 'skipped'",
                    [[state.value for state in TaskRunState]])
        (between,) = cur.fetchone()
    assert between == sorted(TASK_OPEN_STATES)


# Statistics of a table where a task's runs look unique (one run each of many single-run
# workflows), or of one never analyzed: either way a (run, task) probe and a probe of the
# task's index alone are each estimated at one row.
TIED_STATISTICS = ["one-run-per-task", "never-analyzed"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("statistics", TIED_STATISTICS)
@pytest.mark.parametrize("name", ["task_run_promote_dependents", "task_run_settle_dependents", "task_run_start_many",
                                  "task_run_start_and_succeed_many", "task_run_skip_descendants"])
def test_a_run_and_task_probe_reads_one_entry_behind_a_tasks_many_runs(org, make_workflow, statistics, name):
    """A hop's probes by (run, task) (the dependents of a success, under the default rule or
    the others, and their upstreams; a start's upstream outputs; the dependents a failure
    skips) read one index entry each, however many runs the task has had and however wide
    the run: every scan of core_taskrun returns at most one row and filters none out.
    Under statistics that price a probe of the task's index (task_id alone, before migration
    0036) and of uniq_taskrun_per_run_task at one row each, the generic plan took the task's
    index and filtered by run, reading an entry for every run of the task (auto_explain in
    make bench's warm-up: a 10-chain's probes read up to 190 entries each, growing with its
    runs); a review found a probe joined by (run, task) taking idx_taskrun_run_state and
    filtering by task (half the run per skipped task)."""
    fillers = [{"key": f"f{i:02d}", "type": "noop"} for i in range(30)]  # runs of 32: a run-only probe shows
    chain = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]},
                                *fillers], name="chain")
    with connection.cursor() as cur:
        if statistics == "never-analyzed":
            cur.execute("DELETE FROM pg_statistic WHERE starelid = 'core_taskrun'::regclass")
            cur.execute("UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'core_taskrun'::regclass")
        else:
            start_run(workflow=make_workflow(org, [{"key": f"t{i:03d}", "type": "noop"} for i in range(300)],
                                             name="wide"))
            cur.execute("ANALYZE core_taskrun")
    try:
        runs = [start_run(workflow=chain, claim_roots=False) for _ in range(150)]
        run = runs[-1]
        with connection.cursor() as cur:
            outcome = "failed" if name == "task_run_skip_descendants" else "succeeded"
            cur.execute("""UPDATE core_taskrun t SET state = %s, fencing_token = 1, output = '{"n": 1}'::jsonb
                           FROM core_task k WHERE k.id = t.task_id AND k.key = 'a' AND t.workflow_run_id = ANY(%s)
                           RETURNING t.id, t.workflow_run_id""", [outcome, [r.pk for r in runs]])
            a_id = next(i for i, r in cur.fetchall() if r == run.pk)
            if name.startswith("task_run_start"):  # b's generation 1 claimed, not started
                cur.execute("""UPDATE core_taskrun t SET state = 'running', fencing_token = 1,
                                      started_fencing_token = NULL, lease_owner = 'test',
                                      lease_expires_at = clock_timestamp() + interval '1 minute'
                               FROM core_task k WHERE k.id = t.task_id AND k.key = 'b' AND t.workflow_run_id = %s
                               RETURNING t.id""", [run.pk])
                (b_id,) = cur.fetchone()
        params = {"ids": [a_id], "tokens": [1], "outputs": [], "start_ids": [], "start_tokens": [], "owners": [],
                  "start_outbox": [], "worker_lease": 60.0, "upstream_bytes": 1024 * 1024}
        if name.startswith("task_run_start"):
            params.update(ids=[], tokens=[], start_ids=[b_id], start_tokens=[1], owners=["w"], start_outbox=[None])
        plan = generic_plan(queries[name], params)
    finally:
        if statistics == "never-analyzed":
            with connection.cursor() as cur:
                cur.execute("ANALYZE core_taskrun")  # statistics again, for the tests after this one
    scans = taskrun_scans(plan)
    assert any("task_id" in cond for *_rest, cond in scans), plan  # the probes are there: b depends on a
    # b's row was written (promoted, or skipped below the failure; started).
    assert re.search(r"Update on core_taskrun \w+ \(actual time=[\d.]+\.\.[\d.]+ rows=1 loops=1\)", plan), plan
    for node, index, rows, _loops, removed, cond in scans:
        assert node != "Seq Scan", plan
        assert rows <= 1 and removed == 0, (node, index, rows, removed, cond, plan)
