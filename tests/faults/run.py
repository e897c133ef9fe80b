"""Fault injection with real processes: ``python -m tests.faults.run [SCENARIO ...]``.

Each scenario gets its own PostgreSQL cluster and Redis server (tests/faults/servers.py),
migrates a database, starts the web server (gunicorn), two Dramatiq worker commands and
the clock, starts a load of runs through the REST API (each POST with an
Idempotency-Key, retried until it is answered, so a start is never lost or doubled),
injects its fault in the middle of the load, and then proves:

- every run is terminal (the time from the end of the fault to the last run finishing
  is the "drain" figure);
- no (task run, fencing token) generation started twice;
- every succeeded task run has exactly one successful attempt;
- every run's events are complete (one run_started, one run_finished, seq 1..n without
  gaps) and it has exactly one ``run.started`` audit record.

Dead worker commands are restarted, as a process supervisor would. Scenarios:
kill_worker, kill_pool, redis_outage, postgres_restart, postgres_crash, duplicate_delivery,
two_clocks, self_killing_task. Exit status 0 only if every scenario held every invariant.

postgres_crash stops every PostgreSQL process at once (``pg_ctl stop -m immediate``: no
checkpoint, every connection cut mid-transaction) and starts the server again through crash
recovery, with the server's commits waiting for the WAL write as a deployment's do (what
was acknowledged must survive; the relay's publish stamps, which do not wait, may be lost,
and a message published again is refused by its fencing token).

kill_pool (issue 22) SIGKILLs the whole pool (both worker commands, masters and worker
processes) three times during the load, with the deployment's 300 s dispatch lease, and
also proves that the slowest run took at most 2 x the worker lease plus the longest
restart (kill to the restarted pool's first start) plus the longest run that finished
before the first kill; it prints the distribution.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from cryptography.fernet import Fernet

from audit.keys import generate_key_spec
from flowforge.stack import BASE_DIR, Stack, worker_child_pids
from tests.faults.servers import PrivatePostgres, PrivateRedis, free_port

SCENARIOS = ("kill_worker", "kill_pool", "redis_outage", "postgres_restart", "postgres_crash", "duplicate_delivery",
             "two_clocks", "self_killing_task")

LOAD_WORKFLOW = {
    "name": "fault-load",
    "tasks": [
        {"key": "a", "type": "sleep", "config": {"seconds": 0.05}, "max_attempts": 5, "retry_backoff_seconds": 0.2},
        {"key": "b", "type": "sleep", "config": {"seconds": 0.05}, "depends_on": ["a"], "max_attempts": 5,
         "retry_backoff_seconds": 0.2},
        {"key": "c", "type": "noop", "depends_on": ["a"], "max_attempts": 5},
        {"key": "d", "type": "noop", "depends_on": ["b", "c"], "max_attempts": 5},
    ],
}
KILLER_WORKFLOW = {
    "name": "fault-killer",
    "tasks": [{"key": "boom", "type": "python", "config": {"callable": "tests.faults.tasks.kill_own_worker"},
               "max_attempts": 2, "retry_backoff_seconds": 0.2}],
}


@dataclass
class Result:
    scenario: str
    runs_started: int = 0
    runs_finished: int = 0
    states: dict[str, int] = field(default_factory=dict)
    duplicate_executions: int = 0
    succeeded_without_one_success: int = 0
    incomplete_event_logs: int = 0
    missing_audit_records: int = 0
    drain_seconds: float | None = None
    recovery: dict = field(default_factory=dict)
    # Events of generations the leases took back, or whose start or completion was refused
    # (kind -> count): what the fault cost, for the table (a connection cut mid-commit also
    # leads to some).
    taken_back: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# One throwaway key per fault run, shared by its web, workers and clock (DEBUG is off).
_SECRET_KEY = secrets.token_urlsafe(50)


def _env(pg: PrivatePostgres, redis_url: str, dbname: str, report_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{pg.url_base}/{dbname}", REDIS_URL=redis_url, BROKER_URL=redis_url,
        BROKER_NAMESPACE="faults", DEBUG="false", ALLOWED_HOSTS="127.0.0.1,localhost",
        # tests/settings.py registers the self-killing task; DEBUG off needs a real key.
        DJANGO_SETTINGS_MODULE="tests.settings", SECRET_KEY=_SECRET_KEY,
        FLOWFORGE_LEASE_SECONDS="3", FLOWFORGE_HEARTBEAT_SECONDS="0.5", FLOWFORGE_DISPATCH_LEASE_SECONDS="5",
        FLOWFORGE_BROKER_HEARTBEAT_SECONDS="0.5", FLOWFORGE_BROKER_DEAD_AFTER_SECONDS="3",
        FLOWFORGE_CLOCK_SCHEDULE_SECONDS="0.5", FLOWFORGE_CLOCK_REAP_SECONDS="0.5",
        FLOWFORGE_CLOCK_RELAY_SECONDS="1", FLOWFORGE_API_RATE_LIMIT_PER_MINUTE="100000",
        FLOWFORGE_REPORT_DIR=str(report_dir), PYTHONUNBUFFERED="1",
    )
    env.setdefault("FLOWFORGE_AUDIT_KEYS", generate_key_spec("faults"))  # DEBUG is off: the audit log needs a key
    # DEBUG off needs encryption keys (flowforge/crypto.py); a throwaway one for a throwaway database.
    env.setdefault("FLOWFORGE_ENCRYPTION_KEYS", Fernet.generate_key().decode())
    env.setdefault("FLOWFORGE_SECRET_KEYS", Fernet.generate_key().decode())
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout


def _prepare(env: dict[str, str]) -> str:
    """Migrate, create an organization, its API key and the workflows. Returns the key."""
    _manage(env, "migrate", "--noinput")
    script = (
        "from tenancy.services import create_organization;"
        "from tenancy.actors import Actor;"
        "from tenancy.apikeys import create_api_key;"
        "from engine.services import apply_definition;"
        f"load = {LOAD_WORKFLOW!r}; killer = {KILLER_WORKFLOW!r};"
        "org, user, _ = create_organization(slug='faults', name='Faults', owner_email='owner@faults.example');"
        "actor = Actor(organization=org, role='owner', user=user, channel='cli');"
        "apply_definition(actor=actor, document=load); apply_definition(actor=actor, document=killer);"
        "key = create_api_key(actor=actor, name='load', role='owner')[1];"
        "print(key)"
    )
    return _manage(env, "shell", "-c", script).strip().splitlines()[-1]


class Load:
    """Starts ``count`` runs through the API, each with its own Idempotency-Key, retrying
    every start until the server answers it (through outages)."""

    def __init__(self, base_url: str, key: str, count: int, killer_every: int | None = None, pace: float = 0.01):
        self.base_url, self.key, self.count, self.killer_every = base_url, key, count, killer_every
        self.pace = pace  # seconds between two starts
        self.started: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.errors = 0

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=15,
                          headers={"Authorization": f"Bearer {self.key}"}) as client:
            for i in range(self.count):
                workflow = "fault-killer" if self.killer_every and i % self.killer_every == 0 else "fault-load"
                body = {"workflow": workflow, "input": {"i": i}}
                idem = str(uuid.uuid4())
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        resp = client.post("/api/v1/runs/", json=body, headers={"Idempotency-Key": idem})
                        if resp.status_code in (200, 201):
                            self.started.append(resp.json()["id"])
                            break
                        self.errors += 1
                    except httpx.HTTPError:
                        self.errors += 1
                    time.sleep(0.2)
                time.sleep(self.pace)


def _sql(dsn: str, query: str, params=None) -> list[tuple]:
    for _ in range(60):
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                return conn.execute(query, params).fetchall()
        except psycopg.OperationalError:
            time.sleep(0.5)
    raise RuntimeError("the database did not come back")


def _supervise(stack: Stack, names: set[str]) -> None:
    """Restart any dead process of ``names`` (a supervisor's job)."""
    for proc in list(stack.procs):
        if proc.name in names and not proc.alive():
            stack.procs.remove(proc)
            if proc.name.startswith("worker"):
                stack.start_worker(proc.name, processes=1, threads=4)
            elif proc.name.startswith("clock"):
                stack.start_clock(proc.name)
            elif proc.name == "web":
                raise RuntimeError("the web server died")


def run_scenario(name: str, *, runs: int, drain_timeout: float = 180.0) -> Result:
    result = Result(scenario=name)
    pg, rds = PrivatePostgres.create(synchronous_commit=name == "postgres_crash"), PrivateRedis.create()
    workdir = Path(pg.root)
    dbname = "faults"
    _sql(f"{pg.url_base}/postgres", "SELECT 1")
    with psycopg.connect(f"{pg.url_base}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
    dsn = f"{pg.url_base}/{dbname}"
    env = _env(pg, rds.url, dbname, workdir / "reports")
    if name == "duplicate_delivery":
        env["FLOWFORGE_BROKER_MIDDLEWARE"] = "tests.faults.middleware.DuplicateDelivery"
    if name == "kill_pool":  # the deployment's: nothing may be left to it
        env["FLOWFORGE_DISPATCH_LEASE_SECONDS"] = "300"
    kills: list[float] = []
    stack = Stack(env=env, log_dir=workdir / "logs")
    try:
        key = _prepare(env)
        port = free_port()
        stack.start_web(bind=f"127.0.0.1:{port}")
        supervised = {"worker-1", "worker-2", "clock-1"}
        stack.start_worker("worker-1", processes=1, threads=4)
        stack.start_worker("worker-2", processes=1, threads=4)
        stack.start_clock("clock-1")
        if name == "two_clocks":
            stack.start_clock("clock-2")
            supervised.add("clock-2")
        time.sleep(2.0)
        # kill_pool's load lasts about runs / 5 s, so each of its three kills finds work in flight.
        load = Load(f"http://127.0.0.1:{port}", key, runs, killer_every=25 if name == "self_killing_task" else None,
                    pace=0.2 if name == "kill_pool" else 0.01)
        load.thread.start()
        # The fault, once a good part of the load is in flight; a crash once every start has
        # been answered, so that it falls among the workers' transactions alone.
        target = runs if name == "postgres_crash" else runs // 3
        while len(load.started) < target and load.thread.is_alive():
            time.sleep(0.1)
            _supervise(stack, supervised)
        if name == "kill_worker":
            master = next(p for p in stack.procs if p.name == "worker-1")
            children = worker_child_pids(master.pid)
            os.kill(children[0] if children else master.pid, signal.SIGKILL)
        elif name == "kill_pool":
            for k in (1, 2, 3):
                # A quarter more of the load, and 8 s since the last kill (its recovery,
                # 2 leases and a restart, is over before the next one).
                while ((len(load.started) < k * runs // 4 and load.thread.is_alive())
                       or (kills and time.time() - kills[-1] < 8)):
                    time.sleep(0.1)
                    _supervise(stack, supervised)
                for proc in [p for p in stack.procs if p.name.startswith("worker")]:
                    os.killpg(proc.pid, signal.SIGKILL)  # the master and its worker processes
                    proc.popen.wait(10)
                kills.append(time.time())
                _supervise(stack, supervised)
        elif name == "redis_outage":
            rds.stop()
            time.sleep(10)
            rds.start()
        elif name == "postgres_restart":
            pg.restart()
        elif name == "postgres_crash":
            pg.crash()
        fault_ended = time.monotonic()
        # Drain: every run started and terminal.
        deadline = fault_ended + drain_timeout
        last_open = None
        while time.monotonic() < deadline:
            _supervise(stack, supervised)
            open_runs = _sql(dsn, "SELECT count(*) FROM core_workflowrun WHERE state NOT IN "
                                  "('succeeded', 'failed', 'cancelled')")[0][0]
            if not load.thread.is_alive() and open_runs == 0:
                break
            last_open = open_runs
            time.sleep(0.5)
        result.drain_seconds = round(time.monotonic() - fault_ended, 1)
        load.thread.join(5)
        result.runs_started = len(load.started)
        states = dict(_sql(dsn, "SELECT state, count(*) FROM core_workflowrun GROUP BY state"))
        result.states = {k: int(v) for k, v in states.items()}
        result.runs_finished = sum(v for k, v in result.states.items() if k in ("succeeded", "failed", "cancelled"))
        if result.runs_started != runs:
            result.problems.append(f"only {result.runs_started}/{runs} starts were answered")
        total_runs = sum(result.states.values())
        if total_runs != result.runs_started:
            result.problems.append(f"{total_runs} runs exist for {result.runs_started} answered starts")
        if result.runs_finished != total_runs:
            result.problems.append(f"{total_runs - result.runs_finished} run(s) never finished (last count {last_open})")
        result.duplicate_executions = len(_sql(dsn, """
            SELECT task_run_id, fencing_token FROM core_taskrunevent WHERE kind = 'started'
            GROUP BY task_run_id, fencing_token HAVING count(*) > 1"""))
        result.succeeded_without_one_success = _sql(dsn, """
            SELECT count(*) FROM core_taskrun t
            WHERE t.state = 'succeeded' AND (SELECT count(*) FROM core_taskrunevent e
                                             WHERE e.task_run_id = t.id AND e.kind = 'succeeded') <> 1""")[0][0]
        result.incomplete_event_logs = _sql(dsn, """
            SELECT count(*) FROM core_workflowrun r WHERE
              (SELECT count(*) FROM core_taskrunevent e WHERE e.workflow_run_id = r.id AND e.kind = 'run_started') <> 1
              OR (r.state IN ('succeeded', 'failed', 'cancelled') AND (SELECT count(*) FROM core_taskrunevent e
                   WHERE e.workflow_run_id = r.id AND e.kind = 'run_finished') <> 1)
              OR (SELECT max(seq) FROM core_taskrunevent e WHERE e.workflow_run_id = r.id)
                 <> (SELECT count(*) FROM core_taskrunevent e WHERE e.workflow_run_id = r.id)""")[0][0]
        result.missing_audit_records = _sql(dsn, """
            SELECT count(*) FROM core_workflowrun r WHERE (SELECT count(*) FROM core_auditlog a
               WHERE a.action = 'run.started' AND a.target_id = r.id::text) <> 1""")[0][0]
        for label, value in (("generation(s) started twice", result.duplicate_executions),
                             ("succeeded task run(s) without exactly one success", result.succeeded_without_one_success),
                             ("run(s) with an incomplete event log", result.incomplete_event_logs),
                             ("run(s) without exactly one run.started audit record", result.missing_audit_records)):
            if value:
                result.problems.append(f"{value} {label}")
        if name == "self_killing_task":
            killers = _sql(dsn, """
                SELECT t.state, t.attempt FROM core_taskrun t JOIN core_task k ON k.id = t.task_id
                WHERE k.key = 'boom'""")
            if not killers or any(state != "failed" for state, _ in killers):
                result.problems.append(f"self-killing tasks did not all end failed: {killers[:5]}")
        else:
            failed = result.states.get("failed", 0) + result.states.get("cancelled", 0)
            if failed:
                result.problems.append(f"{failed} load run(s) did not succeed")
        if name == "kill_pool":
            _check_recovery(result, dsn, kills, lease=float(env["FLOWFORGE_LEASE_SECONDS"]))
        result.taken_back = {kind: int(n) for kind, n in _sql(dsn, """
            SELECT kind, count(*) FROM core_taskrunevent
            WHERE kind IN ('dispatch_expired', 'lease_expired', 'stale_completion_rejected',
                           'stale_dispatch_ignored', 'duplicate_delivery_ignored')
            GROUP BY kind""")}
        if name == "postgres_crash":  # the server's messages are in English (lc_messages=C)
            server_log = (Path(pg.root) / "server.log").read_text(errors="replace")
            if "not properly shut down" not in server_log:  # it was stopped cleanly: no crash was tested
                result.problems.append("the server did not go through crash recovery")
        _manage(env, "audit_verify")
    except Exception as exc:  # a scenario that crashes is a failed scenario, with its reason
        result.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        # Its checks are done: killed at once (a graceful stop of the workers costs 2-3 s),
        # unless something failed, where the logs printed below should be whole.
        stack.stop_all(graceful=bool(result.problems))
        if result.problems:
            for proc in stack.procs:
                if proc.log_path and proc.log_path.exists():
                    tail = proc.log_path.read_text(errors="replace").splitlines()[-15:]
                    print(f"---- {name}: {proc.name} log ----\n" + "\n".join(tail), file=sys.stderr)
        rds.destroy()
        pg.destroy()
    return result


def _check_recovery(result: Result, dsn: str, kills: list[float], *, lease: float) -> None:
    """kill_pool's bound and figures (module docstring), into ``result.recovery``."""
    restarts = []
    for at in kills:
        first = _sql(dsn, "SELECT min(EXTRACT(EPOCH FROM created_at))::float8 FROM core_taskrunevent "
                          "WHERE kind = 'started' AND created_at > to_timestamp(%s)", [at])[0][0]
        restarts.append(round(first - at, 2) if first is not None else None)
    rows = _sql(dsn, "SELECT EXTRACT(EPOCH FROM created_at)::float8, EXTRACT(EPOCH FROM finished_at - created_at)::float8 "
                     "FROM core_workflowrun WHERE finished_at IS NOT NULL ORDER BY 2")
    took = [d for _c, d in rows]
    before = [d for c, d in rows if kills and c + d < kills[0]]
    if not took or None in restarts:
        result.problems.append(f"no recovery figures: restarts {restarts}, {len(took)} finished runs")
        return
    q = lambda p: took[min(len(took) - 1, int(p * len(took)))]  # noqa: E731
    bound = 2 * lease + max(restarts) + (max(before) if before else 0.0)
    result.recovery = {"kills": len(kills), "restart_seconds": restarts,
                       "run_seconds": {"p50": round(q(0.5), 2), "p90": round(q(0.9), 2), "p99": round(q(0.99), 2),
                                       "max": round(took[-1], 2)},
                       "slowest_before_first_kill": round(max(before), 2) if before else None,
                       "bound_seconds": round(bound, 2)}
    print(f"kill_pool recovery: {result.recovery}", flush=True)
    if took[-1] > bound:
        result.problems.append(f"the slowest run took {took[-1]:.1f} s, over the bound of {bound:.1f} s "
                               f"(2 x {lease:g} s lease + restart {max(restarts):.1f} s + slowest unaffected run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    results = []
    print(f"{'scenario':<20} {'started':>7} {'finished':>8} {'dup exec':>8} {'drain s':>8}  result")
    for name in args.scenarios or SCENARIOS:
        r = run_scenario(name, runs=args.runs)
        results.append(r)
        print(f"{r.scenario:<20} {r.runs_started:>7} {r.runs_finished:>8} {r.duplicate_executions:>8} "
              f"{r.drain_seconds if r.drain_seconds is not None else '-':>8}  "
              f"{'ok' if r.ok else 'FAILED: ' + '; '.join(r.problems)}"
              + (f"  (taken back: {r.taken_back})" if r.taken_back else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ | {"ok": r.ok} for r in results], indent=2))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    # SIGTERM (a caller's time limit) unwinds like an error: each scenario's finally stops its
    # web server, workers and clock (their own sessions) and its private PostgreSQL and Redis.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
