"""The only writer of run and task-run state (seed 000, "How writes reach these tables").

Every state change is one conditional UPDATE whose WHERE clause states the
precondition (``state = 'ready'``, ``fencing_token = $token`` ...). A lost race
therefore matches no row and changes nothing; no function here raises for one.
Each transition writes its TaskRunEvent in the same statement (a data-modifying
CTE), and the event's ``seq`` comes from ``core_workflowrun.last_event_seq``
under that run's row lock, so a run's history is gap-free and in commit order
(seed 001).

Lock order, which keeps deadlocks rare: task-run rows first, the run row last
(the event-sequence bump is the last write of every statement). Functions that
read a run's other task runs (promotion, skipping, terminal-state derivation)
run *after* that bump, so under READ COMMITTED they see every transition of the
run that committed before ours (two completions racing on a fan-in both see the
other's result; one of them promotes).

Statements that address task runs by id state their ``state`` precondition as
``(t.state || '') = 'running'``: the same test, in a form no index and no partial
index predicate matches, so the planner can only find the rows by primary key.
Written plainly, a plan built while statistics said "5 running rows" (a queue's
counts swing far faster than ANALYZE follows, and a prepared statement keeps its
plan) scans every running row of the table (``idx_taskrun_lease_expiry``), or
every succeeded row in history (``idx_taskrun_state_age``), once per batch.

All functions must be called inside ``transaction.atomic`` unless their
docstring says otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connection, transaction

from engine.definitions import MAX_RETRY_BACKOFF_SECONDS
from engine.jsonb import jsonb_safe, strip_nul

TERMINAL = ("succeeded", "failed", "skipped", "cancelled")

# Queue the execute messages go to (OutboxMessage.routing_key).
TASK_QUEUE = "flowforge.tasks"


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """A claimed task-run generation and its outbox row (``outbox_id`` is None when
    another claimer already wrote the row for this generation)."""

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    organization_id: uuid.UUID
    attempt: int
    fencing_token: int
    outbox_id: uuid.UUID | None


@dataclasses.dataclass(frozen=True)
class StartedAttempt:
    """What a worker needs to run one attempt of one task run."""

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    organization_id: uuid.UUID
    task_key: str
    task_type: str
    config: dict[str, Any]
    attempt: int
    max_attempts: int
    fencing_token: int
    timeout_seconds: float | None
    run_input: dict[str, Any]
    # Each dependency's output by task key. Outputs are handed whole, by key in order,
    # while their running total of JSON text stays within FLOWFORGE_MAX_UPSTREAM_BYTES;
    # each one past it is a summary instead:
    # {"$ref": "task_output", "task": <key>, "bytes": <size of its JSON>, "truncated": true}.
    upstream: dict[str, Any]
    # Seconds from this generation's claim to its start (None if the claim event is gone).
    dispatch_latency_seconds: float | None = None
    # Whether any task depends on this one (a success then has dependents to promote).
    has_dependents: bool = True


@dataclasses.dataclass(frozen=True)
class CompletionResult:
    """Outcome of a completion. ``accepted`` is False for a stale or duplicate
    completion (recorded as an event, nothing else changed). ``state`` is the task
    run's new state; ``dispatches`` the dependents claimed in the same transaction;
    ``run_state`` the run's state when this completion finished it, else None;
    ``retry_in_seconds`` the backoff when the attempt will be retried."""

    accepted: bool
    state: str | None = None
    dispatches: tuple[Dispatch, ...] = ()
    run_state: str | None = None
    retry_in_seconds: float | None = None


def _json(value: Any) -> Any:
    """Decode a jsonb column from a raw cursor (Django's psycopg setup returns jsonb as text)."""
    return json.loads(value) if isinstance(value, str) else value


def _fetch(sql: str, params: Any) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


# The hot statements are planned with index probes only (see the module docstring):
# psycopg keeps each one prepared on its connection and PostgreSQL keeps its plan, so a
# plan made while a table was nearly empty (a sequential scan, or a hash or merge join
# over one) would read the whole table on every later call. Set for the transaction
# only (set_config(..., true) is SET LOCAL); inside a caller's transaction the settings'
# configured values are restored afterwards.
_INDEX_PROBES_ONLY = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true)"
)
_PLANNER_DEFAULTS = (
    "SELECT set_config(name, reset_val, true) FROM pg_settings"
    " WHERE name IN ('enable_seqscan', 'enable_hashjoin', 'enable_mergejoin')"
)


