"""Organization secrets (issue 18): their encryption at rest and the actions on them.

A secret is a named value of one organization (``tenancy.models.Secret``) that task
configs reference as ``{{ secrets.NAME }}`` (engine.secret_refs); the engine decrypts it
only when an attempt starts. Nothing here ever returns a value to a person: the API and
the pages show names, versions and who changed them last.

Encryption: Fernet (AES-128-CBC + HMAC-SHA256, ``cryptography``) under a MultiFernet of
``settings.FLOWFORGE_SECRET_KEYS`` (the environment variable of that name, comma-separated
keys): the first key encrypts, every key decrypts. To rotate keys, put a new key first,
deploy, run ``manage.py rotate_secret_keys`` (``rotate_keys``: every stored value
re-encrypted under the first key, in batches, skipping those already under it), then drop
the old key. What is encrypted is the value bound to its organization and name
(``{"org": ..., "name": ..., "value": ...}`` as JSON), and ``decrypt_values`` checks both:
a token copied into another organization's row (by someone who can write the database
but holds no key) is refused, not sent to that organization's URLs.

Actions (after Zulip's ``do_*``): ``set_secret`` creates or rotates a value,
``delete_secret`` removes one; each checks ``secret.manage`` (owners and admins) and
writes its audit record (``secret.created`` / ``secret.rotated`` / ``secret.deleted``,
with the name and version, never the value) in the transaction of the change.
Reads of names and metadata (``secrets_of``, ``get_secret``) are for any role that may
read the organization; the caller checks ``read``.

Limits: FLOWFORGE_MAX_SECRETS_PER_ORG secrets per organization (tenancy.limits'
QuotaExceeded, ``limit="max_secrets"``), values of MIN_VALUE_CHARS characters to
FLOWFORGE_MAX_SECRET_BYTES bytes of UTF-8, names of ``SECRET_NAME_PATTERN``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import Collection
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit import services as audit
from flowforge import crypto
from flowforge.crypto import DecryptionError
from tenancy.access import ObjectNotFound
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded
from tenancy.models import SECRET_NAME_PATTERN, Secret, without_credentials
from tenancy.permissions import Action, require

log = logging.getLogger(__name__)

# The model's pattern with \Z: "$" would let a final newline in ("TOKEN\n").
NAME_RE = re.compile(SECRET_NAME_PATTERN.removesuffix("$") + r"\Z")
NAME_FORM = "1-64 letters, digits or '_', not starting with a digit"
# Shortest value accepted, in characters. Every value a task uses is redacted from what the
# attempt leaves behind (engine.secret_refs.redact); a value of one to three characters
# would blank every occurrence of those characters in outputs, errors and logs, and is
# guessed in a few thousand tries anyway.
MIN_VALUE_CHARS = 4
# Rows re-encrypted per transaction by rotate_keys.
ROTATE_BATCH_SIZE = 500

__all__ = [
    "DecryptionError", "InvalidSecret", "RotationResult", "decrypt", "decrypt_values", "delete_secret", "encrypt",
    "existing_names", "get_secret", "is_name", "reencrypt", "rotate_keys", "secrets_of", "set_secret", "validate_name",
    "validate_value",
]


class InvalidSecret(ValueError):
    """A secret's name or value was refused: ``field`` is ``name`` or ``value``,
    ``message`` says why (never quoting the value). Nothing was stored."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# --- encryption ----------------------------------------------------------------------------------


def _fernet() -> MultiFernet:
    return crypto.multi_fernet(tuple(settings.FLOWFORGE_SECRET_KEYS))


def encrypt(organization_id: uuid.UUID | str, name: str, value: str) -> str:
    """``value``, bound to its organization and name, encrypted under the first key of
    FLOWFORGE_SECRET_KEYS: a Fernet token (url-safe ASCII)."""
    payload = json.dumps({"org": str(organization_id), "name": name, "value": value}, ensure_ascii=False)
    return _fernet().encrypt(payload.encode()).decode("ascii")


def decrypt(token: str, *, organization_id: uuid.UUID | str, name: str) -> str:
    """The value ``encrypt`` was given for ``token``, under any key of FLOWFORGE_SECRET_KEYS.

    Raises DecryptionError when no configured key decrypts it, or when it was encrypted
    for another organization or name (a token moved between rows)."""
    try:
        payload = json.loads(_fernet().decrypt(token.encode("ascii")).decode())
    except (InvalidToken, UnicodeError, ValueError) as exc:
        raise DecryptionError(f"secret {name}: not encrypted under any key of FLOWFORGE_SECRET_KEYS") from exc
    if (not isinstance(payload, dict) or payload.get("org") != str(organization_id) or payload.get("name") != name
            or not isinstance(payload.get("value"), str)):
        raise DecryptionError(f"secret {name}: its ciphertext belongs to another secret")
    return payload["value"]


