"""Per-attempt log lines and tracebacks (issue 19): what a shared worker's handler logs and
prints is kept per attempt (per thread, never mixed), redacted of the attempt's secret
values, capped with a line saying so, written in batches and at the attempt's end; a
failure keeps the handler's full traceback beside its error; an attempt that writes
nothing costs no statement. The organizations' own workers' lines get the same cap, in SQL.
"""

from __future__ import annotations

import io
import json
import logging
import re
import secrets as pysecrets
import threading
import uuid
from urllib.parse import quote

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine import attempt_log
from engine.attempt_log import MAX_LINE_CHARS, AttemptLog, StreamProxy, capturing
from engine.models import TaskLog, TaskRun, TaskRunEvent
from engine.repositories import task_runs as task_run_ops
from engine.services import start_run
from engine.worker import log_shipper
from engine.worker.output import cap_middle, traceback_text
from tenancy import vault
from tests import engine_helpers
from tests.unit.test_runtime_inprocess import broker, drive, quiet_heartbeater  # noqa: F401 (fixtures)
from tests.unit.test_secret_refs import owner_actor
from tests.unit.test_worker_api import Org


def new_log(**kwargs) -> AttemptLog:
    defaults = {"organization_id": uuid.uuid4(), "workflow_run_id": uuid.uuid4(), "task_run_id": uuid.uuid4(),
                "attempt": 1, "fencing_token": 1, "max_lines": 100, "max_bytes": 100_000}
    return AttemptLog(**{**defaults, **kwargs})


def messages(lines) -> list[tuple[str, str, str]]:
    return [(line.stream, line.level, line.message) for line in lines]


# --- the capture, in one process -------------------------------------------------------------


def test_a_line_is_redacted_of_the_attempts_secret_values_before_it_is_kept():
    value = "sk_live_" + pysecrets.token_urlsafe(16)
    log = new_log()
    from engine import secret_refs

    log.redact_with([value], secret_refs.redaction_pattern([value]))
    log.add("logging", "info", f"token={value} and url-encoded {value.replace('_', '%5F')}")
    (line,) = log.take()
    assert value not in line.message
    assert line.message.startswith("token=[redacted] and url-encoded ")


def pem_like() -> str:
    """A PEM-shaped multi-line secret: a header, 64-character base64 lines, a short last
    body line, a footer, and the short lines ("", "==") that are left alone."""
    body = pysecrets.token_urlsafe(200).replace("-", "+").replace("_", "/")
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "-----BEGIN KEY-----\n" + "\n".join(lines) + "\nAB==\n\n==\n-----END KEY-----"


def test_each_line_of_a_multi_line_secret_is_redacted_but_short_lines_are_not():
    from engine import secret_refs

    value = pem_like()
    lines = value.splitlines()
    assert secret_refs.with_lines([value]) == (value, *[line for line in lines if len(line) >= 4])
    assert secret_refs.with_lines(["one line"]) == ("one line",)
    assert secret_refs.with_lines(['{\n  "a": null,\n  "b": "s3cr3t-part"\n}']) == (
        '{\n  "a": null,\n  "b": "s3cr3t-part"\n}', '"a": null,', '"b": "s3cr3t-part"')
    # Each line, each line as JSON escapes it, each line percent-encoded: all gone.
    text = "\n".join(f"{line} | {json.dumps(line)} | {quote(line, safe='')}" for line in lines[1:-4])
    redacted = secret_refs.redact(text, [value])
    assert redacted.splitlines() == ['[redacted] | "[redacted]" | [redacted]'] * len(lines[1:-4])
    # Lines under MIN_LINE_CHARS are not blanked everywhere.
    assert secret_refs.redact("== } AB", [value]) == "== } AB"


def test_a_multi_line_secret_printed_line_by_line_leaves_no_line_of_it():
    from engine import secret_refs

    value = pem_like()
    log = new_log()
    log.redact_with([value], secret_refs.redaction_pattern([value]))
    log.write("stdout", value + "\n")
    for piece in (value[i:i + 5] for i in range(0, len(value), 5)):
        log.write("stdout", piece)
    log.close()
    kept = [line.message for line in log.take()]
    shapes = ["[redacted]" if len(line) >= 4 else line for line in value.splitlines()]
    assert kept == shapes * 2
    assert not any(line in message for line in value.splitlines() if len(line) >= 4 for message in kept)


