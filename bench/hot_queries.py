"""Scenario 3: the engine's hot queries against 10,000 and 1,000,000 historical task runs.

History is bulk-loaded with ``INSERT ... SELECT FROM generate_series`` (not through the
engine): finished runs of a 10-task workflow (every 50th failed: 5 tasks succeeded, one
failed, the rest skipped), each task run with a published outbox row. Beside it sits a
fixed live working set, the same at every size: 200 ready task runs, 100 running ones
(half with an expired lease) and 200 unpublished outbox rows. The small size lives in a
schema of its own (``bench_hot_small``: the same four tables, with the same constraint,
index and trigger names, created from the catalog), the large one in the real tables,
so the two sizes are measured interleaved, repetition by repetition, and a change of
the machine's load hits both alike. Each query is timed (median of ``reps``, each in a
transaction that is rolled back, so every repetition sees the same rows, with
``search_path`` choosing the size) and explained with ``EXPLAIN (ANALYZE, BUFFERS)``;
the plan must use the index seed 000 provisions for it:

=============  ==================================================  ===========================
query          what runs it                                        index
=============  ==================================================  ===========================
claim          ``task_run_claim_fair`` (scheduler, limit 200)       idx_taskrun_ready_claim
lease reaper   ``task_run_get_expired_leases`` (limit 500)         idx_taskrun_lease_expiry
outbox drain   ``outbox_get_pending`` (relay, limit 200)           idx_outbox_pending
run progress   ``state, count(*) ... WHERE workflow_run_id = ?``   idx_taskrun_run_state
=============  ==================================================  ===========================

The first three are the engine's statements, loaded by name from ``engine.sql``; run
progress is what the API and the web UI's run pages ask the ORM for.
"""

from __future__ import annotations

import random
import re
import statistics
import time
import uuid

from django.db import connection, transaction

from engine.repositories.task_runs import claim_params
from engine.services import apply_definition
from engine.sql import queries
from engine.states import TASK_QUEUE

HISTORY_TASKS = 10  # task runs per historical run
CHUNK_TASK_RUNS = 100_000

QUERIES = {
    "claim": {
        "index": "idx_taskrun_ready_claim",
        "sql": queries["task_run_claim_fair"],
        # The fair claim for the working set's organization (its claim lock is taken by a
        # statement of its own, not timed here): the same parameters the scheduler passes.
        "params": lambda ctx: {**claim_params(limit=200, lease_seconds=300.0, owner="bench"),
                               "orgs": ctx["org_ids"], "org_of": [], "only_ids": None},
    },
    "lease_reaper": {
        "index": "idx_taskrun_lease_expiry",
        "sql": queries["task_run_get_expired_leases"],
        "params": lambda ctx: {"limit": 500},
    },
    "outbox_drain": {
        "index": "idx_outbox_pending",
        "sql": queries["outbox_get_pending"],
        "params": lambda ctx: {"limit": 200},
    },
    "run_progress": {
        "index": "idx_taskrun_run_state",
        # The run's task runs by the other seed index that leads with workflow_run_id is the
        # same probe (one run's rows, a few buffers); which of the two the planner takes
        # turns on statistics (seen in a soak: uniq_taskrun_per_run_task, 0.08 ms).
        "also": ("uniq_taskrun_per_run_task",),
        "sql": "SELECT state, count(*) FROM core_taskrun WHERE workflow_run_id = %s GROUP BY state",
        "params": lambda ctx: [random.choice(ctx["run_sample"])],
    },
}


def on_index(spec: dict, used: list[str]) -> bool:
    """Whether a plan that scanned the indexes ``used`` stays on the query's index
    (``spec["index"]``, or one of ``spec["also"]``: an equivalent probe)."""
    return any(name in used for name in (spec["index"], *spec.get("also", ())))


SMALL_SCHEMA = "bench_hot_small"
TABLES = ("core_workflowrun", "core_taskrun", "core_outboxmessage", "core_taskrunevent")