@functools.cache
def _compact(sql: str) -> str:
    """``sql`` without its ``--`` comments and with each run of whitespace made one space:
    the text each hot statement is prepared with (``_prepared_form``) and named after.
    None of them has ``--`` inside a string literal."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


# The names of the statements this module has prepared (SQL PREPARE) on each connection.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


@functools.cache
def _prepared_form(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """(name, text, parameter names) of hot statement ``sql`` prepared in SQL: its
    compacted text with each ``%(name)s`` made ``$n`` (n in order of first use), the
    names in that order, and a statement name derived from the text."""
    compact = _compact(sql)
    names: list[str] = []

    def placeholder(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, compact).replace("%%", "%")
    return "ff_" + hashlib.sha1(compact.encode()).hexdigest()[:20], text, tuple(names)


def _array_element(value: Any) -> str | None:
    """One element of an array literal (``_literal``), or None when ``value`` is not of a
    kind rendered here."""
    t = type(value)
    if value is None:
        return "NULL"
    if t is uuid.UUID or t is int:
        return str(value)
    if t is str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return None


def _literal(value: Any, cursor: Any) -> str:
    """``value`` as an SQL literal for an ``EXECUTE`` argument (typed by the prepared
    statement's parameter): what ``cursor.mogrify`` renders, without its per-value
    adapter lookups for the kinds the hot statements pass (None, bool, int, finite float,
    str, UUID, and lists of UUID/int/str/None). Anything else goes to ``cursor.mogrify``.
    Only valid with ``standard_conforming_strings`` on (a backslash is then an ordinary
    character in '...'); NUL, which no PostgreSQL text can hold, also goes to mogrify,
    which raises."""
    t = type(value)
    if value is None:
        return "NULL"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float and math.isfinite(value):
        return repr(value)
    if t is uuid.UUID:
        return f"'{value}'"
    if t is str and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    if t is list:
        elements = [_array_element(v) for v in value]
        if None not in elements:
            text = "{" + ",".join(elements) + "}"  # type: ignore[arg-type]
            if "\x00" not in text:
                return "'" + text.replace("'", "''") + "'"
    return cursor.mogrify("%s", [value])


def _run_prepared(statements: Sequence[str], params: dict[str, Any]) -> list[list[tuple]]:
    """Run ``statements`` (each given the named ``params`` it uses) as one transaction in
    one message to the server, as prepared statements; returns each one's rows.

    The whole transaction goes as one simple-protocol query string: ``BEGIN`` (in
    autocommit mode), the planner settings (``_INDEX_PROBES_ONLY``), ``EXECUTE name(...)``
    per statement with its parameters as literals (psycopg's client-side binding), and
    ``COMMIT``. So the server runs the transaction start to end without waiting for this
    client: no lock it takes is held while this process's threads compete for the GIL to
    send the next statement. The first time a statement runs on a connection it is
    prepared first (``PREPARE``, its own round trip; PostgreSQL then neither parses nor
    plans it again on that connection). Each statement takes its own snapshot (READ
    COMMITTED), after the previous one finished. Inside a caller's transaction the
    statements just run in it (no BEGIN or COMMIT; the planner settings are restored at
    the end). A failure rolls back what this call did in its own transaction and raises.
    """
    import psycopg

    own = not connection.in_atomic_block and connection.get_autocommit()
    with connection.wrap_database_errors:
        connection.ensure_connection()
        pg = connection.connection
        known = _PREPARED.setdefault(pg, set())
        literal = psycopg.ClientCursor(pg)
        # The fast renderer's quoting (doubled quotes only) is right only with standard strings.
        fast = pg.info.parameter_status("standard_conforming_strings") == "on"
        parts = ["BEGIN"] if own else []
        parts.append(_INDEX_PROBES_ONLY)
        wanted: list[int] = []
        for sql in statements:
            name, text, order = _prepared_form(sql)
            if name not in known:
                # Alone, so that a failure of the transaction below cannot leave the
                # server with a statement this connection's set does not list (a
                # PREPARE outlives the rollback of its transaction).
                pg.execute(f"PREPARE {name} AS {text}", prepare=False)
                known.add(name)
            wanted.append(len(parts))
            if not order:
                parts.append(f"EXECUTE {name}")
            elif fast:
                parts.append(f"EXECUTE {name}(" + ", ".join(_literal(params[p], literal) for p in order) + ")")
            else:
                args = ", ".join(f"%({p})s" for p in order)
                parts.append(literal.mogrify(f"EXECUTE {name}({args})", params))
        parts.append("COMMIT" if own else _PLANNER_DEFAULTS)
        cur = psycopg.ClientCursor(pg)
        try:
            cur.execute(";\n".join(parts), prepare=False)
            results: list[list[tuple]] = []
            while True:
                results.append(cur.fetchall() if cur.description is not None else [])
                if not cur.nextset():
                    break
            return [results[i] for i in wanted]
        except BaseException:
            if own and not pg.closed and pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                try:
                    pg.execute("ROLLBACK")
                except Exception:  # the connection is gone: the server rolled back already
                    pass
            raise
        finally:
            cur.close()
            literal.close()


def autocommit_retry[T](fn: Callable[[], T], *, attempts: int = 5, connection_attempts: int = 0,
                        base_delay_seconds: float = 0.05) -> T:
    """Run ``fn`` in autocommit mode (each statement, or multi-statement query, is its own
    transaction) and return its result, retrying it on a deadlock or serialization failure
    and, when ``connection_attempts`` > 0, on a lost connection, like
    ``engine.db.atomic_retry``.

    For the hot path's one-round-trip transitions (``start_attempt``, a successful
    ``complete_attempt``, ``claim_ready``): no BEGIN and COMMIT round trips, and no row
    lock held while the client is scheduled to send its COMMIT. Only safe for ``fn``
    whose every effect is one such transaction, or a sequence that is correct when
    retried (all the functions named above are).
    """
    from engine.db import retry_transient

    return retry_transient(fn, atomic=False, attempts=attempts, connection_attempts=connection_attempts,
                           base_delay_seconds=base_delay_seconds)


# Appended to a statement whose CTE ``tr`` returns task-run rows with the columns
# (id, workflow_run_id, organization_id, attempt, fencing_token) plus the event's
# kind/from/to/detail as ev_kind, ev_from, ev_to, ev_detail. Bumps each touched
# run's event counter once per row and writes one event per row, numbered in
# ``tr`` order. This is the last write of the statement: the run row is locked last.
_EVENTS_CTE_ORDERED = """
, ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY {order}) AS rn
    FROM tr
), ev_counts AS (
    SELECT workflow_run_id, count(*) AS n FROM tr GROUP BY workflow_run_id
), ev_seq AS (
    UPDATE core_workflowrun r SET last_event_seq = r.last_event_seq + c.n
    FROM ev_counts c WHERE r.id = c.workflow_run_id
    RETURNING r.id, r.last_event_seq - c.n AS base
), ev_ins AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at)
    SELECT gen_random_uuid(), e.organization_id, e.workflow_run_id, e.id, s.base + e.rn, e.ev_kind,
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, clock_timestamp()
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id
)
"""
_EVENTS_CTE = _EVENTS_CTE_ORDERED.format(order="tr.id")


def record_run_event(
    *,
    workflow_run_id: uuid.UUID,
    kind: str,
    task_run_id: uuid.UUID | None = None,
    from_state: str = "",
    to_state: str = "",
    attempt: int | None = None,
    fencing_token: int | None = None,
    detail: dict[str, Any] | None = None,
) -> int | None:
    """Append one event to a run's history; returns its ``seq`` (None if the run is gone).

    Used for events that are not a task-run transition: a run's start and end, a
    rejected stale completion, an ignored duplicate delivery.
    """
    rows = _fetch(
        """
        WITH s AS (
            UPDATE core_workflowrun SET last_event_seq = last_event_seq + 1 WHERE id = %(run)s
            RETURNING id, organization_id, last_event_seq
        )
        INSERT INTO core_taskrunevent
            (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
             attempt, fencing_token, detail, created_at)
        SELECT gen_random_uuid(), s.organization_id, s.id, %(tr)s, s.last_event_seq, %(kind)s, %(from)s, %(to)s,
               %(attempt)s, %(token)s, %(detail)s, clock_timestamp()
        FROM s
        RETURNING seq
        """,
        {
            "run": workflow_run_id,
            "tr": task_run_id,
            "kind": kind,
            "from": from_state,
            "to": to_state,
            "attempt": attempt,
            "token": fencing_token,
            "detail": jsonb_safe(detail or {}),
        },
    )
    return rows[0][0] if rows else None


# --- Start a run ---------------------------------------------------------------------------


def create_run_rows(
    *,
    workflow_id: uuid.UUID,
    organization_id: uuid.UUID,
    run_input: dict[str, Any],
    trigger_source: str,
    triggered_by_id: uuid.UUID | None = None,
    retry_of_id: uuid.UUID | None = None,
    trigger_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Insert a WorkflowRun (``running``) and all its TaskRuns in one go: roots
    ``ready``, the rest ``pending`` (the design brief's "Start"). Returns the run id.

    The caller has checked that the workflow may be started (it is active).
    """
    run_id = uuid.uuid4()
    _fetch(
        """
        INSERT INTO core_workflowrun
            (id, organization_id, workflow_id, state, input, trigger_source, triggered_by_id, retry_of_id,
             trigger_id, error, last_event_seq, created_at, started_at)
        VALUES (%(run)s, %(org)s, %(wf)s, 'running', %(input)s, %(source)s, %(user)s, %(retry_of)s,
                %(trigger)s, '', 0, clock_timestamp(), clock_timestamp())
        """,
        {
            "run": run_id,
            "org": organization_id,
            "wf": workflow_id,
            "input": jsonb_safe(run_input),
            "source": trigger_source,
            "user": triggered_by_id,
            "retry_of": retry_of_id,
            "trigger": trigger_id,
        },
    )
    _fetch(
        """
        INSERT INTO core_taskrun
            (id, organization_id, workflow_run_id, task_id, state, attempt, fencing_token, error, created_at)
        SELECT gen_random_uuid(), t.organization_id, %(run)s, t.id,
               CASE WHEN EXISTS (SELECT 1 FROM core_taskdependency d WHERE d.task_id = t.id)
                    THEN 'pending' ELSE 'ready' END,
               1, 0, '', clock_timestamp()
        FROM core_task t WHERE t.workflow_id = %(wf)s
        ORDER BY t.key
        """,
        {"run": run_id, "wf": workflow_id},
    )
    record_run_event(
        workflow_run_id=run_id,
        kind="run_started",
        to_state="running",
        detail={"trigger_source": trigger_source, "retry_of": str(retry_of_id) if retry_of_id else None},
    )
    return run_id


