"""manage.py apply_workflow --org SLUG FILE [FILE ...]"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from engine.definitions import DefinitionError, parse_document
from engine.management.commands._common import get_organization
from engine.models import WorkflowState
from engine.services import apply_definition
from tenancy.limits import QuotaExceeded


class Command(BaseCommand):
    help = "Apply workflow definition files (JSON or YAML); an existing name gets version N+1."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+")
        parser.add_argument("--org", required=True, help="organization slug or id")
        parser.add_argument("--draft", action="store_true", help="store as draft (not startable until activated)")

    def handle(self, *args, **opts):
        org = get_organization(opts["org"])
        texts = []
        for name in opts["files"]:  # read every file before applying any
            path = Path(name)
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise CommandError(f"{name}: cannot read ({exc.strerror}); nothing was applied") from exc
            try:
                texts.append((name, path, raw.decode("utf-8-sig")))
            except UnicodeDecodeError as exc:
                raise CommandError(
                    f"{name}: not UTF-8 text (byte {exc.start}: {exc.reason}); nothing was applied"
                ) from exc
        failed = False
        applied = 0
        for name, path, text in texts:
            try:
                wf = apply_definition(
                    organization=org,
                    document=parse_document(text, filename=path.name),
                    state=WorkflowState.DRAFT if opts["draft"] else WorkflowState.ACTIVE,
                )
            except DefinitionError as exc:
                failed = True
                self.stderr.write(f"{name}: rejected, nothing stored:")
                for err in exc.errors:
                    self.stderr.write(f"  {err['path']}: {err['message']}")
                continue
            except QuotaExceeded as exc:
                # Over max_definition_bytes: the quota's own message, not a traceback. The
                # files after this one would not fit either; those before it are stored.
                raise CommandError(f"{name}: rejected, nothing of it stored: {exc}"
                                   + (f" ({applied} earlier file(s) applied)" if applied else "")) from exc
            applied += 1
            self.stdout.write(f"{name}: {wf.name} v{wf.version} ({wf.pk}), {wf.tasks.count()} tasks, {wf.state}")
        if failed:
            raise CommandError("some definitions were rejected")
