"""Baseline actors of the benchmark: plain Dramatiq, no database.

Run by a worker group of their own, as plain Dramatiq runs them (``dramatiq
flowforge.worker bench.actors --queues bench`` with FLOWFORGE_BROKER_WAKEUP off: upstream's
polling Redis consumer, the same middleware), with as many processes and threads as the
engine's group; the two groups take turns, each idle while the other is measured.

- ``bench_noop(label)`` does nothing. Each process keeps, per label, how many it ran,
  when the first started and when the last finished (``time.time()``), and a
  background thread copies those figures to Redis every few milliseconds: nothing is
  paid per message beyond the actor call itself.
- ``bench_hop(label, i, n)`` is a chain of ``n`` raw actors: each records when it
  started, then enqueues its successor (recording when it did so), and only then
  appends ``(i, started, finished)`` to a Redis list, off the measured path.
- ``bench_echo(label, i)`` pushes ``(i, started, finished)`` onto a Redis list: one
  enqueue -> actor start -> result round trip (the start-to-finish baseline).
"""

from __future__ import annotations

import json
import os
import threading
import time

import dramatiq
import redis
from django.conf import settings

from flowforge.broker import broker  # noqa: F401  (sets the broker before the actors are declared)

BENCH_QUEUE = "bench"
FLUSH_SECONDS = 0.02

_stats: dict[str, list[float]] = {}  # label -> [count, first_start, last_end]
_stats_lock = threading.Lock()
_flusher: threading.Thread | None = None
_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def stats_key(label: str) -> str:
    return f"{settings.BROKER_NAMESPACE}:bench:noop:{label}"


def hops_key(label: str) -> str:
    return f"{settings.BROKER_NAMESPACE}:bench:hop:{label}"


def _flush_loop() -> None:
    sent: dict[str, float] = {}
    pid = os.getpid()
    while True:
        time.sleep(FLUSH_SECONDS)
        with _stats_lock:
            snapshot = {label: list(v) for label, v in _stats.items() if sent.get(label) != v[0]}
        if not snapshot:
            continue
        try:
            pipe = redis_client().pipeline(transaction=False)
            for label, (count, first, last) in snapshot.items():
                pipe.hset(stats_key(label), str(pid), json.dumps([count, first, last]))
            pipe.execute()
            for label, v in snapshot.items():
                sent[label] = v[0]
        except redis.RedisError:
            pass


@dramatiq.actor(queue_name=BENCH_QUEUE, max_retries=0)
def bench_noop(label: str) -> None:
    global _flusher
    started = time.time()
    with _stats_lock:
        s = _stats.get(label)
        if s is None:
            s = _stats[label] = [0, started, started]
        s[0] += 1
        s[1] = min(s[1], started)
        s[2] = max(s[2], time.time())
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_loop, name="bench-flush", daemon=True)
            _flusher.start()


@dramatiq.actor(queue_name=BENCH_QUEUE, max_retries=0)
def bench_hop(label: str, i: int, n: int) -> None:
    started = time.time()
    finished = time.time()  # the raw actor's "completion": right before it enqueues its successor
    if i + 1 < n:
        bench_hop.send(label, i + 1, n)
    redis_client().rpush(hops_key(label), json.dumps([i, started, finished]))


def echo_key(label: str) -> str:
    return f"{settings.BROKER_NAMESPACE}:bench:echo:{label}"


@dramatiq.actor(queue_name=BENCH_QUEUE, max_retries=0)
def bench_echo(label: str, i: int) -> None:
    """A raw round trip's actor: records when it started and pushes ``[i, started,
    finished]`` onto its label's list, its "result" (the issue 17 baseline)."""
    started = time.time()
    redis_client().rpush(echo_key(label), json.dumps([i, started, time.time()]))
