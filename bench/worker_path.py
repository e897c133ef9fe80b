"""Scenario 8 of ``make bench`` (issue 18): the organizations' own workers, through the
Python SDK (``sdk/python``), against the shared Dramatiq path of the same run.

- throughput: one run of N independent ``worker`` tasks (N = the independent-task size
  of scenario 1) served by SDK worker processes with the same slots as the Dramatiq
  path's threads (processes x threads), tasks/s from the first 'claimed' event to the last
  'succeeded' event, as scenario 1 counts the Dramatiq path; the ratio to scenario 1's
  engine figure of this run (issue 18 aims at >= 0.5);
- hop latency: a chain of worker tasks at light load, per edge the predecessor's
  'succeeded' event to the successor's 'started' event, beside scenario 2's engine figures;
- idle load: 20 SDK workers polling an empty queue (each its own process's Worker thread)
  for ``idle_seconds`` (60), the transactions the bench database committed meanwhile
  against the same span without them, per worker and per poll period.

Every SDK worker talks to a gunicorn of the bench's own (``Stack.start_web``).
``python -m bench.worker_path serve URL KEY QUEUE CONCURRENCY [COUNT]`` is the worker
process: COUNT Workers of the SDK (one thread each) whose handler ``noop`` returns None.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

QUEUE = "bench-own"
IDLE_QUEUE = "bench-idle"
IDLE_WORKERS = 20


def _commits() -> int:
    """Transactions committed in this database so far (pg_stat_database, flushed first)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cur.fetchone()[0])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def independent_worker_workflow(org, n: int, name: str):
    from engine.services import apply_definition

    return apply_definition(organization=org, document={"name": name, "tasks": [
        {"key": f"t{i:05d}", "type": "worker", "config": {"queue": QUEUE, "name": "noop"}} for i in range(n)]})


def chain_worker_workflow(org, n: int, name: str):
    from engine.services import apply_definition

    tasks = [{"key": f"t{i:05d}", "type": "worker", "config": {"queue": QUEUE, "name": "noop"}} for i in range(n)]
    for i in range(1, n):
        tasks[i]["depends_on"] = [f"t{i - 1:05d}"]
    return apply_definition(organization=org, document={"name": name, "tasks": tasks})