def test_an_attempt_keeps_at_most_its_lines_then_says_its_log_was_truncated_and_counts_the_rest():
    log = new_log(max_lines=3)
    for i in range(10):
        log.add("stdout", "info", f"line {i}")
    log.close()
    lines = log.take()
    assert [m for _s, _l, m in messages(lines)[:3]] == ["line 0", "line 1", "line 2"]
    assert messages(lines)[3] == ("system", "warning", "log truncated: this attempt's log reached its limit of 3 "
                                  "lines (FLOWFORGE_TASK_LOG_MAX_LINES); later lines are dropped")
    assert messages(lines)[4] == ("system", "warning", "log truncated: 7 more lines (42 bytes) of this attempt "
                                  "were dropped")
    assert len(lines) == 5
    log.add("stdout", "info", "after the end")  # nothing is added once closed
    assert log.take() == []


def test_an_attempt_keeps_at_most_its_bytes_then_says_so():
    log = new_log(max_bytes=10)
    log.add("stdout", "info", "12345")
    log.add("stdout", "info", "é" * 3)  # 6 bytes: past the 10
    log.add("stdout", "info", "1")  # fits, but the log was cut: dropped too
    lines = messages(log.take())
    assert lines[0] == ("stdout", "info", "12345")
    assert lines[1][0] == "system" and "its limit of 10 bytes (FLOWFORGE_TASK_LOG_MAX_BYTES)" in lines[1][2]
    assert len(lines) == 2
    assert (log.dropped_lines, log.dropped_bytes) == (2, 7)


def test_a_long_line_is_cut_and_what_the_cut_leaves_of_a_secret_is_redacted():
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    from engine import secret_refs

    log = new_log()
    log.redact_with([value], secret_refs.redaction_pattern([value]))
    # Whole values are redacted before the cut...
    log.add("stdout", "info", "x" * (MAX_LINE_CHARS - 10) + value + "tail")
    # ... and a line written in pieces past the cut keeps only the start of a value, which
    # the cut goes through: what it leaves is redacted too.
    log.write("stdout", "y" * (MAX_LINE_CHARS - 5) + value[:10])
    log.write("stdout", value[10:])
    log.write("stdout", "\n")
    whole, pieces = log.take()
    assert whole.message == "x" * (MAX_LINE_CHARS - 10) + "[redacted]… (4 more characters cut)"
    assert pieces.message == "y" * (MAX_LINE_CHARS - 5) + "[redacted]… (5 more characters cut)"
    assert value[:5] not in whole.message + pieces.message


def test_partial_writes_make_one_line_and_a_last_partial_line_comes_at_the_close():
    log = new_log()
    log.write("stdout", "hel")
    log.write("stdout", "lo\nwor")
    log.write("stderr", "oops\r\n")
    log.write("stdout", "ld")
    assert messages(log.take()) == [("stdout", "info", "hello"), ("stderr", "warning", "oops")]
    log.close()
    assert messages(log.take()) == [("stdout", "info", "world")]