# One outbox row per generation in CTE ``claimed`` (columns id, workflow_run_id,
# organization_id, attempt, fencing_token), as CTE ``outbox`` returning (id, task_run_id);
# continues a WITH list. Shared by the claim and the promote-and-claim statements.
_OUTBOX_CTE = """
), outbox AS (
    INSERT INTO core_outboxmessage
        (id, organization_id, task_run_id, workflow_run_id, exchange, routing_key, payload,
         fencing_token_snapshot, attempt_snapshot, publish_attempts, last_error, created_at, next_attempt_at)
    SELECT gen_random_uuid(), c.organization_id, c.id, c.workflow_run_id, '', %(queue)s,
           jsonb_build_object('task_run_id', c.id, 'fencing_token', c.fencing_token, 'attempt', c.attempt,
                              'workflow_run_id', c.workflow_run_id, 'organization_id', c.organization_id),
           c.fencing_token, c.attempt, 0, '', clock_timestamp(),
           -- Reserved for the claimer's own publish right after its commit: the relay's
           -- drain leaves the row alone until then (see engine.relay.publish_claimed).
           CASE WHEN %(reserve)s::float8 > 0
                THEN clock_timestamp() + make_interval(secs => %(reserve)s::float8) END
    FROM claimed c
    -- uniq_outbox_per_taskrun_generation picks the winner of a race; the loser writes nothing.
    ON CONFLICT ON CONSTRAINT uniq_outbox_per_taskrun_generation DO NOTHING
    RETURNING id, task_run_id
"""

# The final SELECT of a statement with CTEs ``claimed`` and ``outbox``: a row per claimed
# generation, then a row per outbox row written (joined by ``_dispatches``: as a join here,
# planned with nested loops only, it would compare every claimed row with every outbox row).
_DISPATCH_ROWS = """
SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token, NULL::uuid FROM claimed c
UNION ALL
SELECT o.task_run_id, NULL, NULL, NULL, NULL, o.id FROM outbox o
"""


def _dispatches(rows: list[tuple]) -> list[Dispatch]:
    """The Dispatches of ``_DISPATCH_ROWS``' rows, in claim order."""
    outbox_ids = {row[0]: row[5] for row in rows if row[5] is not None}
    return [Dispatch(*row[:5], outbox_ids.get(row[0])) for row in rows if row[5] is None]


# --- Claim (ready -> running) + outbox, one statement ---------------------------------------

_CLAIM_SQL = """
WITH picked AS (
    SELECT id FROM core_taskrun
    WHERE state = 'ready' AND (not_before IS NULL OR not_before <= clock_timestamp())
      {id_filter}
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED                       -- idx_taskrun_state_age: oldest ready first
), claimed AS (
    UPDATE core_taskrun t
    SET state = 'running', fencing_token = t.fencing_token + 1, lease_owner = %(owner)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s), not_before = NULL
    FROM picked
    WHERE t.id = picked.id AND (t.state || '') = 'ready'      -- by primary key (module docstring)
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token
""" + _OUTBOX_CTE + """), tr AS (
    SELECT c.*, 'claimed'::text AS ev_kind, 'ready'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('lease_owner', %(owner)s::text) AS ev_detail
    FROM claimed c
)
""" + _EVENTS_CTE + """
""" + _DISPATCH_ROWS


def claim_ready(
    *,
    limit: int,
    lease_seconds: float,
    owner: str,
    task_run_ids: Sequence[uuid.UUID] | None = None,
    reserve_seconds: float = 0.0,
) -> list[Dispatch]:
    """Move up to ``limit`` ready task runs to ``running`` and write one outbox row per
    new generation, all in one statement (the design brief's "Claim + dispatch").

    Oldest ready first (``idx_taskrun_state_age``) with ``FOR UPDATE SKIP LOCKED``, so
    any number of schedulers can run at once; ``task_run_ids`` restricts the claim to
    those rows (the fast path that dispatches a completed task's dependents in the
    completion's own transaction). Each claim bumps ``fencing_token`` and takes a lease
    of ``lease_seconds`` (the dispatch lease) that covers the time until a worker starts
    the attempt; the worker then takes its own, shorter, heartbeated lease.
    With ``reserve_seconds`` > 0 the outbox rows are reserved that long for the caller,
    who publishes them itself after the commit (``engine.relay.publish_claimed``); the
    relay's drain takes them only if that has not happened by then.
    Returns the claimed generations; never raises for a lost race.
    """
    params: dict[str, Any] = {
        "limit": limit,
        "owner": owner,
        "lease": float(lease_seconds),
        "queue": TASK_QUEUE,
        "reserve": float(reserve_seconds),
    }
    id_filter = ""
    if task_run_ids is not None:
        if not task_run_ids:
            return []
        id_filter = "AND id = ANY(%(ids)s)"
        params["ids"] = list(task_run_ids)
    rows = _run_prepared([_CLAIM_SQL.format(id_filter=id_filter)], params)[0]
    return _dispatches(rows)


# --- Start an attempt (at most once per generation) ------------------------------------------

# Starts one or more generations at once: ``sreq`` holds (task_run_id, fencing_token,
# worker) triples with distinct task-run ids. The CTEs (continuing a WITH list), the
# events' rows, and the final SELECT are kept apart so that _START_SUCCEED_SQL can run
# them beside the successes' in one statement.
_STARTED_CTES = """
sreq AS (
    -- One instant per start (at): started_at and the lease are both counted from it, so a
    -- lease that ends at the timeout is exactly started_at + timeout_seconds (expire_lease).
    SELECT a.*, clock_timestamp() AS at
    FROM unnest(%(start_ids)s::uuid[], %(start_tokens)s::bigint[], %(owners)s::text[],
                %(start_outbox)s::uuid[]) AS a(id, token, owner, outbox_id)
), started AS (
    UPDATE core_taskrun t
    SET started_fencing_token = t.fencing_token, started_at = sreq.at, finished_at = NULL,
        lease_owner = sreq.owner,
        -- The worker's lease, or the task's timeout when that is shorter (LEAST inside, so
        -- a timeout of any size never makes a timestamp out of PostgreSQL's range).
        lease_expires_at = sreq.at + make_interval(
            secs => LEAST(COALESCE(k.timeout_seconds, %(worker_lease)s), %(worker_lease)s))
    FROM core_task k, sreq
    WHERE t.id = sreq.id AND k.id = t.task_id
      AND (t.state || '') = 'running' AND t.fencing_token = sreq.token   -- by primary key (module docstring)
      AND t.started_fencing_token IS DISTINCT FROM sreq.token   -- at most one start per generation
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id,
              k.key, k.type, k.config, k.max_attempts, k.timeout_seconds, sreq.owner, sreq.outbox_id
), delivered AS (
    -- A continuation (StartRequest.outbox_id): its outbox row, reserved for the thread
    -- that claimed it and never published, is stamped as delivered by its start.
    UPDATE core_outboxmessage o
    SET published_at = clock_timestamp(), publish_attempts = o.publish_attempts + 1, next_attempt_at = NULL
    FROM started s
    WHERE o.id = s.outbox_id AND o.published_at IS NULL
)"""
_STARTED_EVENTS = """
    SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token, 1 AS ev_ord,
           'started'::text AS ev_kind, 'running'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('worker', s.owner) AS ev_detail
    FROM started s"""
