"""Checking the audit log (``manage.py audit_verify``): what each check proves is in docs/audit.md.

- every chain is walked from the genesis, or from its latest retention checkpoint once
  audit retention removed its oldest rows (``audit.retention``: the checkpoint's signature
  is checked, and the first kept row must link to the hash it carries): each row in its
  place (``seq`` 1, 2, ...),
  linked to its predecessor (``prev_hash``), and its ``row_hash`` recomputed — the HMAC
  under the key its ``key_id`` names for a keyed row, the plain SHA-256 for a legacy one
  (``audit.chain``). Unkeyed rows are refused unless FLOWFORGE_AUDIT_ACCEPT_LEGACY is
  on (a deployment with rows from before keys), and even then none may follow a keyed row;
- every organization with activity (a member, a workflow or a run) has a chain;
- optionally, every chain still reaches the head (last seq and hash) exported earlier
  with ``export_head``, so removing the newest rows or a whole chain is found.

A row signed with a key that FLOWFORGE_AUDIT_KEYS does not hold cannot be checked: it is
reported as unverifiable, by key id, and the walk goes on trusting its hash for the link.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
from typing import Any

from django.conf import settings
from django.db import connection

from audit.chain import GENESIS, HASHED_FIELDS, checkpoint_mac, row_hash, row_mac
from audit.keys import key_for, signing_key
from audit.models import AuditCheckpoint, AuditLog

HEAD_FORMAT = "flowforge-audit-head/1"

# -- name: organizations_with_activity_but_no_chain --
# Organizations that have a member, a workflow or a run but no audit row at all: their
# chain was deleted (every organization records organization.created when it is made).
ORGS_WITHOUT_CHAIN_SQL = """
SELECT o.id::text, o.slug
FROM core_organization o
WHERE (EXISTS (SELECT 1 FROM core_membership m WHERE m.organization_id = o.id)
       OR EXISTS (SELECT 1 FROM core_workflow w WHERE w.organization_id = o.id)
       OR EXISTS (SELECT 1 FROM core_workflowrun r WHERE r.organization_id = o.id))
  AND NOT EXISTS (SELECT 1 FROM core_auditlog a WHERE a.chain = o.id::text)
ORDER BY o.slug
"""


class HeadFileError(ValueError):
    """A head file cannot be used: unreadable, malformed, or its signature does not verify."""


@dataclasses.dataclass(frozen=True)
class Break:
    """The first problem found in one chain. ``seq`` is 0 and ``row_id`` empty when the
    problem is the chain as a whole (missing, shorter than an exported head)."""

    chain: str
    seq: int
    row_id: str
    problem: str


@dataclasses.dataclass(frozen=True)
class Unverifiable:
    """``rows`` rows of ``chain`` (the first at ``first_seq``) are signed with ``key_id``,
    which FLOWFORGE_AUDIT_KEYS does not hold, so their content could not be checked."""

    chain: str
    key_id: str
    rows: int
    first_seq: int


@dataclasses.dataclass
class Report:
    """The outcome of ``verify``: rows checked, breaks (at most one per chain),
    unverifiable rows by (chain, key id), and each intact chain's head (seq, row_hash)."""

    checked: int = 0
    breaks: list[Break] = dataclasses.field(default_factory=list)
    unverifiable: list[Unverifiable] = dataclasses.field(default_factory=list)
    heads: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.breaks and not self.unverifiable


def checkpoint_problem(checkpoint: AuditCheckpoint) -> str:
    """Why a retention checkpoint cannot be trusted ("" when its signature verifies)."""
    key = key_for(checkpoint.key_id)
    if key is None:
        return (f"the retention checkpoint at seq {checkpoint.seq} is signed with key id {checkpoint.key_id!r}, "
                "which FLOWFORGE_AUDIT_KEYS does not hold")
    fields = {f: getattr(checkpoint, f) for f in ("chain", "seq", "row_hash", "row_created_at", "key_id")}
    if not hmac.compare_digest(checkpoint_mac(fields, key), checkpoint.signature):
        return (f"the retention checkpoint at seq {checkpoint.seq} does not match its signature "
                "(written or edited without the audit key)")
    return ""


