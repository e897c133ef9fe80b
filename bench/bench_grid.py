"""Benchmark (not a test): the workflow grid does not slow down with a workflow's history.

    .venv/bin/python -m bench.bench_grid [--runs 1000000] [--few 1000] [--tasks 4] [--samples 31] [--reload]

It works in a database of its own, ``BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/ff_bench_grid``; created and migrated when missing),
never in ``DATABASE_URL``'s. One organization holds two versions-1 workflows of the same
``--tasks`` tasks: ``grid-many`` with ``--runs`` runs (1,000,000) and ``grid-few`` with
``--few`` (1,000), each run with a task run per task (4,000,000 task runs for the big one),
bulk-loaded with one ``INSERT ... SELECT FROM generate_series`` per 100,000 runs (runs and
their task runs in one statement; not through the engine: no events), spread over a year
at microsecond precision, then ``VACUUM ANALYZE``. The first invocation loads them
(a few minutes); later ones reuse them (``--reload`` starts afresh).

Then, through Django's test Client as the signed-in owner (middleware, session,
organization, the view and its template), the median latency of ``/workflows/<id>/grid/``
(25 runs × the tasks) sampled alternately for the two workflows:

- the newest page of each (target: many / few < 1.5);
- an old page of each through its ``older_than`` cursor (as the "Older" link carries it):
  the few's last page against the many's page 20,000 pages deep (row 500,000).

It prints the SQL count of each request (the same for both: no query grows with history)
and ``EXPLAIN (ANALYZE, BUFFERS)`` of each old page's run query (an index scan of
``idx_wfrun_wf_recent``, or of ``idx_wfrun_org_recent`` for a workflow holding most of the
organization's runs; never a sort of the workflow's runs) and task-run query (an index
leading with ``workflow_run``). No index was added for the grid: both are served by
existing ones. Exit status 0 when every ratio is under the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dbsetup import use_bench_database  # noqa: E402

BENCH_DATABASE_URL = use_bench_database("postgres://postgres@127.0.0.1:5432/ff_bench_grid",
                                        BROKER_NAMESPACE="ff-bench-grid")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from engine.models import Workflow, WorkflowRun  # noqa: E402
from engine.services import apply_definition  # noqa: E402
from flowforge.cursors import encode_cursor  # noqa: E402
from tenancy.context import actor_for_membership  # noqa: E402
from tenancy.models import Membership, Organization, Role  # noqa: E402
from tenancy.services import create_organization  # noqa: E402

SLUG = "bench-grid"
CHUNK = 100_000
TARGET = 1.5
# The Client talks to the bench database only, over plain HTTP.
settings.ALLOWED_HOSTS = ["testserver"]

# Runs of one workflow and, in the same statement, a task run per task of it (the run's
# state, every 50th run failed at its last task, every 97th still running).
LOAD_SQL = """
WITH new_runs AS (
    INSERT INTO core_workflowrun
        (id, organization_id, workflow_id, state, input, trigger_source, error, last_event_seq,
         created_at, started_at, finished_at)
    SELECT gen_random_uuid(), %(org)s, %(wf)s,
           CASE WHEN i %% 97 = 0 THEN 'running' WHEN i %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
           '{}'::jsonb, 'api', '', 0, t, t,
           CASE WHEN i %% 97 = 0 THEN NULL ELSE t + interval '2 seconds' END
    FROM generate_series(%(lo)s, %(hi)s) AS i,
         -- spread over a year back from now, at microsecond precision
         LATERAL (SELECT %(newest)s::timestamptz - i * %(step)s::interval
                         - (random() * 1000)::int * interval '1 microsecond' AS t) AS c
    RETURNING id, state, created_at, started_at, finished_at
)
INSERT INTO core_taskrun
    (id, organization_id, workflow_run_id, task_id, state, attempt, fencing_token, error, created_at,
     started_at, finished_at, lease_expires_at)