# What a worker needs to run each started attempt (StartedAttempt's fields, in order).
_STARTED_SELECT = """
SELECT s.id, s.workflow_run_id, s.organization_id, s.key, s.type, s.config, s.attempt, s.max_attempts,
       s.fencing_token, s.timeout_seconds, r.input,
       -- Dependency outputs by key, whole while their running total of JSON bytes (by key)
       -- fits %(upstream_bytes)s; each one past it as a summary (StartedAttempt.upstream).
       COALESCE((SELECT jsonb_object_agg(x.key, CASE WHEN x.total <= %(upstream_bytes)s::bigint THEN x.output
                    ELSE jsonb_build_object('$ref', 'task_output', 'task', x.key, 'bytes', x.bytes,
                                            'truncated', true) END)
                 FROM (SELECT uk.key, u.output, octet_length(u.output::text) AS bytes,
                              sum(octet_length(u.output::text)) OVER (ORDER BY uk.key) AS total
                       FROM core_taskdependency d
                       JOIN core_task uk ON uk.id = d.depends_on_id
                       JOIN core_taskrun u ON u.task_id = d.depends_on_id AND u.workflow_run_id = s.workflow_run_id
                       WHERE d.task_id = s.task_id) x), '{}'::jsonb),
       -- idx_event_taskrun_created: this generation's claim, for the dispatch-latency metric.
       EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT e.created_at FROM core_taskrunevent e
           WHERE e.task_run_id = s.id AND e.kind = 'claimed' AND e.fencing_token = s.fencing_token
           ORDER BY e.created_at DESC LIMIT 1)),
       EXISTS (SELECT 1 FROM core_taskdependency x WHERE x.depends_on_id = s.task_id)
FROM started s JOIN core_workflowrun r ON r.id = s.workflow_run_id"""

_START_SQL = (
    "WITH " + _STARTED_CTES + ", tr AS (" + _STARTED_EVENTS + "\n)\n" + _EVENTS_CTE + _STARTED_SELECT + "\n"
)


@dataclasses.dataclass(frozen=True)
class StartRequest:
    """One delivered execute message: start generation ``fencing_token`` as ``owner``."""

    task_run_id: uuid.UUID
    fencing_token: int
    owner: str
    # The generation's outbox row when no message was sent for it (a worker continuing
    # with a dependent its own success claimed): stamped as delivered if the start succeeds.
    outbox_id: uuid.UUID | None = None


def start_attempt(
    *, task_run_id: uuid.UUID, fencing_token: int, owner: str, lease_seconds: float
) -> StartedAttempt | None:
    """Mark generation ``fencing_token`` of a task run as started by ``owner`` and take
    the worker's lease (bounded by the task's ``timeout_seconds``).

    Returns None, after recording why, when the message is stale (the row moved to
    another generation or state) or a duplicate delivery of a generation that has
    already started: the broker may deliver twice, the handler runs once.
    One statement on the way that starts; may be called in autocommit mode.
    """
    return start_attempts([StartRequest(task_run_id, fencing_token, owner)], lease_seconds=lease_seconds)[0]


def start_attempts(
    requests: Sequence[StartRequest], *, lease_seconds: float, connection_attempts: int = 0
) -> list[StartedAttempt | None]:
    """``start_attempt`` for several messages at once (a worker process's threads that
    received messages at the same time): one statement and one commit start them all.
    Returns, in order, each request's StartedAttempt or None (stale or duplicate, recorded
    like ``start_attempt`` does). Of requests naming the same task run, only the first
    can start; the others are judged against the row afterwards, one by one.
    In autocommit mode the statement that starts is its own transaction, retried on a
    deadlock (and on a lost connection, ``connection_attempts`` times); inside a
    transaction it runs in it.
    """
    started, _results, _claimed = start_and_complete(
        starts=requests, successes=(), worker_lease_seconds=lease_seconds, dispatch_lease_seconds=0.0,
        owner="", connection_attempts=connection_attempts,
    )
    return started


def _record_ignored_start(task_run_id: uuid.UUID, fencing_token: int) -> None:
    current = _fetch(
        "SELECT workflow_run_id, state, fencing_token, started_fencing_token FROM core_taskrun WHERE id = %s",
        [task_run_id],
    )
    if not current:
        return
    run_id, state, token, started_token = current[0]
    duplicate = token == fencing_token and started_token == fencing_token
    record_run_event(
        workflow_run_id=run_id,
        task_run_id=task_run_id,
        kind="duplicate_delivery_ignored" if duplicate else "stale_dispatch_ignored",
        from_state=state,
        to_state=state,
        fencing_token=fencing_token,
        detail={"message_fencing_token": fencing_token, "current_fencing_token": token, "state": state},
    )


def heartbeat(*, leases: Iterable[tuple[uuid.UUID, int]], lease_seconds: float) -> set[uuid.UUID]:
    """Extend the leases of running attempts, one statement for all of them.

    ``leases`` is (task_run_id, fencing_token) pairs. A lease is never extended past
    the attempt's ``started_at + timeout_seconds``, so a hung handler times out.
    Returns the ids whose lease was extended; the others were reaped, cancelled or
    moved to a newer generation, and their worker no longer owns them.
    May be called outside a transaction (autocommit).
    """
    pairs = list(leases)
    if not pairs:
        return set()
    rows = _fetch(
        """
        UPDATE core_taskrun t
        SET lease_expires_at = LEAST(
            clock_timestamp() + make_interval(secs => %(lease)s),
            -- started_at + timeout_seconds, the timeout bounded first by what the LEAST can
            -- pick anyway (elapsed + lease), so no timestamp out of range is ever computed.
            CASE WHEN k.timeout_seconds IS NULL THEN 'infinity'::timestamptz
                 ELSE t.started_at + make_interval(secs => LEAST(
                     k.timeout_seconds, EXTRACT(EPOCH FROM clock_timestamp() - t.started_at)::float8 + %(lease)s))
            END)
        FROM core_task k, unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS a(id, token)
        WHERE t.id = a.id AND t.fencing_token = a.token AND (t.state || '') = 'running' AND k.id = t.task_id
          AND t.lease_expires_at > clock_timestamp()   -- an expired lease belongs to the reaper now
        RETURNING t.id
        """,
        {"ids": [p[0] for p in pairs], "tokens": [p[1] for p in pairs], "lease": float(lease_seconds)},
    )
    return {r[0] for r in rows}


# --- Complete an attempt --------------------------------------------------------------------

# Successful completions of one or more generations: ``req`` holds (task_run_id,
# fencing_token, output as JSON text) triples. Matches only a generation that started.
_DONE_CTES = """
creq AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[], %(outputs)s::text[]) AS a(id, token, output)
), done AS (
    UPDATE core_taskrun t
    SET state = 'succeeded', output = creq.output::jsonb, error = '', finished_at = clock_timestamp(),
        lease_owner = NULL, lease_expires_at = NULL, not_before = NULL
    FROM creq
    WHERE t.id = creq.id AND (t.state || '') = 'running' AND t.fencing_token = creq.token   -- by primary key
      AND t.started_fencing_token = creq.token
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state
)"""
_DONE_EVENTS = """
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, 0 AS ev_ord,
           'succeeded'::text AS ev_kind, 'running'::text AS ev_from, 'succeeded'::text AS ev_to,
           '{}'::jsonb AS ev_detail
    FROM done d"""

_SUCCEED_SQL = (
    "WITH " + _DONE_CTES + ", tr AS (" + _DONE_EVENTS + "\n)\n" + _EVENTS_CTE
    + "\nSELECT id, fencing_token, workflow_run_id, state FROM done\n"
)