def test_threads_printing_and_logging_at_once_keep_their_own_lines_and_outside_an_attempt_nothing_is_taken():
    original = io.StringIO()
    proxy = StreamProxy("stdout", original)
    logger = logging.getLogger("tests.attempt_logs.threads")
    logger.setLevel(logging.INFO)
    attempt_log.install()
    logs = [new_log() for _ in range(8)]
    barrier = threading.Barrier(len(logs))

    def work(i: int) -> None:
        with capturing(logs[i]):
            barrier.wait()
            for n in range(50):
                proxy.write(f"thread {i} says {n}\n")
                logger.info("thread %d logs %d", i, n)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(logs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, log in enumerate(logs):
        lines = messages(log.take())
        assert [m for s, _l, m in lines if s == "stdout"] == [f"thread {i} says {n}" for n in range(50)]
        assert [m for s, _l, m in lines if s == "logging"] == [
            f"tests.attempt_logs.threads: thread {i} logs {n}" for n in range(50)]
    proxy.write("outside any attempt\n")
    assert original.getvalue() == "outside any attempt\n"


def test_the_platforms_own_log_records_stay_out_of_an_attempts_lines():
    attempt_log.install()
    log = new_log()
    with capturing(log):
        logging.getLogger("engine.worker.execute").warning("the engine's own line")
        logging.getLogger("httpx").warning("HTTP Request: GET https://example.com")
        logging.getLogger("tests.mine").error("the handler's line", exc_info=ValueError("inside"))
        attempt_log.note("http", "info", "GET https://example.com -> 200 OK, 2 bytes in 3 ms")
    attempt_log.note("http", "info", "outside an attempt: nowhere")
    lines = messages(log.take())
    assert [s for s, _l, _m in lines] == ["logging", "http"]
    assert lines[0][1] == "error" and lines[0][2].startswith("tests.mine: the handler's line\nValueError: inside")


def test_a_logged_exceptions_traceback_keeps_only_the_organizations_frames():
    """logging.exception in a handler: its line carries the traceback as a stored one
    does, the library's frames (json's decoder here) and their server paths left out."""
    import json as stdlib_json

    attempt_log.install()
    log = new_log()
    with capturing(log):
        try:
            stdlib_json.loads("{not json")
        except ValueError:
            logging.getLogger("tests.mine").exception("could not parse")
    ((stream, level, message),) = messages(log.take())
    assert (stream, level) == ("logging", "error")
    assert re.findall(r'File "([^"]+)", line \d+, in (\w+)', message) == [
        ("tests/unit/test_attempt_logs.py", "test_a_logged_exceptions_traceback_keeps_only_the_organizations_frames")]
    assert message.startswith("tests.mine: could not parse\nTraceback (most recent call last):\n")
    assert message.endswith("json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: "
                            "line 1 column 2 (char 1)")
    assert "decoder.py" not in message and "/" not in message.split('File "', 1)[1].split('"', 1)[0][:1]


def _handler_that_fails(secret: str) -> None:
    raise RuntimeError(f"could not use {secret}")


def test_a_traceback_starts_at_the_handler_is_redacted_and_cut_in_its_middle():
    from engine import secret_refs

    value = "sk_live_" + pysecrets.token_urlsafe(16)
    try:
        _handler_that_fails(value)
    except RuntimeError as exc:
        text = traceback_text(exc, values=[value], redaction=secret_refs.redaction_pattern([value]), limit=10_000)
    assert text.startswith("Traceback (most recent call last):\n")
    assert "in _handler_that_fails" in text and "in test_a_traceback_starts" not in text  # this frame caught it
    assert text.rstrip().endswith("RuntimeError: could not use [redacted]") and value not in text

    long = "".join(f"  frame {i}\n" for i in range(2000)) + "ValueError: the end\n"
    cut = cap_middle(long, limit=1000, values=[], what="the traceback", setting="FLOWFORGE_TASK_TRACEBACK_MAX_CHARS")
    assert len(cut) <= 1000
    assert cut.startswith("  frame 0\n") and cut.endswith("ValueError: the end\n")
    assert re.search(r"\n… \d+ characters of the traceback cut \(FLOWFORGE_TASK_TRACEBACK_MAX_CHARS\) …\n", cut)


# --- attempts on the in-process worker -------------------------------------------------------


def lines_of(task_run) -> list[tuple[int, str, str, str]]:
    return list(TaskLog.objects.for_organization(task_run.organization_id).filter(task_run=task_run)
                .order_by("id").values_list("attempt", "stream", "level", "message"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_python_task_that_logs_prints_and_raises_keeps_its_lines_and_traceback_per_attempt(org, make_workflow):
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    vault.set_secret(actor=owner_actor(org), name="WAREHOUSE", value=value)
    wf = make_workflow(org, [{"key": "load", "type": "python", "max_attempts": 2, "retry_backoff_seconds": 0,
                              "config": {"callable": "tests.callables.log_print_raise",
                                         "params": {"secret": "{{ secrets.WAREHOUSE }}"}}}], name="lpr")
    run = start_run(workflow=wf, run_input={"rows": 7})
    assert [o[2] for o in drive(run.pk)] == ["retrying", "failed"]
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    assert lines_of(tr) == [
        (attempt, stream, level, message)
        for attempt in (1, 2)
        for stream, level, message in (
            ("logging", "warning", "tests.callables: connecting with token [redacted]"),
            ("stdout", "info", f"attempt {attempt} printed this"),
            ("stderr", "warning", "to stderr"))
    ]
    failures = list(TaskRunEvent.objects.for_organization(org).filter(task_run=tr, kind="attempt_failed")
                    .order_by("seq"))
    assert [e.detail["error"] for e in failures] == ["ValueError: no rows left after 7 tries"] * 2
    for event in failures:
        trace = event.detail["traceback"]
        assert trace.startswith("Traceback (most recent call last):\n")
        assert [m for m in re.findall(r", in (\w+)\n", trace)] == ["log_print_raise", "_outer_step", "_inner_step"]
        assert trace.endswith("ValueError: no rows left after 7 tries\n")
        assert "execute.py" not in trace and "handlers/builtin.py" not in trace  # the engine's frames are left out
    assert value not in str(lines_of(tr)) and value not in str([e.detail for e in failures])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_multi_line_secret_printed_by_a_python_task_is_redacted_line_by_line(org, make_workflow):
    value = pem_like()
    vault.set_secret(actor=owner_actor(org), name="SIGNING_KEY", value=value)
    wf = make_workflow(org, [{"key": "sign", "type": "python",
                              "config": {"callable": "tests.callables.print_key",
                                         "params": {"key": "{{ secrets.SIGNING_KEY }}"}}}], name="pem")
    run = start_run(workflow=wf)
    assert [o[2] for o in drive(run.pk)] == ["succeeded"]
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    shapes = ["[redacted]" if len(line) >= 4 else line for line in value.splitlines()]
    # whole, line by line, in 7-character pieces, then "done"
    assert lines_of(tr) == [(1, "stdout", "info", m) for m in [*shapes, *shapes, *shapes, "done"]]
    kept = str(lines_of(tr))
    assert not [line for line in value.splitlines() if len(line) >= 4 and line in kept]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_built_in_handlers_failure_keeps_no_platform_frame_nor_server_path(org, make_workflow, settings):
    """An http task that cannot connect: its stored traceback is the exception chain's
    ``Type: message`` lines only (every frame is the platform's: the handler, httpx, the
    standard library), so a viewer sees no server path."""
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    wf = make_workflow(org, [{"key": "get", "type": "http", "max_attempts": 1,
                              "config": {"url": "http://127.0.0.1:9/nothing-listens"}}], name="refused")
    run = start_run(workflow=wf)
    assert [o[2] for o in drive(run.pk)] == ["failed"]
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    (event,) = TaskRunEvent.objects.for_organization(org).filter(task_run=tr, kind="attempt_failed")
    trace = event.detail["traceback"]
    assert trace, "the handler's failure keeps a traceback"
    assert 'File "' not in trace and "Traceback (most recent call last)" not in trace
    assert str(settings.BASE_DIR) not in trace and "site-packages" not in trace and ".py" not in trace
    # What is left is the chain's messages, ending with the error the task run shows.
    assert trace.rstrip("\n").endswith(event.detail["error"].split(": ", 1)[1])


def test_a_callables_frames_are_kept_with_paths_relative_to_their_package_and_library_frames_are_not():
    import json as stdlib_json

    def platform_like():  # this module is the organization's (tests.*): a frame kept
        return stdlib_json.loads("{not json")

    try:
        platform_like()
    except ValueError as exc:
        text = traceback_text(exc, values=[], redaction=None, limit=10_000, skip_frames=0)
    assert re.findall(r'File "([^"]+)", line \d+, in (\w+)', text) == [
        ("tests/unit/test_attempt_logs.py", "test_a_callables_frames_are_kept_with_paths_relative_to_their_package_and_"
                                            "library_frames_are_not"),
        ("tests/unit/test_attempt_logs.py", "platform_like")]  # json/decoder.py's frames are left out
    assert text.rstrip().endswith("json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: "
                                  "line 1 column 2 (char 1)")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_an_attempt_that_writes_nothing_costs_no_log_statement(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "fail", "depends_on": ["a"]}],
                       name="quiet")
    run = start_run(workflow=wf)
    with CaptureQueriesContext(connection) as ctx:
        assert [o[2] for o in drive(run.pk)] == ["succeeded", "failed"]
    assert not [q["sql"] for q in ctx.captured_queries if "core_tasklog" in q["sql"]]
    # The fail type's failure still keeps its traceback beside its error.
    event = TaskRunEvent.objects.for_organization(org).get(workflow_run=run, kind="attempt_failed")
    assert event.detail["traceback"].endswith("RuntimeError: task failed on purpose (attempt 1)\n")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_an_attempts_lines_past_the_cap_are_dropped_behind_a_line_saying_so(org, make_workflow, settings):
    settings.FLOWFORGE_TASK_LOG_MAX_LINES = 5
    wf = make_workflow(org, [{"key": "talk", "type": "python",
                              "config": {"callable": "tests.callables.chatty", "params": {"lines": 12}}}],
                       name="chatty")
    run = start_run(workflow=wf)
    assert [o[2] for o in drive(run.pk)] == ["succeeded"]
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    rows = lines_of(tr)
    assert [m[:6] for _a, s, _l, m in rows if s == "stdout"] == [f"{i:06d}" for i in range(5)]
    assert [(s, m) for _a, s, _l, m in rows if s == "system"] == [
        ("system", "log truncated: this attempt's log reached its limit of 5 lines (FLOWFORGE_TASK_LOG_MAX_LINES); "
                   "later lines are dropped"),
        ("system", "log truncated: 7 more lines (140 bytes) of this attempt were dropped")]


@pytest.mark.django_db(transaction=True)
def test_the_shipper_writes_every_running_attempts_lines_in_one_statement_in_order(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}], name="ship")
    run = start_run(workflow=wf)
    trs = list(TaskRun.objects.for_organization(org).filter(workflow_run=run).order_by("task__key"))
    shipper = log_shipper.LogShipper(interval_seconds=3600)  # ship() by hand
    logs = [shipper.open(organization_id=org.pk, workflow_run_id=run.pk, task_run_id=tr.pk, attempt=1,
                         fencing_token=0) for tr in trs]
    with CaptureQueriesContext(connection) as ctx:
        assert shipper.ship() == 0  # nothing registered: no statement
    assert ctx.captured_queries == []
    for n in range(3):
        for i, log in enumerate(logs):
            log.add("stdout", "info", f"{i}-{n}")
    with CaptureQueriesContext(connection) as ctx:
        assert shipper.ship() == 6
    assert len([q for q in ctx.captured_queries if "INSERT INTO core_tasklog" in q["sql"]]) == 1
    logs[0].add("stderr", "warning", "0-last")
    assert shipper.finish(logs[0]) == 1
    assert shipper.finish(logs[1]) == 0  # nothing left to write
    for i, tr in enumerate(trs):
        assert [m for _a, _s, _l, m in lines_of(tr)] == [f"{i}-{n}" for n in range(3)] + (["0-last"] if i == 0 else [])
    shipper.stop()