def scenario(stack, org, cfg: dict, dramatiq: dict, log=print) -> dict:
    """Scenario 8 (module docstring); ``dramatiq`` holds scenario 1's and 2's results of
    this run (``throughput``, ``hop_latency``). Returns its figures."""
    import httpx

    from bench import live
    from flowforge.stack import wait_until
    from tenancy.apikeys import create_api_key
    from tenancy.context import actor_for_membership
    from tenancy.models import KeyRole, Membership, Role

    owner = (Membership.objects.for_organization(org).select_related("organization", "user")
             .filter(role=Role.OWNER).order_by("created_at").first())
    _row, key = create_api_key(actor=actor_for_membership(owner, channel="cli"), name="bench workers",
                               role=KeyRole.WORKER)
    port = _free_port()
    slots = cfg["processes"] * cfg["threads"]
    # Room for every waiting poll: the 20 idle workers and the throughput workers' slots.
    web = stack.start("bench-worker-web", [
        *_gunicorn(port), "--threads", str(max(24, IDLE_WORKERS + 8))],
        env={"FLOWFORGE_WORKER_POLLS_PER_PROCESS": str(IDLE_WORKERS + slots)})
    base = f"http://127.0.0.1:{port}"

    def up():
        if not web.alive():
            raise RuntimeError(f"gunicorn exited; see {web.log_path}")
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=60, interval=0.2, what="gunicorn to answer")
    out: dict = {"slots": slots}

    # Throughput and hops: processes x threads slots of SDK workers, as the Dramatiq path has.
    # The workflows first: a poll of a queue that no task names is refused.
    independent = independent_worker_workflow(org, cfg["independent_tasks"], "bench-own-independent")
    chain = chain_worker_workflow(org, cfg["hop_chain_length"], "bench-own-chain")
    from engine.services import apply_definition

    apply_definition(organization=org, document={"name": "bench-own-idle", "tasks": [
        {"key": "never", "type": "worker", "config": {"queue": IDLE_QUEUE}}]})
    workers = [stack.start(f"sdk-worker-{i}", [sys.executable, "-m", "bench.worker_path", "serve", base, key, QUEUE,
                                               str(cfg["threads"])]) for i in range(cfg["processes"])]
    try:
        time.sleep(1.0)  # their first polls are waiting
        log("worker path: throughput")
        rounds = []
        for _ in range(max(1, cfg["throughput_rounds"] // 2)):
            rounds.append(live.engine_throughput(independent, 1, timeout=cfg["timeout"]))
            live.settle()
        best = sorted(rounds, key=lambda r: r["tasks_per_s"])[(len(rounds) - 1) // 2]
        engine = dramatiq["throughput"]["independent"]["engine"]["tasks_per_s"]
        out["throughput"] = {**best, "rounds": [r["tasks_per_s"] for r in rounds],
                             "dramatiq_tasks_per_s": engine, "ratio": round(best["tasks_per_s"] / engine, 3)}
        log("worker path: hop latency")
        hops = []
        for _ in range(cfg["hop_rounds"]):
            hops.extend(live.engine_hops(chain, timeout=cfg["timeout"])["_hops"])
            live.settle()
        summary = live.latency_summary(hops)
        d = dramatiq["hop_latency"]["engine"]
        out["hop_latency"] = {**summary, "dramatiq_p50_ms": d["p50_ms"], "dramatiq_p99_ms": d["p99_ms"]}
    finally:
        for w in workers:
            w.stop()

    # Idle load: the database's commits with 20 idle workers polling, against none.
    log(f"worker path: {IDLE_WORKERS} idle workers for {cfg['idle_seconds']} s")
    span = cfg["idle_seconds"]
    live.settle(1.0)
    before = _commits()
    time.sleep(span)
    without = _commits() - before
    idle = stack.start("sdk-idle-workers", [sys.executable, "-m", "bench.worker_path", "serve", base, key, IDLE_QUEUE,
                                            "1", str(IDLE_WORKERS)])
    try:
        time.sleep(3.0)  # every worker's first poll is in (its worker row written)
        before = _commits()
        time.sleep(span)
        with_workers = _commits() - before
    finally:
        idle.stop()
        web.stop()
    wait = 20.0  # the SDK's default poll_wait_seconds
    extra = max(0, with_workers - without)
    out["idle"] = {"workers": IDLE_WORKERS, "seconds": span, "commits_without": without,
                   "commits_with": with_workers,
                   "commits_per_worker_per_poll": round(extra / IDLE_WORKERS / (span / wait), 2)}
    return out


def _gunicorn(port: int) -> list[str]:
    from flowforge.stack import bin_path

    return [bin_path("gunicorn"), "flowforge.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2",
            "--worker-class", "gthread"]


def serve(base: str, key: str, queue: str, concurrency: int, count: int = 1) -> None:
    """Run ``count`` SDK Workers of ``queue`` (``concurrency`` slots each) until SIGTERM,
    each with the handler ``noop``."""
    import signal

    from flowforge_sdk import Worker

    workers = []
    for i in range(count):
        w = Worker(base, queue, api_key=key, concurrency=concurrency, worker_name=f"bench-{i}",
                   handle_signals=False)

        @w.task("noop")
        def noop(ctx):  # noqa: ARG001 - the SDK hands every handler its context
            return None

        workers.append(w)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    done.wait()
    for w in workers:
        w.stop()
    for t in threads:
        t.join(15)


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]) if len(sys.argv) > 6 else 1)
    else:
        raise SystemExit("usage: python -m bench.worker_path serve URL KEY QUEUE CONCURRENCY [COUNT]")
