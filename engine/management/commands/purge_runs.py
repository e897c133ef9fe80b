"""manage.py purge_runs [--preview] [--max-runs N]: remove finished runs past their
organization's retention, with everything they own, and published outbox rows
(engine.retention; docs/retention.md). The clock's housekeeping does the same in bounded passes."""

from django.core.management.base import BaseCommand, CommandError

from engine import retention


class Command(BaseCommand):
    help = "Remove (or with --preview list) finished runs past their organization's retention."

    def add_arguments(self, parser):
        parser.add_argument("--preview", action="store_true", help="list what would be removed; remove nothing")
        parser.add_argument("--max-runs", type=int, default=None,
                            help="at most this many runs (default FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS)")

    def handle(self, *args, **opts):
        if opts["preview"]:
            rows = retention.backlog()
            for b in rows:
                self.stdout.write(f"{b.slug}: {b.runs} run(s) past {retention.describe(b.retention_seconds)}, oldest created "
                                  f"{b.oldest:%Y-%m-%d %H:%M:%S %Z}")
            self.stdout.write(f"would remove {sum(b.runs for b in rows)} run(s) in {len(rows)} organization(s)")
            return
        try:
            result = retention.purge(max_runs=opts["max_runs"])
        except ValueError as exc:
            raise CommandError(f"--max-runs: {exc}") from None
        self.stdout.write(f"removed {result.runs} run(s) ({result.files} offloaded file(s)) and "
                          f"{result.outbox_rows} published outbox row(s)")
