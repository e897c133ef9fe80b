"""Benchmark (not a test): keyset pagination of GET /api/v1/runs/ over 1,000,000 runs.

    .venv/bin/python -m bench.bench_api_pagination [--runs 1000000] [--page-size 50] [--depth 500]
                                                   [--samples 31]

It works in a database of its own, ``BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/ff_bench_pagination``; created and migrated when
missing), never in ``DATABASE_URL``'s. Redis comes from ``REDIS_URL`` as usual (the API
key cache). The first run loads the runs with one ``INSERT ... SELECT FROM
generate_series`` per 100,000 rows (not through the engine: no task runs, no events),
spread over a year with microsecond timestamps, over four workflow versions (one with
~3 % of them), then ``VACUUM ANALYZE``; later runs reuse them (``--reload`` starts afresh).
Loading takes about a minute; measuring, seconds.

Then, through Django's test Client with an API key (the whole view: authentication,
the page query, serialization), the median latency of

- the first page of the org-scoped list and the page ``--depth`` pages deep (its cursor
  is built directly from row depth × page size, as a client following ``next`` would
  hold it), and their ratio (target ≤ 1.5: keyset pages cost the same at any depth);
- the same two pages filtered by a workflow version holding ~3 % of the runs, and by one
  holding a third of them (``?workflow=<id>``);

and ``EXPLAIN (ANALYZE, BUFFERS)`` of the deep page query: an index scan of
``idx_wfrun_org_recent`` (unfiltered) and of ``idx_wfrun_wf_recent`` for the rare
workflow (an incremental sort orders the few rows sharing a ``created_at`` by id), never
a sort of the whole matched set. For a workflow with a third of the runs the planner may
rather walk ``idx_wfrun_org_recent`` and skip the other workflows' rows; either way the
page is a bounded index range scan.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dbsetup import use_bench_database  # noqa: E402

BENCH_DATABASE_URL = use_bench_database(
    "postgres://postgres@127.0.0.1:5432/ff_bench_pagination", FLOWFORGE_API_RATE_LIMIT_PER_MINUTE="1000000"
)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from api.pagination import encode_cursor  # noqa: E402
from engine.models import Workflow, WorkflowRun  # noqa: E402
from engine.services import apply_definition  # noqa: E402
from tenancy import apikeys  # noqa: E402
from tenancy.context import actor_for_membership  # noqa: E402
from tenancy.models import ApiKey, Membership, Organization, Role  # noqa: E402
from tenancy.services import create_organization  # noqa: E402

SLUG = "bench-pagination"
WORKFLOW = "bench-etl"
VERSIONS = 4
CHUNK = 100_000

LOAD_SQL = """
INSERT INTO core_workflowrun
    (id, organization_id, workflow_id, state, input, trigger_source, error, last_event_seq,
     created_at, started_at, finished_at)
SELECT gen_random_uuid(), %(org)s,
       -- version 1 gets every 32nd run (~3 %%), versions 2..4 share the rest
       CASE WHEN i %% 32 = 0 THEN (%(workflows)s::uuid[])[1] ELSE (%(workflows)s::uuid[])[2 + i %% 3] END,
       CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'succeeded' END, '{}'::jsonb, 'api', '', 0,
       t, t, t + interval '2 seconds'
FROM generate_series(%(lo)s, %(hi)s) AS i,
     -- one run every ~31.5 s over a year, at microsecond precision (ties are rare but exist)
     LATERAL (SELECT %(newest)s::timestamptz - i * interval '31536 milliseconds'
                     - (random() * 1000)::int * interval '1 microsecond' AS t) AS c
