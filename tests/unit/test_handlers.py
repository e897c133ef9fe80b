"""Task types: config validation and execution, the http type against a local server."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.handlers import REGISTRY, ConfigError, PermanentTaskError, TaskContext, get_handler
from engine.handlers.http import MAX_BODY_BYTES, HttpStatusError
from engine.worker.output import OutputNotJson, OutputTooLarge, cap_output


def ctx(config, *, attempt=1, input=None, upstream=None) -> TaskContext:
    return TaskContext(
        task_run_id=uuid.uuid4(), workflow_run_id=uuid.uuid4(), organization_id=uuid.uuid4(), task_key="t",
        attempt=attempt, max_attempts=3, fencing_token=1, timeout_seconds=None, config=config,
        input=input or {}, upstream=upstream or {},
    )


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, status, body: bytes, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/ok":
            self._send(200, json.dumps({"hello": "world", "n": 3}).encode())
        elif self.path == "/nul":
            self._send(200, b'{"text": "a\\u0000b"}')
        elif self.path == "/big":
            self._send(200, b"x" * (MAX_BODY_BYTES + 5000), "text/plain")
        else:
            self._send(404, b'{"error": "nope"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        self._send(201, json.dumps({"echo": body, "auth": self.headers.get("X-Token")}).encode())


@pytest.fixture(scope="module")
def loopback_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def server(loopback_server, settings):
    """The local server's URL, with loopback allowed by the egress policy (as a deployment
    calling its own network would allow it); tests/security/test_ssrf.py tests the refusal."""
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    return loopback_server


def test_known_types_are_registered():
    assert sorted(REGISTRY) == ["fail", "http", "noop", "python", "sleep", "worker"]
    with pytest.raises(KeyError, match="unknown task type 'nope'; known types: fail, http, noop, python, sleep, worker"):
        get_handler("nope")


def test_http_get_parses_json_body(server):
    h = REGISTRY["http"]
    cfg = h.validate_config({"url": f"{server}/ok"})
    out = h.run(ctx(cfg))
    assert out["status"] == 200
    assert out["body"] == {"hello": "world", "n": 3}
    assert out["truncated"] is False


def test_http_post_sends_json_and_headers(server):
    h = REGISTRY["http"]
    cfg = h.validate_config(
        {"url": f"{server}/post", "method": "post", "json": {"a": 1}, "headers": {"X-Token": "t1"}, "expected_status": 201}
    )
    out = h.run(ctx(cfg))
    assert out["status"] == 201
    assert out["body"] == {"echo": {"a": 1}, "auth": "t1"}


def test_http_unexpected_status_is_an_error_naming_it(server):
    h = REGISTRY["http"]
    cfg = h.validate_config({"url": f"{server}/missing"})
    with pytest.raises(HttpStatusError, match=r"answered 404, expected \[200, 201, 202, 204\]"):
        h.run(ctx(cfg))


def test_http_body_is_capped(server):
    h = REGISTRY["http"]
    out = h.run(ctx(h.validate_config({"url": f"{server}/big"})))
    assert out["truncated"] is True
    assert len(out["body"]) == MAX_BODY_BYTES


def test_http_output_with_nul_is_stored_without_it(server):
    h = REGISTRY["http"]
    out = cap_output(h.run(ctx(h.validate_config({"url": f"{server}/nul"}))))
    assert out["body"] == {"text": "ab"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "'url' is required"),
        ({"url": "ftp://x"}, "must be an absolute http(s) URL"),
        ({"url": "http://x", "method": "FETCH"}, "'method' must be one of"),
        ({"url": "http://x", "headers": {"a": 1}}, "'headers' must be an object of string to string"),
        ({"url": "http://x", "expected_status": [700]}, "'expected_status'"),
        ({"url": "http://x", "bogus": 1}, "unknown field(s) 'bogus'"),
    ],
)
def test_http_config_errors_name_the_field(config, message):
    with pytest.raises(ConfigError) as exc:
        REGISTRY["http"].validate_config(config)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("expected_status", "shown"),
    [([700], "[700]"), (99, "99"), ("200", "'200'"), ([200, True], "[200, True]")],
)
def test_http_expected_status_error_shows_the_bad_value(expected_status, shown):
    with pytest.raises(ConfigError) as exc:
        REGISTRY["http"].validate_config({"url": "http://x", "expected_status": expected_status})
    assert str(exc.value) == (
        f"'expected_status' must be a status code or a list of status codes (100-599), got {shown}"
    )


def test_fail_type_fails_then_succeeds():
    h = REGISTRY["fail"]
    cfg = h.validate_config({"message": "boom", "fail_attempts": 2})
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=f"boom \\(attempt {attempt}\\)"):
            h.run(ctx(cfg, attempt=attempt))
    assert h.run(ctx(cfg, attempt=3)) == {"succeeded_on_attempt": 3}


def test_sleep_stops_early_when_the_lease_is_lost():
    h = REGISTRY["sleep"]
    c = ctx(h.validate_config({"seconds": 30}))
    c.lost.set()
    with pytest.raises(Exception, match="lost its lease"):
        h.run(c)


def test_python_type_calls_a_registered_function_with_input_upstream_and_context():
    h = REGISTRY["python"]
    cfg = h.validate_config({"callable": "tests.callables.echo", "params": {"factor": 2}})
    out = h.run(ctx(cfg, attempt=2, input={"x": 1}, upstream={"a": 5}))
    assert out == {"input": {"x": 1}, "upstream": {"a": 5}, "factor": 2, "attempt": 2}


def test_python_type_refuses_a_callable_that_is_not_registered():
    with pytest.raises(ConfigError, match="'os.system' is not a registered task callable"):
        REGISTRY["python"].validate_config({"callable": "os.system"})


def test_output_larger_than_the_cap_fails_permanently_naming_both_sizes(settings):
    settings.FLOWFORGE_MAX_OUTPUT_BYTES = 100
    with pytest.raises(OutputTooLarge, match=r"task output is 512 bytes of JSON, over FLOWFORGE_MAX_OUTPUT_BYTES \(100\)"):
        cap_output({"data": "y" * 500})
    assert issubclass(OutputTooLarge, PermanentTaskError)


def test_output_that_is_not_json_fails_permanently():
    with pytest.raises(OutputNotJson, match="not JSON-encodable"):
        cap_output({"when": object()})


def test_an_http_timeout_past_a_day_is_refused_naming_the_limit():
    with pytest.raises(ConfigError, match=r"'timeout_seconds' must be at most 86400, got 1e\+20"):
        REGISTRY["http"].validate_config({"url": "https://example.org/", "timeout_seconds": 1e20})
    assert REGISTRY["http"].validate_config({"url": "https://example.org/", "timeout_seconds": 86400})[
        "timeout_seconds"] == 86400
