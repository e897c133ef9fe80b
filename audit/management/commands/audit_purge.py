"""manage.py audit_purge [--preview] [--days N]: remove audit rows past the audit retention
(FLOWFORGE_AUDIT_RETENTION_DAYS; docs/audit.md, "Retention"), each chain carried forward by a
signed checkpoint. The clock's housekeeping does the same in bounded passes."""

from django.core.management.base import BaseCommand, CommandError

from audit.retention import MAX_ROWS_PER_PASS, MIN_KEEP_DAYS, purge, retention_days


class Command(BaseCommand):
    help = ("Remove (or with --preview count) audit rows older than the audit retention, chain by chain; "
            "a chain that does not verify is left whole and named (exit 1).")

    def add_arguments(self, parser):
        parser.add_argument("--preview", action="store_true", help="count what would be removed; remove nothing")
        parser.add_argument("--days", type=int, default=None,
                            help=f"keep this many days instead of the policy (at least {MIN_KEEP_DAYS})")
        parser.add_argument("--max-rows", type=int, default=MAX_ROWS_PER_PASS,
                            help=f"rows per chain in this pass (default {MAX_ROWS_PER_PASS})")

    def handle(self, *args, **opts):
        days = retention_days() if opts["days"] is None else opts["days"]
        if days == 0:
            self.stdout.write("audit retention is off (FLOWFORGE_AUDIT_RETENTION_DAYS=0): nothing is removed")
            return
        try:
            results = purge(keep_days=days, preview=opts["preview"], max_rows=opts["max_rows"])
        except ValueError as exc:
            raise CommandError(f"--days {days}: {exc}") from None
        verb = "would remove" if opts["preview"] else "removed"
        for item in results:
            if item.problem:
                self.stderr.write(f"chain {item.chain}: left whole, it does not verify: {item.problem}")
                continue
            count = item.removable if opts["preview"] else item.removed
            self.stdout.write(f"chain {item.chain}: {verb} {count} row(s), seq {item.first_seq}..{item.through_seq}")
        total = sum(i.removable if opts["preview"] else i.removed for i in results)
        self.stdout.write(f"audit retention ({days} days): {verb} {total} row(s) in {len(results)} chain(s)")
        broken = [i for i in results if i.problem]
        if broken:
            raise CommandError(f"{len(broken)} chain(s) do not verify and were left whole (see above)")
