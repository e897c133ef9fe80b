"""The append-only audit log (seed 000: ``core_auditlog``, append-only by trigger).

Every change made by a person, an API key or the system is recorded once, in the
transaction of the change. Rows are chained: each carries the hash of the previous
row of its chain (one chain per organization, one for account-level events) and its
own HMAC, under a key from the environment, over a canonical encoding of its content,
so an edit, insertion or deletion that bypasses the trigger is detectable
(``manage.py audit_verify``; docs/audit.md says what each check proves).

Foreign keys are not enforced by the database (``db_constraint=False``) and never
act on delete: deleting a user or a key must neither be blocked by its history nor
rewrite it. The actor's email and the key's prefix are kept as text for the same reason.
"""

from __future__ import annotations

import uuid

from django.db import models

from tenancy.scoping import OrganizationScopedManager


class ActorType(models.TextChoices):
    USER = "user", "User"
    API_KEY = "api_key", "API key"
    SYSTEM = "system", "System"


class AuditLog(models.Model):
    """One audit record. Never updated or deleted (a database trigger refuses both)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "tenancy.Organization", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="+",
    )
    actor_type = models.CharField(max_length=20, choices=ActorType.choices)
    actor_user = models.ForeignKey(
        "tenancy.User", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    actor_email = models.CharField(max_length=254, blank=True, default="")
    actor_api_key = models.ForeignKey(
        "tenancy.ApiKey", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    actor_api_key_prefix = models.CharField(max_length=16, blank=True, default="")
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=50, blank=True, default="")
    target_id = models.CharField(max_length=100, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=500, blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    # Tamper evidence: chain = organization id, or "account" for account-level events.
    chain = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    row_hash = models.CharField(max_length=64)
    # The id of the FLOWFORGE_AUDIT_KEYS key whose HMAC row_hash is; NULL for a legacy
    # row (plain SHA-256, written before keys existed). See audit/chain.py.
    key_id = models.CharField(max_length=32, null=True, blank=True)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_auditlog"
        constraints = [
            # No two rows claim the same place (and so the same predecessor) in a chain.
            models.UniqueConstraint(fields=["chain", "seq"], name="uniq_auditlog_chain_seq"),
            models.CheckConstraint(
                condition=models.Q(actor_type__in=["user", "api_key", "system"]), name="auditlog_actor_type_valid"
            ),
        ]
        indexes = [
            # An organization's log, newest first, keyset-paginated: WHERE organization_id = ? ORDER BY created_at DESC, id DESC.
            models.Index(models.F("organization"), models.F("created_at").desc(), models.F("id").desc(),
                         name="idx_auditlog_org_recent"),
            # Staff search by request id: WHERE request_id = ?.
            models.Index(fields=["request_id"], name="idx_auditlog_request_id"),
            # Staff search by target: WHERE target_id = ?.
            models.Index(fields=["target_id"], name="idx_auditlog_target_id"),
            # Audit retention (audit.retention): WHERE created_at < cutoff GROUP BY chain —
            # the chains with rows past the policy, reading only those rows.
            models.Index(fields=["created_at"], name="idx_auditlog_created"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.action} by {self.actor_email or self.actor_type}"


class AuditCheckpoint(models.Model):
    """Where a chain starts after audit retention removed its oldest rows (docs/audit.md).

    One row per retention batch of a chain, never updated or deleted (a trigger refuses
    both): rows ``1..seq`` of ``chain`` were removed after the walk from the chain's previous
    start verified them, and ``row_hash`` is the hash of row ``seq``, the ``prev_hash`` the
    first kept row must carry. ``signature`` is the HMAC-SHA256 (``audit.retention.checkpoint_mac``)
    under the audit key ``key_id`` of (chain, seq, row_hash, row_created_at), so a checkpoint
    written without the key does not verify.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    chain = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    row_hash = models.CharField(max_length=64)
    row_created_at = models.DateTimeField()
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=64)
    rows_removed = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "core_auditcheckpoint"
        constraints = [
            # The removal function (ff_audit_remove_through) and the walk look a chain's
            # checkpoint up by (chain, seq); one per place.
            models.UniqueConstraint(fields=["chain", "seq"], name="uniq_auditcheckpoint_chain_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.chain} through seq {self.seq}"
