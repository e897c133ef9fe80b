"""Benchmark (not a test): what authenticating by API key costs next to a session.

    DJANGO_SETTINGS_MODULE=flowforge.settings .venv/bin/python -m bench.bench_auth [--requests N] [--in-process]

In the configured database (DATABASE_URL) it creates, idempotently, the organization
``bench-auth`` with an owner and a few workflows, revokes the API keys earlier runs
made and makes a fresh viewer key (a key's secret is never stored, so it cannot be
reused). Then it measures requests per second of ``GET /api/v1/workflows/``
authenticated by that key and by a session cookie, interleaved in rounds so drift
hits both alike: against a real gunicorn (flowforge.stack.Stack.start_web, 2 sync
workers, DEBUG off) on a free local port, driven by httpx over one connection, or
with ``--in-process`` through Django's test Client. Finally the median cost of
``tenancy.apikeys.authenticate`` itself, with the verified-key cache and without it
(the entry deleted before each call, so every call pays Argon2).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import django

from bench.dbsetup import throwaway_production_keys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
throwaway_production_keys()  # the gunicorn it starts runs with DEBUG off
django.setup()

from django.conf import settings  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.test import Client  # noqa: E402

from engine.models import Workflow  # noqa: E402
from engine.services import apply_definition  # noqa: E402
from tenancy import apikeys  # noqa: E402
from tenancy.context import actor_for_membership  # noqa: E402
from tenancy.models import ApiKey, Membership, Organization, Role  # noqa: E402
from tenancy.services import create_organization  # noqa: E402

SLUG = "bench-auth"
OWNER_EMAIL = "owner@bench-auth.example"
KEY_NAME = "bench-auth"
PATH = "/api/v1/workflows/"
WORKFLOWS = 5


def setup_fixture() -> tuple[str, str]:
    """(full API key, session cookie value) for the bench organization's owner."""
    org = Organization.objects.filter(slug=SLUG).first()
    if org is None:
        org, _user, _ = create_organization(slug=SLUG, name="Bench Auth", owner_email=OWNER_EMAIL)
    owner = (
        Membership.objects.for_organization(org).select_related("organization", "user").filter(role=Role.OWNER)
        .order_by("created_at").first()
    )
    existing = set(Workflow.objects.for_organization(org).values_list("name", flat=True))
    for i in range(WORKFLOWS):
        if f"bench-{i}" not in existing:
            tasks = [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}]
            apply_definition(organization=org, document={"name": f"bench-{i}", "tasks": tasks})
    actor = actor_for_membership(owner, channel="cli")
    for old in ApiKey.objects.for_organization(org).filter(name=KEY_NAME, revoked_at__isnull=True):
        apikeys.revoke_api_key(actor=actor, api_key=old)
    _row, full_key = apikeys.create_api_key(actor=actor, name=KEY_NAME, role=Role.VIEWER)
    client = Client()
    client.force_login(owner.user)
    return full_key, client.cookies[settings.SESSION_COOKIE_NAME].value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate(call, n: int) -> float:
    """Requests per second of ``n`` sequential calls."""
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return n / (time.perf_counter() - t0)


