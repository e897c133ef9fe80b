"""engine/sql: every statement written out whole under a name, the parts several
statements share written the same in each, and nothing in engine/ assembling SQL."""

from __future__ import annotations

import pathlib
import re

import pytest

from engine.definitions import MAX_RETRY_BACKOFF_SECONDS
from engine.repositories import driver
from engine.sql import descriptions, parse, queries

ENGINE = pathlib.Path(__file__).resolve().parents[2] / "engine"


def part(name: str, start: str, end: str) -> str:
    """The compacted text of statement ``name`` from ``start`` up to (not including) ``end``."""
    text = driver.compact(queries[name])
    i = text.index(start)
    return text[i:text.index(end, i)]


def test_the_loader_reads_names_descriptions_and_whole_statements():
    parsed = parse("-- preamble\n\n-- name: a_b\n-- Does a thing; pkey.\nSELECT 1\nFROM t;\n\n-- name: c\n-- C.\nSELECT 2;\n")
    assert parsed == {"a_b": ("Does a thing; pkey.", "SELECT 1\nFROM t"), "c": ("C.", "SELECT 2")}
    with pytest.raises(ValueError, match="no '-- <what it does>' line"):
        parse("-- name: x\nSELECT 1;\n")
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- name: x\n-- X.\nSELECT 1;\n-- name: x\n-- X.\nSELECT 2;\n")


# The relay's own transaction in two round trips (engine/sql/outbox.sql): each of these
# is one named statement framed by BEGIN / SET LOCAL ... / COMMIT, nothing else.
TRANSACTION_SCRIPTS = {
    "outbox_begin_get_pending": "outbox_get_pending",
    "outbox_begin_get_pending_among": "outbox_get_pending_among",
    "outbox_stamp_published_commit": "outbox_stamp_published",
    "outbox_stamp_failed_commit": "outbox_stamp_failed",
    "outbox_stamp_published_async": "outbox_stamp_published",
}
FRAMING = {"BEGIN", "SET LOCAL synchronous_commit = off", "COMMIT"}


def test_every_statement_has_a_description_and_no_semicolon_inside():
    assert len(queries) >= 53
    for name, sql in queries.items():
        assert descriptions[name], name
        assert "{" not in re.sub(r"'[^']*'", "", driver.compact(sql)), name  # no template holes left
        if name in TRANSACTION_SCRIPTS:
            continue
        assert ";" not in driver.compact(sql), name  # one statement each


def test_a_transaction_script_is_its_named_statement_framed_and_nothing_else():
    for name, statement in TRANSACTION_SCRIPTS.items():
        parts = [p.strip() for p in driver.compact(queries[name]).split(";") if p.strip()]
        body = [p for p in parts if p not in FRAMING]
        assert body == [driver.compact(queries[statement])], name
        assert parts[-1] == "COMMIT" or parts[0] == "BEGIN", name


def test_the_shared_parts_are_written_the_same_in_each_statement():
    events = {name: part(name, "ev_rows AS (", "SELECT gen_random_uuid(), e.organization_id")
              for name in queries if "ev_rows AS (" in queries[name]}
    # main's 11, task_run_note_waiting (engine/sql/waiting.sql), event_append_redelivered_many,
    # task_run_settle_dependents and task_run_skip_condition_false (issue 19, trigger rules);
    # engine/sql/recovery.sql's task_run_reopen_many, task_run_mark_succeeded, task_run_mark_skipped
    assert len(events) == 18
    assert len({text.replace("ORDER BY tr.ev_ord, tr.id", "ORDER BY tr.id") for text in events.values()}) == 1
    assert all(text.endswith("INSERT INTO core_taskrunevent (id, organization_id, workflow_run_id, task_run_id, seq, "
                              "kind, from_state, to_state, attempt, fencing_token, detail, created_at, run_created_at) ")
               for text in events.values())

    # One statement claims (ready -> running) and writes outbox rows: the fair claim.
    assert [n for n in queries if "INSERT INTO core_outboxmessage" in queries[n]] == ["task_run_claim_fair"]
    # (run_admit_queued sets a queued *run* running, run_reopen a finished one: core_workflowrun,
    # no task run.)
    assert [n for n in queries if "SET state = 'running'" in queries[n]
            and n not in ("run_admit_queued", "run_reopen")] == ["task_run_claim_fair"]
    assert "UPDATE core_taskrun" not in queries["run_reopen"]
    assert "UPDATE core_taskrun t SET state = 'ready'" in driver.compact(queries["run_admit_queued"])

    starts = ("task_run_start_many", "task_run_start_and_succeed_many")
    assert len({part(n, "sreq AS (", "), creq AS (" if "succeed" in n else "), tr AS (") for n in starts}) == 1
    # What a worker needs of each start: the statements' last SELECT, from its columns on.
    assert len({driver.compact(queries[n]).split("s.id, s.workflow_run_id, s.organization_id, s.key")[1]
                for n in starts}) == 1
    assert len({part(n, "SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token, 1 AS ev_ord",
                     "FROM started s") for n in starts}) == 1

    succeeds = ("task_run_succeed_many", "task_run_start_and_succeed_many")
    assert len({part(n, "creq AS (", "), tr AS (") for n in succeeds}) == 1
    assert len({part(n, "SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, 0 AS ev_ord",
                     "FROM done d") for n in succeeds}) == 1

    fails = ("task_run_fail_attempt", "task_run_fail_undelivered", "task_run_fail_expired_lease")
    assert len({part(n, "), tr AS (", "SELECT gen_random_uuid()") for n in fails}) == 1
    assert len({part(n, "SET state", "FROM core_task k").replace("fencing_token = t.fencing_token + 1, ", "")
                for n in fails}) == 1

    finishes = ("run_finish_if_done", "run_finish_if_done_many")
    # The probe for an open task run is written the same; the batch's form then counts as
    # main did and leaves a run with a failure to run_finish_if_done (issue 19: was it handled?),
    # which also selects the failed tasks' keys (named in the run's error).
    assert len({part(n, "FROM runs r LEFT JOIN LATERAL", "CROSS JOIN LATERAL (SELECT count(*)") for n in finishes}) == 1
    assert "SELECT r.id, c.failed, c.keys, c.cancelled FROM runs r" in driver.compact(queries["run_finish_if_done"])
    assert "AND c.failed = 0" in driver.compact(queries["run_finish_if_done_many"])
    assert "trigger_rule IN ('one_failed', 'all_failed')" in driver.compact(queries["run_finish_if_done"])