# --- the organizations' own workers' lines: the same cap, in SQL ------------------------------


@pytest.mark.django_db
def test_a_workers_lines_past_the_cap_are_refused_behind_one_line_saying_so(make_org, settings):
    settings.FLOWFORGE_TASK_LOG_MAX_LINES = 4
    settings.FLOWFORGE_TASK_LOG_MAX_BYTES = 1000
    a = Org(make_org())
    run = a.start()
    task = a.poll().json()["tasks"][0]
    url = f"worker/tasks/{task['task_run_id']}/logs/"

    def send(*messages):
        return a.post(url, {"fencing_token": 1, "lines": [{"message": m} for m in messages]}).json()

    assert send("one", "two", "three") == {"accepted": 3}
    assert send("four", "five", "six") == {"accepted": 1}
    assert send("seven") == {"accepted": 0}  # the log is full: refused, and no second marker
    tr = TaskRun.objects.for_organization(a.org).get(workflow_run=run, task__key="resize")
    rows = lines_of(tr)
    assert [(s, m) for _a, s, _l, m in rows][:4] == [("worker", m) for m in ("one", "two", "three", "four")]
    assert [(s, lvl) for _a, s, lvl, _m in rows[4:]] == [("system", "warning")]
    assert rows[4][3].startswith("log truncated: this attempt's log reached its limit of 4 lines")
    assert len(rows) == 5