# Successes and starts in one statement: both conditional UPDATEs (never the same row: a
# success needs the generation started, a start needs it not started), then one bump of
# each run's event counter for both, successes' events first. The run row is locked at
# the end of the statement, after both UPDATEs, instead of from the first statement's
# end through the whole second one. Rows: ('d', id, workflow_run_id, state at [4],
# fencing_token at [9]) per success, padded with NULLs to _STARTED_SELECT's width, then
# ('s', *_STARTED_SELECT's row) per start.
_START_SUCCEED_SQL = (
    "WITH " + _STARTED_CTES + ", " + _DONE_CTES + ", tr AS (" + _DONE_EVENTS + "\n    UNION ALL" + _STARTED_EVENTS
    + "\n)\n" + _EVENTS_CTE_ORDERED.format(order="tr.ev_ord, tr.id")
    + "\nSELECT 'd', d.id, d.workflow_run_id, NULL, d.state, NULL, NULL, NULL, NULL, d.fencing_token,"
    " NULL, NULL, NULL, NULL, NULL FROM done d\nUNION ALL\n"
    + _STARTED_SELECT.replace("\nSELECT s.id,", "\nSELECT 's', s.id,", 1) + "\n"
)


# A failed attempt: retried (back to ready, attempt + 1, exponential backoff) while
# attempts remain and ``retryable``; otherwise terminal ``failed``. SET expressions
# read the row's old values, so ``t.attempt < k.max_attempts`` is about this attempt.
_FAIL_SQL = """
WITH done AS (
    UPDATE core_taskrun t
    SET state = CASE WHEN %(retryable)s AND t.attempt < k.max_attempts THEN 'ready' ELSE 'failed' END,
        attempt = CASE WHEN %(retryable)s AND t.attempt < k.max_attempts THEN t.attempt + 1 ELSE t.attempt END,
        not_before = CASE WHEN %(retryable)s AND t.attempt < k.max_attempts
            -- Doubling per attempt, up to MAX_RETRY_BACKOFF_SECONDS (engine.definitions).
            THEN clock_timestamp() + make_interval(
                secs => LEAST(k.retry_backoff_seconds * power(2, t.attempt - 1), """ + str(MAX_RETRY_BACKOFF_SECONDS) + """))
            ELSE NULL END,
        finished_at = CASE WHEN %(retryable)s AND t.attempt < k.max_attempts THEN NULL ELSE clock_timestamp() END,
        error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
    FROM core_task k
    WHERE t.id = %(id)s AND k.id = t.task_id AND t.state = 'running' AND t.fencing_token = %(token)s
      {extra}
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state,
              t.not_before
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id,
           CASE WHEN d.state = 'ready' THEN d.attempt - 1 ELSE d.attempt END AS attempt, d.fencing_token,
           %(kind)s::text AS ev_kind, 'running'::text AS ev_from, d.state AS ev_to,
           jsonb_build_object('error', %(error)s::text, 'retry_at', d.not_before) AS ev_detail
    FROM done d
)
""" + _EVENTS_CTE + """
SELECT id, workflow_run_id, task_id, state, attempt, not_before FROM done
"""


# Derive the terminal state of each run in ``{runs}`` (a query of run ids, column ``id``)
# none of whose task runs is open. The open check probes idx_taskrun_run_state for the
# three open states and stops at the first live one, so it costs the same for a 10-task
# run and a 5,000-task one; failed/cancelled rows are counted only for a run that is done.
# Run after the run's event-counter bump (see the module docstring).
_FINISH_SQL = """
WITH runs AS (
    {runs}
), done_runs AS (
    -- One probe of idx_taskrun_run_state per run. LATERAL ... LIMIT 1 keeps it a per-run
    -- probe (as an anti-join the planner may read every open task run of every run), and
    -- ORDER BY state makes that index the cheapest way in (on the run's foreign-key index
    -- it would read the run's finished task runs too, one heap fetch each).
    SELECT r.id, c.failed, c.cancelled
    FROM runs r
    LEFT JOIN LATERAL (SELECT 1 AS one FROM core_taskrun t
                       WHERE t.workflow_run_id = r.id AND t.state IN ('pending', 'ready', 'running')
                       ORDER BY t.state LIMIT 1) o ON true
    -- Counted once per run, when it is done: one pass over its task runs.
    CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE t.state = 'failed') AS failed,
                               count(*) FILTER (WHERE t.state = 'cancelled') AS cancelled
                        FROM core_taskrun t WHERE t.workflow_run_id = r.id AND o.one IS NULL) c
    WHERE o.one IS NULL
), prev AS (
    SELECT r.id, r.state FROM core_workflowrun r JOIN done_runs d ON d.id = r.id
), fin AS (
    UPDATE core_workflowrun r
    SET state = CASE WHEN c.failed > 0 THEN 'failed' WHEN c.cancelled > 0 THEN 'cancelled'
                     ELSE 'succeeded' END,
        finished_at = clock_timestamp(),
        last_event_seq = r.last_event_seq + 1,
        error = CASE WHEN c.failed > 0 THEN c.failed || ' task(s) failed' ELSE '' END
    FROM done_runs c, prev p
    WHERE r.id = c.id AND p.id = r.id AND r.state IN ('running', 'pending')
    RETURNING r.id, r.organization_id, r.state, r.last_event_seq, p.state AS old_state
), ev AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at)
    SELECT gen_random_uuid(), f.organization_id, f.id, NULL, f.last_event_seq, 'run_finished',
           f.old_state, f.state, NULL, NULL, '{{}}'::jsonb, clock_timestamp()
    FROM fin f
)
SELECT id, state FROM fin
"""


# The (run, task) of each generation of this batch that is now succeeded.
_SUCCEEDED_ME = """
SELECT DISTINCT t.workflow_run_id AS run, t.task_id AS task
FROM core_taskrun t JOIN unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS a(id, token)
     ON t.id = a.id AND t.fencing_token = a.token
WHERE (t.state || '') = 'succeeded'   -- by primary key (module docstring)
"""

# The dependents of the tasks that just succeeded whose dependencies have all
# succeeded, promoted and claimed at once: pending -> running with the fencing token
# bumped and the dispatch lease, one outbox row per new generation, and the two events
# the separate steps write ('promoted' pending -> ready with the old token, then
# 'claimed' ready -> running with the new one; a run's promoted events come before its
# claimed ones, as when _PROMOTE_SQL and _CLAIM_SQL run one after the other). One row
# version per dependent instead of two.
_PROMOTE_CLAIM_SQL = """
WITH me AS (""" + _SUCCEEDED_ME + """), claimed AS (
    UPDATE core_taskrun d
    SET state = 'running', fencing_token = d.fencing_token + 1, lease_owner = %(owner)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s), not_before = NULL
    FROM me JOIN core_taskdependency dep ON dep.depends_on_id = me.task
    -- Each dependent found by (run, task) (uniq_taskrun_per_run_task), not by scanning the
    -- run's pending rows; a dependent of two of these tasks is updated once.
    WHERE d.workflow_run_id = me.run AND d.task_id = dep.task_id AND (d.state || '') = 'pending'
      AND NOT EXISTS (
          SELECT 1 FROM core_taskdependency e
          JOIN core_taskrun u ON u.workflow_run_id = d.workflow_run_id AND u.task_id = e.depends_on_id
          WHERE e.task_id = d.task_id AND u.state <> 'succeeded')
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token
""" + _OUTBOX_CTE + """), tr AS (
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token - 1 AS fencing_token,
           0 AS ev_ord, 'promoted'::text AS ev_kind, 'pending'::text AS ev_from, 'ready'::text AS ev_to,
           '{}'::jsonb AS ev_detail
    FROM claimed c
    UNION ALL
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
           1, 'claimed', 'ready', 'running', jsonb_build_object('lease_owner', %(owner)s::text)
    FROM claimed c
)
""" + _EVENTS_CTE_ORDERED.format(order="tr.ev_ord, tr.id") + """
""" + _DISPATCH_ROWS