def test_the_wait_reasons_are_computed_in_one_statement():
    """engine/sql/waiting.sql: only task_run_wait_reasons words the reasons; the
    scheduler's note of changes stores what it computed (engine.repositories.waiting)."""
    worded = [n for n in queries if "'waiting: for a worker'" in queries[n]]
    assert worded == ["task_run_wait_reasons"]


def test_a_live_worker_is_counted_the_same_in_every_statement_that_counts_one():
    """engine/sql/worker_queues.sql: the workers list, the queues' summary and the run page's
    check of a queue share one ``held`` part (running task runs per queue and lease owner)
    and one test of a live worker (a poll since the cutoff, or a held current lease)."""
    live = ("w.last_seen_at > clock_timestamp() - make_interval(secs => %(cutoff)s) "
            "OR COALESCE(h.leased, 0) > 0")
    join = "LEFT JOIN held h ON h.queue = w.queue AND h.lease_owner = 'worker:' || w.worker_id"
    counting = ("worker_list", "worker_queue_summary", "worker_queue_live")
    assert sorted(n for n in queries if "core_workerconnection" in queries[n] and "held AS (" in queries[n]) == \
        sorted(counting)
    held = {part(n, "WITH held AS (", "GROUP BY t.queue, t.lease_owner )") for n in counting}
    assert len(held) == 1 and "t.organization_id = %(org)s AND t.state = 'running' AND t.queue <> ''" in held.pop()
    for name in counting:
        text = driver.compact(queries[name])
        assert live in text and join in text, name
        # The lease owner is the poll's: "worker:" and the worker's own id (engine.worker_queues.poll).
        assert "GROUP BY t.queue, t.lease_owner" in text, name


def test_the_retry_backoff_cap_in_the_fail_statements_is_the_definitions_one():
    for name in ("task_run_fail_attempt", "task_run_fail_undelivered", "task_run_fail_expired_lease"):
        # Counted from the task run's last reset (attempt_base, engine.recovery).
        assert f"power(2, t.attempt - t.attempt_base - 1), {MAX_RETRY_BACKOFF_SECONDS}))" in \
            driver.compact(queries[name]), name


def test_no_sql_is_assembled_from_pieces_in_the_engine():
    """The engine runs statements by name: no module of engine/ (its migrations aside)
    holds statement text, and none is built with ``+``, ``.format``, ``.replace`` or ``%``
    in the repositories (the driver only compacts a statement and numbers its parameters).
    BEGIN / COMMIT / ROLLBACK, LISTEN on a constant channel and the driver's PREPARE stay inline."""
    sql_words = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|WITH)\b")
    for path in sorted(ENGINE.rglob("*.py")):
        if "migrations" in path.relative_to(ENGINE).parts:
            continue
        text = path.read_text()
        for literal in re.findall(r'"""(.*?)"""|"([^"\n]*)"', text, flags=re.S):
            body = literal[0] or literal[1]
            if sql_words.search(body) and re.search(r"\b(FROM|SET|INTO)\b", body):
                pytest.fail(f"{path.name} holds SQL text: {body[:80]!r}")
        if path.parent.name == "repositories":
            assert ".format(" not in text, path.name
