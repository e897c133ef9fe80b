"""The prepared-statement driver of the engine's hot path: how a repository's statements
reach PostgreSQL.

``run_prepared`` sends a whole transaction (its statements, their parameters rendered as
literals, BEGIN/COMMIT and the planner settings) as one simple-protocol message, each
statement PREPAREd once per connection and planned once (a generic plan, under
``INDEX_PROBES_ONLY``). ``fetch`` runs one statement through Django's cursor (the paths
that are not hot). ``autocommit_retry`` and ``in_own_transaction`` retry a transaction
on a deadlock or a lost connection.

Statements come from ``engine.sql.queries``; this module never composes SQL, it only
compacts a statement's text (``compact``) and numbers its parameters (``prepared_form``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from django.db import connection

from engine.db import retry_transient
from engine.sql import queries


def fetch(sql: str, params: Any) -> list[tuple]:
    """Run ``sql`` (psycopg parameters) through Django's cursor, in the caller's
    transaction or autocommit; returns its rows ([] for a statement without a result)."""
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


@functools.cache
def compact(sql: str) -> str:
    """``sql`` without its ``--`` comments and with each run of whitespace made one space:
    the text each hot statement is prepared with (``prepared_form``) and named after.
    None of the statements has ``--`` inside a string literal."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


# The hot statements are planned with index probes only: psycopg keeps each one
# prepared on its connection and PostgreSQL keeps its plan, so a plan made while a
# table was nearly empty (a sequential scan, or a hash or merge join over one) would
# read the whole table on every later call. Set for the transaction only; inside a
# caller's transaction the settings' configured values are restored afterwards.
INDEX_PROBES_ONLY = compact(queries["planner_index_probes_only"])
PLANNER_DEFAULTS = compact(queries["planner_defaults"])

# The names of the statements this module has prepared (SQL PREPARE) on each connection.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

# A psycopg parameter, or a doubled percent sign (one literal "%").
_PARAMETER = re.compile(r"%\((\w+)\)s|%%")


@functools.cache
def prepared_form(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """(name, text, parameter names) of hot statement ``sql`` prepared in SQL: its
    compacted text with each ``%(name)s`` made ``$n`` (n in order of first use) and each
    ``%%`` made ``%``, the names in that order, and a statement name derived from the text."""
    text = compact(sql)
    names: list[str] = []

    def placeholder(match: re.Match) -> str:
        if match.group(1) is None:
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return "ff_" + hashlib.sha1(text.encode()).hexdigest()[:20], _PARAMETER.sub(placeholder, text), tuple(names)


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


def run_prepared(statements: Sequence[str], params: dict[str, Any]) -> list[list[tuple]]:
    """Run ``statements`` (each given the named ``params`` it uses) as one transaction in
    one message to the server, as prepared statements; returns each one's rows.

    The whole transaction goes as one simple-protocol query string: ``BEGIN`` (in
    autocommit mode), the planner settings (``INDEX_PROBES_ONLY``), ``EXECUTE name(...)``
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
    own = not connection.in_atomic_block and connection.get_autocommit()
    with connection.wrap_database_errors:
        connection.ensure_connection()
        pg = connection.connection
        known = _PREPARED.setdefault(pg, set())
        literal = psycopg.ClientCursor(pg)
        # The fast renderer's quoting (doubled quotes only) is right only with standard strings.
        fast = pg.info.parameter_status("standard_conforming_strings") == "on"
        parts = ["BEGIN"] if own else []
        parts.append(INDEX_PROBES_ONLY)
        wanted: list[int] = []
        for sql in statements:
            name, text, order = prepared_form(sql)
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
                parts.append(f"EXECUTE {name}({', '.join(_literal(params[p], literal) for p in order)})")
            else:
                args = ", ".join(f"%({p})s" for p in order)
                parts.append(literal.mogrify(f"EXECUTE {name}({args})", params))
        parts.append("COMMIT" if own else PLANNER_DEFAULTS)
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
    ``engine.db.atomic_retry``. Re-raises the last error when the retries are spent.

    For the hot path's one-round-trip transitions (``task_runs.claim_ready_many``,
    ``task_runs.start_and_complete_many``): no BEGIN and COMMIT round trips, and no row
    lock held while the client is scheduled to send its COMMIT. Only safe for ``fn``
    whose every effect is one such transaction, or a sequence that is correct when
    retried (both named above are).
    """
    return retry_transient(fn, atomic=False, attempts=attempts, connection_attempts=connection_attempts,
                           base_delay_seconds=base_delay_seconds)


def in_own_transaction[T](fn: Callable[[], T], connection_attempts: int) -> T:
    """``fn`` retried as its own transaction in autocommit mode (``autocommit_retry``), or
    run as is inside a caller's transaction."""
    if connection.in_atomic_block:
        return fn()
    return autocommit_retry(fn, connection_attempts=connection_attempts)
