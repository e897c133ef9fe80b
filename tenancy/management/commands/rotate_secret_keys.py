"""manage.py rotate_secret_keys [--batch-size N]

Re-encrypts every organization's stored secrets under the first key of
FLOWFORGE_SECRET_KEYS (tenancy.vault.rotate_keys), then what other apps keep under those
keys (tenancy.signals.secret_keys_rotated: the webhook endpoints' signing secrets). Rotation, step by step (README,
"Secrets"): put a new key first in FLOWFORGE_SECRET_KEYS (keep the old one after it),
restart every process, run this command, then remove the old key. Safe to run again or
after an interruption: values already under the first key are not rewritten.

Prints what it did on stdout; exits 1 when some value no configured key decrypts (their
ids are listed on stderr: a key was dropped too early; put it back and run again).
"""

from django.core.management.base import BaseCommand, CommandError

from tenancy.signals import secret_keys_rotated
from tenancy.vault import ROTATE_BATCH_SIZE, rotate_keys


class Command(BaseCommand):
    help = "Re-encrypt every stored secret under the first key of FLOWFORGE_SECRET_KEYS."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", dest="batch_size", type=int, default=ROTATE_BATCH_SIZE,
                            help=f"rows re-encrypted per transaction (default {ROTATE_BATCH_SIZE})")

    def handle(self, *args, **opts):
        if opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        result = rotate_keys(batch_size=opts["batch_size"])
        self.stdout.write(f"{result.examined} secrets examined, {result.rewritten} re-encrypted under the first key "
                          f"of FLOWFORGE_SECRET_KEYS, {result.examined - result.rewritten - len(result.undecryptable)} "
                          "already under it")
        undecryptable = [("secret", secret_id) for secret_id in result.undecryptable]
        # The other values under these keys (the engine's webhook signing secrets).
        for _receiver, (what, other) in secret_keys_rotated.send(sender=None, batch_size=opts["batch_size"]):
            if other.examined:
                self.stdout.write(f"{other.examined} {what} examined, {other.rewritten} re-encrypted")
            undecryptable += [(what, row_id) for row_id in other.undecryptable]
        if undecryptable:
            for what, row_id in undecryptable:
                self.stderr.write(f"{what} {row_id}: no key of FLOWFORGE_SECRET_KEYS decrypts it")
            raise CommandError(f"{len(undecryptable)} secrets could not be decrypted with any configured key "
                               "(was a key removed before rotating?); they were left as they are")
