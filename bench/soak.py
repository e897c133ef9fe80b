"""``make soak``: a million tasks through the engine with a retention of minutes, and a purge
of a million old runs beside live traffic (issue 21, "Done when" 1 and 2).

    python -m bench.soak [--tasks N] [--baseline-tasks M] [--purge-runs K] [--retention-seconds S]

It works in its own PostgreSQL database (``SOAK_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/ff_soak``: dropped, re-created and migrated each run),
Redis database 9 (``SOAK_REDIS_URL``; also the broker) and broker namespace ``ff-soak``, and
starts the deployment's processes through ``flowforge.stack``: ``dramatiq flowforge.worker``
(2 processes x 8 threads) and the clock, with ``DEBUG=0``.

1. **Soak**: N no-op tasks in runs of ``--run-tasks`` (1,000) independent tasks, at most
   ``--in-flight`` (6) runs unfinished at a time, with FLOWFORGE_RUN_RETENTION_SECONDS
   ``--retention-seconds`` (60), housekeeping every ``--housekeeping-seconds`` (5; it runs
   the purge, up to FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS = 1,000,000 runs a pass: it keeps
   up) and published outbox rows kept 10 s. After the first M tasks (default 100,000, or
   N/10 when N < 1,000,000) and at the end, with the runs in flight drained (the same state
   both times), it records each history table's total size (heap + indexes + TOAST; a
   partitioned table's summed over ``pg_partition_tree``) and row counts, and the four hot
   queries of ``bench.hot_queries`` (claim, lease reaper, outbox drain, run progress): the
   indexes their plans use, the plan's estimated cost and the median time of
   ``--hot-reps`` (25). The retention is one minute, not several, so that the first
   100,000 tasks (about 100 s here) already reach the steady state a retention reaches
   after one retention plus a housekeeping period: with a longer one the baseline would be
   a table still filling up. The table says so when the baseline came earlier than that.
2. **Purge** (``--purge-runs K``; 0 skips it): the workers and clock are restarted with run
   retention off (0: housekeeping removes no run), K finished one-task runs with their
   task run and five events each are bulk-loaded (``INSERT ... SELECT generate_series``,
   triggers and foreign-key checks off as in a restore) into the real tables, created and
   finished two minutes past the retention; then ``--purge-rounds`` (3) rounds, each a
   leg of ``--leg-tasks`` (20,000) tasks without the purge and one with it, in the order
   AB BA AB (so a drift of the machine's load hits both alike). The purge is
   ``engine.retention.purge`` in a loop in a process of its own (``python -m bench.soak
   --purger``, the soak's retention, the deployment's batch size), started before a leg
   and stopped after it (``--purge-pause`` seconds between its calls of up to 2,000 runs:
   0, flat out, by default). Throughput is tasks / seconds from the first run's start to the
   last run's end, over all legs of each kind; the purge's rate is the old runs gone
   during the "with" legs over their seconds. Then the purger runs alone until every old
   run is gone (at most ``--purge-drain-seconds``).

Where the server's autovacuum is off (a CI database), a thread runs ``VACUUM (ANALYZE)`` on
the history tables every ``--vacuum-seconds`` (30) throughout both phases, as autovacuum
would with these tables' 1% scale factor and its one-minute naptime; the table says so.

Targets (the exit status is 1 when one is missed): each table's size at the end <= 1.2x
its size at M (the audit log is shown, not judged: one row per run started, kept for years
by the audit retention); every hot query on its seed index at M and at the end, and its median time
at the end <= 1.5x the one at M (or within 0.2 ms: sub-millisecond medians move by more
than that between two quiet moments); every run succeeded; throughput with the purge >=
0.9x without it. It prints a table and writes ``bench/soak_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.run import load  # the load averages, as make bench prints them

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/ff_soak"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
NAMESPACE = "ff-soak"

# The tables that grow with history (engine.metrics' table sizes, less the small ones).
SIZE_TABLES = ("core_workflowrun", "core_taskrun", "core_taskrunevent", "core_tasklog", "core_outboxmessage",
               "core_triggerfiring", "core_auditlog")
# Not bounded by the run retention the soak exercises: one audit row per run started, kept
# for years by the audit retention (docs/audit.md). Shown, not judged.
NOT_JUDGED = ("core_auditlog",)
VACUUM_TABLES = ("core_workflowrun", "core_taskrun", "core_taskrunevent", "core_tasklog", "core_outboxmessage")
TERMINAL_RUN = ("succeeded", "failed", "cancelled")

TARGETS = {"size_ratio": 1.2, "hot_time_ratio": 1.5, "hot_time_slack_ms": 0.2, "purge_throughput_ratio": 0.9}

DEFAULTS = {
    "tasks": 1_000_000,
    "baseline_tasks": None,  # 100,000, or tasks / 10 below a million
    "run_tasks": 1000,
    "in_flight": 6,
    "retention_seconds": 60.0,
    "housekeeping_seconds": 5.0,
    "outbox_keep_seconds": 10.0,
    "partition_seconds": 60.0,
    "vacuum_seconds": 30.0,
    "hot_reps": 25,
    "purge_runs": 1_000_000,
    "purge_rounds": 3,
    "leg_tasks": 20_000,
    "purge_drain_seconds": 900.0,
    "purge_pause": 0.0,
    "processes": 2,
    "threads": 8,
    "timeout": 900.0,
}


def baseline_size(cfg: dict) -> int:
    """M: ``cfg['baseline_tasks']`` when given, else 100,000 (N/10 below a million tasks),
    rounded to whole runs."""
    m = cfg.get("baseline_tasks") or (100_000 if cfg["tasks"] >= 1_000_000 else cfg["tasks"] // 10)
    return max(cfg["run_tasks"], m // cfg["run_tasks"] * cfg["run_tasks"])


def engine_env(cfg: dict, *, retention_seconds: float) -> dict[str, str]:
    """The settings the soak's worker and clock processes run with (on top of the stack's
    environment). FLOWFORGE_HISTORY_PARTITION_SECONDS is passed whether or not the engine
    reads it (history partitions of one minute, when the tables are partitioned)."""
    return {
        "FLOWFORGE_RUN_RETENTION_SECONDS": f"{retention_seconds:g}",
        "FLOWFORGE_CLOCK_HOUSEKEEPING_SECONDS": f"{cfg['housekeeping_seconds']:g}",
        "FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS": f"{cfg['outbox_keep_seconds']:g}",
        "FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS": "1000000",
        "FLOWFORGE_HISTORY_PARTITION_SECONDS": f"{cfg['partition_seconds']:g}",
    }


# --- processes -----------------------------------------------------------------------------------


def start_engine(stack, cfg: dict, env: dict[str, str], tag: str):
    """Start ``dramatiq flowforge.worker`` (processes x threads, prefetch = threads as
    ``Stack.start_worker`` sets it) and the clock with ``env``; return (worker, clock)
    once the worker processes are up."""
    from flowforge.stack import bin_path, wait_until, worker_child_pids

    worker_env = {"dramatiq_queue_prefetch": str(cfg["threads"]), **env}
    worker = stack.start(f"soak-worker-{tag}", [
        bin_path("dramatiq"), "flowforge.worker", "--processes", str(cfg["processes"]), "--threads",
        str(cfg["threads"]), "--worker-shutdown-timeout", "10000"], env=worker_env)
    clock = stack.start(f"soak-clock-{tag}", [sys.executable, "manage.py", "run_clock"], env=env)
    wait_until(lambda: len(worker_child_pids(worker.pid)) >= cfg["processes"], timeout=60,
               what="the worker processes to start")
    return worker, clock


def stop(stack, *procs) -> None:
    """Stop ``procs`` (SIGTERM, then SIGKILL after 15 s) side by side and forget them."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.stop()
        if proc in stack.procs:
            stack.procs.remove(proc)