def create_small_schema() -> None:
    """``SMALL_SCHEMA`` with copies of the engine's execution tables: columns, defaults,
    primary/unique/check constraints, indexes and triggers, under the same names
    (foreign keys are left out: the measured transactions roll back before a deferred
    check would run)."""
    _exec(f"DROP SCHEMA IF EXISTS {SMALL_SCHEMA} CASCADE")
    _exec(f"CREATE SCHEMA {SMALL_SCHEMA}")
    for table in TABLES:
        _exec(f"CREATE TABLE {SMALL_SCHEMA}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING STORAGE)")
        for name, definition in _exec(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'c') ORDER BY contype DESC, conname",
            [f"public.{table}"],
        ):
            _exec(f'ALTER TABLE {SMALL_SCHEMA}.{table} ADD CONSTRAINT "{name}" {definition}')
        for (definition,) in _exec(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
            [f"public.{table}"],
        ):
            # A partitioned table's index reads "ON ONLY" (engine migration 0033); the copy is plain.
            _exec(definition.replace(f" ON ONLY public.{table} ", f" ON {SMALL_SCHEMA}.{table} ")
                  .replace(f" ON public.{table} ", f" ON {SMALL_SCHEMA}.{table} "))
        for (definition,) in _exec(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            [f"public.{table}"],
        ):
            _exec(definition.replace(f" ON public.{table} ", f" ON {SMALL_SCHEMA}.{table} "))


def drop_small_schema() -> None:
    _exec(f"DROP SCHEMA IF EXISTS {SMALL_SCHEMA} CASCADE")


def _use(schema: str | None) -> None:
    """Point this transaction's unqualified table names at ``schema`` (None: the real tables)."""
    _exec(f"SET LOCAL search_path TO {schema + ', ' if schema else ''}public")


def history_workflow(org):
    tasks = [{"key": f"h{i}", "type": "noop"} for i in range(HISTORY_TASKS)]
    for i in range(1, HISTORY_TASKS):
        tasks[i]["depends_on"] = [f"h{i - 1}"]
    return apply_definition(organization=org, document={"name": "bench-history", "tasks": tasks})