def reencrypt(token: str) -> str | None:
    """``token`` re-encrypted under the first key (MultiFernet.rotate), or None when the
    first key alone decrypts it already (nothing to do). Raises DecryptionError when no
    configured key decrypts it."""
    primary = Fernet(settings.FLOWFORGE_SECRET_KEYS[0])
    raw = token.encode("ascii")
    try:
        primary.decrypt(raw)
        return None
    except InvalidToken:
        pass
    try:
        return _fernet().rotate(raw).decode("ascii")
    except InvalidToken as exc:
        raise DecryptionError("not encrypted under any key of FLOWFORGE_SECRET_KEYS") from exc


# --- validation ----------------------------------------------------------------------------------


def validate_name(name: Any) -> str:
    """``name`` when it is a secret name (NAME_FORM); raises InvalidSecret("name", ...)."""
    if not isinstance(name, str) or not name:
        raise InvalidSecret("name", f"required: {NAME_FORM}")
    if not NAME_RE.match(name):
        shown = repr(name) if len(name) <= 80 else repr(name[:80]) + "..."
        raise InvalidSecret("name", f"{shown} is not a secret name: use {NAME_FORM}")
    return name


# Values whose redaction would blank ordinary text (JSON's literals appear in most outputs).
_COMMON_WORDS = frozenset({"true", "false", "null", "none", "undefined"})


def validate_value(value: Any) -> str:
    """``value`` when it may be stored: a string of MIN_VALUE_CHARS characters (besides
    spaces around it) up to FLOWFORGE_MAX_SECRET_BYTES bytes of UTF-8, not a common word
    (``true``, ``null``, ...), without NUL or unpaired surrogates. Raises
    InvalidSecret("value", ...) naming the rule, never the value."""
    if not isinstance(value, str):
        raise InvalidSecret("value", "must be a string")
    if len(value.strip()) < MIN_VALUE_CHARS:
        raise InvalidSecret("value", f"must be at least {MIN_VALUE_CHARS} characters, not counting spaces around "
                            "it: every value a task uses is redacted from its output, errors and logs, and a "
                            "shorter one would blank every occurrence of those characters there")
    if value.strip().lower() in _COMMON_WORDS:
        raise InvalidSecret("value", "must not be a JSON literal or a word as common: it would be redacted from "
                            "every output, error and log line of the tasks that use it")
    if "\x00" in value:
        raise InvalidSecret("value", "must not contain NUL characters")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise InvalidSecret("value", "must not contain unpaired surrogate characters") from None
    limit = settings.FLOWFORGE_MAX_SECRET_BYTES
    if size > limit:
        raise InvalidSecret("value", f"is {size} bytes of UTF-8; at most {limit} (FLOWFORGE_MAX_SECRET_BYTES)")
    return value


# --- reads of names and metadata -------------------------------------------------------------------


def secrets_of(organization: Any) -> QuerySet[Secret]:
    """The organization's secrets (an Organization or its id), ciphertext not loaded,
    ordered by name. The caller checks ``read``."""
    return Secret.objects.for_organization(organization).defer("ciphertext").order_by("name")


def is_name(name: Any) -> bool:
    """True when ``name`` is a string a secret may be named (NAME_FORM). A read of any
    other name answers "no such secret" without a query (a NUL in it could not even be sent)."""
    return isinstance(name, str) and NAME_RE.match(name) is not None


def get_secret(organization: Any, name: str) -> Secret:
    """The organization's secret ``name`` (ciphertext not loaded). Raises ObjectNotFound
    (a 404) when it has none of that name, whatever the name looks like."""
    row = None
    if is_name(name):
        row = without_credentials(secrets_of(organization).filter(name=name), "updated_by", "created_by").first()
    if row is None:
        raise ObjectNotFound("No such secret.")
    return row


def existing_names(organization_id: Any, names: Collection[str]) -> set[str]:
    """Which of ``names`` the organization has secrets of (one query; none for no names)."""
    if not names:
        return set()
    return set(Secret.objects.for_organization(organization_id).filter(name__in=list(names))
               .values_list("name", flat=True))


def decrypt_values(organization_id: Any, names: Collection[str]) -> dict[str, str]:
    """{name: value} of the organization's secrets among ``names`` (absent names are
    left out), decrypted. For the engine when an attempt starts (engine.secret_refs.resolve)
    and nothing else: no permission is checked, and the values must go nowhere but the
    task. One query. Raises DecryptionError when a stored value cannot be decrypted."""
    if not names:
        return {}
    rows = (Secret.objects.for_organization(organization_id).filter(name__in=list(names))
            .values_list("name", "ciphertext"))
    return {name: decrypt(token, organization_id=organization_id, name=name) for name, token in rows}


# --- actions -------------------------------------------------------------------------------------


def _lock_organization_secrets(organization_id: Any) -> None:
    # Serializes the changes of one organization's secrets: the cap's count and the insert
    # cannot interleave with another request's, nor two rotations of one name.
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"secrets:{organization_id}"])


