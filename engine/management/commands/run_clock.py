"""manage.py run_clock: enqueue the periodic actors (the safety net behind nudges)."""

import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand

log = logging.getLogger("flowforge.clock")


class Command(BaseCommand):
    help = (
        "Run the clock: every few seconds enqueue schedule_tick, relay_outbox, reap_leases and fire_triggers "
        "(and housekeeping every few minutes)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="enqueue each periodic actor once and exit")

    def handle(self, *args, **opts):
        from engine.actors import (
            fire_triggers,
            housekeeping,
            reap_leases,
            relay_outbox,
            schedule_tick,
            sweep_runs,
        )

        jobs = [
            (schedule_tick, settings.FLOWFORGE_CLOCK_SCHEDULE_SECONDS),
            (relay_outbox, settings.FLOWFORGE_CLOCK_RELAY_SECONDS),
            (reap_leases, settings.FLOWFORGE_CLOCK_REAP_SECONDS),
            (fire_triggers, settings.FLOWFORGE_CLOCK_TRIGGER_SECONDS),
            (sweep_runs, settings.FLOWFORGE_CLOCK_SWEEP_SECONDS),
            (housekeeping, settings.FLOWFORGE_CLOCK_HOUSEKEEPING_SECONDS),
        ]
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        due = {actor.actor_name: 0.0 for actor, _ in jobs}
        self.stdout.write("clock started: " + ", ".join(f"{a.actor_name} every {p:g}s" for a, p in jobs))
        while not stop.is_set():
            now = time.monotonic()
            for actor, period in jobs:
                if now >= due[actor.actor_name]:
                    try:
                        actor.send()
                    except Exception as exc:  # broker down: say so, try again next period
                        log.warning("clock could not enqueue %s: %s", actor.actor_name, exc)
                    due[actor.actor_name] = now + period
            if opts["once"]:
                return
            stop.wait(max(0.05, min(due.values()) - time.monotonic()))
        self.stdout.write("clock stopped")
