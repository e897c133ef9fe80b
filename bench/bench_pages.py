"""Benchmark (not a test): the run page and the run list do not slow down with size.

    .venv/bin/python -m bench.bench_pages [--runs 100000] [--samples 31] [--reload]

It works in a database of its own, ``BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/ff_bench_pages``; created and migrated when
missing), never in ``DATABASE_URL``'s. Every request goes through Django's test Client
as a signed-in owner: middleware, session, organization, the view, the templates.

1. The run page ``/runs/<id>/`` of a finished 200-task run against a finished 5-task
   run (a layered DAG with fan-in, one task retried once; the runs are executed in this
   process through the engine's transitions, so they have real attempts and events:
   ~800 events for the big one). Target: median(200) / median(5) <= 3. The live
   fragment ``/runs/<id>/live/`` (what the page fetches on each change while a run is
   active) and the SQL count of both are printed too, and the fragment once more with
   the DAG drawing cache off (an active run's states change between updates, so its
   drawing is usually made afresh).
2. The run list ``/runs/`` of an organization with 100,000 runs against one with 100
   runs (bulk-loaded with ``INSERT ... SELECT FROM generate_series``, not through the
   engine, each run with two task runs): the first page, a page 500 pages deep (through
   its cursor) and a filtered page. Target: median(100,000) / median(100) <= 1.5.

The first invocation loads the data (about a minute); later ones reuse it (``--reload``
starts afresh). Measuring takes under a minute.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dbsetup import use_bench_database  # noqa: E402

# start_run's nudge must not wake anyone's workers: a broker namespace of its own.
BENCH_DATABASE_URL = use_bench_database(
    "postgres://postgres@127.0.0.1:5432/ff_bench_pages", BROKER_NAMESPACE="ff-bench-pages"
)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.cache import cache as django_cache  # noqa: E402
from django.core.cache.backends.dummy import DummyCache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from api.pagination import encode_cursor  # noqa: E402
from engine import services as engine_services  # noqa: E402
from engine.models import TaskRun, Workflow, WorkflowRun  # noqa: E402
from engine.repositories import task_runs  # noqa: E402
from engine.repositories.types import StartRequest, SuccessRequest  # noqa: E402
from engine.services import apply_definition, start_run  # noqa: E402
from frontend.presenters import run_page as run_views  # noqa: E402  (the DAG cache is the run page presenter's)
from tenancy.context import actor_for_membership  # noqa: E402
from tenancy.models import Membership, Organization, Role  # noqa: E402
from tenancy.services import create_organization  # noqa: E402

CHUNK = 50_000
# No scheduler nudges from start_run: the bench executes its runs itself, and no worker listens.
engine_services.nudge_scheduler = lambda: None
# The Client talks to the bench database only, over plain HTTP.
settings.ALLOWED_HOSTS = ["testserver"]

LOAD_RUNS_SQL = """
INSERT INTO core_workflowrun
    (id, organization_id, workflow_id, state, input, trigger_source, error, last_event_seq,
     created_at, started_at, finished_at)
SELECT gen_random_uuid(), %(org)s, %(wf)s,
       CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'succeeded' END, '{}'::jsonb, 'api', '', 0,
       t, t, t + interval '2 seconds'
FROM generate_series(%(lo)s, %(hi)s) AS i,
     -- one run every ~31.5 s back from now, at microsecond precision
     LATERAL (SELECT %(newest)s::timestamptz - i * interval '31536 milliseconds'
                     - (random() * 1000)::int * interval '1 microsecond' AS t) AS c
RETURNING id
"""

# Two task runs per bulk-loaded run (the workflow's two tasks), so the list's progress
# column has something to count.
LOAD_TASK_RUNS_SQL = """
INSERT INTO core_taskrun
    (id, organization_id, workflow_run_id, task_id, state, attempt, fencing_token, error, created_at,
     started_at, finished_at)
SELECT gen_random_uuid(), r.organization_id, r.id, k.id, r.state, 1, 1, '', r.created_at, r.started_at,
       r.finished_at
FROM core_workflowrun r CROSS JOIN core_task k
WHERE r.organization_id = %(org)s AND k.workflow_id = %(wf)s
  AND NOT EXISTS (SELECT 1 FROM core_taskrun t WHERE t.workflow_run_id = r.id)
