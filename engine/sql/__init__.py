"""Every SQL statement the engine's repositories run, by name (after procrastinate's
``procrastinate/sql/__init__.py``).

The ``.sql`` files beside this module are grouped by the table their statements write
or read (``task_runs.sql``, ``runs.sql``, ``events.sql``, ``outbox.sql``,
``subscriptions.sql``, ``idempotency_keys.sql``, ``triggers.sql``, ``workflows.sql``;
``waiting.sql`` the wait reasons of ready task runs, ``metrics.sql`` the /metrics gauges, ``driver.sql`` the prepared-statement driver's
own). Each statement is written out whole under a header::

    -- name: task_run_claim_ready
    -- <one line: what it does; the seed index or key it relies on>
    WITH picked AS (...)
    ...;

Text before the first header is the file's preamble. ``queries[name]`` is the statement's
text as written (its own ``--`` comments included, the closing ``;`` left out), with
psycopg's ``%(name)s`` parameters; ``descriptions[name]`` is its one-line comment.
"""

from __future__ import annotations

import pathlib
import re

_HEADER = re.compile(r"^-- name: (\w+)[ \t]*\n", re.MULTILINE)


def parse(text: str, source: str = "<sql>") -> dict[str, tuple[str, str]]:
    """``{name: (description, statement)}`` of the statements in ``text`` (a ``.sql`` file).
    Raises ValueError for a statement without its one-line ``-- `` description, or with an
    empty body."""
    parts = _HEADER.split(text)[1:]  # [name, body, name, body, ...]
    out: dict[str, tuple[str, str]] = {}
    for name, body in zip(parts[::2], parts[1::2], strict=True):
        first, _, rest = body.partition("\n")
        statement = rest.strip().removesuffix(";").rstrip()
        if not first.startswith("-- ") or not first[3:].strip():
            raise ValueError(f"{source}: statement {name} has no '-- <what it does>' line under its name")
        if not statement:
            raise ValueError(f"{source}: statement {name} is empty")
        if name in out:
            raise ValueError(f"{source}: statement {name} is defined twice")
        out[name] = (first[3:].strip(), statement)
    return out


def _load() -> tuple[dict[str, str], dict[str, str]]:
    queries: dict[str, str] = {}
    descriptions: dict[str, str] = {}
    for path in sorted(pathlib.Path(__file__).parent.glob("*.sql")):
        for name, (description, statement) in parse(path.read_text(), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: statement {name} is defined twice")
            queries[name] = statement
            descriptions[name] = description
    return queries, descriptions


#: Statement text by name.
queries, descriptions = _load()