@pytest.mark.django_db
def test_a_workers_lines_past_the_byte_cap_are_cut_at_the_first_line_that_does_not_fit(make_org, settings):
    settings.FLOWFORGE_TASK_LOG_MAX_BYTES = 10
    a = Org(make_org())
    run = a.start()
    task = a.poll().json()["tasks"][0]
    answer = a.post(f"worker/tasks/{task['task_run_id']}/logs/",
                    {"fencing_token": 1, "lines": [{"message": "12345"}, {"message": "123456"}, {"message": "1"}]})
    assert answer.json() == {"accepted": 1}
    tr = TaskRun.objects.for_organization(a.org).get(workflow_run=run, task__key="resize")
    assert [s for _a, s, _l, _m in lines_of(tr)] == ["worker", "system"]


@pytest.mark.django_db
def test_a_failure_without_a_traceback_keeps_only_its_error_and_a_long_one_is_cut(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop", "max_attempts": 2, "retry_backoff_seconds": 0}],
                       name="plain")
    run = start_run(workflow=wf)
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    for token, trace in ((1, ""), (2, "T" * (task_run_ops.MAX_TRACEBACK_CHARS + 10))):
        task_run_ops.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[tr.pk])
        assert engine_helpers.start_attempt(task_run_id=tr.pk, fencing_token=token, owner="t", lease_seconds=30)
        task_run_ops.fail_attempt(task_run_id=tr.pk, fencing_token=token, error="boom", traceback=trace)
    first, second = TaskRunEvent.objects.for_organization(org).filter(task_run=tr, kind="attempt_failed").order_by("seq")
    assert first.detail == {"error": "boom", "retry_at": first.detail["retry_at"]}
    assert second.detail["traceback"] == "T" * task_run_ops.MAX_TRACEBACK_CHARS