# Successful completions in one round trip and one transaction (see _run_prepared): the
# conditional UPDATE + events; then, each statement with a fresh snapshot taken after the
# runs' event counters were bumped, promotion and claim of the dependents with one outbox
# row per generation, and the terminal state of each run left with nothing open. The
# statements after the first are idempotent: what they do after a stale or duplicate
# completion was due anyway.
_SUCCEED_STATEMENTS = (
    _SUCCEED_SQL,
    _PROMOTE_CLAIM_SQL,
    _FINISH_SQL.format(runs="SELECT DISTINCT workflow_run_id AS id FROM core_taskrun WHERE id = ANY(%(ids)s)"),
)

@dataclasses.dataclass(frozen=True)
class SuccessRequest:
    """A handler that returned: generation ``fencing_token`` succeeded with ``output``."""

    task_run_id: uuid.UUID
    fencing_token: int
    output: Any = None
    # False when no task depends on this one (``StartedAttempt.has_dependents``): a batch
    # of such successes skips the promote-and-claim statement.
    has_dependents: bool = True
    # ``output`` already encoded as JSON text (``engine.runtime.encode_output``): stored
    # as it is instead of encoding ``output`` again.
    output_json: str | None = None


def _json_text(value: Any) -> str:
    """``value`` as JSON text for a jsonb column (NULs stripped, like ``jsonb_safe``)."""
    try:
        return json.dumps(strip_nul(value), allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"NaN and Infinity cannot be stored as JSON ({exc})") from exc


def _in_own_transaction[T](fn: Callable[[], T], connection_attempts: int) -> T:
    """``fn`` retried as its own transaction in autocommit mode, or as is inside a caller's."""
    if connection.in_atomic_block:
        return fn()
    return autocommit_retry(fn, connection_attempts=connection_attempts)


def complete_successes(
    requests: Sequence[SuccessRequest],
    *,
    lease_seconds: float,
    owner: str,
    connection_attempts: int = 0,
    reserve_seconds: float = 0.0,
) -> tuple[list[CompletionResult], tuple[Dispatch, ...]]:
    """Record several successful completions at once (a worker process's threads whose
    handlers returned at the same time): one round trip and one commit (see
    ``_SUCCEED_STATEMENTS``), with the same checks, events and consequences as
    ``complete_attempt(succeeded=True)`` for each. Returns each request's result, in
    order, and the dependents claimed for all of them (publish them after the commit;
    ``reserve_seconds`` as for ``claim_ready``).
    A stale request is recorded as ``stale_completion_rejected`` afterwards.

    In autocommit mode the script is its own transaction and is retried on a deadlock
    (and on a lost connection, ``connection_attempts`` times); inside a transaction it
    runs in it.
    """
    _started, results, claimed = start_and_complete(
        starts=(), successes=requests, worker_lease_seconds=0.0, dispatch_lease_seconds=lease_seconds,
        owner=owner, connection_attempts=connection_attempts, reserve_seconds=reserve_seconds,
    )
    return results, claimed


def _upstream_bytes() -> int:
    """FLOWFORGE_MAX_UPSTREAM_BYTES: bytes of dependency outputs (JSON text) one task is
    handed whole (StartedAttempt.upstream)."""
    from django.conf import settings

    return int(getattr(settings, "FLOWFORGE_MAX_UPSTREAM_BYTES", 1024 * 1024))


def start_and_complete(
    *,
    starts: Sequence[StartRequest],
    successes: Sequence[SuccessRequest],
    worker_lease_seconds: float,
    dispatch_lease_seconds: float,
    owner: str,
    connection_attempts: int = 0,
    reserve_seconds: float = 0.0,
) -> tuple[list[StartedAttempt | None], list[CompletionResult], tuple[Dispatch, ...]]:
    """``complete_successes(successes)``, then ``start_attempts(starts)``, in one
    transaction and one round trip: what a worker process's threads have to record at
    the same moment, some having received a message and some having seen their handler
    return, costs one commit and one bump of each run's event counter per statement.

    ``worker_lease_seconds`` is the lease the starts take; ``dispatch_lease_seconds``,
    ``owner`` and ``reserve_seconds`` apply to the dependents the successes claim (as in
    ``claim_ready``). Returns each start's StartedAttempt or None, each success's
    CompletionResult (both in request order) and the generations claimed (publish them
    after the commit). With both kinds, the two UPDATEs are one statement
    (``_START_SUCCEED_SQL``), so the runs' rows are locked only after both have run. Stale and duplicate requests are recorded afterwards, each in its
    own transaction. In autocommit mode the whole is its own transaction, retried on a
    deadlock (and on a lost connection, ``connection_attempts`` times); inside a
    transaction it runs in it.
    """
    first: dict[uuid.UUID, int] = {}
    for i, req in enumerate(starts):
        first.setdefault(req.task_run_id, i)
    to_start = [starts[i] for i in first.values()]
    # One parameter dict for every statement (their names do not clash).
    params: dict[str, Any] = {}
    statements: list[str] = []
    if successes:
        params.update(
            ids=[r.task_run_id for r in successes],
            tokens=[r.fencing_token for r in successes],
            outputs=[r.output_json if r.output_json is not None else _json_text(r.output) for r in successes],
            owner=owner,
            lease=float(dispatch_lease_seconds),
            queue=TASK_QUEUE,
            reserve=float(reserve_seconds),
        )
        # Without dependents to promote, only the succeed and finish statements.
        statements += _SUCCEED_STATEMENTS if any(r.has_dependents for r in successes) else _SUCCEED_STATEMENTS[::2]
    if to_start:
        params.update(
            start_ids=[r.task_run_id for r in to_start],
            start_tokens=[r.fencing_token for r in to_start],
            owners=[r.owner for r in to_start],
            start_outbox=[r.outbox_id for r in to_start],
            worker_lease=float(worker_lease_seconds),
            upstream_bytes=_upstream_bytes(),
        )
        if successes:  # both UPDATEs in the first statement (_START_SUCCEED_SQL)
            statements[0] = _START_SUCCEED_SQL
        else:
            statements.append(_START_SQL)
    if not statements:
        return [], [], ()
    out = _in_own_transaction(lambda: _run_prepared(statements, params), connection_attempts)
    if successes and to_start:
        first_rows = out[0]
        done = [(r[1], r[9], r[2], r[4]) for r in first_rows if r[0] == "d"]
        start_rows = [r[1:] for r in first_rows if r[0] == "s"]
    else:
        done = out[0] if successes else []
        start_rows = out[0] if not successes else []
    finished = out[-1] if successes else []
    claimed = out[1] if successes and len(out) == 3 else []

    started = {
        (r[0], r[8]): StartedAttempt(
            task_run_id=r[0],
            workflow_run_id=r[1],
            organization_id=r[2],
            task_key=r[3],
            task_type=r[4],
            config=_json(r[5]) or {},
            attempt=r[6],
            max_attempts=r[7],
            fencing_token=r[8],
            timeout_seconds=r[9],
            run_input=_json(r[10]) or {},
            upstream=_json(r[11]) or {},
            dispatch_latency_seconds=float(r[12]) if r[12] is not None else None,
            has_dependents=r[13],
        )
        for r in start_rows
    }
    start_results: list[StartedAttempt | None] = []
    for i, req in enumerate(starts):
        attempt = started.get((req.task_run_id, req.fencing_token)) if first[req.task_run_id] == i else None
        if attempt is None:
            _in_own_transaction(
                lambda r=req: _record_ignored_start(r.task_run_id, r.fencing_token), connection_attempts
            )
        start_results.append(attempt)

    succeeded = {(row[0], row[1]): row for row in done}
    run_states = dict(finished)
    results: list[CompletionResult] = []
    for req in successes:
        row = succeeded.pop((req.task_run_id, req.fencing_token), None)
        if row is None:
            _in_own_transaction(
                lambda r=req: _record_stale_completion(
                    task_run_id=r.task_run_id, fencing_token=r.fencing_token, succeeded=True
                ),
                connection_attempts,
            )
            results.append(CompletionResult(accepted=False))
            continue
        results.append(CompletionResult(accepted=True, state=row[3], run_state=run_states.pop(row[2], None)))
    return start_results, results, tuple(_dispatches(claimed))


