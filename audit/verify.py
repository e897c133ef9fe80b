"""Walking the audit chains to find the first broken link."""

from __future__ import annotations

import dataclasses

from audit.chain import GENESIS, HASHED_FIELDS, row_hash
from audit.models import AuditLog


@dataclasses.dataclass(frozen=True)
class Break:
    """The first broken link of one chain."""

    chain: str
    seq: int
    row_id: str
    problem: str


def verify_chain(chain: str) -> tuple[int, Break | None]:
    """Check one chain from its first row. Returns (rows checked, first break or None).

    A row whose content was edited no longer matches its own hash; a deleted row
    leaves a gap in ``seq`` and a ``prev_hash`` that matches nothing.
    """
    expected_seq, expected_prev, checked = 1, GENESIS, 0
    fields = [f for f in HASHED_FIELDS] + ["row_hash"]
    rows = AuditLog.objects.unscoped().filter(chain=chain).order_by("seq").values(*fields).iterator(chunk_size=2000)
    for row in rows:
        checked += 1
        rid = str(row["id"])
        if row["seq"] != expected_seq:
            return checked, Break(chain, row["seq"], rid,
                                  f"seq {row['seq']} follows {expected_seq - 1}: rows {expected_seq}..{row['seq'] - 1} are missing (deleted)")
        if row["prev_hash"] != expected_prev:
            return checked, Break(chain, row["seq"], rid,
                                  "prev_hash does not match the previous row's hash (a row before it was edited or replaced)")
        actual = row_hash(row)
        if actual != row["row_hash"]:
            return checked, Break(chain, row["seq"], rid,
                                  "its content does not match its hash (the row was edited)")
        expected_seq, expected_prev = row["seq"] + 1, row["row_hash"]
    return checked, None


def verify_all() -> tuple[int, list[Break]]:
    """Check every chain. Returns (rows checked, breaks: at most one per chain)."""
    total, breaks = 0, []
    chains = AuditLog.objects.unscoped().order_by("chain").values_list("chain", flat=True).distinct()
    for chain in chains:
        n, brk = verify_chain(chain)
        total += n
        if brk:
            breaks.append(brk)
    return total, breaks
