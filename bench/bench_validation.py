"""Benchmark (not a test): definition validation takes time linear in the definition.

    .venv/bin/python -m bench.bench_validation [--samples 5]

Times ``engine.definitions.validate_document`` (what POST /api/v1/workflows/validate/,
POST /workflows/ and the web upload run; no database is touched) on:

1. layered DAGs with about n and 10n dependencies (6,000 and 50,000: the default
   FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW), each task depending on 20 tasks of the
   layer before. Target: time(10n) / time(n) about 10 (linear), well under 100
   (quadratic).
2. one task fanning in from n and 10n tasks (100 and 1,000: the default
   FLOWFORGE_MAX_DEPENDENCIES_PER_TASK). Same target.
3. the attack of issue 14: one task listing 30,000 unique dependencies (it took 25-43 s
   per request before the cap). Now refused at once, naming the task and the cap.

Prints the median of ``--samples`` runs of each, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def layered(edges: int, *, fan: int = 20, width: int = 100) -> dict:
    """A DAG of layers of ``width`` tasks, each (after the first layer) depending on ``fan``
    tasks of the layer before: ``edges`` dependencies in all."""
    tasks = [{"key": f"l0t{i}", "type": "noop"} for i in range(width)]
    layer = 1
    while sum(len(t.get("depends_on", [])) for t in tasks) < edges:
        for i in range(width):
            tasks.append({"key": f"l{layer}t{i}", "type": "noop",
                          "depends_on": [f"l{layer - 1}t{(i + j) % width}" for j in range(fan)]})
        layer += 1
    return {"name": "layered", "tasks": tasks}


def fan_in(n: int, *, known: bool = True) -> dict:
    deps = [f"d{i}" for i in range(n)]
    tasks = [{"key": k, "type": "noop"} for k in deps] if known else []
    return {"name": "fanin", "tasks": [*tasks, {"key": "sink", "type": "noop", "depends_on": deps}]}


def median_seconds(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
    import django

    django.setup()
    from engine.definitions import DefinitionError, validate_document

    def valid(doc):
        return lambda: validate_document(doc)

    print(f"validate_document, median of {args.samples} runs")
    for label, small, big in (
        ("layered DAG", layered(5_000), layered(50_000)),
        ("fan-in", fan_in(100), fan_in(1_000)),
    ):
        n_small = sum(len(t.get("depends_on", [])) for t in small["tasks"])
        n_big = sum(len(t.get("depends_on", [])) for t in big["tasks"])
        t_small = median_seconds(valid(small), args.samples)
        t_big = median_seconds(valid(big), args.samples)
        print(f"  {label:12} {n_small:>6} deps ({len(small['tasks'])} tasks): {t_small * 1000:8.1f} ms   "
              f"{n_big:>6} deps ({len(big['tasks'])} tasks): {t_big * 1000:8.1f} ms   "
              f"time ratio {t_big / t_small:5.1f} for {n_big / n_small:.1f}x the dependencies")

    attack = fan_in(30_000, known=False)

    def refused():
        try:
            validate_document(attack)
        except DefinitionError as exc:
            return exc
        raise AssertionError("30,000 dependencies were accepted")

    t_attack = median_seconds(refused, args.samples)
    print(f"  attack       30000 unique deps in one task: refused in {t_attack * 1000:.1f} ms: "
          f"{refused().errors[0]['message']}")


if __name__ == "__main__":
    main()