def _start(chain: str, first_seq: int, first_id: str) -> tuple[int, str] | Break:
    """Where the walk of ``chain`` starts when its first row is ``first_seq``: (seq, the
    prev_hash that row must carry), from the genesis or from the signed checkpoint that
    audit retention wrote at ``first_seq - 1``; a Break when neither accounts for it."""
    if first_seq == 1:
        return 1, GENESIS
    checkpoint = AuditCheckpoint.objects.filter(chain=chain, seq=first_seq - 1).first()
    if checkpoint is None:
        return Break(chain, first_seq, first_id, f"the chain does not start at the genesis: its first row is seq "
                                                 f"{first_seq} (rows 1..{first_seq - 1} are missing, and no "
                                                 "retention checkpoint accounts for them)")
    problem = checkpoint_problem(checkpoint)
    if problem:
        return Break(chain, first_seq, first_id, problem)
    return first_seq, checkpoint.row_hash


def _walk(chain: str, report: Report, *, through: int | None = None) -> Break | None:
    # Unkeyed rows are accepted only where the deployment says it has some from before
    # keys: otherwise rewriting a whole chain as "legacy" SHA-256 would verify.
    accept_legacy = bool(getattr(settings, "FLOWFORGE_AUDIT_ACCEPT_LEGACY", False))
    expected_seq, expected_prev = 0, GENESIS  # set from the first row (_start)
    keyed_since: int | None = None
    unknown: dict[str, list[int]] = {}
    fields = [*HASHED_FIELDS, "key_id", "row_hash"]
    rows = AuditLog.objects.unscoped().filter(chain=chain)
    if through is not None:
        rows = rows.filter(seq__lte=through)
    rows = rows.order_by("seq").values(*fields).iterator(chunk_size=2000)
    brk = None
    for row in rows:
        report.checked += 1
        rid, seq = str(row["id"]), row["seq"]
        if expected_seq == 0:
            start = _start(chain, seq, rid)
            if isinstance(start, Break):
                brk = start
                break
            expected_seq, expected_prev = start
        if seq != expected_seq:
            if expected_seq == 1:
                problem = f"the chain does not start at the genesis: its first row is seq {seq} (rows 1..{seq - 1} are missing)"
            else:
                problem = f"seq {seq} follows {expected_seq - 1}: rows {expected_seq}..{seq - 1} are missing (deleted)"
            brk = Break(chain, seq, rid, problem)
            break
        if row["prev_hash"] != expected_prev:
            problem = ("the chain does not start at the genesis: its first row's prev_hash is not the genesis"
                       if expected_prev == GENESIS else
                       "prev_hash does not match the previous row's hash (a row before it was edited or replaced, "
                       "or the retention checkpoint before it does not belong to this chain)")
            brk = Break(chain, seq, rid, problem)
            break
        key_id = row["key_id"]
        if key_id is None:
            if not accept_legacy:
                brk = Break(chain, seq, rid, "an unkeyed row: it was written without the audit key (rows from "
                                             "before keyed chains verify only with FLOWFORGE_AUDIT_ACCEPT_LEGACY=1)")
                break
            if keyed_since is not None:
                brk = Break(chain, seq, rid, f"an unkeyed row after keyed rows (keyed since seq {keyed_since}): "
                                             "it was written without the audit key")
                break
            if not hmac.compare_digest(row_hash(row), row["row_hash"]):
                brk = Break(chain, seq, rid, "its content does not match its hash (the row was edited)")
                break
        else:
            keyed_since = keyed_since or seq
            key = key_for(key_id)
            if key is None:
                unknown.setdefault(key_id, []).append(seq)
            elif not hmac.compare_digest(row_mac(row, key), row["row_hash"]):
                brk = Break(chain, seq, rid, f"its content does not match its hash (the HMAC under key {key_id!r}): "
                                             "the row was edited, or written without the key")
                break
        expected_seq, expected_prev = seq + 1, row["row_hash"]
    for key_id, seqs in sorted(unknown.items()):
        report.unverifiable.append(Unverifiable(chain, key_id, len(seqs), seqs[0]))
    if brk is None and expected_seq > 1:
        report.heads[chain] = (expected_seq - 1, expected_prev)
    return brk


def verify_chain(chain: str, *, through: int | None = None) -> tuple[int, Break | None]:
    """Check one chain from the genesis (or its retention checkpoint), up to row
    ``through`` when given. Returns (rows checked, first break or None)."""
    report = Report()
    brk = _walk(chain, report, through=through)
    return report.checked, brk


def _chains_missing() -> list[Break]:
    with connection.cursor() as cur:
        cur.execute(ORGS_WITHOUT_CHAIN_SQL)
        return [Break(org_id, 0, "", f"organization {slug!r} has members, workflows or runs but no audit chain "
                                     "(its chain was deleted)") for org_id, slug in cur.fetchall()]


