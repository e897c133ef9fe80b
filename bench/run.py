"""``make bench``: FlowForge against raw Dramatiq and against a big database, in one run.

    .venv/bin/python -m bench.run [--smoke] [--skip-api] [--skip-hot] [--output bench/results.json]

It works in its own PostgreSQL database (``BENCH_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/flowforge_bench``: dropped, re-created and migrated
each run), its own Redis database and broker namespace (``BENCH_REDIS_URL``, default
``redis://127.0.0.1:6379/4``; namespace ``ff-bench``), and starts two Dramatiq worker
groups of 2 processes x 8 threads each (``--processes``/``--threads``) with Dramatiq's
default prefetch: the engine's, ``dramatiq flowforge.worker`` (its consumers woken by
enqueues, ``flowforge.redis_wakeup``), and the baseline's, plain Dramatiq:
``dramatiq flowforge.worker bench.actors --queues bench`` with upstream's polling Redis
consumer (FLOWFORGE_BROKER_WAKEUP=0); plus the clock, through ``flowforge.stack``, with
``DEBUG=0`` as deployed. Each group is idle while the other is measured. Every engine
figure and its baseline are measured in this one run:

1. throughput: one run of 2,000 independent ``noop`` tasks and 200 runs of a 10-task
   chain, tasks/s from the first 'claimed' event to the last 'succeeded' event; baseline
   the same number of messages to a no-op Dramatiq actor (``bench.actors``), written to
   its queue at once, first actor start to last actor end. Each is measured in
   ``throughput_rounds`` rounds (5; engine, then its baseline, the two scenarios
   alternating): the round with the median ratio is reported, with every round's ratio
   beside it (one round's ratio moves by a third from run to run on this machine, and
   raw Dramatiq's own rate by as much: 2,300 to 3,500 messages/s in one hour);
2. hop latency: a 100-task chain at light load (3 rounds), per edge the predecessor's
   'succeeded' event to the successor's 'started' event; baseline a raw actor that
   enqueues its successor, measured the same way from the actors' own timestamps;
3. hot queries at 10,000 and 1,000,000 historical task runs (``bench.hot_queries``);
4. API and pages: ``python -m bench.bench_auth``, ``python -m bench.bench_api_pagination``
   and ``python -m bench.bench_grid`` (the workflow grid at 1,000,000 runs against 1,000:
   issue 20) when present (their printed figures are kept as they are);
5. worker memory: peak RSS of each worker process once it has run 100 engine tasks and
   once it has run 10,000 (the larger of the per-process ratios is reported);
6. fairness between organizations: organization B's one-task run's start latency (run
   created -> 'started' event) while organization A's run of 2,000 sleep tasks of 50 ms
   fills the workers (5 runs of B one after another, the median), as a ratio to B's idle
   start latency measured just before on the same workers (median of 5); target <= 3
   (issue 16); the worst loaded sample's ratio is printed beside it;
7. start to finish (issue 17): a one-task run started through the public API
   (``POST /api/v1/runs/`` on a gunicorn of the bench's own) and awaited, 100 times one
   after another with idle gaps of 5 s and 60 s before some of them, from just before
   the request to the run's ``finished_at``; baseline raw Dramatiq's enqueue -> actor
   start -> result round trip, interleaved, with the same gaps (``bench.start_latency``).
   Targets: p50 <= 3x the raw round trip's and <= 10 ms; p99 <= 45 ms.
8. the organizations' own workers (issue 18, ``bench.worker_path``): SDK worker processes
   with the Dramatiq path's slots serve one run of the independent size in worker tasks
   (tasks/s, and the ratio to scenario 1's engine figure: aim >= 0.5) and a chain (hop
   latency beside scenario 2's); then 20 idle SDK workers poll an empty queue for 60 s,
   and the database's committed transactions are counted against the same span without
   them.

Where the server's autovacuum is off (a CI database), the hot tables are vacuumed between
rounds (``bench.live.settle``), as autovacuum would, so that no round runs on the dead row
versions of all earlier ones; the table says so.

It prints a table and writes ``bench/results.json``. ``--smoke`` runs the same code with
tiny sizes (about 30 s) and without the API benches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from bench.dbsetup import throwaway_production_keys

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/flowforge_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/4"
NAMESPACE = "ff-bench"

FULL = {
    "processes": 2,
    "threads": 8,
    "independent_tasks": 2000,
    "chain_runs": 200,
    "chain_length": 10,
    "hop_chain_length": 100,
    "hop_rounds": 3,
    "throughput_rounds": 5,
    "memory_small": 100,
    "memory_large": 10_000,
    "hot_sizes": (10_000, 1_000_000),
    "hot_reps": 25,
    "fairness_tasks": 2000,
    "fairness_task_seconds": 0.05,
    "start_runs": 100,
    "start_gaps": None,  # bench.start_latency.GAPS: 5 s and 60 s idle before some runs
    "idle_seconds": 60.0,  # scenario 8: 20 idle SDK workers polling
    "timeout": 600.0,
}
SMOKE = {
    **FULL,
    "independent_tasks": 30,
    "chain_runs": 3,
    "chain_length": 4,
    "hop_chain_length": 8,
    "hop_rounds": 1,
    "throughput_rounds": 2,
    "memory_small": 20,
    "memory_large": 80,
    "hot_sizes": (500, 2_000),
    "hot_reps": 3,
    "fairness_tasks": 40,
    "start_runs": 10,
    "start_gaps": {4: 0.5},
    "idle_seconds": 3.0,
    "timeout": 60.0,
}

TARGETS = {
    "throughput_ratio_independent": 0.35,  # issue 16: with fairness on
    "hop_p50_ratio": 3.0,
    "hop_p99_ratio": 5.0,
    "hot_query_ratio": 1.5,
    "memory_ratio": 1.10,
    "fairness_ratio": 3.0,
    # issue 17: a one-task run, API start to finish, against raw Dramatiq's round trip
    "start_p50_ratio": 3.0,
    "start_p50_ms": 10.0,
    "start_p99_ms": 45.0,
}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- environment ---------------------------------------------------------------------------------


def recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # our own configuration's name
        conn.execute(f'CREATE DATABASE "{name}"')


def bench_env(database_url: str, redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        BROKER_URL=redis_url,
        BROKER_NAMESPACE=NAMESPACE,
        DJANGO_SETTINGS_MODULE="flowforge.settings",
        DEBUG="0",
        PYTHONUNBUFFERED="1",
        FLOWFORGE_REPORT_DIR=str(BASE_DIR / "var" / "bench" / "reports"),
        # The API benches send thousands of requests a minute with one key.
        FLOWFORGE_API_RATE_LIMIT_PER_MINUTE="100000000",
    )
    env.update(throwaway_production_keys())  # DEBUG is off: it refuses to start without them
    return env


def flush_namespace(redis_url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{namespace}*"):
        client.delete(key)


# --- scenarios 1, 2, 5 ------------------------------------------------------------------------------


def start_workers(stack, cfg: dict):
    """The engine's worker group (``dramatiq flowforge.worker``, its own broker: consumers
    woken by enqueues; plus a reserved thread per process for first-lane generations and
    control actors, FLOWFORGE_WORKER_RESERVED_THREADS) and the baseline's (``bench.actors``
    on the ``bench`` queue only, with upstream Dramatiq's polling Redis consumer:
    FLOWFORGE_BROKER_WAKEUP=0, no reserved thread), the same processes x threads each, and
    the clock. Returns the engine's group and the baseline's."""
    from flowforge.stack import bin_path, wait_until, worker_child_pids

    size = ["--processes", str(cfg["processes"]), "--threads", str(cfg["threads"]), "--worker-shutdown-timeout",
            "10000"]
    # An idle upstream consumer backs off up to the worker timeout before it polls again (1 s
    # by default): with 100 ms no process sits out a whole run while another drains it.
    worker = stack.start("worker", [bin_path("dramatiq"), "flowforge.worker", *size],
                         env={"dramatiq_worker_timeout": "100"})
    # The baseline is upstream Dramatiq: no reserved thread beside its --threads either.
    baseline = stack.start("baseline-worker", [bin_path("dramatiq"), "flowforge.worker", "bench.actors",
                                               "--queues", "bench", *size],
                           env={"dramatiq_worker_timeout": "100", "FLOWFORGE_BROKER_WAKEUP": "0",
                                "FLOWFORGE_WORKER_RESERVED_THREADS": "0"})
    stack.start_clock()
    for group in (worker, baseline):
        wait_until(lambda g=group: len(worker_child_pids(g.pid)) >= cfg["processes"], timeout=60,
                   what="the worker processes to start")
    return worker, baseline


def run_live(stack, org, cfg: dict, log=print) -> dict:
    """Scenarios 1, 2 and 5 on one set of worker processes (started here, stopped by the caller)."""
    from bench import live

    timeout = cfg["timeout"]
    worker, baseline_group = start_workers(stack, cfg)
    groups = {"engine workers": worker.pid, "baseline workers": baseline_group.pid}
    log("workers up; warming up")
    live.baseline_throughput(cfg["processes"] * cfg["threads"] * 2, timeout=timeout)  # every consumer is polling

    independent = live.independent_workflow(org, cfg["independent_tasks"], "bench-independent")
    chain = live.chain_workflow(org, cfg["chain_length"], "bench-chain")
    hop_chain = live.chain_workflow(org, cfg["hop_chain_length"], "bench-hop-chain")
    # Wider than both processes' prefetch (threads x 2 each), so one process cannot take a
    # whole run's messages in one fetch and leave the other idle.
    small_width = max(cfg["memory_small"] // 2, 2 * cfg["processes"] * cfg["threads"] * 2)
    small = live.independent_workflow(org, small_width, "bench-memory-small")

    # 5 (first half): chains, then independent tasks until every worker process has run
    # 100 engine tasks; then each process's RSS.
    out: dict = {"load": {"start": load()}}
    live.engine_throughput(chain, max(1, cfg["memory_small"] // 2 // cfg["chain_length"]), timeout=timeout)
    per_process = live.run_until_each_process_ran(small, worker.pid, cfg["memory_small"], timeout=timeout,
                                                  max_total=max(cfg["memory_small"], small_width) * 20)
    live.settle()
    memory_small = {"tasks": live.engine_tasks_done(), "tasks_per_process": per_process,
                    "processes": live.worker_memory(worker.pid)}

    # 1: throughput, each engine figure followed by its baseline, in rounds.
    log("throughput")
    rounds: dict[str, list[dict]] = {"independent": [], "chains": []}
    for _ in range(cfg["throughput_rounds"]):
        for key, workflow, runs in (("independent", independent, 1), ("chains", chain, cfg["chain_runs"])):
            engine = live.engine_throughput(workflow, runs, timeout=timeout, workers=groups)
            live.settle()
            baseline = live.baseline_throughput(engine["tasks"], timeout=timeout, workers=groups)
            live.settle()
            rounds[key].append({"engine": engine, "baseline": baseline,
                                "ratio": round(engine["tasks_per_s"] / baseline["messages_per_s"], 3)})
    out["load"]["after_throughput"] = load()
    out["throughput"] = {key: median_round(rs) for key, rs in rounds.items()}

    # 2: hop latency, engine and baseline rounds interleaved, at light load.
    log("hop latency")
    live.settle(1.0)
    engine_hops: list[dict] = []
    raw_hops: list[dict] = []
    for _ in range(cfg["hop_rounds"]):
        engine_hops.append(live.engine_hops(hop_chain, timeout=timeout))
        live.settle()
        raw_hops.append(live.baseline_hops(cfg["hop_chain_length"], timeout=timeout))
        live.settle()
    e, r = _pool(engine_hops), _pool(raw_hops)
    out["load"]["after_hops"] = load()
    out["hop_latency"] = {
        "engine": e, "baseline": r,
        "ratio_p50": round(e["p50_ms"] / r["p50_ms"], 2),
        "ratio_p95": round(e["p95_ms"] / r["p95_ms"], 2),
        "ratio_p99": round(e["p99_ms"] / r["p99_ms"], 2),
    }

    # 6: fairness between organizations (a second organization, B, beside the bench's own, A).
    log("fairness")
    from tenancy.services import create_organization

    org_b, _user, _ = create_organization(slug="bench-b", name="Bench B", owner_email="owner@bench-b.example")
    burst = live.sleep_workflow(org, cfg["fairness_tasks"], cfg["fairness_task_seconds"], "bench-fairness-burst")
    single = live.sleep_workflow(org_b, 1, cfg["fairness_task_seconds"], "bench-fairness-single")
    live.settle()
    out["fairness"] = live.fairness(burst, single, busy=2 * cfg["processes"] * cfg["threads"], timeout=timeout)
    out["load"]["after_fairness"] = load()
    live.settle()

    # 7: start to finish of a one-task run through the public API, against raw Dramatiq.
    log("start latency")
    out["start_latency"] = run_start_latency(stack, org, cfg, log=log)
    out["load"]["after_start_latency"] = load()

    # 8: the organizations' own workers through the SDK, against this run's Dramatiq path.
    log("worker path")
    from bench import worker_path

    out["worker_path"] = worker_path.scenario(stack, org, cfg, out, log=log)
    out["load"]["after_worker_path"] = load()

    # 5 (second half): more independent runs until every worker process has run 10,000.
    log("memory")
    wide = independent if cfg["independent_tasks"] >= small_width else small
    per_process = live.run_until_each_process_ran(wide, worker.pid, cfg["memory_large"], timeout=timeout,
                                                  max_total=cfg["memory_large"] * cfg["processes"] * 4)
    live.settle()
    memory_large = {"tasks": live.engine_tasks_done(), "tasks_per_process": per_process,
                    "processes": live.worker_memory(worker.pid)}
    before = {p["pid"]: p for p in memory_small["processes"]}
    ratios = [p["peak_rss_kib"] / before[p["pid"]]["peak_rss_kib"] for p in memory_large["processes"] if p["pid"] in before]
    out["memory"] = {"after_small": memory_small, "after_large": memory_large,
                     "ratio": round(max(ratios), 3) if ratios else None}
    out["load"]["end"] = load()
    return out


def run_start_latency(stack, org, cfg: dict, log=print) -> dict:
    """Scenario 7 on a gunicorn of its own (``Stack.start_web``, a free port)."""
    import logging
    import socket

    import httpx

    from bench import start_latency
    from engine.services import apply_definition
    from flowforge.stack import wait_until

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    web = stack.start_web("bench-web", bind=f"127.0.0.1:{port}")
    apply_definition(organization=org, document={"name": "bench-start", "tasks": [{"key": "only", "type": "noop"}]})
    key = start_latency.api_key_for(org)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        def up():
            if not web.alive():
                raise RuntimeError(f"gunicorn exited; see {web.log_path}")
            try:
                return http.get("/api/v1/runs/").status_code == 401
            except httpx.TransportError:
                return False

        wait_until(up, timeout=60, interval=0.2, what="gunicorn to answer")
        return start_latency.scenario(http, key, "bench-start", runs=cfg["start_runs"], gaps=cfg["start_gaps"],
                                      timeout=cfg["timeout"], log=log)


def median_round(rounds: list[dict]) -> dict:
    """The round (engine, baseline, ratio) with the median ratio (the lower middle one of
    an even number), plus ``rounds``: every round's ratio in the order measured."""
    chosen = sorted(rounds, key=lambda r: r["ratio"])[(len(rounds) - 1) // 2]
    return {**chosen, "rounds": [r["ratio"] for r in rounds]}


def _pool(rounds: list[dict]) -> dict:
    """One latency summary over the edges of several rounds."""
    hops = [h for rnd in rounds for h in rnd.pop("_hops")]
    from bench.live import latency_summary

    return {**latency_summary(hops), "rounds": len(rounds)}


# --- scenario 4 ----------------------------------------------------------------------------------


API_BENCHES = ("bench_auth", "bench_api_pagination", "bench_grid")
# Seconds each may take: bench_grid's first invocation loads 1,000,000 runs and their
# 4,000,000 task runs (about five minutes on two cores) before it measures.
API_BENCH_TIMEOUTS = {"bench_grid": 1200.0}


def run_api_benches(env: dict[str, str], *, timeout: float = 420.0, log=print) -> dict:
    out = {}
    for name in API_BENCHES:
        if not (BASE_DIR / "bench" / f"{name}.py").exists():
            out[name] = {"status": "absent"}
            continue
        log(f"api: {name}")
        began = time.monotonic()
        limit = API_BENCH_TIMEOUTS.get(name, timeout)
        try:
            proc = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=BASE_DIR, env=env,
                                  capture_output=True, text=True, timeout=limit)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            output = proc.stdout + (proc.stderr[-2000:] if proc.returncode else "")
        except subprocess.TimeoutExpired as exc:
            status = f"timeout after {limit:.0f}s"
            output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out[name] = {"status": status, "seconds": round(time.monotonic() - began, 1), "output": output.strip()}
    return out


