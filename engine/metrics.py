"""Operational metrics, collected cluster-wide in Redis and served at /metrics.

Counters and histograms are incremented by whichever process sees the event (web,
worker, clock). Each process adds them up in memory and a daemon thread sends the sums
to Redis every ``FLUSH_INTERVAL_SECONDS`` in one pipelined round trip (a worker running
hundreds of tasks a second would otherwise pay a round trip of ~15 commands per task);
/metrics renders the Redis totals, plus gauges read from PostgreSQL at scrape time, in
Prometheus' text format. Redis is a cache here, not a record: if it restarts, counters
start again from zero, which Prometheus treats as an ordinary counter reset, and sums
not yet flushed when a process is killed are lost. A metrics failure never fails the
operation being measured.
"""

from __future__ import annotations

import atexit
import bisect
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable

import redis
from django.conf import settings
from django.db import connection

from engine import sql
from engine.states import RUN_OPEN_STATES

log = logging.getLogger(__name__)

# Histogram buckets, in seconds.
DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# A ready task run may wait long behind limits (rate windows, quotas, run limits).
CLAIM_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

COUNTERS = {
    "flowforge_runs_started_total": ("Runs started, by channel.", ("channel",)),
    "flowforge_runs_finished_total": ("Runs finished, by final state.", ("state",)),
    "flowforge_task_attempts_total": ("Task attempts finished, by outcome.", ("outcome",)),
    "flowforge_lease_reaps_total": ("Expired leases taken back by the reaper, by result.", ("result",)),
    "flowforge_broker_messages_reclaimed_total": ("Unacknowledged messages of dead worker processes given back to "
                                                  "their queues (flowforge.broker_recovery), by reason.", ("reason",)),
}
HISTOGRAMS = {
    "flowforge_dispatch_latency_seconds": ("From claim to handler start.", DISPATCH_BUCKETS),
    "flowforge_claim_wait_seconds": ("From ready (past any retry backoff) to claimed: the wait for a "
                                     "worker's share, a permit, a rate window or a quota.", CLAIM_WAIT_BUCKETS),
    "flowforge_task_duration_seconds": ("Handler run time of one attempt.", DURATION_BUCKETS),
    "flowforge_worker_poll_wait_seconds": ("From a worker's poll to the tasks it was handed, when it had to wait "
                                           "for one (engine.worker_queues).", CLAIM_WAIT_BUCKETS),
    "flowforge_redelivery_wait_seconds": ("From claim to the redelivery of a generation whose message a dead "
                                          "worker process held (flowforge.broker_recovery).", CLAIM_WAIT_BUCKETS),
}

# The label of the organizations past FLOWFORGE_METRICS_TOP_ORGS in the per-organization gauges.
# The label of the organizations past the top ones: parentheses, which no slug holds, so
# no tenant's series can be mistaken for (or merged into) the rest's.
OTHER_ORGS = "(others)"

# How often each process sends its sums to Redis, in seconds.
FLUSH_INTERVAL_SECONDS = 1.0

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