def complete_attempt(
    *,
    task_run_id: uuid.UUID,
    fencing_token: int,
    succeeded: bool,
    output: Any = None,
    error: str = "",
    retryable: bool = True,
    lease_seconds: float,
    owner: str,
) -> CompletionResult:
    """Finish generation ``fencing_token`` of a task run and advance its run.

    The UPDATE matches only the generation that started (``fencing_token`` and
    ``state = 'running'``): a stale worker's completion matches nothing, is recorded
    as a ``stale_completion_rejected`` event and returns ``accepted=False``.
    On success the dependents whose dependencies all succeeded become ready and are
    claimed here (one commit per hop); on a final failure the task's descendants are
    skipped; when nothing in the run is left open the run's terminal state is derived.
    ``lease_seconds`` is the dispatch lease of the dependents claimed here.
    ``output`` must be JSON-shaped; NUL characters are stripped (seed 001). A failure
    with ``retryable=False`` fails the task at once, whatever attempts remain.
    """
    if succeeded:
        results, dispatches = complete_successes(
            [SuccessRequest(task_run_id, fencing_token, output)], lease_seconds=lease_seconds, owner=owner
        )
        return dataclasses.replace(results[0], dispatches=dispatches)
    with transaction.atomic(savepoint=False):
        rows = _fetch(
            _FAIL_SQL.format(extra="AND t.started_fencing_token = %(token)s"),
            {
                "id": task_run_id,
                "token": fencing_token,
                "error": strip_nul(error)[:10_000],
                "retryable": retryable,
                "kind": "attempt_failed",
            },
        )
        if not rows:
            _record_stale_completion(task_run_id=task_run_id, fencing_token=fencing_token, succeeded=succeeded)
            return CompletionResult(accepted=False)
        return _advance_after(rows[0], lease_seconds=lease_seconds, owner=owner)


def _record_stale_completion(*, task_run_id: uuid.UUID, fencing_token: int, succeeded: bool) -> None:
    current = _fetch("SELECT workflow_run_id, state, fencing_token FROM core_taskrun WHERE id = %s", [task_run_id])
    if not current:
        return
    run_id, state, token = current[0]
    record_run_event(
        workflow_run_id=run_id,
        task_run_id=task_run_id,
        kind="stale_completion_rejected",
        from_state=state,
        to_state=state,
        fencing_token=fencing_token,
        detail={
            "completion_fencing_token": fencing_token,
            "current_fencing_token": token,
            "state": state,
            "outcome": "succeeded" if succeeded else "failed",
        },
    )


def _advance_after(row: tuple, *, lease_seconds: float, owner: str) -> CompletionResult:
    task_run_id, run_id, task_id, state, _attempt, not_before = row
    dispatches: list[Dispatch] = []
    retry_in = None
    if state == "succeeded":
        promoted = promote_dependents(workflow_run_id=run_id, task_id=task_id)
        if promoted:
            dispatches = claim_ready(
                limit=len(promoted), lease_seconds=lease_seconds, owner=owner, task_run_ids=promoted
            )
    elif state == "failed":
        skip_descendants(workflow_run_id=run_id, task_id=task_id, reason="upstream_failed")
    elif state == "ready" and not_before is not None:
        retry_in = max(0.0, (not_before - _db_now()).total_seconds())
    run_state = finish_run_if_done(workflow_run_id=run_id) if state in TERMINAL else None
    return CompletionResult(
        accepted=True, state=state, dispatches=tuple(dispatches), run_state=run_state, retry_in_seconds=retry_in
    )


def _db_now():
    return _fetch("SELECT clock_timestamp()", [])[0][0]


# --- Advance ------------------------------------------------------------------------------

_PROMOTE_SQL = """
WITH promoted AS (
    UPDATE core_taskrun d SET state = 'ready'
    WHERE d.workflow_run_id = %(run)s AND d.state = 'pending'
      AND d.task_id IN (SELECT task_id FROM core_taskdependency WHERE depends_on_id = %(task)s)
      AND NOT EXISTS (
          SELECT 1 FROM core_taskdependency e
          JOIN core_taskrun u ON u.workflow_run_id = d.workflow_run_id AND u.task_id = e.depends_on_id
          WHERE e.task_id = d.task_id AND u.state <> 'succeeded')
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token
), tr AS (
    SELECT p.*, 'promoted'::text AS ev_kind, 'pending'::text AS ev_from, 'ready'::text AS ev_to,
           '{}'::jsonb AS ev_detail
    FROM promoted p
)
""" + _EVENTS_CTE + """
SELECT id FROM promoted
"""


def promote_dependents(*, workflow_run_id: uuid.UUID, task_id: uuid.UUID) -> list[uuid.UUID]:
    """Move pending dependents of ``task_id`` whose dependencies have all succeeded to
    ``ready``. Returns their task-run ids."""
    return [r[0] for r in _fetch(_PROMOTE_SQL, {"run": workflow_run_id, "task": task_id})]


_SKIP_SQL = """
WITH RECURSIVE below(task_id) AS (
    SELECT task_id FROM core_taskdependency WHERE depends_on_id = %(task)s
    UNION
    SELECT e.task_id FROM core_taskdependency e JOIN below b ON e.depends_on_id = b.task_id
), open AS (
    SELECT d.id, d.state FROM core_taskrun d
    WHERE d.workflow_run_id = %(run)s AND d.state IN ('pending', 'ready')
      AND d.task_id IN (SELECT task_id FROM below)
    ORDER BY d.id
    FOR UPDATE
), skipped AS (
    UPDATE core_taskrun d SET state = 'skipped', finished_at = clock_timestamp(), not_before = NULL
    FROM open o
    WHERE d.id = o.id AND d.state IN ('pending', 'ready')
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, o.state AS old_state
), tr AS (
    SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token,
           'skipped'::text AS ev_kind, s.old_state AS ev_from, 'skipped'::text AS ev_to,
           jsonb_build_object('reason', %(reason)s::text) AS ev_detail
    FROM skipped s
)
""" + _EVENTS_CTE + """
SELECT count(*) FROM skipped
"""


def skip_descendants(*, workflow_run_id: uuid.UUID, task_id: uuid.UUID, reason: str) -> int:
    """Mark every not-yet-started descendant of ``task_id`` in the run ``skipped``: it can
    never run because something upstream failed. Returns how many were skipped."""
    return _fetch(_SKIP_SQL, {"run": workflow_run_id, "task": task_id, "reason": reason})[0][0]


def finish_run_if_done(*, workflow_run_id: uuid.UUID) -> str | None:
    """Derive and set the run's terminal state once none of its task runs is open
    (``idx_taskrun_run_state``): failed if any task failed, else cancelled if any was
    cancelled, else succeeded. Returns the new state, or None when the run is not
    finished (or was already finished by someone else)."""
    rows = _fetch(_FINISH_SQL.format(runs="SELECT %(run)s::uuid AS id"), {"run": workflow_run_id})
    return rows[0][1] if rows else None


# --- Reap expired leases ----------------------------------------------------------------------


