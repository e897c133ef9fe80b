"""Recording audit events: the one function every entry point calls.

``record`` is called inside the transaction of the change it describes, so a
rolled-back change leaves no record and no committed change lacks one.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.chain import ACCOUNT_CHAIN, GENESIS, row_mac
from audit.context import current_request
from audit.keys import signing_key
from audit.models import ActorType, AuditLog
from flowforge.jsonb import strip_nul

# Metadata keys that can never be recorded: a secret must not reach the audit log,
# even by mistake. Matching is on the key name, at any depth.
FORBIDDEN_METADATA_KEYS = frozenset({
    "password", "password1", "password2", "new_password", "old_password", "secret", "token", "key",
    "api_key", "hashed_key", "full_key", "raw_key", "totp", "totp_secret", "code", "recovery_codes",
    "session_key", "csrfmiddlewaretoken",
})


class SecretInMetadata(ValueError):
    """``record`` was given metadata with a key that may hold a secret."""


def _check_metadata(value: Any, path: str = "metadata") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k).lower() in FORBIDDEN_METADATA_KEYS:
                raise SecretInMetadata(f"{path}.{k}: audit metadata cannot hold a field named {k!r}")
            _check_metadata(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_metadata(v, f"{path}[{i}]")


def _target(target: Any) -> tuple[str, str]:
    if target is None:
        return "", ""
    if isinstance(target, tuple):
        return str(target[0]), str(target[1])
    return target._meta.model_name, str(target.pk)


def record(
    action: str,
    *,
    actor: Any = None,
    organization: Any = None,
    user: Any = None,
    target: Any = None,
    metadata: dict[str, Any] | None = None,
    actor_email: str | None = None,
) -> AuditLog:
    """Append one audit record and return it.

    ``action`` is a dotted verb (``run.started``). The actor is a ``tenancy.actors.Actor``
    (user, API key or system), or just a ``user`` for account-level events such as a
    sign-in (``actor_email`` names the address of a sign-in attempt that matched no
    user); ``organization`` defaults to the actor's (None for account events, which
    only staff see). ``target`` is a model instance or a (type, id) pair. ``metadata``
    is recorded as given — field by field, never a dumped model — and raises
    SecretInMetadata if a key may name a secret. Request metadata (IP, user agent,
    request id) comes from the current request, if any.

    The row is signed with the current audit key (HMAC-SHA256, ``audit.chain.row_mac``;
    its id in ``key_id``). Appends to one chain are serialized with a transaction-scoped advisory lock, so
    no two rows claim the same predecessor (``uniq_auditlog_chain_seq`` backs it up). The
    transaction's pending foreign-key checks are made before that lock is taken (the lock is
    held to the commit; a check at the commit would lock referenced rows after it, and
    deadlock with a transaction that locked such a row and then records).
    """
    metadata = strip_nul(metadata or {})
    _check_metadata(metadata)
    if actor is not None:
        organization = organization if organization is not None else actor.organization
        user = user if user is not None else actor.user
        api_key = actor.api_key
        actor_type = ActorType.API_KEY if api_key is not None else ActorType.USER if user is not None else ActorType.SYSTEM
    else:
        api_key = None
        # A person who is not (yet) a user — a sign-in with an unknown address — is a
        # user actor named only by ``actor_email``, not the system.
        actor_type = ActorType.USER if user is not None or actor_email else ActorType.SYSTEM
    org_id = getattr(organization, "pk", organization)
    chain = str(org_id) if org_id else ACCOUNT_CHAIN
    target_type, target_id = _target(target)
    meta = current_request.get()
    key_id, key = signing_key()
    with transaction.atomic():
        with connection.cursor() as cur:
            # The chain lock is held to the commit, and a foreign key is checked at the
            # commit (Django's are DEFERRABLE INITIALLY DEFERRED): a row this transaction
            # references (a retry's original run, a new run's workflow version) would be
            # locked FOR KEY SHARE only after the chain lock. Another transaction holding
            # that row FOR UPDATE and then recording (an action on the run, an archive)
            # would deadlock with it. Checking what is pending now takes those row locks
            # before the chain lock, in the order every other transaction takes them.
            # Then deferred again for the rest of the transaction (every deferrable constraint
            # of the schema is INITIALLY DEFERRED: audit tests check it); one round trip.
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE; SET CONSTRAINTS ALL DEFERRED")
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"audit-chain:{chain}"])
        last = AuditLog.objects.unscoped().filter(chain=chain).order_by("-seq").values("seq", "row_hash").first()
        fields = {
            "id": None,
            "organization_id": org_id,
            "actor_type": str(actor_type),
            "actor_user_id": getattr(user, "pk", None),
            "actor_email": (getattr(user, "email", "") or actor_email or "")[:254],
            "actor_api_key_id": getattr(api_key, "pk", None),
            "actor_api_key_prefix": getattr(api_key, "prefix", "") or "",
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "metadata": metadata,
            "ip_address": meta.ip_address if meta else None,
            "user_agent": strip_nul((meta.user_agent if meta else "")[:500]),
            "request_id": meta.request_id if meta else "",
            "created_at": timezone.now(),
            "chain": chain,
            "seq": (last["seq"] + 1) if last else 1,
            "prev_hash": last["row_hash"] if last else GENESIS,
            "key_id": key_id,
        }
        entry = AuditLog(**{k: v for k, v in fields.items() if k != "id"})
        fields["id"] = entry.id
        entry.row_hash = row_mac(fields, key)
        entry.save(force_insert=True)
    return entry


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"field": {"before": x, "after": y}} for the fields whose value differs."""
    return {k: {"before": before.get(k), "after": after.get(k)} for k in after if before.get(k) != after.get(k)}
