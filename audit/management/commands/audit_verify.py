"""manage.py audit_verify [--export-head FILE] [--head FILE]: check the audit log's chains
(docs/audit.md): every row in place and signed, every active organization with a chain,
and, with --head, every chain still reaching a head exported earlier."""

import json
import os
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.verify import HeadFileError, export_head, load_head, verify


class Command(BaseCommand):
    help = ("Verify the audit log's chains; exit 1 naming the first broken row of each broken chain, "
            "each organization without a chain, and rows signed with a key that is not configured.")

    def add_arguments(self, parser):
        parser.add_argument("--head", metavar="FILE",
                            help="also check that every chain still reaches the head exported to FILE earlier")
        parser.add_argument("--export-head", metavar="FILE",
                            help="after a clean check, write each chain's last (seq, hash), signed, to FILE")

    def handle(self, *args, **opts):
        head = None
        if opts["head"]:
            try:
                head = load_head(Path(opts["head"]).read_text())
            except OSError as exc:
                raise CommandError(f"--head {opts['head']}: cannot read it ({exc.strerror})") from None
            except HeadFileError as exc:
                raise CommandError(f"--head {opts['head']}: {exc}") from None
        report = verify(head=head)
        for b in report.breaks:
            where = f"broken at row {b.row_id} (seq {b.seq})" if b.row_id else "broken"  # no row: the chain itself
            self.stderr.write(f"chain {b.chain}: {where}: {b.problem}")
        for u in report.unverifiable:
            self.stderr.write(f"chain {u.chain}: {u.rows} row(s) from seq {u.first_seq} are unverifiable: signed "
                              f"with key id {u.key_id!r}, which FLOWFORGE_AUDIT_KEYS does not hold")
        if not report.ok:
            parts = []
            if report.breaks:
                parts.append(f"{len(report.breaks)} broken chain(s)")
            if report.unverifiable:
                parts.append(f"{sum(u.rows for u in report.unverifiable)} unverifiable row(s)")
            raise CommandError(f"{'; '.join(parts)}; {report.checked} rows checked")
        suffix = f", every chain reaches the head of {opts['head']}" if head is not None else ""
        self.stdout.write(f"audit log intact: {report.checked} rows checked{suffix}")
        if opts["export_head"]:
            self._write(Path(opts["export_head"]), export_head(report))
            self.stdout.write(f"head of {len(report.heads)} chain(s) written to {opts['export_head']}")

    def _write(self, path: Path, doc: dict) -> None:
        # Written whole or not at all: a temporary file in the same directory, then renamed.
        fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, indent=2, sort_keys=True)
                fh.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