"""


def org_and_owner(slug: str):
    org = Organization.objects.filter(slug=slug).first()
    if org is None:
        org, _user, _ = create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                            owner_email=f"owner@{slug}.example")
    owner = (Membership.objects.for_organization(org).select_related("organization", "user")
             .filter(role=Role.OWNER).order_by("created_at").first())
    return org, owner


def layered(n: int, *, width: int, flaky: str | None) -> list[dict]:
    """``n`` tasks in layers of ``width``, each depending on two tasks of the layer above."""
    tasks = []
    for i in range(n):
        deps = []
        if i >= width:
            deps = sorted({f"t{i - width:03d}", f"t{i - width + (1 if i % width < width - 1 else -1):03d}"})
        task = {"key": f"t{i:03d}", "type": "noop", "depends_on": deps, "retry_backoff_seconds": 0}
        if task["key"] == flaky:
            task.update(type="fail", config={"fail_attempts": 1}, max_attempts=2)
        tasks.append(task)
    return tasks


def drive(run: WorkflowRun, *, flaky: str | None) -> WorkflowRun:
    """Execute ``run`` in this process through the engine's transitions (claim, start,
    complete), as the scheduler and the workers would; ``flaky`` fails its first attempt."""
    org = run.organization_id
    while True:
        ready = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="ready")
                     .values_list("id", flat=True))
        if ready:
            task_runs.claim_ready_many(limit=len(ready), lease_seconds=30, owner="bench", task_run_ids=ready)
        pending = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running")
                       .exclude(started_fencing_token=F("fencing_token")).values_list("id", "fencing_token"))
        if not pending:
            break
        for task_run_id, token in pending:
            (att,), _, _ = task_runs.start_and_complete_many(
                starts=[StartRequest(task_run_id, token, "bench")], successes=(), worker_lease_seconds=30,
                dispatch_lease_seconds=30, owner="bench")
            if att is None:
                continue
            if att.task_key == flaky and att.attempt == 1:
                task_runs.fail_attempt(task_run_id=att.task_run_id, fencing_token=att.fencing_token, error="transient")
            else:
                task_runs.start_and_complete_many(
                    starts=(), successes=[SuccessRequest(att.task_run_id, att.fencing_token, {"key": att.task_key, "n": 42})],
                    worker_lease_seconds=30, dispatch_lease_seconds=30, owner="bench")
    run.refresh_from_db()
    return run


def dag_run(org, owner, *, tasks: int, width: int) -> WorkflowRun:
    """The finished run of the ``tasks``-task bench workflow (made and executed on first use)."""
    name = f"bench-dag-{tasks}"
    actor = actor_for_membership(owner, channel="cli")
    wf = Workflow.objects.for_organization(org).filter(name=name).order_by("-version").first()
    if wf is None:
        wf = apply_definition(actor=actor, document={"name": name, "tasks": layered(tasks, width=width,
                                                                                   flaky="t001")})
    run = WorkflowRun.objects.for_organization(org).filter(workflow=wf, state="succeeded").first()
    if run is None:
        with transaction.atomic():
            run = start_run(workflow=wf, actor=actor)
        run = drive(run, flaky="t001")
    return run


def bulk_runs(org, owner, *, runs: int, reload: bool) -> None:
    """``runs`` runs (two task runs each) in ``org``, loaded with generate_series."""
    actor = actor_for_membership(owner, channel="cli")
    wf = Workflow.objects.for_organization(org).filter(name="bench-bulk").first() or apply_definition(
        actor=actor, document={"name": "bench-bulk", "tasks": [{"key": "extract", "type": "noop"},
                                                               {"key": "load", "type": "noop",
                                                                "depends_on": ["extract"]}]})
    have = WorkflowRun.objects.for_organization(org).count()
    if reload and have:
        with connection.cursor() as cur:  # the bench's own database and organization
            cur.execute("DELETE FROM core_taskrun WHERE organization_id = %s", [org.pk])
            cur.execute("DELETE FROM core_workflowrun WHERE organization_id = %s", [org.pk])
        have = 0
    if have >= runs:
        return
    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        newest = cur.fetchone()[0]
    for lo in range(have + 1, runs + 1, CHUNK):
        hi = min(runs, lo + CHUNK - 1)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(LOAD_RUNS_SQL, {"org": org.pk, "wf": wf.pk, "lo": lo, "hi": hi, "newest": newest})
            cur.execute(LOAD_TASK_RUNS_SQL, {"org": org.pk, "wf": wf.pk})
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE core_workflowrun")
        cur.execute("VACUUM ANALYZE core_taskrun")
    print(f"  loaded {runs:,} runs into {org.slug} in {time.perf_counter() - started:.0f} s")


def sql_count(client: Client, path: str) -> tuple[int, int]:
    """(SQL statements without savepoints, response bytes) of GET ``path``."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, path
    return len([q for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]), len(
        response.content)


def measure_pair(a: tuple[Client, str], b: tuple[Client, str], *, samples: int) -> tuple[float, float]:
    """Median milliseconds of GET ``a`` and of GET ``b``, sampled alternately so that
    both see the same machine load (the ratio is what matters)."""
    for client, path in (a, b, a, b, a, b):  # warm: sessions, plan cache, buffers, the DAG cache
        assert client.get(path).status_code == 200, path
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(samples):
        for i, (client, path) in enumerate((a, b)):
            t0 = time.perf_counter()
            response = client.get(path)
            times[i].append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, path
    return statistics.median(times[0]), statistics.median(times[1])