def set_secret(*, actor: Actor, name: str, value: str) -> tuple[Secret, bool]:
    """Create the secret ``name`` of ``actor.organization`` with ``value``, or rotate its
    value when it exists (version + 1). Returns (secret, created).

    Raises Forbidden without secret.manage, InvalidSecret for a bad name or value
    (naming the field), QuotaExceeded (``limit="max_secrets"``) when creating one more
    would pass FLOWFORGE_MAX_SECRETS_PER_ORG. Records ``secret.created`` or
    ``secret.rotated`` (name and version) in the same transaction; nothing is stored
    when anything is refused.
    """
    require(actor.role, Action.SECRET_MANAGE)
    name = validate_name(name)
    value = validate_value(value)
    organization_id = getattr(actor.organization, "pk", actor.organization)
    user = actor.user
    key_id = getattr(actor.api_key, "pk", None)
    with transaction.atomic():
        _lock_organization_secrets(organization_id)
        row = Secret.objects.for_organization(organization_id).filter(name=name).first()
        now = timezone.now()
        if row is not None:
            row.ciphertext = encrypt(organization_id, name, value)
            row.version += 1
            row.updated_by = user
            row.updated_by_api_key_id = key_id
            row.updated_at = now
            row.save(update_fields=["ciphertext", "version", "updated_by", "updated_by_api_key", "updated_at"])
            audit.record("secret.rotated", actor=actor, target=row, metadata={"name": name, "version": row.version})
            return row, False
        allowed = settings.FLOWFORGE_MAX_SECRETS_PER_ORG
        used = Secret.objects.for_organization(organization_id).count()
        if used >= allowed:
            raise QuotaExceeded(
                f"the organization has {used} secrets, the most allowed (FLOWFORGE_MAX_SECRETS_PER_ORG={allowed}); "
                "delete one it no longer needs first", limit="max_secrets", allowed=allowed, used=used)
        row = Secret.objects.create(
            organization_id=organization_id, name=name, ciphertext=encrypt(organization_id, name, value), version=1,
            created_by=user, created_by_api_key_id=key_id, updated_by=user, updated_by_api_key_id=key_id,
            created_at=now, updated_at=now,
        )
        audit.record("secret.created", actor=actor, target=row, metadata={"name": name, "version": 1})
    return row, True


def delete_secret(*, actor: Actor, name: str) -> Secret:
    """Delete the secret ``name`` of ``actor.organization``; returns the deleted row (its
    last version). Runs that reference it fail their next attempt ("secret NAME no
    longer exists"); definitions keep the reference.

    Raises Forbidden without secret.manage, ObjectNotFound (404) when there is no such
    secret. Records ``secret.deleted`` (name and version) in the same transaction.
    """
    require(actor.role, Action.SECRET_MANAGE)
    organization_id = getattr(actor.organization, "pk", actor.organization)
    with transaction.atomic():
        _lock_organization_secrets(organization_id)
        row = (Secret.objects.for_organization(organization_id).filter(name=name).defer("ciphertext").first()
               if is_name(name) else None)
        if row is None:
            raise ObjectNotFound("No such secret.")
        target = ("secret", str(row.pk))
        row.delete()
        audit.record("secret.deleted", actor=actor, target=target, metadata={"name": row.name, "version": row.version})
    return row


@dataclasses.dataclass(frozen=True)
class RotationResult:
    """What ``rotate_keys`` did: rows examined, rows re-encrypted, and the ids of rows no
    configured key decrypts (left as they are)."""

    examined: int
    rewritten: int
    undecryptable: list[uuid.UUID]


def rotate_keys(*, batch_size: int = ROTATE_BATCH_SIZE) -> RotationResult:
    """Re-encrypt every organization's stored secrets under the first key of
    FLOWFORGE_SECRET_KEYS (after a new key was put first), ``batch_size`` rows per
    transaction in id order, each batch's rows locked while it is rewritten.

    Idempotent: a value already under the first key is not rewritten, so a second run
    (or a run after an interrupted one) rewrites nothing more. Values, versions and
    ``updated_at`` do not change. A row no configured key decrypts is left as it is and
    listed in the result. Every organization's rows: system code (the management command).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    examined = rewritten = 0
    undecryptable: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    while True:
        with transaction.atomic():
            batch = Secret.objects.unscoped().order_by("id").select_for_update().only("id", "ciphertext")
            if after is not None:
                batch = batch.filter(id__gt=after)
            rows = list(batch[:batch_size])
            changed = []
            for row in rows:
                try:
                    token = reencrypt(row.ciphertext)
                except DecryptionError:
                    undecryptable.append(row.pk)
                    continue
                if token is not None:
                    row.ciphertext = token
                    changed.append(row)
            if changed:
                Secret.objects.unscoped().bulk_update(changed, ["ciphertext"])
        examined += len(rows)
        rewritten += len(changed)
        if len(rows) < batch_size:
            break
        after = rows[-1].pk
    log.info("rotate_secret_keys: %d secrets examined, %d re-encrypted, %d undecryptable",
             examined, rewritten, len(undecryptable))
    return RotationResult(examined=examined, rewritten=rewritten, undecryptable=undecryptable)
