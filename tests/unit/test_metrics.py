"""engine.metrics: increments are summed in the process and sent to Redis in one flush."""

from __future__ import annotations

import redis

from engine import metrics


def _hash(name: str) -> dict[str, float]:
    raw = metrics._client().hgetall(metrics._key(name))
    return {k.decode(): float(v) for k, v in raw.items()}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0) - before.get(k, 0), 9) for k in set(before) | set(after)
            if round(after.get(k, 0) - before.get(k, 0), 9)}


def test_an_observation_counts_in_every_bucket_at_or_above_it_and_in_the_sum():
    metrics.flush()
    before = _hash("flowforge_task_duration_seconds")
    metrics.observe("flowforge_task_duration_seconds", 0.07)
    metrics.observe("flowforge_task_duration_seconds", 0.5)  # exactly on a bound: le=0.5 counts it
    metrics.flush()
    delta = _delta(before, _hash("flowforge_task_duration_seconds"))
    assert delta == {
        "le=0.1": 1, "le=0.5": 2, "le=1.0": 2, "le=5.0": 2, "le=10.0": 2, "le=30.0": 2, "le=60.0": 2,
        "le=300.0": 2, "le=900.0": 2, "le=3600.0": 2, "le=+Inf": 2, "sum": 0.57,
    }


def test_increments_between_flushes_are_summed_into_one_field():
    metrics.flush()
    before = _hash("flowforge_task_attempts_total")
    metrics.incr("flowforge_task_attempts_total", "succeeded", amount=2)
    metrics.incr("flowforge_task_attempts_total", "succeeded", amount=3)
    metrics.incr("flowforge_task_attempts_total", "failed")
    assert _delta(before, _hash("flowforge_task_attempts_total")) == {}  # nothing sent yet
    metrics.flush()
    assert _delta(before, _hash("flowforge_task_attempts_total")) == {"succeeded": 5, "failed": 1}


def test_sums_are_kept_when_redis_does_not_answer_and_sent_with_the_next_flush():
    metrics.flush()
    good = metrics._client()
    before = _hash("flowforge_runs_finished_total")
    metrics.incr("flowforge_runs_finished_total", "succeeded", amount=4)
    metrics._local.client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        metrics.flush()  # fails quietly: a metric never fails the operation it measures
    finally:
        metrics._local.client = good
    assert _delta(before, _hash("flowforge_runs_finished_total")) == {}
    metrics.incr("flowforge_runs_finished_total", "succeeded", amount=1)
    metrics.flush()
    assert _delta(before, _hash("flowforge_runs_finished_total")) == {"succeeded": 5}


def test_the_flush_thread_sends_without_an_explicit_flush():
    import time

    metrics.flush()
    before = _hash("flowforge_lease_reaps_total")
    metrics.incr("flowforge_lease_reaps_total", "requeued")
    deadline = time.monotonic() + metrics.FLUSH_INTERVAL_SECONDS * 5
    while time.monotonic() < deadline and not _delta(before, _hash("flowforge_lease_reaps_total")):
        time.sleep(0.05)
    assert _delta(before, _hash("flowforge_lease_reaps_total")) == {"requeued": 1}