class _Pending:
    """This process's increments not yet sent: {(metric name, hash field): amount}.

    ``add`` is a dict update under a lock (microseconds, on the caller's thread);
    a daemon thread, started on first use in each process, flushes every
    ``FLUSH_INTERVAL_SECONDS``. Sums inherited through ``fork`` belong to the parent
    and are dropped in the child.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: Counter[tuple[str, str]] = Counter()
        # Histograms: {name: [observations whose first bucket is i, for each bucket i and
        # +Inf last; the sum of the observed values]}. Made cumulative only at the flush, so
        # an observation costs two additions here, not one per bucket (a worker observes
        # three histograms per task).
        self._hist: dict[str, list[float]] = {}
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def _ensure(self) -> None:
        # (under self._lock)
        if self._pid != os.getpid():  # a forked child: the parent sends its own sums
            self._sums.clear()
            self._hist.clear()
            self._pid = os.getpid()
            self._thread = None
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="flowforge-metrics", daemon=True)
            self._thread.start()

    def add(self, items: Iterable[tuple[str, str, float]]) -> None:
        with self._lock:
            self._ensure()
            for name, field, amount in items:
                self._sums[(name, field)] += amount

    def add_observation(self, name: str, first: int, n_buckets: int, seconds: float) -> None:
        """One observation of histogram ``name`` with ``n_buckets`` finite buckets, the
        first one it falls in being ``first`` (``n_buckets``: only +Inf)."""
        with self._lock:
            self._ensure()
            counts = self._hist.get(name)
            if counts is None:
                counts = self._hist[name] = [0.0] * (n_buckets + 2)
            counts[first] += 1
            counts[-1] += seconds

    def _fold_histograms(self) -> None:
        # (under self._lock) The pending observations as the cumulative fields Redis keeps:
        # bucket i counts every observation whose first bucket is i or lower.
        for name, counts in self._hist.items():
            buckets = HISTOGRAMS[name][1]
            running = 0.0
            for i, bound in enumerate(buckets):
                running += counts[i]
                if running:
                    self._sums[(name, f"le={bound}")] += running
            running += counts[len(buckets)]
            if running:
                self._sums[(name, "le=+Inf")] += running
                self._sums[(name, "sum")] += counts[-1]
        self._hist.clear()

    def _loop(self) -> None:
        while True:
            self._wake.wait(FLUSH_INTERVAL_SECONDS)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Send the pending sums in one pipeline. On a Redis error they are kept and sent
        with the next flush (merged with what came meanwhile)."""
        with self._lock:
            if self._pid != os.getpid():
                return
            self._fold_histograms()
            if not self._sums:
                return
            sums, self._sums = self._sums, Counter()
        try:
            pipe = _client().pipeline(transaction=False)
            for (name, field), amount in sums.items():
                pipe.hincrbyfloat(_key(name), field, amount)
            pipe.execute()
        except redis.RedisError as exc:
            log.debug("metrics not sent (kept for the next flush): %s", exc)
            with self._lock:
                self._sums.update(sums)


_pending = _Pending()
atexit.register(_pending.flush)


def flush() -> None:
    """Send this process's pending counter and histogram increments to Redis now (the
    daemon thread does it every ``FLUSH_INTERVAL_SECONDS``; /metrics calls it so that a
    scrape served by this process includes its own latest increments)."""
    _pending.flush()


def incr(name: str, *labels: str, amount: float = 1) -> None:
    """Add ``amount`` to counter ``name`` with the given label values (in declared order).
    Buffered in this process; reaches Redis within ``FLUSH_INTERVAL_SECONDS``."""
    _pending.add(((name, _field(labels), amount),))


def observe(name: str, seconds: float) -> None:
    """Record one observation of histogram ``name`` (buckets are cumulative, as in
    Prometheus: every bucket whose bound is >= ``seconds`` counts it). Buffered like
    ``incr``. Raises KeyError for an undeclared histogram."""
    _help, buckets = HISTOGRAMS[name]
    _pending.add_observation(name, bisect.bisect_left(buckets, seconds), len(buckets), seconds)


