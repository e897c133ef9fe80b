"""Fixtures of the SDK's tests: a fake FlowForge server (tests/fakeserver.py) on a free
port, clients with its member and worker keys, and workers run in a thread."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakeserver import MEMBER_KEY, WORKER_KEY, FakeFlowForge  # noqa: E402
from flowforge_sdk import Backoff, Client, Worker  # noqa: E402


@pytest.fixture
def fake() -> Iterator[FakeFlowForge]:
    server = FakeFlowForge().start()
    yield server
    server.stop()


@pytest.fixture
def client(fake: FakeFlowForge) -> Iterator[Client]:
    with Client(fake.url, MEMBER_KEY, retries=2, backoff=Backoff(initial_seconds=0.01, max_seconds=0.05)) as c:
        yield c


@pytest.fixture
def worker_client(fake: FakeFlowForge) -> Iterator[Client]:
    with Client(fake.url, WORKER_KEY, retries=0, timeout=5.0) as c:
        yield c


@pytest.fixture
def make_worker(worker_client: Client) -> Callable[..., Worker]:
    def make(queue: str = "images", **kwargs: Any) -> Worker:
        options: dict[str, Any] = {"concurrency": 2, "poll_wait_seconds": 0.3, "handle_signals": False,
                                   "drain_timeout_seconds": 10.0, "log_flush_interval_seconds": 0.1,
                                   "backoff": Backoff(initial_seconds=0.05, max_seconds=0.2)}
        options.update(kwargs)
        return Worker(worker_client, queue, **options)

    return make