@pytest.mark.django_db
def test_a_workers_failure_keeps_its_traceback_redacted_and_cut_beside_its_error(make_org, settings):
    settings.FLOWFORGE_TASK_TRACEBACK_MAX_CHARS = 2000
    a = Org(make_org())
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    vault.set_secret(actor=a.owner, name="KEY", value=value)
    run = a.start(tasks=[{"key": "resize", "type": "worker",
                          "config": {"queue": "images", "input": {"key": "{{ secrets.KEY }}"}}}])
    task = a.poll().json()["tasks"][0]
    url = f"worker/tasks/{task['task_run_id']}/fail/"
    assert a.post(url, {"fencing_token": 1, "error": "x", "traceback": "t" * 100_001}).status_code == 400
    trace = ("Traceback (most recent call last):\n" + "".join(f'  File "w.py", line {i}, in f\n' for i in range(500))
             + f"ValueError: bad key {value}\n")
    answer = a.post(url, {"fencing_token": 1, "error": "ValueError: bad key", "retryable": False, "traceback": trace})
    assert answer.json() == {"state": "failed", "retry_in_seconds": None}
    event = TaskRunEvent.objects.for_organization(a.org).get(workflow_run=run, kind="attempt_failed")
    stored = event.detail["traceback"]
    assert len(stored) <= 2000 and value not in stored
    assert stored.startswith("Traceback (most recent call last):\n") and stored.endswith("ValueError: bad key [redacted]\n")
    assert "characters of the traceback cut (FLOWFORGE_TASK_TRACEBACK_MAX_CHARS) …" in stored