def _exec(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def create_live_set(org, workflow, schema: str | None = None) -> None:
    """The in-flight rows every size shares: 20 running runs with 10 ready task runs each,
    10 running runs with 10 running task runs each (half of them expired), and two
    unpublished outbox rows (two generations) per running task run."""
    params = {"org": org.pk, "wf": workflow.pk}
    with transaction.atomic():
        _use(schema)
        _exec(
            """
            WITH r AS (
                INSERT INTO core_workflowrun (id, organization_id, workflow_id, state, input, trigger_source, error,
                                              last_event_seq, created_at, started_at)
                SELECT gen_random_uuid(), %(org)s, %(wf)s, 'running', '{"live": true}', 'cli', '', 0,
                       now() - g * interval '1 second', now() - g * interval '1 second'
                FROM generate_series(1, 30) g
                RETURNING id, created_at
            ), numbered AS (
                SELECT r.*, row_number() OVER (ORDER BY r.id) AS n FROM r
            ), k AS (
                SELECT id, row_number() OVER (ORDER BY key) AS i FROM core_task WHERE workflow_id = %(wf)s
            )
            INSERT INTO core_taskrun (id, organization_id, workflow_run_id, task_id, state, attempt, fencing_token,
                                      started_fencing_token, lease_owner, lease_expires_at, error, created_at,
                                      started_at)
            SELECT gen_random_uuid(), %(org)s, n.id, k.id,
                   CASE WHEN n.n <= 20 THEN 'ready' ELSE 'running' END, 1,
                   CASE WHEN n.n <= 20 THEN 0 ELSE 2 END,
                   CASE WHEN n.n <= 20 THEN NULL ELSE 2 END,
                   CASE WHEN n.n <= 20 THEN NULL ELSE 'worker@bench:1:1' END,
                   CASE WHEN n.n <= 20 THEN NULL
                        WHEN k.i %% 2 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
                   '', n.created_at + k.i * interval '1 millisecond',
                   CASE WHEN n.n <= 20 THEN NULL ELSE now() - interval '2 minutes' END
            FROM numbered n CROSS JOIN k
            """,
            params,
        )
        _exec(
            """
            INSERT INTO core_outboxmessage (id, organization_id, task_run_id, workflow_run_id, exchange, routing_key,
                                            payload, fencing_token_snapshot, attempt_snapshot, publish_attempts,
                                            last_error, created_at)
            SELECT gen_random_uuid(), t.organization_id, t.id, t.workflow_run_id, '', %(queue)s,
                   jsonb_build_object('task_run_id', t.id, 'fencing_token', g.tok, 'attempt', 1),
                   g.tok, 1, 0, '', now() - interval '1 minute' + g.tok * interval '1 millisecond'
            FROM core_taskrun t CROSS JOIN (VALUES (1), (2)) AS g(tok)
            WHERE t.state = 'running' AND t.organization_id = %(org)s AND t.lease_owner = 'worker@bench:1:1'
            """,
            {**params, "queue": TASK_QUEUE},
        )


def history_size(workflow, schema: str | None = None) -> int:
    with transaction.atomic():
        _use(schema)
        return _history_size(workflow)


def _history_size(workflow) -> int:
    return _exec(
        "SELECT count(*) FROM core_taskrun t JOIN core_workflowrun r ON r.id = t.workflow_run_id "
        "WHERE r.workflow_id = %s AND r.state <> 'running'",
        [workflow.pk],
    )[0][0]


def load_history(org, workflow, target: int, schema: str | None = None) -> float:
    """Add finished runs (with their task runs and published outbox rows) until the
    workflow has ``target`` historical task runs. Returns the seconds it took."""
    began = time.monotonic()
    have = history_size(workflow, schema)
    while have < target:
        runs = min(CHUNK_TASK_RUNS, target - have) // HISTORY_TASKS or 1
        with transaction.atomic():
            _use(schema)
            _exec("SET LOCAL synchronous_commit = off")
            if _exec("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0][0]:
                # Consistent by construction: skip the per-row deferred foreign-key checks
                # (as a restore does); without superuser they simply run.
                _exec("SET LOCAL session_replication_role = replica")
            _exec(
                """
                WITH r AS (
                    INSERT INTO core_workflowrun (id, organization_id, workflow_id, state, input, trigger_source,
                                                  error, last_event_seq, created_at, started_at, finished_at)
                    SELECT gen_random_uuid(), %(org)s, %(wf)s,
                           CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END, '{}', 'cli',
                           CASE WHEN g %% 50 = 0 THEN 'task load failed' ELSE '' END, 0, ts, ts,
                           ts + interval '5 seconds'
                    FROM (SELECT g, now() - interval '400 days' + random() * interval '365 days' AS ts
                          FROM generate_series(1, %(runs)s) g) s
                    RETURNING id, created_at, state
                ), k AS (
                    SELECT id, row_number() OVER (ORDER BY key) AS i FROM core_task WHERE workflow_id = %(wf)s
                ), t AS (
                    INSERT INTO core_taskrun (id, organization_id, workflow_run_id, task_id, state, attempt,
                                              fencing_token, started_fencing_token, error, output, created_at,
                                              started_at, finished_at)
                    SELECT gen_random_uuid(), %(org)s, r.id, k.id,
                           CASE WHEN r.state = 'succeeded' OR k.i <= 5 THEN 'succeeded'
                                WHEN k.i = 6 THEN 'failed' ELSE 'skipped' END,
                           1, CASE WHEN r.state = 'failed' AND k.i > 6 THEN 0 ELSE 1 END,
                           CASE WHEN r.state = 'failed' AND k.i > 6 THEN NULL ELSE 1 END,
                           CASE WHEN r.state = 'failed' AND k.i = 6 THEN 'RuntimeError: boom' ELSE '' END,
                           NULL, r.created_at,
                           CASE WHEN r.state = 'failed' AND k.i > 6 THEN NULL
                                ELSE r.created_at + k.i * interval '300 milliseconds' END,
                           r.created_at + k.i * interval '400 milliseconds'
                    FROM r CROSS JOIN k
                    RETURNING id, workflow_run_id, created_at, fencing_token
                )
                INSERT INTO core_outboxmessage (id, organization_id, task_run_id, workflow_run_id, exchange,
                                                routing_key, payload, fencing_token_snapshot, attempt_snapshot,
                                                publish_attempts, last_error, created_at, published_at)
                SELECT gen_random_uuid(), %(org)s, t.id, t.workflow_run_id, '', %(queue)s,
                       jsonb_build_object('task_run_id', t.id, 'fencing_token', 1, 'attempt', 1),
                       1, 1, 1, '', t.created_at, t.created_at + interval '2 milliseconds'
                FROM t WHERE t.fencing_token = 1
                """,
                {"org": org.pk, "wf": workflow.pk, "runs": runs, "queue": TASK_QUEUE},
            )
        have += runs * HISTORY_TASKS
    with connection.cursor() as cur:  # autocommit: VACUUM cannot run in a transaction
        prefix = f"{schema}." if schema else "public."
        cur.execute("VACUUM ANALYZE " + ", ".join(prefix + t for t in TABLES))
    return time.monotonic() - began


def _run_once(spec: dict, ctx: dict, schema: str | None) -> float:
    params = spec["params"](ctx)
    with transaction.atomic():
        _use(schema)
        began = time.perf_counter()
        with connection.cursor() as cur:
            cur.execute(spec["sql"], params)
            if cur.description:
                cur.fetchall()
        elapsed = time.perf_counter() - began
        transaction.set_rollback(True)
    return elapsed


def _explain(spec: dict, ctx: dict, schema: str | None) -> str:
    with transaction.atomic():
        _use(schema)
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + spec["sql"], spec["params"](ctx))
            plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    return plan


def _run_sample(workflow, schema: str | None) -> list:
    with transaction.atomic():
        _use(schema)
        return [
            r[0]
            for r in _exec(
                "SELECT id FROM core_workflowrun WHERE workflow_id = %s AND state <> 'running' "
                "ORDER BY random() LIMIT 200",
                [workflow.pk],
            )
        ]


def measure(workflow, schemas: dict[str, str | None], *, reps: int, warmup: int = 3) -> dict:
    """Median time, plan and index use of each hot query at each size (``schemas``: size
    label -> schema), the sizes interleaved repetition by repetition."""
    ctxs = {label: {"run_sample": _run_sample(workflow, schema), "org_ids": [workflow.organization_id]}
            for label, schema in schemas.items()}
    out: dict = {label: {} for label in schemas}
    for name, spec in QUERIES.items():
        times: dict[str, list[float]] = {label: [] for label in schemas}
        for i in range(warmup + reps):
            for label, schema in schemas.items():
                elapsed = _run_once(spec, ctxs[label], schema)
                if i >= warmup:
                    times[label].append(elapsed)
        for label, schema in schemas.items():
            plan = _explain(spec, ctxs[label], schema)
            used = sorted(set(re.findall(r"(?:Index|Index Only|Bitmap Index) Scan(?: Backward)? (?:using|on) (\w+)", plan)))
            out[label][name] = {
                "median_ms": round(statistics.median(times[label]) * 1000, 3),
                "index": spec["index"],
                "uses_index": on_index(spec, used),
                "indexes_used": used,
                "plan": plan,
            }
    return out


def run(org, *, sizes: tuple[int, int], reps: int) -> dict:
    """Load ``sizes[0]`` historical task runs into the small schema and ``sizes[1]`` into
    the real tables, measure both interleaved; returns per-size results and the
    large/small ratio of each query's median."""
    small, large = str(sizes[0]), str(sizes[-1])
    schemas = {small: SMALL_SCHEMA, large: None}
    workflow = history_workflow(org)
    create_small_schema()
    try:
        results: dict = {"sizes": {}, "live_set": {"ready": 200, "running": 100, "expired": 50, "outbox_pending": 200},
                         "small_schema": SMALL_SCHEMA}
        for label, schema in schemas.items():
            create_live_set(org, workflow, schema)
            load_seconds = load_history(org, workflow, int(label), schema)
            results["sizes"][label] = {"history_task_runs": history_size(workflow, schema),
                                       "load_seconds": round(load_seconds, 1)}
        measured = measure(workflow, schemas, reps=reps)
        for label in schemas:
            results["sizes"][label]["queries"] = measured[label]
    finally:
        drop_small_schema()
    results["ratios"] = {
        name: round(
            results["sizes"][large]["queries"][name]["median_ms"] / results["sizes"][small]["queries"][name]["median_ms"],
            2,
        )
        for name in QUERIES
    }
    return results


__all__ = ["QUERIES", "run", "uuid"]