def compare(key_call, session_call, *, requests: int, rounds: int) -> tuple[float, float]:
    """Median requests/second of each over interleaved rounds (after a warm-up)."""
    for _ in range(20):
        key_call()
        session_call()
    key_rates, session_rates = [], []
    per_round = max(1, requests // rounds)
    for _ in range(rounds):
        key_rates.append(rate(key_call, per_round))
        session_rates.append(rate(session_call, per_round))
    return statistics.median(key_rates), statistics.median(session_rates)


def over_http(full_key: str, session_id: str, *, requests: int, rounds: int) -> tuple[float, float, str]:
    import httpx

    from flowforge.stack import Stack, wait_until

    port = free_port()
    env = dict(os.environ, DEBUG="0", DJANGO_SETTINGS_MODULE="flowforge.settings")
    stack = Stack(env=env, log_dir=Path(settings.BASE_DIR) / "var" / "bench")
    web = stack.start_web("bench-web", bind=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as http:
            def up():
                if not web.alive():
                    raise RuntimeError(f"gunicorn exited; see {web.log_path}")
                try:
                    return http.get(PATH).status_code == 401
                except httpx.TransportError:
                    return False

            wait_until(up, timeout=30, what="gunicorn to answer")
            key_headers = {"Authorization": f"Bearer {full_key}"}
            cookies = {settings.SESSION_COOKIE_NAME: session_id}

            def by_key():
                r = http.get(PATH, headers=key_headers)
                assert r.status_code == 200, r.text

            def by_session():
                r = http.get(PATH, cookies=cookies)
                assert r.status_code == 200, r.text

            key_rps, session_rps = compare(by_key, by_session, requests=requests, rounds=rounds)
    finally:
        stack.stop_all()
    return key_rps, session_rps, f"gunicorn (2 sync workers, DEBUG off) at {base}, httpx, sequential"


def in_process(full_key: str, session_id: str, *, requests: int, rounds: int) -> tuple[float, float, str]:
    key_client = Client(headers={"Authorization": f"Bearer {full_key}"})
    session_client = Client()
    session_client.cookies[settings.SESSION_COOKIE_NAME] = session_id

    def by_key():
        assert key_client.get(PATH).status_code == 200

    def by_session():
        assert session_client.get(PATH).status_code == 200

    key_rps, session_rps = compare(by_key, by_session, requests=requests, rounds=rounds)
    return key_rps, session_rps, "in-process Django test Client"


def auth_overhead(full_key: str, *, samples: int) -> tuple[float, float]:
    """Median seconds of one ``authenticate`` with a warm cache and with none (Argon2 each time)."""
    prefix = apikeys.parse_key(full_key)[0]
    entry = apikeys._entry_key(prefix)
    assert apikeys.authenticate(full_key) is not None
    cached, uncached = [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        apikeys.authenticate(full_key)
        cached.append(time.perf_counter() - t0)
        cache.delete(entry)
        t0 = time.perf_counter()
        apikeys.authenticate(full_key)  # Argon2 + the row, then re-caches
        uncached.append(time.perf_counter() - t0)
    return statistics.median(cached), statistics.median(uncached)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="requests per authentication method")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--samples", type=int, default=100, help="authenticate() calls per cache mode")
    parser.add_argument("--in-process", action="store_true", help="use Django's test Client, not gunicorn")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

    db = settings.DATABASES["default"]
    print(f"database {db['NAME']} on {db['HOST']}:{db['PORT']}; cache {settings.CACHES['default']['LOCATION']}")
    full_key, session_id = setup_fixture()
    run = in_process if args.in_process else over_http
    key_rps, session_rps, how = run(full_key, session_id, requests=args.requests, rounds=args.rounds)
    print(f"GET {PATH} ({WORKFLOWS} workflows), {args.requests} requests each in {args.rounds} interleaved rounds, "
          f"{how}:")
    print(f"  API key (Bearer, cached): {key_rps:8.1f} req/s")
    print(f"  session cookie:           {session_rps:8.1f} req/s")
    print(f"  ratio key/session:        {key_rps / session_rps:8.2f}  (aim >= 0.8)")
    with_cache, without = auth_overhead(full_key, samples=args.samples)
    print(f"tenancy.apikeys.authenticate, median of {args.samples}:")
    print(f"  with the verified-key cache:     {with_cache * 1000:7.2f} ms")
    print(f"  without (Argon2 every time):     {without * 1000:7.2f} ms  "
          f"({without / with_cache:.0f}x; Argon2id m={apikeys.HASHER.memory_cost} KiB, "
          f"t={apikeys.HASHER.time_cost}, p={apikeys.HASHER.parallelism})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
