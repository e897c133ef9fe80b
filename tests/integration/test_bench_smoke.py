"""The benchmark's code paths at tiny sizes, so ``make bench`` cannot rot.

Runs ``bench.run``'s live scenarios (throughput, hop latency, worker memory, fairness) on real
worker processes started like the bench starts them (``dramatiq flowforge.worker
bench.actors``), and the hot-query scenario, in the test database. It checks the shape
of the results and that every figure is a positive number; it never checks a
wall-clock threshold (timing belongs to ``make bench``, not to ``make test``).
"""

from __future__ import annotations

import numbers

import pytest

from bench import hot_queries
from bench.run import SMOKE, table, verdicts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _schemas():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT nspname FROM pg_namespace")
        return cur.fetchall()


def positive(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


def test_bench_smoke_mode_produces_every_figure(stack, org):
    from bench.run import run_live

    cfg = dict(SMOKE, timeout=45.0)
    results = {"meta": {"mode": "smoke", "processes": cfg["processes"], "threads": cfg["threads"], "cpus": 2,
                        "load_start": [0.0, 0.0, 0.0]}}
    results.update(run_live(stack, org, cfg, log=lambda *_: None))
    results["hot_queries"] = hot_queries.run(org, sizes=(300, 900), reps=2)
    assert hot_queries.SMALL_SCHEMA not in {s for (s,) in _schemas()}  # dropped again

    for key in ("independent", "chains"):
        t = results["throughput"][key]
        assert t["engine"]["tasks"] == (cfg["independent_tasks"] if key == "independent"
                                        else cfg["chain_runs"] * cfg["chain_length"])
        assert t["engine"]["run_states"] == {"succeeded": t["engine"]["runs"]}
        assert positive(t["engine"]["tasks_per_s"]) and positive(t["baseline"]["messages_per_s"])
        assert t["baseline"]["messages"] == t["engine"]["tasks"]
        assert positive(t["ratio"])
        assert len(t["rounds"]) == cfg["throughput_rounds"] and t["ratio"] in t["rounds"]
        # CPU per task by group. /proc counts in clock ticks (10 ms): the baseline's 30 smoke
        # messages cost about 10 ms and may read as 0 (a CI run saw it), so only the engine's
        # round, about 60 ms of CPU in all, is held to more than nothing.
        cpu_e, cpu_b = t["engine"]["cpu_ms_per_task"], t["baseline"]["cpu_ms_per_message"]
        assert set(cpu_e) == set(cpu_b) == {"postgres", "redis", "engine workers", "baseline workers"}
        assert all(v >= 0 for v in (*cpu_e.values(), *cpu_b.values())), (cpu_e, cpu_b)
        assert positive(cpu_e["engine workers"] + cpu_e["postgres"]), cpu_e

    hop = results["hop_latency"]
    for side in ("engine", "baseline"):
        assert hop[side]["hops"] == cfg["hop_chain_length"] - 1
        assert all(positive(hop[side][p]) for p in ("p50_ms", "p95_ms", "p99_ms"))
    assert all(positive(hop[r]) for r in ("ratio_p50", "ratio_p95", "ratio_p99"))

    mem = results["memory"]
    assert mem["after_large"]["tasks"] > mem["after_small"]["tasks"] > 0
    assert min(mem["after_small"]["tasks_per_process"].values()) >= cfg["memory_small"]
    assert min(mem["after_large"]["tasks_per_process"].values()) >= cfg["memory_large"]
    assert len(mem["after_large"]["processes"]) == cfg["processes"]
    assert all(positive(p["peak_rss_kib"]) for p in mem["after_large"]["processes"])
    assert positive(mem["ratio"])

    fair = results["fairness"]
    assert len(fair["idle_ms"]) == 5 and all(positive(x) for x in fair["idle_ms"])
    assert positive(fair["idle_median_ms"]) and positive(fair["loaded_ms"]) and positive(fair["ratio"])
    assert fair["a"]["tasks"] == cfg["fairness_tasks"] and positive(fair["a"]["tasks_per_s"])

    hq = results["hot_queries"]
    assert set(hq["sizes"]) == {"300", "900"}
    for size in hq["sizes"].values():
        assert set(size["queries"]) == set(hot_queries.QUERIES)
        for q in size["queries"].values():
            assert positive(q["median_ms"])
            assert "Scan" in q["plan"]
    assert all(positive(r) for r in hq["ratios"].values())

    results["verdicts"] = verdicts(results)
    assert set(results["verdicts"]) >= {"throughput_ratio_independent", "hop_p50", "hop_p99", "hot_queries_on_index",
                                        "hot_queries_ratio", "memory", "fairness"}
    text = table(results)
    assert "1 throughput" in text and "2 hop latency p99" in text and "3 claim" in text and "5 worker peak RSS" in text
    assert "6 fairness" in text
    assert "CPU ms per task: " in text and "per raw message: " in text