def _fmt(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{int(value)}"


def _db_gauges() -> list[str]:
    lines: list[str] = []
    with connection.cursor() as cur:
        cur.execute(sql.queries["metrics_runs_active"])
        active = dict(cur.fetchall())
        lines += ["# HELP flowforge_runs_active Runs not yet finished, by state.", "# TYPE flowforge_runs_active gauge"]
        lines += [f'flowforge_runs_active{{state="{s}"}} {active.get(s, 0)}' for s in RUN_OPEN_STATES]
        cur.execute(sql.queries["metrics_task_runs_ready"])
        ready = cur.fetchone()[0]
        cur.execute(sql.queries["metrics_task_runs_running"])
        running, expired = cur.fetchone()
        lines += ["# HELP flowforge_ready_queue_depth Task runs ready and waiting to be claimed.",
                  "# TYPE flowforge_ready_queue_depth gauge", f"flowforge_ready_queue_depth {ready}",
                  "# HELP flowforge_task_runs_running Task runs holding a lease.",
                  "# TYPE flowforge_task_runs_running gauge", f"flowforge_task_runs_running {running}",
                  "# HELP flowforge_leases_expired Running task runs whose lease has expired (awaiting the reaper).",
                  "# TYPE flowforge_leases_expired gauge", f"flowforge_leases_expired {expired}"]
        lines += _org_gauges(cur)
        cur.execute(sql.queries["metrics_outbox_backlog"])
        backlog, oldest = cur.fetchone()
        cur.execute(sql.queries["metrics_outbox_dead_letters"])
        dead = cur.fetchone()[0]
        lines += ["# HELP flowforge_outbox_backlog Outbox rows not yet published.",
                  "# TYPE flowforge_outbox_backlog gauge", f"flowforge_outbox_backlog {backlog}",
                  "# HELP flowforge_outbox_oldest_age_seconds Age of the oldest unpublished outbox row.",
                  "# TYPE flowforge_outbox_oldest_age_seconds gauge",
                  f"flowforge_outbox_oldest_age_seconds {_fmt(float(oldest))}",
                  "# HELP flowforge_outbox_dead_letters Outbox rows dead-lettered after failed publishes.",
                  "# TYPE flowforge_outbox_dead_letters gauge", f"flowforge_outbox_dead_letters {dead}"]
        lines += _history_gauges(cur)
    return lines


def _history_gauges(cur) -> list[str]:
    """Table sizes, the oldest run kept, the retention purge's lag and the history partitions
    (issue 21; docs/retention.md)."""
    cur.execute(sql.queries["metrics_table_sizes"])
    sizes = cur.fetchall()
    cur.execute(sql.queries["metrics_retention"],
                {"default_seconds": float(settings.FLOWFORGE_RUN_RETENTION_SECONDS)})
    oldest, lag = cur.fetchone()
    cur.execute(sql.queries["metrics_history_partitions"])
    parts = cur.fetchall()
    lines = ["# HELP flowforge_table_bytes Bytes on disk of a history table (with its indexes and TOAST).",
             "# TYPE flowforge_table_bytes gauge"]
    lines += [f'flowforge_table_bytes{{table="{name}"}} {size}' for name, size in sizes]
    lines += ["# HELP flowforge_oldest_run_age_seconds Age of the oldest run kept, any state.",
              "# TYPE flowforge_oldest_run_age_seconds gauge", f"flowforge_oldest_run_age_seconds {_fmt(float(oldest))}",
              "# HELP flowforge_retention_lag_seconds How long past its organization's retention the oldest "
              "finished run still kept is (0: the purge is keeping up).",
              "# TYPE flowforge_retention_lag_seconds gauge", f"flowforge_retention_lag_seconds {_fmt(float(lag))}"]
    lines += ["# HELP flowforge_history_partitions_ahead Partitions of a history table for periods not over yet "
              "(the current one and those created ahead; alert below 2).",
              "# TYPE flowforge_history_partitions_ahead gauge"]
    lines += [f'flowforge_history_partitions_ahead{{table="{name}"}} {ahead}' for name, ahead, _ in parts]
    lines += ["# HELP flowforge_history_partitions Partitions of a history table in all.",
              "# TYPE flowforge_history_partitions gauge"]
    lines += [f'flowforge_history_partitions{{table="{name}"}} {total}' for name, _, total in parts]
    return lines


def _org_gauges(cur) -> list[str]:
    """Ready and running task runs per organization: the FLOWFORGE_METRICS_TOP_ORGS
    organizations with the most (ready + running) by slug, the rest summed under
    org="(others)" (always present), so the series stay bounded however many tenants
    there are. One query (``metrics_task_runs_by_org``)."""
    top = int(getattr(settings, "FLOWFORGE_METRICS_TOP_ORGS", 10))
    cur.execute(sql.queries["metrics_task_runs_by_org"], {"top": max(0, top)})
    ready: dict[str, int] = {}
    running: dict[str, int] = {}
    for org, n_ready, n_running in cur.fetchall():
        ready[org] = ready.get(org, 0) + int(n_ready)
        running[org] = running.get(org, 0) + int(n_running)
    ready.setdefault(OTHER_ORGS, 0)
    running.setdefault(OTHER_ORGS, 0)
    lines = ["# HELP flowforge_org_task_runs_ready Task runs ready, per organization (top organizations by "
             "ready + running; the rest as org=\"(others)\").", "# TYPE flowforge_org_task_runs_ready gauge"]
    lines += [f'flowforge_org_task_runs_ready{{org="{org}"}} {n}' for org, n in ready.items()]
    lines += ["# HELP flowforge_org_task_runs_running Task runs running (claimed or started), per organization "
              "(top organizations by ready + running; the rest as org=\"(others)\").",
              "# TYPE flowforge_org_task_runs_running gauge"]
    lines += [f'flowforge_org_task_runs_running{{org="{org}"}} {n}' for org, n in running.items()]
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
    flush()
    lines = _db_gauges()
    try:
        lines += _redis_series()
    except redis.RedisError as exc:
        lines.append(f"# counters unavailable: Redis did not answer ({type(exc).__name__})")
    return "\n".join(lines) + "\n"