# --- report -------------------------------------------------------------------------------------


def verdicts(results: dict) -> dict:
    v = {}
    if "throughput" in results:
        v["throughput_ratio_independent"] = results["throughput"]["independent"]["ratio"] >= TARGETS[
            "throughput_ratio_independent"]
    if "hop_latency" in results:
        v["hop_p50"] = results["hop_latency"]["ratio_p50"] <= TARGETS["hop_p50_ratio"]
        v["hop_p99"] = results["hop_latency"]["ratio_p99"] <= TARGETS["hop_p99_ratio"]
    if "hot_queries" in results:
        hq = results["hot_queries"]
        large = hq["sizes"][max(hq["sizes"], key=int)]["queries"]
        v["hot_queries_on_index"] = all(q["uses_index"] for q in large.values())
        v["hot_queries_ratio"] = all(r <= TARGETS["hot_query_ratio"] for r in hq["ratios"].values())
    if results.get("memory", {}).get("ratio") is not None:
        v["memory"] = results["memory"]["ratio"] <= TARGETS["memory_ratio"]
    if "fairness" in results:
        v["fairness"] = results["fairness"]["ratio"] <= TARGETS["fairness_ratio"]
    if "start_latency" in results:
        s = results["start_latency"]
        v["start_p50"] = (s["ratio_p50"] <= TARGETS["start_p50_ratio"]
                          and s["engine"]["p50_ms"] <= TARGETS["start_p50_ms"])
        v["start_p99"] = s["engine"]["p99_ms"] <= TARGETS["start_p99_ms"]
    return v


