"""Scenario 7 (issue 17): start to finish of a one-task run, through the public API.

A client POSTs ``/api/v1/runs/`` (an API key, a workflow of one ``noop`` task) and waits
for the run to finish, ``runs`` times one after another, with an idle gap before some
of them (``GAPS``: 5 s and 60 s, when every upstream consumer has backed off to its
longest poll). Each figure is from just before the request was sent (this process's
clock) to the run's ``finished_at`` (the database's clock, the same host's): what the
engine takes, not how often this client looks.

Beside it, in the same run and with the same gaps, the raw round trip of plain Dramatiq
(the baseline worker group, ``bench.actors``): enqueue of ``bench_echo`` -> its actor
starts -> its result is written (the actor's own clock), the same measure.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid

from django.db import connection

from bench import actors
from bench.live import _percentile
from flowforge.stack import wait_until

# Idle seconds before the run of that (0-based) index; the others follow at once.
GAPS = {10: 5.0, 30: 60.0, 50: 5.0, 70: 5.0, 90: 5.0}


def api_key_for(org) -> str:
    """A new member API key of ``org`` (its owner creates it)."""
    from tenancy import apikeys
    from tenancy.context import actor_for_membership
    from tenancy.models import Membership, Role

    owner = (Membership.objects.for_organization(org).select_related("organization", "user")
             .filter(role=Role.OWNER).order_by("created_at").first())
    _row, full_key = apikeys.create_api_key(actor=actor_for_membership(owner, channel="cli"),
                                            name=f"bench-start-{uuid.uuid4().hex[:8]}", role=Role.MEMBER)
    return full_key


def _finished_at(run_id: str, *, timeout: float) -> float:
    def done():
        with connection.cursor() as cur:
            cur.execute("SELECT EXTRACT(EPOCH FROM finished_at)::float8, state FROM core_workflowrun WHERE id = %s",
                        [run_id])
            row = cur.fetchone()
        if row and row[0] is not None:
            if row[1] != "succeeded":
                raise RuntimeError(f"bench run {run_id} ended {row[1]}")
            return row[0]
        return None

    return wait_until(done, timeout=timeout, interval=0.002, what=f"run {run_id} to finish")


def engine_once(http, key: str, workflow: str, *, timeout: float) -> float:
    """Milliseconds from just before the POST to the run's finished_at."""
    began = time.time()
    response = http.post("/api/v1/runs/", json={"workflow": workflow, "input": {}},
                         headers={"Authorization": f"Bearer {key}"})
    if response.status_code != 201:
        raise RuntimeError(f"POST /api/v1/runs/ answered {response.status_code}: {response.text[:300]}")
    return (_finished_at(response.json()["id"], timeout=timeout) - began) * 1000


def raw_once(label: str, i: int, *, timeout: float) -> float:
    """Milliseconds from just before the enqueue to the raw actor's result."""
    client = actors.redis_client()
    key = actors.echo_key(label)
    began = time.time()
    actors.bench_echo.send(label, i)
    reply = client.blpop([key], timeout=timeout)
    if reply is None:
        raise RuntimeError(f"no raw round trip result within {timeout} s")
    _i, _started, finished = json.loads(reply[1])
    return (finished - began) * 1000


def summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(_percentile(values, 99), 2),
        "max_ms": round(max(values), 2),
    }


def scenario(http, key: str, workflow: str, *, runs: int = 100, gaps: dict[int, float] | None = None,
             timeout: float = 60.0, log=print) -> dict:
    """``runs`` engine runs and as many raw round trips, interleaved; where ``gaps`` gives
    an index an idle gap, each of that pair comes after a gap of its own. Returns p50/p99 of both, the figures after each
    gap, and every figure."""
    gaps = GAPS if gaps is None else gaps
    label = uuid.uuid4().hex[:12]
    engine_once(http, key, workflow, timeout=timeout)  # warm-up: connections, caches, key verification
    raw_once(label, -1, timeout=timeout)
    engine: list[float] = []
    raw: list[float] = []
    after_gap: list[dict] = []
    for i in range(runs):
        gap = gaps.get(i, 0.0)
        if gap:
            # Each side gets its own idle gap (the other's work would wake the machine).
            log(f"start latency: idle {gap:g} s before run {i}, and before its raw round trip")
            time.sleep(gap)
            engine.append(engine_once(http, key, workflow, timeout=timeout))
            time.sleep(gap)
            raw.append(raw_once(label, i, timeout=timeout))
        elif i % 2:  # alternate which goes first
            raw.append(raw_once(label, i, timeout=timeout))
            engine.append(engine_once(http, key, workflow, timeout=timeout))
        else:
            engine.append(engine_once(http, key, workflow, timeout=timeout))
            raw.append(raw_once(label, i, timeout=timeout))
        if gap:
            after_gap.append({"gap_s": gap, "engine_ms": round(engine[-1], 2), "raw_ms": round(raw[-1], 2)})
    actors.redis_client().delete(actors.echo_key(label))
    e, r = summary(engine), summary(raw)
    return {
        "engine": e, "raw": r,
        "ratio_p50": round(e["p50_ms"] / r["p50_ms"], 2),
        "after_gap": after_gap,
        "_engine_ms": [round(x, 3) for x in engine], "_raw_ms": [round(x, 3) for x in raw],
    }