# statement_timestamp(), not clock_timestamp(): a volatile function cannot bound an index
# scan, and the planner would then rather filter idx_taskrun_state_age's running rows.
# With a stable bound the partial idx_taskrun_lease_expiry serves the range and the order.
EXPIRED_LEASES_SQL = """
SELECT id, fencing_token FROM core_taskrun
WHERE state = 'running' AND lease_expires_at < statement_timestamp()   -- idx_taskrun_lease_expiry (partial)
ORDER BY lease_expires_at LIMIT %s
"""


def expired_leases(*, limit: int) -> list[tuple[uuid.UUID, int]]:
    """(task_run_id, fencing_token) of running rows whose lease has expired, oldest
    expiry first (``idx_taskrun_lease_expiry``). Read-only; may run outside a transaction."""
    return [(r[0], r[1]) for r in _fetch(EXPIRED_LEASES_SQL, [limit])]


def expire_lease(
    *, task_run_id: uuid.UUID, fencing_token: int, lease_seconds: float, owner: str
) -> CompletionResult:
    """Take back one expired lease (the design brief's "Reap").

    A generation that never started (its message was lost or is still queued) goes
    back to ``ready`` without using an attempt. A generation that started and ran
    out of lease (worker died, or ``timeout_seconds`` passed) fails this attempt: back
    to ``ready`` with a backoff while attempts remain, else ``failed`` (and the run
    advances). Either way the fencing token is bumped, so the old generation's
    completion can never match. Returns ``accepted=False`` when the row was no longer
    expired (heartbeat, completion or another reaper won).
    """
    never_started = _fetch(
        """
        WITH back AS (
            UPDATE core_taskrun t
            SET state = 'ready', fencing_token = t.fencing_token + 1, lease_owner = NULL, lease_expires_at = NULL
            WHERE t.id = %(id)s AND t.state = 'running' AND t.fencing_token = %(token)s
              AND t.lease_expires_at < clock_timestamp()
              AND t.started_fencing_token IS DISTINCT FROM t.fencing_token
            RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token
        ), tr AS (
            SELECT b.*, 'dispatch_expired'::text AS ev_kind, 'running'::text AS ev_from, 'ready'::text AS ev_to,
                   jsonb_build_object('reason', 'not started before its lease expired') AS ev_detail
            FROM back b
        )
        """
        + _EVENTS_CTE
        + "SELECT id FROM back",
        {"id": task_run_id, "token": fencing_token},
    )
    if never_started:
        return CompletionResult(accepted=True, state="ready", retry_in_seconds=0.0)
    timed_out = _fetch(
        """
        SELECT k.timeout_seconds IS NOT NULL
               -- Less a microsecond: an interval holds whole microseconds, a timeout may not.
               AND EXTRACT(EPOCH FROM t.lease_expires_at - t.started_at) >= k.timeout_seconds - 0.000001
        FROM core_taskrun t JOIN core_task k ON k.id = t.task_id WHERE t.id = %s
        """,
        [task_run_id],
    )
    if timed_out and timed_out[0][0]:
        error = "attempt timed out (timeout_seconds reached)"
        kind = "attempt_timed_out"
    else:
        error = "lease expired: the worker stopped heartbeating (crashed or lost its connection)"
        kind = "lease_expired"
    rows = _fetch(
        _FAIL_SQL.format(extra="AND t.lease_expires_at < clock_timestamp()").replace(
            "error = %(error)s, lease_owner",
            "fencing_token = t.fencing_token + 1, error = %(error)s, lease_owner",
        ),
        {"id": task_run_id, "token": fencing_token, "error": error, "retryable": True, "kind": kind},
    )
    if not rows:
        return CompletionResult(accepted=False)
    return _advance_after(rows[0], lease_seconds=lease_seconds, owner=owner)


def fail_undelivered(
    *, task_run_id: uuid.UUID, fencing_token: int, error: str, lease_seconds: float, owner: str
) -> CompletionResult:
    """Fail a claimed generation whose dispatch was dead-lettered (the broker refused it
    MAX_PUBLISH_ATTEMPTS times): the task run fails at once with ``error`` rather than
    waiting on a message that will never arrive, and the run advances (its dependents
    are skipped). Matches only that generation, still claimed and never started;
    returns ``accepted=False`` otherwise (it started after all, or moved on)."""
    rows = _fetch(
        _FAIL_SQL.format(extra="AND t.started_fencing_token IS DISTINCT FROM %(token)s"),
        {"id": task_run_id, "token": fencing_token, "error": strip_nul(error)[:10_000], "retryable": False,
         "kind": "dispatch_dead_lettered"},
    )
    if not rows:
        return CompletionResult(accepted=False)
    return _advance_after(rows[0], lease_seconds=lease_seconds, owner=owner)


# --- Cancel -----------------------------------------------------------------------------------


def cancel_run(*, workflow_run_id: uuid.UUID, reason: str, final_state: str = "cancelled") -> bool:
    """Cancel a run: every open task run (pending, ready, running) becomes ``cancelled``
    with its fencing token bumped, so a running worker's next heartbeat finds it
    gone and its completion is rejected as stale; then the run becomes ``final_state``
    (``cancelled``, or ``failed`` when the run is stopped for timing out) with
    ``reason`` as its error. Returns False when the run was already terminal (the
    cancel lost a race with the run's completion and changed nothing)."""
    if final_state not in ("cancelled", "failed"):
        raise ValueError(f"final_state must be cancelled or failed, not {final_state!r}")
    _fetch(
        """
        WITH open AS (
            -- Lock the open rows in id order first (fewer deadlocks with completions) and
            -- remember their state for the events.
            SELECT t.id, t.state FROM core_taskrun t
            WHERE t.workflow_run_id = %(run)s AND t.state IN ('pending', 'ready', 'running')
              AND EXISTS (SELECT 1 FROM core_workflowrun r WHERE r.id = t.workflow_run_id
                          AND r.state IN ('pending', 'running'))
            ORDER BY t.id
            FOR UPDATE
        ), c AS (
            UPDATE core_taskrun t
            SET state = 'cancelled', finished_at = clock_timestamp(), lease_owner = NULL,
                lease_expires_at = NULL, not_before = NULL,
                fencing_token = t.fencing_token + CASE WHEN t.state = 'running' THEN 1 ELSE 0 END
            FROM open o
            WHERE t.id = o.id AND t.state IN ('pending', 'ready', 'running')
            RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, o.state AS old_state
        ), tr AS (
            SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
                   'cancelled'::text AS ev_kind, c.old_state AS ev_from, 'cancelled'::text AS ev_to,
                   jsonb_build_object('reason', %(reason)s::text) AS ev_detail
            FROM c
        )
        """
        + _EVENTS_CTE
        + "SELECT count(*) FROM c",
        {"run": workflow_run_id, "reason": reason},
    )
    rows = _fetch(
        """
        WITH prev AS (
            SELECT id, state FROM core_workflowrun WHERE id = %(run)s FOR UPDATE
        ), fin AS (
            UPDATE core_workflowrun r SET state = %(final)s, finished_at = clock_timestamp(),
                   error = %(reason)s, last_event_seq = r.last_event_seq + 1
            FROM prev p
            WHERE r.id = p.id AND r.state IN ('pending', 'running')
            RETURNING r.id, r.organization_id, r.last_event_seq, p.state AS old_state
        )
        INSERT INTO core_taskrunevent
            (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
             attempt, fencing_token, detail, created_at)
        SELECT gen_random_uuid(), f.organization_id, f.id, NULL, f.last_event_seq, 'run_finished', f.old_state,
               %(final)s, NULL, NULL, jsonb_build_object('reason', %(reason)s::text), clock_timestamp()
        FROM fin f
        RETURNING id
        """,
        {"run": workflow_run_id, "reason": reason, "final": final_state},
    )
    return bool(rows)