def _against_head(report: Report, head: dict[str, tuple[int, str]]) -> None:
    broken = {b.chain for b in report.breaks}
    for chain, (seq, digest) in sorted(head.items()):
        if chain in broken:
            continue
        last = AuditLog.objects.unscoped().filter(chain=chain).order_by("-seq").values_list("seq", flat=True).first()
        if last is None:
            report.breaks.append(Break(chain, 0, "", f"the chain is gone: the exported head reached seq {seq}"))
            continue
        if last < seq:
            report.breaks.append(Break(chain, last, "", f"the chain ends at seq {last} but the exported head reached "
                                                        f"seq {seq}: rows {last + 1}..{seq} were removed"))
            continue
        row = AuditLog.objects.unscoped().filter(chain=chain, seq=seq).values("id", "row_hash").first()
        if row is None:
            # Removed since by audit retention: the walk checked the checkpoint the chain
            # now starts from, and the head is at or before it.
            if AuditCheckpoint.objects.filter(chain=chain, seq__gte=seq).exists():
                continue
            report.breaks.append(Break(chain, seq, "", "the row at the exported head's seq is gone and no retention "
                                                       "checkpoint covers it"))
            continue
        if not hmac.compare_digest(row["row_hash"], digest):
            report.breaks.append(Break(chain, seq, str(row["id"]), "the row at the exported head's seq is not the "
                                                                   "one exported (the chain was rewritten)"))


def verify(*, head: dict[str, tuple[int, str]] | None = None) -> Report:
    """Check every chain, that every organization with activity has one, and with
    ``head`` (from ``load_head``) that each chain still reaches its exported head."""
    report = Report()
    chains = AuditLog.objects.unscoped().order_by("chain").values_list("chain", flat=True).distinct()
    for chain in chains:
        brk = _walk(chain, report)
        if brk:
            report.breaks.append(brk)
    report.breaks.extend(_chains_missing())
    if head is not None:
        _against_head(report, head)
    return report


def verify_all() -> tuple[int, list[Break]]:
    """Check every chain and every organization's chain (``verify`` without a head).
    Returns (rows checked, breaks: at most one per chain)."""
    report = verify()
    return report.checked, report.breaks


# --- head files --------------------------------------------------------------------------------------


def _signed_bytes(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def export_head(report: Report) -> dict[str, Any]:
    """The head document of an intact ``report``: each chain's last (seq, row_hash),
    signed (HMAC-SHA256) with the current audit key. Shape::

        {"format": "flowforge-audit-head/1", "exported_at": ISO 8601, "key_id": "k2",
         "heads": {"<chain>": {"seq": 12, "row_hash": "<64 hex>"}}, "signature": "<64 hex>"}

    Raises ValueError when the report is not intact (a head must not bless a broken chain).
    """
    if not report.ok:
        raise ValueError("the audit log does not verify; no head is exported")
    key_id, key = signing_key()
    doc: dict[str, Any] = {
        "format": HEAD_FORMAT,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "key_id": key_id,
        "heads": {chain: {"seq": seq, "row_hash": digest} for chain, (seq, digest) in sorted(report.heads.items())},
    }
    doc["signature"] = hmac.new(key, _signed_bytes(doc), hashlib.sha256).hexdigest()
    return doc


def load_head(text: str) -> dict[str, tuple[int, str]]:
    """The heads of a document written by ``export_head``: {chain: (seq, row_hash)}.

    Raises HeadFileError when it is not such a document, is signed with a key id that
    FLOWFORGE_AUDIT_KEYS does not hold, or its signature does not verify (edited)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise HeadFileError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != HEAD_FORMAT:
        raise HeadFileError(f"not a head file (expected format {HEAD_FORMAT!r})")
    key_id, signature, heads = doc.get("key_id"), doc.get("signature"), doc.get("heads")
    if not isinstance(key_id, str) or not isinstance(signature, str) or not isinstance(heads, dict):
        raise HeadFileError("key_id, signature and heads are required")
    key = key_for(key_id)
    if key is None:
        raise HeadFileError(f"signed with key id {key_id!r}, which FLOWFORGE_AUDIT_KEYS does not hold")
    if not hmac.compare_digest(hmac.new(key, _signed_bytes(doc), hashlib.sha256).hexdigest(), signature):
        raise HeadFileError("its signature does not verify (the file was edited, or signed with another key)")
    out: dict[str, tuple[int, str]] = {}
    for chain, value in heads.items():
        if not (isinstance(value, dict) and isinstance(value.get("seq"), int) and isinstance(value.get("row_hash"), str)):
            raise HeadFileError(f"heads[{chain!r}]: expected {{'seq': int, 'row_hash': str}}")
        out[chain] = (value["seq"], value["row_hash"])
    return out