def table(results: dict) -> str:
    lines = []
    meta = results["meta"]
    lines.append(
        f"FlowForge bench ({meta['mode']}): {meta['processes']} worker processes x {meta['threads']} threads, "
        f"{meta['cpus']} CPUs; load average at start {meta['load_start']}, at end {meta.get('load_end')}"
    )
    if meta.get("autovacuum") == "off":
        lines.append("the server's autovacuum is off: the bench vacuums the engine's hot tables between rounds "
                     "(bench.live.vacuum_hot_tables)")
    if results.get("load"):
        lines.append("load average (1/5/15 min) during the live scenarios: "
                     + "; ".join(f"{k} {v}" for k, v in results["load"].items()))
    row = "{:<44} {:>16} {:>16} {:>9}  {}"
    lines.append(row.format("scenario", "engine", "baseline", "ratio", "target"))
    if "throughput" in results:
        for key, label in (("independent", "1 throughput: 1 run x {n} independent"),
                           ("chains", "1 throughput: {runs} runs x 10-chain")):
            t = results["throughput"][key]
            lines.append(row.format(
                label.format(n=t["engine"]["tasks"], runs=t["engine"]["runs"]),
                f"{t['engine']['tasks_per_s']:.0f} tasks/s", f"{t['baseline']['messages_per_s']:.0f} msg/s",
                f"{t['ratio']:.2f}", (">= 0.35; " if key == "independent" else "")
                + f"median of {len(t['rounds'])} rounds: " + ", ".join(f"{r:.2f}" for r in t["rounds"])))
            cpu = _cpu_line(t)
            if cpu:
                lines.append("    " + cpu)
    if "hop_latency" in results:
        h = results["hop_latency"]
        for p, target in (("p50", "<= 3x"), ("p95", ""), ("p99", "<= 5x")):
            lines.append(row.format(f"2 hop latency {p} ({h['engine']['hops']} edges)",
                                    f"{h['engine'][p + '_ms']:.1f} ms", f"{h['baseline'][p + '_ms']:.1f} ms",
                                    f"{h['ratio_' + p]:.2f}x", target))
    if "hot_queries" in results:
        hq = results["hot_queries"]
        sizes = sorted(hq["sizes"], key=int)
        small, large = sizes[0], sizes[-1]
        for name in hq["ratios"]:
            a = hq["sizes"][small]["queries"][name]
            b = hq["sizes"][large]["queries"][name]
            lines.append(row.format(
                f"3 {name} ({_n(small)} -> {_n(large)})", f"{b['median_ms']:.2f} ms", f"{a['median_ms']:.2f} ms",
                f"{hq['ratios'][name]:.2f}x",
                f"<= 1.5x; {b['index']} {'used' if b['uses_index'] else 'NOT USED: ' + ','.join(b['indexes_used'])}"))
    if "memory" in results:
        m = results["memory"]
        peak = lambda snap: max(p["peak_rss_kib"] for p in snap["processes"]) / 1024  # noqa: E731
        lines.append(row.format(
            f"5 worker peak RSS ({_per(m['after_small'])} -> {_per(m['after_large'])} tasks/proc)",
            f"{peak(m['after_large']):.1f} MiB", f"{peak(m['after_small']):.1f} MiB",
            f"{m['ratio']:.3f}", "<= 1.10"))
    if "fairness" in results:
        f = results["fairness"]
        lines.append(row.format(
            f"6 fairness: B's start under A's {f['a']['tasks']} tasks", f"{f['loaded_ms']:.1f} ms",
            f"{f['idle_median_ms']:.1f} ms", f"{f['ratio']:.2f}x",
            f"<= 3x; medians of {len(f['loaded_all_ms'])} loaded and {len(f['idle_ms'])} idle samples; worst "
            f"{max(f['loaded_all_ms']):.1f} ms ({f['ratio_worst']:.2f}x); A {f['a']['tasks_per_s']:.0f} tasks/s"))
    if "start_latency" in results:
        s = results["start_latency"]
        gaps = ", ".join(f"{g['gap_s']:g} s: {g['engine_ms']:.1f}/{g['raw_ms']:.1f} ms" for g in s["after_gap"])
        lines.append(row.format(f"7 start to finish p50 ({s['engine']['n']} runs)", f"{s['engine']['p50_ms']:.1f} ms",
                                f"{s['raw']['p50_ms']:.1f} ms", f"{s['ratio_p50']:.2f}x", "<= 3x and <= 10 ms"))
        lines.append(row.format("7 start to finish p99", f"{s['engine']['p99_ms']:.1f} ms",
                                f"{s['raw']['p99_ms']:.1f} ms", "", "<= 45 ms; after idle gaps (engine/raw): "
                                + gaps))
    if "worker_path" in results:
        w = results["worker_path"]
        t, h, i = w["throughput"], w["hop_latency"], w["idle"]
        lines.append(row.format(f"8 own workers (SDK, {w['slots']} slots): {t['tasks']} tasks",
                                f"{t['tasks_per_s']:.0f} tasks/s", f"{t['dramatiq_tasks_per_s']:.0f} tasks/s",
                                f"{t['ratio']:.2f}", "aim >= 0.5 of the Dramatiq path (engine column of 1); rounds: "
                                + ", ".join(f"{r:.0f}" for r in t["rounds"])))
        for p in ("p50", "p99"):
            lines.append(row.format(f"8 own workers hop latency {p} ({h['hops']} edges)", f"{h[p + '_ms']:.1f} ms",
                                    f"{h['dramatiq_' + p + '_ms']:.1f} ms",
                                    f"{h[p + '_ms'] / h['dramatiq_' + p + '_ms']:.2f}x", "beside the Dramatiq path's (2)"))
        lines.append(row.format(f"8 {i['workers']} idle SDK workers, {i['seconds']:g} s", f"{i['commits_with']} commits",
                                f"{i['commits_without']} commits", "",
                                f"database transactions with them / without; "
                                f"{i['commits_per_worker_per_poll']} per worker per 20 s poll"))
    lines.append("(engine column: the larger size / later figure; baseline column: raw Dramatiq, the smaller "
                 "size or the earlier figure)")
    if "api" in results:
        for name, r in results["api"].items():
            lines.append(f"4 {name}: {r['status']}" + (f" ({r.get('seconds')} s)" if "seconds" in r else ""))
            shown = []
            for line in (r.get("output") or "").splitlines():
                if line.startswith(("EXPLAIN", "Traceback")) and r["status"] == "ok":
                    break  # the plans are in results.json
                shown.append(line)
            for line in (shown[:30] if r["status"] == "ok" else shown[-15:]):
                lines.append("    " + line)
    if results.get("verdicts"):
        met = ", ".join(f"{k}={'yes' if ok else 'NO'}" for k, ok in results["verdicts"].items())
        if results.get("meta", {}).get("mode") == "smoke":
            # 30 tasks run in a few milliseconds: start-up costs dominate, the ratios mean nothing.
            lines.append(f"smoke sizes: the targets are judged by the full run (make bench), not here ({met})")
        else:
            lines.append("targets met: " + met)
    return "\n".join(lines)