SELECT gen_random_uuid(), %(org)s, r.id, k.id,
       CASE WHEN r.state = 'failed' AND k.key = %(last)s THEN 'failed'
            WHEN r.state = 'running' AND k.key = %(last)s THEN 'running'
            WHEN r.state = 'running' THEN 'succeeded' ELSE r.state END,
       1, 1, '', r.created_at, r.started_at,
       CASE WHEN r.state = 'running' AND k.key = %(last)s THEN NULL ELSE coalesce(r.finished_at, r.started_at) END,
       CASE WHEN r.state = 'running' AND k.key = %(last)s THEN r.created_at + interval '1 day' END
FROM new_runs r CROSS JOIN core_task k
WHERE k.workflow_id = %(wf)s
"""


def setup(tasks: int):
    """The bench organization, its owner membership and the two workflows (made on first use)."""
    org = Organization.objects.filter(slug=SLUG).first()
    if org is None:
        org, _user, _ = create_organization(slug=SLUG, name="Bench Grid", owner_email=f"owner@{SLUG}.example")
    owner = (Membership.objects.for_organization(org).select_related("organization", "user")
             .filter(role=Role.OWNER).order_by("created_at").first())
    actor = actor_for_membership(owner, channel="cli")
    document = {"tasks": [{"key": f"step{i}", "type": "noop", "depends_on": [f"step{i - 1}"] if i else []}
                          for i in range(tasks)]}
    flows = {}
    for name in ("grid-few", "grid-many"):
        flows[name] = (Workflow.objects.for_organization(org).filter(name=name, version=1).first()
                       or apply_definition(actor=actor, document={"name": name, **document}))
    return org, owner, flows


def load(org, wf: Workflow, *, runs: int, reload: bool) -> None:
    have = WorkflowRun.objects.for_organization(org).filter(workflow=wf).count()
    if reload and have:
        with connection.cursor() as cur:  # the bench's own database and workflow
            cur.execute("DELETE FROM core_taskrun WHERE workflow_run_id IN "
                        "(SELECT id FROM core_workflowrun WHERE workflow_id = %s)", [wf.pk])
            cur.execute("DELETE FROM core_workflowrun WHERE workflow_id = %s", [wf.pk])
        have = 0
    if have >= runs:
        print(f"  reusing {have:,} runs of {wf.name}")
        return
    last = max(wf.definition["tasks"], key=lambda t: int(t["key"][4:]))["key"]
    step = f"{31_536_000_000 // runs} milliseconds"  # a year over ``runs``
    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        newest = cur.fetchone()[0]
    for lo in range(have + 1, runs + 1, CHUNK):
        hi = min(runs, lo + CHUNK - 1)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(LOAD_SQL, {"org": org.pk, "wf": wf.pk, "lo": lo, "hi": hi, "newest": newest, "step": step,
                                   "last": last})
        print(f"  {wf.name}: loaded {hi:,} runs ({time.perf_counter() - started:.0f} s)", flush=True)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE core_workflowrun")
        cur.execute("VACUUM ANALYZE core_taskrun")
    print(f"  {wf.name}: {runs:,} runs in {time.perf_counter() - started:.0f} s (with VACUUM ANALYZE)")


def cursor_after(wf: Workflow, row: int) -> str:
    """The cursor the "Older" link holds after ``row`` runs (read once with OFFSET, only here)."""
    created_at, pk = (WorkflowRun.objects.for_organization(wf.organization_id).filter(workflow=wf)
                      .order_by("-created_at", "-id").values_list("created_at", "id")[row - 1])
    return encode_cursor(created_at, pk)


def captured(client: Client, path: str) -> list[str]:
    """The SQL of GET ``path`` (without savepoints); asserts a 200."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]