class Vacuumer:
    """Where the server's autovacuum is off: ``VACUUM (ANALYZE)`` the history tables every
    ``period`` seconds in a thread of its own (its own connection), as autovacuum would.
    ``start`` does nothing when autovacuum is on."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.passes = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Vacuumer:
        from bench.live import autovacuum_on

        if not autovacuum_on():
            self._thread = threading.Thread(target=self._loop, name="soak-vacuum", daemon=True)
            self._thread.start()
        return self

    @property
    def active(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(self.period):
                began = time.monotonic()
                with connection.cursor() as cur:
                    cur.execute("VACUUM (ANALYZE) " + ", ".join(existing_tables(cur, VACUUM_TABLES)))
                self.passes += 1
                self.seconds += time.monotonic() - began
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=600)


def existing_tables(cur, names) -> list[str]:
    cur.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind IN ('r', 'p')", [list(names)])
    found = {r[0] for r in cur.fetchall()}
    return [n for n in names if n in found]


# --- driving the engine ----------------------------------------------------------------------------


class Driver:
    """Starts runs of one workflow of independent no-op tasks, at most ``in_flight``
    unfinished at a time, and waits for them."""

    def __init__(self, workflow, *, in_flight: int, timeout: float) -> None:
        self.workflow = workflow
        self.run_tasks = workflow.tasks.count()
        self.in_flight = in_flight
        self.timeout = timeout
        self.states: dict[str, int] = {}

    def push(self, tasks: int) -> dict:
        """Run ``tasks`` tasks (rounded up to whole runs) and wait for every run to end.
        Returns tasks, runs, seconds (first start to last end, as the driver saw them),
        tasks_per_s and the runs' final states."""
        from django.db import connection

        from bench.live import start_runs

        runs = -(-tasks // self.run_tasks)
        open_ids: list = []
        started = 0
        states: dict[str, int] = {}
        began = time.monotonic()
        last_progress = began
        while started < runs or open_ids:
            while started < runs and len(open_ids) < self.in_flight:
                open_ids.extend(start_runs(self.workflow, 1))
                started += 1
            with connection.cursor() as cur:
                cur.execute("SELECT id, state FROM core_workflowrun WHERE id = ANY(%s) AND state = ANY(%s)",
                            [open_ids, list(TERMINAL_RUN)])
                done = cur.fetchall()
            if done:
                last_progress = time.monotonic()
                finished = {i for i, _ in done}
                open_ids = [i for i in open_ids if i not in finished]
                for _, state in done:
                    states[state] = states.get(state, 0) + 1
            else:
                if time.monotonic() - last_progress > self.timeout:
                    raise TimeoutError(f"no soak run finished in {self.timeout:.0f} s")
                time.sleep(0.02)
        seconds = time.monotonic() - began
        for state, n in states.items():
            self.states[state] = self.states.get(state, 0) + n
        return {"tasks": runs * self.run_tasks, "runs": runs, "seconds": round(seconds, 2),
                "tasks_per_s": round(runs * self.run_tasks / seconds, 1), "states": states}


# --- measurements ----------------------------------------------------------------------------------


SIZE_SQL = """
SELECT CASE WHEN c.relkind = 'p'
            THEN (SELECT COALESCE(sum(pg_total_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t)
            ELSE pg_total_relation_size(c.oid) END,
       c.relkind = 'p',
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
FROM pg_class c WHERE c.oid = to_regclass(%s)
"""


def table_sizes() -> dict[str, dict]:
    """Per history table: ``bytes`` (heap + indexes + TOAST; a partitioned table's summed over
    its partition tree), ``partitioned``, ``partitions`` and ``rows`` (an exact count).
    A table that does not exist is left out."""
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for table in SIZE_TABLES:
            cur.execute(SIZE_SQL, [f"public.{table}"])
            row = cur.fetchone()
            if row is None:
                continue
            cur.execute(f"SELECT count(*) FROM {table}")  # a name from SIZE_TABLES
            out[table] = {"bytes": int(row[0]), "partitioned": bool(row[1]), "partitions": int(row[2]),
                          "rows": cur.fetchone()[0]}
    return out


def history_facts(workflow_ids: list) -> dict:
    """How old the oldest finished run kept is (seconds since its creation and since its
    end), and the finished runs of ``workflow_ids`` kept."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), "
            "EXTRACT(EPOCH FROM clock_timestamp() - min(finished_at)) "
            "FROM core_workflowrun WHERE state = ANY(%s) AND workflow_id = ANY(%s)",
            [list(TERMINAL_RUN), workflow_ids],
        )
        n, created, finished = cur.fetchone()
    return {"finished_runs": n, "oldest_created_age_s": round(float(created or 0), 1),
            "oldest_finished_age_s": round(float(finished or 0), 1)}


_COST = re.compile(r"cost=[\d.]+\.\.([\d.]+)")
_INDEX = re.compile(r"(?:Index|Index Only|Bitmap Index) Scan(?: Backward)? (?:using|on) (\w+)")


def _seed_names(names: list[str]) -> set[str]:
    """``names`` plus, for an index of a partition, the partitioned index it belongs to (the
    seed's name)."""
    from django.db import connection

    out = set(names)
    with connection.cursor() as cur:
        for name in names:
            cur.execute("SELECT pg_partition_root(to_regclass(%s))::regclass::text", [f"public.{name}"])
            row = cur.fetchone()
            if row and row[0]:
                out.add(row[0].split(".")[-1])
    return out


def _drained_reaper(name: str, used: list[str], running: int) -> bool:
    """Whether a lease-reaper plan on the other index partial on state = 'running' is taken
    with nothing running: the soak snapshots drained runs, and with both partial indexes
    empty the planner may read idx_taskrun_running_org and sort (seen: 1 buffer, 0.012 ms).
    Neither index holds history; with a working set (make bench's hot queries) only the
    seed's idx_taskrun_lease_expiry counts."""
    return name == "lease_reaper" and running == 0 and used == ["idx_taskrun_running_org"]


def hot_queries(workflow, *, reps: int) -> dict:
    """The four hot queries of ``bench.hot_queries`` on the real tables as they are now: per
    query the median of ``reps`` timings (each in a rolled-back transaction), the plan
    (EXPLAIN ANALYZE, BUFFERS), its top node's estimated total cost, the indexes it uses
    and whether the seed's index is among them."""
    import random

    from django.db import connection

    from bench.hot_queries import QUERIES, _explain, _run_once, on_index

    with connection.cursor() as cur:
        cur.execute("SELECT id FROM core_workflowrun WHERE workflow_id = %s AND state = ANY(%s) "
                    "ORDER BY created_at DESC LIMIT 200", [workflow.pk, list(TERMINAL_RUN)])
        sample = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT count(*) FROM core_taskrun WHERE state = 'running'")
        running = cur.fetchone()[0]
    ctx = {"run_sample": sample or [workflow.pk], "org_ids": [workflow.organization_id]}
    random.seed(21)
    out = {}
    for name, spec in QUERIES.items():
        times = []
        for i in range(3 + reps):
            elapsed = _run_once(spec, ctx, None)
            if i >= 3:
                times.append(elapsed)
        plan = _explain(spec, ctx, None)
        used = sorted(_seed_names(sorted(set(_INDEX.findall(plan)))))
        cost = _COST.search(plan)
        out[name] = {"median_ms": round(statistics.median(times) * 1000, 3), "index": spec["index"],
                     "uses_index": on_index(spec, used) or _drained_reaper(name, used, running),
                     "indexes_used": used,
                     "cost": float(cost.group(1)) if cost else None, "plan": plan}
    return out


def snapshot(workflow, cfg: dict, *, tasks_done: int, began: float) -> dict:
    """Sizes, history facts and hot queries now (the caller has drained its runs)."""
    return {"tasks": tasks_done, "elapsed_s": round(time.monotonic() - began, 1), "load": load(),
            "sizes": table_sizes(), "history": history_facts([workflow.pk]),
            "hot_queries": hot_queries(workflow, reps=cfg["hot_reps"])}


# --- phase 1: the soak -------------------------------------------------------------------------------


def soak_phase(stack, org, cfg: dict, log=print) -> dict:
    """Phase 1 (see the module's docstring). Starts and stops its own worker and clock."""
    from bench.live import independent_workflow

    m = baseline_size(cfg)
    n = max(cfg["tasks"], m)
    workflow = independent_workflow(org, cfg["run_tasks"], "soak-noop")
    worker, clock = start_engine(stack, cfg, engine_env(cfg, retention_seconds=cfg["retention_seconds"]), "soak")
    vacuum = Vacuumer(cfg["vacuum_seconds"]).start()
    driver = Driver(workflow, in_flight=cfg["in_flight"], timeout=cfg["timeout"])
    out: dict = {"baseline_tasks": m, "tasks": n, "vacuum_thread": vacuum.active}
    try:
        began = time.monotonic()
        log(f"soak: {n:,} tasks, baseline after {m:,}")
        first = driver.push(m)
        out["at_baseline"] = snapshot(workflow, cfg, tasks_done=first["tasks"], began=began)
        log(f"soak: baseline taken at {first['tasks']:,} tasks ({out['at_baseline']['elapsed_s']} s)")
        pushed = [first]
        done = first["tasks"]
        chunk = max(cfg["run_tasks"], 50 * cfg["run_tasks"])
        while done < n:
            leg = driver.push(min(chunk, n - done))
            pushed.append(leg)
            done += leg["tasks"]
            log(f"soak: {done:,} tasks, {leg['tasks_per_s']:.0f} tasks/s; load {load()}")
        out["at_end"] = snapshot(workflow, cfg, tasks_done=done, began=began)
    finally:
        vacuum.stop()
        stop(stack, clock, worker)
    seconds = sum(p["seconds"] for p in pushed)
    out["throughput"] = {"tasks": done, "seconds": round(seconds, 1), "tasks_per_s": round(done / seconds, 1),
                         "legs_tasks_per_s": [p["tasks_per_s"] for p in pushed]}
    out["run_states"] = driver.states
    out["vacuum"] = {"passes": vacuum.passes, "seconds": round(vacuum.seconds, 1)} if vacuum.active else None
    out["steady_at_baseline"] = out["at_baseline"]["elapsed_s"] >= cfg["retention_seconds"] + 2 * cfg[
        "housekeeping_seconds"]
    out["size_ratios"] = {
        t: round(out["at_end"]["sizes"][t]["bytes"] / out["at_baseline"]["sizes"][t]["bytes"], 3)
        for t in out["at_end"]["sizes"] if out["at_baseline"]["sizes"].get(t, {}).get("bytes")
    }
    total = lambda snap: sum(s["bytes"] for s in snap["sizes"].values())  # noqa: E731
    out["size_ratio_total"] = round(total(out["at_end"]) / total(out["at_baseline"]), 3)
    out["hot_ratios"] = {}
    for name, end in out["at_end"]["hot_queries"].items():
        start = out["at_baseline"]["hot_queries"][name]
        out["hot_ratios"][name] = {
            "time": round(end["median_ms"] / start["median_ms"], 2) if start["median_ms"] else None,
            "cost": round(end["cost"] / start["cost"], 2) if start["cost"] and end["cost"] is not None else None,
        }
    return out


# --- phase 2: the purge ------------------------------------------------------------------------------


def load_old_runs(org, workflow, runs: int, *, age_seconds: float, chunk: int = 100_000) -> float:
    """Bulk-load ``runs`` succeeded one-task runs of ``workflow`` (its one task run and five
    events each: run_started, claimed, started, succeeded, run_finished), created
    ``age_seconds`` ago (spread over the minute before) and finished a second later, in
    transactions of ``chunk`` runs; then VACUUM ANALYZE. Triggers and foreign-key checks
    are off while it loads (``session_replication_role = replica``, as a restore; they hold
    by construction). ``run_created_at`` is filled where the event table has that column
    (partitioned history). Returns the seconds it took."""
    from django.db import connection, transaction

    began = time.monotonic()
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                    "AND table_name = 'core_taskrunevent' AND column_name = 'run_created_at'")
        partition_key = cur.fetchone() is not None
    extra_col, extra_val = (", run_created_at", ", x.created_at") if partition_key else ("", "")
    if partition_key:
        # Their history needs partitions: those of the minutes they are made to look created
        # in may have been dropped by the soak's retention already (engine.partitions).
        import datetime as dt

        from engine import partitions

        with connection.cursor() as cur:
            cur.execute("SELECT statement_timestamp()")
            now = cur.fetchone()[0]
        partitions.ensure_range(now - dt.timedelta(seconds=age_seconds + 120), now)
    task_id = workflow.tasks.values_list("id", flat=True).get()
    left = runs
    while left > 0:
        n = min(chunk, left)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = off")
            cur.execute("SET LOCAL session_replication_role = replica")
            cur.execute(
                f"""
                WITH r AS (
                    INSERT INTO core_workflowrun (id, organization_id, workflow_id, state, input, trigger_source,
                                                  error, last_event_seq, created_at, started_at, finished_at, priority)
                    SELECT gen_random_uuid(), %(org)s, %(wf)s, 'succeeded', '{{}}', 'cli', '', 5, ts, ts,
                           ts + interval '1 second', 0
                    FROM (SELECT now() - make_interval(secs => %(age)s + (g %% 60000) / 1000.0) AS ts
                          FROM generate_series(1, %(n)s) g) s
                    RETURNING id, created_at
                ), t AS (
                    INSERT INTO core_taskrun (id, organization_id, workflow_run_id, task_id, state, attempt,
                                              fencing_token, started_fencing_token, error, output, created_at,
                                              started_at, finished_at, priority, wait_reason, queue, skip_reason,
                                              attempt_base)
                    SELECT gen_random_uuid(), %(org)s, r.id, %(task)s, 'succeeded', 1, 1, 1, '', '{{}}',
                           r.created_at, r.created_at + interval '100 milliseconds',
                           r.created_at + interval '200 milliseconds', 0, '', %(queue)s, '', 0
                    FROM r
                    RETURNING id, workflow_run_id, created_at
                )
                INSERT INTO core_taskrunevent (id, organization_id, workflow_run_id, task_run_id, seq, kind,
                                               from_state, to_state, attempt, fencing_token, detail,
                                               created_at{extra_col})
                SELECT gen_random_uuid(), %(org)s, x.workflow_run_id, CASE WHEN e.task THEN x.id END, e.seq, e.kind,
                       e.from_state, e.to_state, CASE WHEN e.task THEN 1 END, CASE WHEN e.task THEN 1 END, '{{}}',
                       x.created_at + e.seq * interval '10 milliseconds'{extra_val}
                FROM t x CROSS JOIN (VALUES (1, 'run_started', '', '', false), (2, 'claimed', 'ready', 'running', true),
                                            (3, 'started', '', '', true), (4, 'succeeded', 'running', 'succeeded', true),
                                            (5, 'run_finished', 'running', 'succeeded', false))
                     AS e(seq, kind, from_state, to_state, task)
                """,
                {"org": org.pk, "wf": workflow.pk, "task": task_id, "n": n, "age": age_seconds,
                 "queue": _task_queue()},
            )
        left -= n
    with connection.cursor() as cur:  # autocommit: VACUUM cannot run in a transaction
        cur.execute("VACUUM ANALYZE " + ", ".join(existing_tables(cur, VACUUM_TABLES)))
    return time.monotonic() - began


def _task_queue() -> str:
    from engine.states import TASK_QUEUE

    return TASK_QUEUE


def count_runs(workflow) -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM core_workflowrun WHERE workflow_id = %s", [workflow.pk])
        return cur.fetchone()[0]


def start_purger(stack, cfg: dict, tag: str):
    """``python -m bench.soak --purger`` with the soak's retention; returns it once it has
    set Django up and is about to purge (its first log line)."""
    from flowforge.stack import wait_until

    env = {**engine_env(cfg, retention_seconds=cfg["retention_seconds"]), "SOAK_PURGE_PAUSE": f"{cfg['purge_pause']:g}"}
    log_path = stack.log_dir / f"soak-purger-{tag}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to, run after run
    proc = stack.start(f"soak-purger-{tag}", [sys.executable, "-m", "bench.soak", "--purger"], env=env)

    def ready():
        if not proc.alive():
            raise RuntimeError(f"the purger exited; see {proc.log_path}")
        with open(proc.log_path, "rb") as f:
            f.seek(offset)
            return b"purging" in f.read()

    wait_until(ready, timeout=60, interval=0.1, what="the purger to start")
    return proc


def purger_main() -> int:
    """The purger process: ``engine.retention.purge`` in a loop (the deployment's batch
    size, up to 2,000 runs a call so that SIGTERM is heard within a batch or ten), until
    SIGTERM; prints one JSON line with what it removed."""
    import django

    django.setup()
    from engine import retention

    stop_flag = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_flag.set())
    print("purging", flush=True)
    total = {"runs": 0, "outbox_rows": 0, "calls": 0}
    pause = float(os.environ.get("SOAK_PURGE_PAUSE", "0"))
    while not stop_flag.is_set():
        result = retention.purge(max_runs=2000)
        total["runs"] += result.runs
        total["outbox_rows"] += result.outbox_rows
        total["calls"] += 1
        if not result.runs:
            stop_flag.wait(0.2)
        elif pause:
            stop_flag.wait(pause)
    print(json.dumps(total), flush=True)
    return 0


