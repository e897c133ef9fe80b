"""Audit retention: remove each chain's rows older than the policy, keeping the chain
verifiable (docs/audit.md, "Retention").

The audit log is kept longer than run history (seed 001 keeps audit events 84 months
against execution history's 12): ``FLOWFORGE_AUDIT_RETENTION_DAYS``, 2,557 days (7 years)
by default, never less than 365, 0 to keep everything.

For each chain with rows past the policy, in batches of ``batch_rows``:

1. the chain is walked from where it starts now (the genesis or its latest checkpoint)
   to the last row to remove, checking every row as ``audit_verify`` does — a broken
   chain is left whole and reported, never "cleaned";
2. one transaction per batch writes a checkpoint (``core_auditcheckpoint``: the chain,
   the batch's last seq, that row's hash and time, signed with the audit key) and calls
   ``ff_audit_remove_through``, the database function that removes the batch — the only
   DELETE the log's append-only trigger lets through (migration audit/0004).

A chain's newest row is always kept, so every chain still has a row and a head.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.chain import checkpoint_mac
from audit.keys import signing_key
from audit.models import AuditCheckpoint, AuditLog
from audit.verify import verify_chain

log = logging.getLogger(__name__)

MIN_KEEP_DAYS = 365  # also enforced by ff_audit_remove_through
BATCH_ROWS = 5000  # rows removed per transaction (and per checkpoint)
MAX_ROWS_PER_PASS = 50_000  # per chain and call: a backlog is worked off over several housekeeping passes

# -- name: audit_chains_past_cutoff --
# Each chain with rows older than the cutoff and the last such row's seq; idx_auditlog_created
# (reads only the rows past the policy).
CHAINS_PAST_CUTOFF_SQL = """
SELECT a.chain, max(a.seq) AS old_seq
FROM core_auditlog a
WHERE a.created_at < %(cutoff)s
GROUP BY a.chain
ORDER BY a.chain
"""

# -- name: audit_chain_bounds --
# A chain's first and last seq; uniq_auditlog_chain_seq (two index endpoints).
CHAIN_BOUNDS_SQL = """
SELECT (SELECT a.seq FROM core_auditlog a WHERE a.chain = %(chain)s ORDER BY a.seq LIMIT 1),
       (SELECT a.seq FROM core_auditlog a WHERE a.chain = %(chain)s ORDER BY a.seq DESC LIMIT 1)
"""


@dataclasses.dataclass
class ChainPurge:
    """One chain's outcome: ``removable`` rows past the policy (first..through, the newest
    row excepted, at most MAX_ROWS_PER_PASS), ``removed`` of them removed (0 in a preview),
    and ``problem`` when the chain does not verify and was left whole."""

    chain: str
    first_seq: int
    through_seq: int
    removable: int
    removed: int = 0
    problem: str = ""


def retention_days() -> int:
    """The configured policy in days (0: keep everything). Settings refuse 1..364."""
    return int(getattr(settings, "FLOWFORGE_AUDIT_RETENTION_DAYS", 0))


def purge(*, keep_days: int | None = None, preview: bool = False, batch_rows: int = BATCH_ROWS,
          max_rows: int = MAX_ROWS_PER_PASS, now: dt.datetime | None = None) -> list[ChainPurge]:
    """Remove (or with ``preview`` only count) every chain's rows older than ``keep_days``
    (default: the policy). Returns one ChainPurge per chain with rows past it.

    Raises ValueError for a ``keep_days`` between 1 and 364 (``0`` keeps everything and
    returns []). A chain that does not verify up to its last row to remove is reported
    (``problem``) and nothing of it is removed.
    """
    keep_days = retention_days() if keep_days is None else keep_days
    if keep_days == 0:
        return []
    if keep_days < MIN_KEEP_DAYS:
        raise ValueError(f"keep_days={keep_days}: audit rows are kept at least {MIN_KEEP_DAYS} days (0 keeps all)")
    if batch_rows < 1 or max_rows < 1:
        raise ValueError("batch_rows and max_rows must be at least 1")
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=keep_days)
    with connection.cursor() as cur:
        cur.execute(CHAINS_PAST_CUTOFF_SQL, {"cutoff": cutoff})
        past = cur.fetchall()
    out: list[ChainPurge] = []
    for chain, old_seq in past:
        first, last = _bounds(chain)
        if first is None:
            continue
        through = min(old_seq, last - 1, first + max_rows - 1)  # the newest row stays
        if through < first:
            continue
        item = ChainPurge(chain, first, through, removable=through - first + 1)
        out.append(item)
        if preview:
            continue
        _checked, brk = verify_chain(chain, through=through)
        if brk is not None:
            item.problem = f"seq {brk.seq}: {brk.problem}" if brk.seq else brk.problem
            log.warning("audit retention: chain %s left whole, it does not verify: %s", chain, item.problem)
            continue
        item.removed = _remove(chain, first, through, keep_days=keep_days, batch_rows=batch_rows)
    return out


def _bounds(chain: str) -> tuple[int | None, int | None]:
    with connection.cursor() as cur:
        cur.execute(CHAIN_BOUNDS_SQL, {"chain": chain})
        return cur.fetchone()


def _remove(chain: str, first: int, through: int, *, keep_days: int, batch_rows: int) -> int:
    removed = 0
    start = first
    key_id, key = signing_key()
    while start <= through:
        with transaction.atomic():
            with connection.cursor() as cur:
                # One purger per chain at a time (two would race for the same checkpoint).
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"audit-retention:{chain}"])
            now_first, _ = _bounds(chain)
            if now_first is None or now_first > through:
                break  # another purger got there first
            start = now_first
            end = min(start + batch_rows - 1, through)
            row = AuditLog.objects.unscoped().filter(chain=chain, seq=end).values("row_hash", "created_at").get()
            fields = {"chain": chain, "seq": end, "row_hash": row["row_hash"], "row_created_at": row["created_at"],
                      "key_id": key_id}
            AuditCheckpoint.objects.create(
                **fields, signature=checkpoint_mac(fields, key), rows_removed=end - start + 1,
                created_at=timezone.now(),
            )
            with connection.cursor() as cur:
                cur.execute("SELECT ff_audit_remove_through(%s, %s, make_interval(days => %s))",
                            [chain, end, keep_days])
                removed += cur.fetchone()[0]
        start = end + 1
    return removed
