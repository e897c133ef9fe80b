"""manage.py run_clock: enqueue the periodic actors (the safety net behind nudges)."""

import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from engine import dispatch

log = logging.getLogger("flowforge.clock")


class Command(BaseCommand):
    help = (
        "Run the clock: every few seconds enqueue schedule_tick, relay_outbox, reap_leases, fire_triggers, "
        "advance_backfills and notify_tick (and housekeeping every few minutes)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="enqueue each periodic actor once and exit")

    def handle(self, *args, **opts):
        # Sent by actor name (engine.dispatch): the clock declares no actor of its own.
        jobs = [
            ("schedule_tick", settings.FLOWFORGE_CLOCK_SCHEDULE_SECONDS),
            ("relay_outbox", settings.FLOWFORGE_CLOCK_RELAY_SECONDS),
            ("reap_leases", settings.FLOWFORGE_CLOCK_REAP_SECONDS),
            ("fire_triggers", settings.FLOWFORGE_CLOCK_TRIGGER_SECONDS),
            ("advance_backfills", settings.FLOWFORGE_CLOCK_BACKFILL_SECONDS),
            ("sweep_runs", settings.FLOWFORGE_CLOCK_SWEEP_SECONDS),
            ("housekeeping", settings.FLOWFORGE_CLOCK_HOUSEKEEPING_SECONDS),
            ("notify_tick", settings.FLOWFORGE_CLOCK_NOTIFY_SECONDS),
        ]
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        due = {name: 0.0 for name, _ in jobs}
        self.stdout.write("clock started: " + ", ".join(f"{name} every {p:g}s" for name, p in jobs))
        while not stop.is_set():
            now = time.monotonic()
            for name, period in jobs:
                if now >= due[name]:
                    try:
                        dispatch.send(name)
                    except Exception as exc:  # broker down: say so, try again next period
                        log.warning("clock could not enqueue %s: %s", name, exc)
                    due[name] = now + period
            if opts["once"]:
                return
            stop.wait(max(0.05, min(due.values()) - time.monotonic()))
        self.stdout.write("clock stopped")