def deep_cursor(org, *, row: int) -> str:
    """The cursor a reader holds after ``row`` rows (read once with OFFSET, only here)."""
    created_at, pk = (WorkflowRun.objects.for_organization(org).order_by("-created_at", "-id")
                      .values_list("created_at", "id")[row - 1])
    return encode_cursor(created_at, pk)


def client_for(owner) -> Client:
    client = Client()
    client.force_login(owner.user)
    return client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="runs of the big organization")
    parser.add_argument("--samples", type=int, default=31, help="requests per measurement (median)")
    parser.add_argument("--reload", action="store_true", help="load the bulk runs again")
    args = parser.parse_args()
    wall = time.perf_counter()
    print(f"database: {connection.settings_dict['NAME']}")
    call_command("migrate", verbosity=0)
    ok = True

    # 1. The run page: 200 tasks against 5.
    org, owner = org_and_owner("bench-pages-dag")
    small, big = dag_run(org, owner, tasks=5, width=5), dag_run(org, owner, tasks=200, width=20)
    client = client_for(owner)
    print(f"\nrun page, median of {args.samples} requests each, sampled alternately (events: 5-task run {small.last_event_seq}, "
          f"200-task run {big.last_event_seq})")
    print(f"{'page':<34} {'5 tasks':>10} {'200 tasks':>10} {'ratio':>7} {'SQL':>9} {'KiB (200)':>10}")
    for label, suffix, target in (("/runs/<id>/ (the page)", "", 3.0), ("/runs/<id>/live/ (fragment)", "live/", None)):
        small_path, big_path = f"/runs/{small.pk}/{suffix}", f"/runs/{big.pk}/{suffix}"
        s_ms, b_ms = measure_pair((client, small_path), (client, big_path), samples=args.samples)
        (s_q, _), (b_q, b_bytes) = sql_count(client, small_path), sql_count(client, big_path)
        ratio = b_ms / s_ms
        if target is not None:
            ok &= ratio <= target and s_q == b_q
        print(f"{label:<34} {s_ms:>7.1f} ms {b_ms:>7.1f} ms {ratio:>7.2f} {s_q:>4} / {b_q:<3} {b_bytes / 1024:>9.0f}")
    # While a run is active its task states change between updates, so the fragment usually
    # draws the DAG afresh: the same fragment with the drawing cache switched off.
    run_views.cache = DummyCache("bench", {})
    try:
        s_ms, b_ms = measure_pair((client, f"/runs/{small.pk}/live/"), (client, f"/runs/{big.pk}/live/"),
                                  samples=args.samples)
    finally:
        run_views.cache = django_cache
    print(f"{'/runs/<id>/live/, DAG drawn afresh':<34} {s_ms:>7.1f} ms {b_ms:>7.1f} ms {b_ms / s_ms:>7.2f}")
    print("target: page ratio <= 3 with the same SQL count")

    # 2. The run list: 100,000 runs against 100.
    few_org, few_owner = org_and_owner("bench-pages-100")
    many_org, many_owner = org_and_owner("bench-pages-many")
    bulk_runs(few_org, few_owner, runs=100, reload=args.reload)
    bulk_runs(many_org, many_owner, runs=args.runs, reload=args.reload)
    few_client, many_client = client_for(few_owner), client_for(many_owner)
    print(f"\nrun list, median of {args.samples} requests each, sampled alternately")
    print(f"{'page':<34} {'100 runs':>10} {f'{args.runs:,} runs':>14} {'ratio':>7} {'SQL':>9}")
    rows = [
        ("/runs/ (first page)", "/runs/", "/runs/"),
        ("/runs/?state=succeeded", "/runs/?state=succeeded", "/runs/?state=succeeded"),
        ("/runs/ page 2 vs page 500", f"/runs/?older_than={deep_cursor(few_org, row=50)}",
         f"/runs/?older_than={deep_cursor(many_org, row=500 * 50)}"),
    ]
    for label, few_path, many_path in rows:
        f_ms, m_ms = measure_pair((few_client, few_path), (many_client, many_path), samples=args.samples)
        (f_q, _), (m_q, _) = sql_count(few_client, few_path), sql_count(many_client, many_path)
        ratio = m_ms / f_ms
        ok &= ratio <= 1.5 and f_q == m_q
        print(f"{label:<34} {f_ms:>7.1f} ms {m_ms:>11.1f} ms {ratio:>7.2f} {f_q:>4} / {m_q:<3}")
    print("target: ratio <= 1.5 with the same SQL count")
    print(f"\n{'all targets met' if ok else 'a target was NOT met'} ({time.perf_counter() - wall:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