def _cpu_line(t: dict) -> str:
    """The median round's CPU per task (engine) and per message (baseline), by group."""
    e, b = t["engine"].get("cpu_ms_per_task"), t["baseline"].get("cpu_ms_per_message")
    if not e or not b:
        return ""

    def fmt(d: dict) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in d.items() if v >= 0.005)

    return (f"CPU ms per task: {fmt(e)} (sum {sum(e.values()):.2f}); per raw message: {fmt(b)} "
            f"(sum {sum(b.values()):.2f})")


def _per(snapshot: dict) -> str:
    counts = snapshot.get("tasks_per_process") or {}
    return f">={min(counts.values())}" if counts else str(snapshot["tasks"])


def _n(size: str) -> str:
    n = int(size)
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (f"{n // 1000}k" if n >= 1000 else str(n))


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no API benches (about 30 s)")
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--skip-hot", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--output", default=str(BASE_DIR / "bench" / "results.json"))
    args = parser.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL, processes=args.processes, threads=args.threads)
    began = time.monotonic()

    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS_URL)
    env = bench_env(database_url, redis_url)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "BROKER_NAMESPACE",
                                           "DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY")})
    print(f"bench database {database_url} (re-created), redis {redis_url} namespace {NAMESPACE}; load {load()}")
    recreate_database(database_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=BASE_DIR, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    flush_namespace(redis_url, NAMESPACE)

    import django

    django.setup()
    from flowforge.stack import Stack
    from tenancy.services import create_organization

    org, _user, _ = create_organization(slug="bench", name="Bench", owner_email="owner@bench.example")
    # The bench starts thousands of runs a minute (200 chains a round, rounds back to back):
    # the free plan's start quota would refuse them. Its scheduling (weight, running quota,
    # dispatch-ahead) stays the free plan's, as a tenant's would be.
    from tenancy.models import Organization

    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=1_000_000)
    org.refresh_from_db()
    results: dict = {"meta": {
        "mode": "smoke" if args.smoke else "full", "processes": cfg["processes"], "threads": cfg["threads"],
        "cpus": os.cpu_count(), "load_start": load(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "database": database_url, "redis": redis_url, "namespace": NAMESPACE,
        "sizes": {k: v for k, v in cfg.items() if k not in ("timeout",)},
    }}
    from bench.live import autovacuum_on

    results["meta"]["autovacuum"] = "on" if autovacuum_on() else "off"
    if not args.skip_live:
        stack = Stack(env=env, log_dir=BASE_DIR / "var" / "bench" / "logs")
        try:
            live_results = run_live(stack, org, cfg)
        finally:
            stack.stop_all()
        results.update(live_results)
    if not args.skip_hot:
        from bench import hot_queries

        print("hot queries: loading history")
        with __import__("django.db", fromlist=["connection"]).connection.cursor() as cur:
            cur.execute("TRUNCATE core_taskrunevent, core_outboxmessage, core_taskrun, core_workflowrun CASCADE")
        results["hot_queries"] = hot_queries.run(org, sizes=cfg["hot_sizes"], reps=cfg["hot_reps"])
    if not (args.smoke or args.skip_api):
        results["api"] = run_api_benches(env)
    results["meta"]["load_end"] = load()
    results["meta"]["seconds"] = round(time.monotonic() - began, 1)
    results["verdicts"] = verdicts(results)
    text = table(results)
    print(text)
    print(f"total {results['meta']['seconds']} s")
    results["table"] = text
    Path(args.output).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