def purge_phase(stack, org, cfg: dict, log=print) -> dict:
    """Phase 2 (see the module's docstring). Starts and stops its own worker, clock and
    purger processes."""
    from bench.live import independent_workflow

    workflow = independent_workflow(org, cfg["run_tasks"], "soak-purge-noop")
    old = independent_workflow(org, 1, "soak-old")
    # Run retention off for the engine's own housekeeping: only the purger removes runs.
    worker, clock = start_engine(stack, cfg, engine_env(cfg, retention_seconds=0), "purge")
    vacuum = Vacuumer(cfg["vacuum_seconds"]).start()
    driver = Driver(workflow, in_flight=cfg["in_flight"], timeout=cfg["timeout"])
    out: dict = {"old_runs": cfg["purge_runs"], "leg_tasks": cfg["leg_tasks"], "legs": []}
    try:
        age = cfg["retention_seconds"] + 120
        log(f"purge: loading {cfg['purge_runs']:,} old runs")
        out["load_seconds"] = round(load_old_runs(org, old, cfg["purge_runs"], age_seconds=age), 1)
        out["old_runs_loaded"] = count_runs(old)
        out["warmup"] = driver.push(cfg["leg_tasks"] // 4 or cfg["run_tasks"])  # not measured
        for i in range(cfg["purge_rounds"]):
            for with_purge in ((False, True) if i % 2 == 0 else (True, False)):
                purger = start_purger(stack, cfg, f"{i}") if with_purge else None
                before = count_runs(old)
                leg = driver.push(cfg["leg_tasks"])
                after = count_runs(old)
                if purger:
                    stop(stack, purger)
                leg.update(with_purge=with_purge, old_runs_removed=before - after,
                           old_runs_left=after, load=load())
                out["legs"].append(leg)
                log(f"purge: round {i + 1} {'with' if with_purge else 'without'} the purge: "
                    f"{leg['tasks_per_s']:.0f} tasks/s, {before - after:,} old runs removed, {after:,} left")
        # The rest of the backlog, the purger alone.
        left = count_runs(old)
        began = time.monotonic()
        if left:
            purger = start_purger(stack, cfg, "drain")
            try:
                while left and time.monotonic() - began < cfg["purge_drain_seconds"]:
                    time.sleep(1.0)
                    left = count_runs(old)
            finally:
                stop(stack, purger)
        drained = count_runs(old)
        out["drain"] = {"seconds": round(time.monotonic() - began, 1), "old_runs_left": drained}
    finally:
        vacuum.stop()
        stop(stack, clock, worker)
    out["run_states"] = driver.states
    out["vacuum"] = {"passes": vacuum.passes, "seconds": round(vacuum.seconds, 1)} if vacuum.active else None
    for key, flag in (("without", False), ("with", True)):
        legs = [leg for leg in out["legs"] if leg["with_purge"] is flag]
        tasks, seconds = sum(leg["tasks"] for leg in legs), sum(leg["seconds"] for leg in legs)
        out[key] = {"tasks": tasks, "seconds": round(seconds, 2), "tasks_per_s": round(tasks / seconds, 1),
                    "legs_tasks_per_s": [leg["tasks_per_s"] for leg in legs]}
    with_legs = [leg for leg in out["legs"] if leg["with_purge"]]
    removed = sum(leg["old_runs_removed"] for leg in with_legs)
    out["purge_runs_per_s"] = round(removed / out["with"]["seconds"], 1)
    out["old_runs_removed_during_legs"] = removed
    out["throughput_ratio"] = round(out["with"]["tasks_per_s"] / out["without"]["tasks_per_s"], 3)
    return out


# --- report ------------------------------------------------------------------------------------------


def verdicts(results: dict) -> dict[str, bool]:
    """Each target met or not (see the module's docstring)."""
    v = {}
    soak = results.get("soak")
    if soak:
        v["sizes"] = all(r <= TARGETS["size_ratio"] for t, r in soak["size_ratios"].items() if t not in NOT_JUDGED)
        ok_index = ok_time = True
        for name, end in soak["at_end"]["hot_queries"].items():
            start = soak["at_baseline"]["hot_queries"][name]
            ok_index &= start["uses_index"] and end["uses_index"]
            ok_time &= (end["median_ms"] <= start["median_ms"] * TARGETS["hot_time_ratio"]
                        or end["median_ms"] - start["median_ms"] <= TARGETS["hot_time_slack_ms"])
        v["hot_queries_on_seed_index"] = ok_index
        v["hot_queries_time"] = ok_time
        v["soak_runs_succeeded"] = set(soak["run_states"]) == {"succeeded"}
    purge = results.get("purge")
    if purge:
        v["purge_throughput"] = purge["throughput_ratio"] >= TARGETS["purge_throughput_ratio"]
        v["purge_runs_succeeded"] = set(purge["run_states"]) == {"succeeded"}
    return v


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def table(results: dict) -> str:
    """The printed report."""
    meta = results["meta"]
    lines = [f"FlowForge soak: {meta['processes']} worker processes x {meta['threads']} threads, {meta['cpus']} CPUs; "
             f"retention {meta['retention_seconds']:g} s, housekeeping every {meta['housekeeping_seconds']:g} s; "
             f"load at start {meta['load_start']}, at end {meta.get('load_end')}"]
    if meta.get("autovacuum") == "off":
        lines.append(f"the server's autovacuum is off: the soak runs VACUUM (ANALYZE) on the history tables every "
                     f"{meta['vacuum_seconds']:g} s in a thread of its own, as autovacuum would")
    soak = results.get("soak")
    if soak:
        a, b = soak["at_baseline"], soak["at_end"]
        lines.append(f"1 soak: {soak['tasks']:,} tasks in {soak['throughput']['seconds']:g} s: "
                     f"{soak['throughput']['tasks_per_s']:.0f} tasks/s; runs {soak['run_states']}")
        lines.append("  tasks/s of each stretch (the baseline's, then each up to 50 runs): "
                     + ", ".join(f"{x:.0f}" for x in soak["throughput"]["legs_tasks_per_s"]))
        if not soak["steady_at_baseline"]:
            lines.append(f"  the baseline came {a['elapsed_s']:g} s in, before one retention plus two housekeeping "
                         "periods: it is not yet the steady state")
        row = "  {:<22} {:>14} {:>14} {:>7}  {}"
        lines.append(row.format("table", f"at {a['tasks']:,}", f"at {b['tasks']:,}", "ratio",
                                "rows at baseline -> end (target <= 1.2)"))
        for t, end in b["sizes"].items():
            start = a["sizes"].get(t, {})
            ratio = soak["size_ratios"].get(t)
            part = f"; {end['partitions']} partitions" if end["partitioned"] else ""
            part += "; audit retention (years): not judged" if t in NOT_JUDGED else ""
            lines.append(row.format(t, _mib(start.get("bytes", 0)), _mib(end["bytes"]),
                                    f"{ratio:.2f}" if ratio is not None else "-",
                                    f"{start.get('rows', 0):,} -> {end['rows']:,}{part}"))
        lines.append(row.format("all of them", _mib(sum(s["bytes"] for s in a["sizes"].values())),
                                _mib(sum(s["bytes"] for s in b["sizes"].values())), f"{soak['size_ratio_total']:.2f}",
                                ""))
        lines.append(f"  oldest finished run kept: created {a['history']['oldest_created_age_s']:g} s / "
                     f"{b['history']['oldest_created_age_s']:g} s ago, finished {a['history']['oldest_finished_age_s']:g}"
                     f" s / {b['history']['oldest_finished_age_s']:g} s ago (baseline / end)")
        qrow = "  {:<14} {:<26} {:<26} {:>16} {:>8} {:>14} {:>6}"
        lines.append(qrow.format("hot query", "index at baseline", "index at end", "median ms", "ratio",
                                 "plan cost", "ratio"))
        for name, end in b["hot_queries"].items():
            start = a["hot_queries"][name]
            r = soak["hot_ratios"][name]
            idx = lambda q: q["index"] if q["uses_index"] else "NOT " + q["index"] + ": " + ",".join(q["indexes_used"])  # noqa: E731
            lines.append(qrow.format(name, idx(start), idx(end), f"{start['median_ms']:.2f} -> {end['median_ms']:.2f}",
                                     f"{r['time']}x", f"{start['cost']:g} -> {end['cost']:g}", f"{r['cost']}x"))
    purge = results.get("purge")
    if purge:
        lines.append(f"2 purge: {purge['old_runs_loaded']:,} old runs loaded in {purge['load_seconds']:g} s; "
                     f"{len(purge['legs'])} legs of {purge['leg_tasks']:,} tasks")
        lines.append(f"  without the purge {purge['without']['tasks_per_s']:.0f} tasks/s (legs "
                     + ", ".join(f"{x:.0f}" for x in purge["without"]["legs_tasks_per_s"]) + ")")
        lines.append(f"  with the purge    {purge['with']['tasks_per_s']:.0f} tasks/s (legs "
                     + ", ".join(f"{x:.0f}" for x in purge["with"]["legs_tasks_per_s"]) + ")")
        lines.append(f"  ratio {purge['throughput_ratio']:.3f} (target >= 0.9); the purge removed "
                     f"{purge['old_runs_removed_during_legs']:,} old runs during those legs: "
                     f"{purge['purge_runs_per_s']:.0f} runs/s")
        lines.append(f"  then the purger alone for {purge['drain']['seconds']:g} s: "
                     f"{purge['drain']['old_runs_left']:,} old runs left")
    if results.get("verdicts"):
        lines.append("targets met: " + ", ".join(f"{k}={'yes' if ok else 'NO'}" for k, ok in results["verdicts"].items()))
    return "\n".join(lines)


# --- main ----------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--purger", action="store_true", help=argparse.SUPPRESS)  # the purge phase's own process
    for key, value in DEFAULTS.items():
        kind = float if isinstance(value, float) else int
        parser.add_argument("--" + key.replace("_", "-"), type=kind, default=value)
    parser.add_argument("--output", default=str(BASE_DIR / "bench" / "soak_results.json"))
    return parser.parse_args(argv)


def run(stack, org, cfg: dict, log=print, save=None) -> dict:
    """Both phases on ``stack``'s environment, in the database Django is set up for.
    Returns the results with ``verdicts``; ``save(results)``, when given, is called after
    the first phase too (a long soak keeps its first half if the second fails)."""
    results: dict = {"meta": {k: v for k, v in cfg.items() if k != "output"}}
    results["meta"].update(cpus=os.cpu_count(), load_start=load())
    from bench.live import autovacuum_on

    results["meta"]["autovacuum"] = "on" if autovacuum_on() else "off"
    if cfg["tasks"]:
        results["soak"] = soak_phase(stack, org, cfg, log=log)
        if save:
            save(results)
    if cfg["purge_runs"]:
        results["purge"] = purge_phase(stack, org, cfg, log=log)
    results["meta"]["load_end"] = load()
    results["verdicts"] = verdicts(results)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.purger:
        return purger_main()
    cfg = {k: getattr(args, k) for k in DEFAULTS}
    began = time.monotonic()
    from bench.run import bench_env, flush_namespace, recreate_database

    database_url = os.environ.get("SOAK_DATABASE_URL", DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("SOAK_REDIS_URL", DEFAULT_REDIS_URL)
    env = bench_env(database_url, redis_url)
    env["BROKER_NAMESPACE"] = NAMESPACE
    env["FLOWFORGE_REPORT_DIR"] = str(BASE_DIR / "var" / "soak" / "reports")
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "BROKER_NAMESPACE",
                                           "DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY")})
    os.environ.update(engine_env(cfg, retention_seconds=cfg["retention_seconds"]))
    print(f"soak database {database_url} (re-created), redis {redis_url} namespace {NAMESPACE}; load {load()}")
    recreate_database(database_url)
    # The engine's settings for the migration too: it creates the first history partitions,
    # of FLOWFORGE_HISTORY_PARTITION_SECONDS each.
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=BASE_DIR, check=True,
                   env={**env, **engine_env(cfg, retention_seconds=cfg["retention_seconds"])},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flush_namespace(redis_url, NAMESPACE)

    import django

    django.setup()
    from flowforge.stack import Stack
    from tenancy.models import Organization
    from tenancy.services import create_organization

    org, _user, _ = create_organization(slug="soak", name="Soak", owner_email="owner@soak.example")
    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=1_000_000)  # as make bench
    org.refresh_from_db()
    stack = Stack(env=env, log_dir=BASE_DIR / "var" / "soak" / "logs")
    try:
        results = run(stack, org, cfg, save=lambda r: Path(args.output).write_text(
            json.dumps(r, indent=2, default=str) + "\n"))
    finally:
        stack.stop_all()
        flush_namespace(redis_url, NAMESPACE)
    results["meta"].update(database=database_url, redis=redis_url, namespace=NAMESPACE,
                           seconds=round(time.monotonic() - began, 1))
    text = table(results)
    print(text)
    print(f"total {results['meta']['seconds']} s")
    results["table"] = text
    Path(args.output).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(results["verdicts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
