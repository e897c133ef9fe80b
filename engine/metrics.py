"""Operational metrics, collected cluster-wide in Redis and served at /metrics.

Counters and histograms are incremented by whichever process sees the event (web,
worker, clock) with one pipelined Redis round trip; /metrics renders them, plus
gauges read from PostgreSQL at scrape time, in Prometheus' text format. Redis is a
cache here, not a record: if it restarts, counters start again from zero, which
Prometheus treats as an ordinary counter reset. A metrics failure never fails the
operation being measured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import redis
from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

# Histogram buckets, in seconds.
DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

COUNTERS = {
    "flowforge_runs_started_total": ("Runs started, by channel.", ("channel",)),
    "flowforge_runs_finished_total": ("Runs finished, by final state.", ("state",)),
    "flowforge_task_attempts_total": ("Task attempts finished, by outcome.", ("outcome",)),
    "flowforge_lease_reaps_total": ("Expired leases taken back by the reaper, by result.", ("result",)),
}
HISTOGRAMS = {
    "flowforge_dispatch_latency_seconds": ("From claim to handler start.", DISPATCH_BUCKETS),
    "flowforge_task_duration_seconds": ("Handler run time of one attempt.", DURATION_BUCKETS),
}

_local = threading.local()


def _client() -> redis.Redis:
    client = getattr(_local, "client", None)
    if client is None:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        _local.client = client
    return client


def _key(name: str) -> str:
    return f"{settings.BROKER_NAMESPACE}:metrics:{name}"


def _field(labels: Iterable[str]) -> str:
    return "|".join(labels)


def incr(name: str, *labels: str, amount: float = 1) -> None:
    """Add ``amount`` to counter ``name`` with the given label values (in declared order)."""
    try:
        _client().hincrbyfloat(_key(name), _field(labels), amount)
    except redis.RedisError as exc:
        log.debug("metric %s not recorded: %s", name, exc)


def observe(name: str, seconds: float) -> None:
    """Record one observation of histogram ``name``."""
    _help, buckets = HISTOGRAMS[name]
    try:
        pipe = _client().pipeline(transaction=False)
        key = _key(name)
        for bound in buckets:
            if seconds <= bound:
                pipe.hincrbyfloat(key, f"le={bound}", 1)
        pipe.hincrbyfloat(key, "le=+Inf", 1)
        pipe.hincrbyfloat(key, "sum", seconds)
        pipe.execute()
    except redis.RedisError as exc:
        log.debug("metric %s not recorded: %s", name, exc)


def _fmt(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{int(value)}"


def _db_gauges() -> list[str]:
    lines: list[str] = []
    with connection.cursor() as cur:
        cur.execute("SELECT state, count(*) FROM core_workflowrun WHERE state IN ('pending', 'running') GROUP BY state")
        active = dict(cur.fetchall())
        lines += ["# HELP flowforge_runs_active Runs not yet finished, by state.", "# TYPE flowforge_runs_active gauge"]
        lines += [f'flowforge_runs_active{{state="{s}"}} {active.get(s, 0)}' for s in ("pending", "running")]
        # idx_taskrun_state_age serves both counts.
        cur.execute("SELECT count(*) FROM core_taskrun WHERE state = 'ready'")
        ready = cur.fetchone()[0]
        cur.execute("SELECT count(*), count(*) FILTER (WHERE lease_expires_at < clock_timestamp()) "
                    "FROM core_taskrun WHERE state = 'running'")
        running, expired = cur.fetchone()
        lines += ["# HELP flowforge_ready_queue_depth Task runs ready and waiting to be claimed.",
                  "# TYPE flowforge_ready_queue_depth gauge", f"flowforge_ready_queue_depth {ready}",
                  "# HELP flowforge_task_runs_running Task runs holding a lease.",
                  "# TYPE flowforge_task_runs_running gauge", f"flowforge_task_runs_running {running}",
                  "# HELP flowforge_leases_expired Running task runs whose lease has expired (awaiting the reaper).",
                  "# TYPE flowforge_leases_expired gauge", f"flowforge_leases_expired {expired}"]
        # idx_outbox_pending serves the backlog and its oldest row.
        cur.execute("SELECT count(*), COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0) "
                    "FROM core_outboxmessage WHERE published_at IS NULL AND dead_lettered_at IS NULL")
        backlog, oldest = cur.fetchone()
        cur.execute("SELECT count(*) FROM core_outboxmessage WHERE dead_lettered_at IS NOT NULL")
        dead = cur.fetchone()[0]
        lines += ["# HELP flowforge_outbox_backlog Outbox rows not yet published.",
                  "# TYPE flowforge_outbox_backlog gauge", f"flowforge_outbox_backlog {backlog}",
                  "# HELP flowforge_outbox_oldest_age_seconds Age of the oldest unpublished outbox row.",
                  "# TYPE flowforge_outbox_oldest_age_seconds gauge",
                  f"flowforge_outbox_oldest_age_seconds {_fmt(float(oldest))}",
                  "# HELP flowforge_outbox_dead_letters Outbox rows dead-lettered after failed publishes.",
                  "# TYPE flowforge_outbox_dead_letters gauge", f"flowforge_outbox_dead_letters {dead}"]
    return lines


def _redis_series() -> list[str]:
    lines: list[str] = []
    client = _client()
    pipe = client.pipeline(transaction=False)
    for name in (*COUNTERS, *HISTOGRAMS):
        pipe.hgetall(_key(name))
    values = pipe.execute()
    for name, raw in zip((*COUNTERS, *HISTOGRAMS), values, strict=True):
        data = {k.decode(): float(v) for k, v in raw.items()}
        if name in COUNTERS:
            help_text, label_names = COUNTERS[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for field, value in sorted(data.items()):
                labels = ",".join(f'{n}="{v}"' for n, v in zip(label_names, field.split("|"), strict=False))
                lines.append(f"{name}{{{labels}}} {_fmt(value)}")
        else:
            help_text, buckets = HISTOGRAMS[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            for bound in buckets:
                lines.append(f'{name}_bucket{{le="{bound}"}} {_fmt(data.get(f"le={bound}", 0))}')
            count = data.get("le=+Inf", 0)
            lines += [f'{name}_bucket{{le="+Inf"}} {_fmt(count)}', f"{name}_sum {_fmt(data.get('sum', 0))}",
                      f"{name}_count {_fmt(count)}"]
    return lines


def render() -> str:
    """The whole exposition (Prometheus text format 0.0.4)."""
    lines = _db_gauges()
    try:
        lines += _redis_series()
    except redis.RedisError as exc:
        lines.append(f"# counters unavailable: Redis did not answer ({type(exc).__name__})")
    return "\n".join(lines) + "\n"
