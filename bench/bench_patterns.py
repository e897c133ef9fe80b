"""Benchmark (not a test): what a member's regular expression costs to compile, before and
after engine.patterns' bounds.

    .venv/bin/python -m bench.bench_patterns [--samples 3]

``"a{0,1000}" * N`` (the review of issue 19: 2.6 s for N=20, 20 s for N=60 with the GIL
   held). Times RE2's compile with its default options for N=5 and N=10 (larger N take
   seconds to minutes: not run) and ``engine.patterns.problem`` for N=20, 60 and 200
   (refused before RE2 sees them). Target: the refusal orders of magnitude faster than
   even the smallest unbounded compile.

Prints medians of ``--samples`` runs and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def median_seconds(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
    import django

    django.setup()
    import itertools

    import re2

    from engine import patterns

    # google-re2 keeps its own LRU of compiled patterns: each sample compiles a new text.
    fresh = itertools.count()

    unbounded = {}
    for n in (5, 10):
        unbounded[n] = median_seconds(lambda n=n: re2.compile("a{0,1000}" * n + f"b{next(fresh)}"), args.samples)
        print(f"RE2 default options, 'a{{0,1000}}'*{n}: {unbounded[n] * 1000:.1f} ms")
    for n in (20, 60, 200):
        refused = median_seconds(lambda n=n: patterns.problem("a{0,1000}" * n + f"b{next(fresh)}"), args.samples)
        print(f"patterns.problem, 'a{{0,1000}}'*{n}: {refused * 1e6:.1f} us "
              f"(ratio to the unbounded compile of N=5: 1/{unbounded[5] / refused:.0f})")
        assert patterns.problem("a{0,1000}" * n) is not None


if __name__ == "__main__":
    main()