def measure_pair(client: Client, a: str, b: str, *, samples: int) -> tuple[float, float]:
    """Median milliseconds of GET ``a`` and of GET ``b``, sampled alternately (same machine load)."""
    for path in (a, b, a, b, a, b):  # warm: session, plan cache, buffers
        assert client.get(path).status_code == 200, path
    times: dict[str, list[float]] = {a: [], b: []}
    for _ in range(samples):
        for path in (a, b):
            t0 = time.perf_counter()
            response = client.get(path)
            times[path].append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, path
    return statistics.median(times[a]), statistics.median(times[b])


def explain(sql: str) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return "\n".join(r[0] for r in cur.fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs of the big workflow")
    parser.add_argument("--few", type=int, default=1_000, help="runs of the small workflow")
    parser.add_argument("--tasks", type=int, default=4, help="tasks of each workflow (a chain)")
    parser.add_argument("--samples", type=int, default=31, help="requests per measurement (median)")
    parser.add_argument("--reload", action="store_true", help="load the runs again")
    args = parser.parse_args()
    wall = time.perf_counter()
    print(f"database: {connection.settings_dict['NAME']}")
    call_command("migrate", verbosity=0)
    org, owner, flows = setup(args.tasks)
    few, many = flows["grid-few"], flows["grid-many"]
    load(org, few, runs=args.few, reload=args.reload)
    load(org, many, runs=args.runs, reload=args.reload)
    client = Client()
    client.force_login(owner.user)
    page = 25
    few_last = max(1, (args.few - 1) // page * page)  # the row after which the few's last page starts
    pages = [
        ("newest page", f"/workflows/{few.pk}/grid/", f"/workflows/{many.pk}/grid/"),
        (f"page after row {few_last:,} vs row {args.runs // 2:,}",
         f"/workflows/{few.pk}/grid/?older_than={cursor_after(few, few_last)}",
         f"/workflows/{many.pk}/grid/?older_than={cursor_after(many, args.runs // 2)}"),
    ]
    print(f"\nworkflow grid (25 runs x {args.tasks} tasks), median of {args.samples} requests each, sampled "
          "alternately, through the whole view")
    print(f"{'page':<36} {f'{args.few:,} runs':>12} {f'{args.runs:,} runs':>14} {'ratio':>7} {'SQL':>9}")
    ok = True
    for label, few_path, many_path in pages:
        f_ms, m_ms = measure_pair(client, few_path, many_path, samples=args.samples)
        f_q, m_q = len(captured(client, few_path)), len(captured(client, many_path))
        ratio = m_ms / f_ms
        ok &= ratio < TARGET and f_q == m_q
        print(f"{label:<36} {f_ms:>9.2f} ms {m_ms:>11.2f} ms {ratio:>7.2f} {f_q:>4} / {m_q:<3}")
    print(f"target: ratio < {TARGET} with the same SQL count -> {'met' if ok else 'NOT met'}")
    # Either workflow's deep page must be a bounded index scan: of idx_wfrun_wf_recent, or (for a
    # workflow holding most of the organization's runs, where the planner may prefer it) of
    # idx_wfrun_org_recent; its task runs by an index leading with workflow_run. Never a Seq Scan.
    for name, path in (("few", pages[1][1]), ("many", pages[1][2])):
        sql = captured(client, path)
        runs_sql = next(q for q in sql if 'FROM "core_workflowrun"' in q and "LIMIT" in q)
        task_sql = next(q for q in sql if 'FROM "core_taskrun"' in q)
        for label, query, indexes in (("run page query", runs_sql, ("idx_wfrun_wf_recent", "idx_wfrun_org_recent")),
                                      ("task-run query", task_sql, ("uniq_taskrun_per_run_task", "idx_taskrun_run_state"))):
            plan = explain(query)
            used = [i for i in indexes if i in plan]
            fine = bool(used) and "Seq Scan" not in plan
            ok &= fine
            print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the {name} workflow's old page, {label}: "
                  f"{'index scan of ' + ', '.join(used) if fine else 'NOT a bounded index scan'}")
            print(plan if len(plan) < 3000 else plan[:3000] + " ...")
    print(f"\n({time.perf_counter() - wall:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