"""


def setup_org() -> tuple[Organization, str, list[Workflow]]:
    """The bench organization, a fresh viewer API key (earlier ones revoked) and its workflow versions."""
    org = Organization.objects.filter(slug=SLUG).first()
    if org is None:
        org, _user, _ = create_organization(slug=SLUG, name="Bench Pagination", owner_email=f"owner@{SLUG}.example")
    owner = Membership.objects.for_organization(org).select_related("organization", "user").filter(
        role=Role.OWNER).order_by("created_at").first()
    actor = actor_for_membership(owner, channel="cli")
    for old in ApiKey.objects.for_organization(org).filter(revoked_at__isnull=True):
        apikeys.revoke_api_key(actor=actor, api_key=old)
    _row, full_key = apikeys.create_api_key(actor=actor, name="bench-pagination", role=Role.VIEWER)
    workflows = list(Workflow.objects.for_organization(org).filter(name=WORKFLOW).order_by("version"))
    while len(workflows) < VERSIONS:
        workflows.append(apply_definition(actor=actor, document={
            "name": WORKFLOW, "tasks": [{"key": "extract", "type": "noop"},
                                        {"key": "load", "type": "noop", "depends_on": ["extract"]}]}))
    return org, full_key, workflows


def load_runs(org: Organization, workflows: list[Workflow], *, runs: int, reload: bool) -> None:
    have = WorkflowRun.objects.for_organization(org).count()
    if reload and have:
        with connection.cursor() as cur:  # the bench's own database: nothing else lives here
            cur.execute("TRUNCATE core_workflowrun CASCADE")
        have = 0
    if have >= runs:
        print(f"reusing {have:,} runs already loaded")
        return
    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        newest = cur.fetchone()[0]
    for lo in range(have + 1, runs + 1, CHUNK):
        hi = min(runs, lo + CHUNK - 1)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(LOAD_SQL, {"org": org.pk, "workflows": [w.pk for w in workflows], "lo": lo, "hi": hi,
                                   "newest": newest})
        print(f"  loaded {hi:,} runs ({time.perf_counter() - started:.0f} s)", flush=True)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE core_workflowrun")
    print(f"loaded in {time.perf_counter() - started:.0f} s (with VACUUM ANALYZE)")


def deep_cursor(org: Organization, *, row: int, workflow: Workflow | None) -> str:
    """The cursor a client holds after ``row`` rows (what the ``next`` link of page
    row/page_size carries), read once with OFFSET — only here, never by the API."""
    qs = WorkflowRun.objects.for_organization(org)
    if workflow is not None:
        qs = qs.filter(workflow=workflow)
    created_at, pk = qs.order_by("-created_at", "-id").values_list("created_at", "id")[row - 1]
    return encode_cursor(created_at, pk)


def median_ms(client: Client, path: str, headers: dict, *, samples: int) -> float:
    for _ in range(5):  # warm: key cache, plan cache, buffers
        assert client.get(path, headers=headers).status_code == 200
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        response = client.get(path, headers=headers)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, response.content[:300]
    return statistics.median(times)


def page_sql(client: Client, path: str, headers: dict) -> str:
    """The SQL of the page query the view ran for ``path`` (parameters inlined by Django)."""
    with CaptureQueriesContext(connection) as captured:
        client.get(path, headers=headers)
    (sql,) = [q["sql"] for q in captured.captured_queries
              if 'FROM "core_workflowrun"' in q["sql"] and "LIMIT" in q["sql"]]
    return sql


def explain(sql: str) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return "\n".join(r[0] for r in cur.fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--depth", type=int, default=500, help="pages deep of the second measurement")
    parser.add_argument("--samples", type=int, default=31, help="requests per measurement (median)")
    parser.add_argument("--reload", action="store_true", help="delete the loaded runs and load them again")
    args = parser.parse_args()

    print(f"database: {connection.settings_dict['NAME']} (PostgreSQL {connection.cursor().connection.info.server_version})")
    call_command("migrate", verbosity=0)
    org, key, workflows = setup_org()
    load_runs(org, workflows, runs=args.runs, reload=args.reload)
    total = WorkflowRun.objects.for_organization(org).count()
    row = args.depth * args.page_size
    rare, common = workflows[0], workflows[-1]
    counts = {w.pk: WorkflowRun.objects.for_organization(org).filter(workflow=w).count() for w in (rare, common)}
    print(f"runs: {total:,} in the organization; {counts[rare.pk]:,} of {rare.name} v{rare.version}, "
          f"{counts[common.pk]:,} of v{common.version}")
    print(f"page size {args.page_size}; deep page = page {args.depth + 1} (after row {row:,}); "
          f"median of {args.samples} requests each, through the whole view (auth, query, JSON)\n")

    client = Client()
    headers = {"Authorization": f"Bearer {key}"}
    listings = [("unfiltered", None, "idx_wfrun_org_recent"),
                (f"?workflow=<v{rare.version} id> (~3% of runs)", rare, "idx_wfrun_wf_recent"),
                (f"?workflow=<v{common.version} id> (~32% of runs)", common, None)]
    results, plans = {}, {}
    for label, workflow, _index in listings:
        base = f"/api/v1/runs/?page_size={args.page_size}" + (f"&workflow={workflow.pk}" if workflow else "")
        deep = f"{base}&cursor={deep_cursor(org, row=row, workflow=workflow)}"
        first_ms = median_ms(client, base, headers, samples=args.samples)
        deep_ms = median_ms(client, deep, headers, samples=args.samples)
        results[label] = (first_ms, deep_ms)
        plans[label] = explain(page_sql(client, deep, headers))

    print(f"{'listing':<38} {'first page':>12} {'page ' + str(args.depth + 1):>12} {'ratio':>8}")
    ok = True
    for label, (first_ms, deep_ms) in results.items():
        ratio = deep_ms / first_ms
        ok &= ratio <= 1.5
        print(f"{label:<38} {first_ms:>9.2f} ms {deep_ms:>9.2f} ms {ratio:>8.2f}")
    print(f"\ntarget: ratio <= 1.5 for every listing -> {'met' if ok else 'NOT met'}")
    for label, _workflow, index in listings:
        plan = plans[label]
        used = sorted({w for w in plan.replace("(", " ").split() if w.startswith("idx_")})
        if index is None:  # a common workflow: the planner may take either index; say which
            print(f"\ndeep page, {label}: index scan of {', '.join(used)} (plan omitted)")
            continue
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the deep page, {label} "
              f"({'uses' if index in plan else 'does NOT use'} {index}):")
        print(plan)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
