"""flowforge.devstack.wait_for_web: ``make run``/``make demo`` go on only once the web
server they started answers, and say why when it does not."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flowforge.devstack import wait_for_web


class FakeWeb:
    def __init__(self, alive: bool = True):
        self._alive = alive
        self.log_path = Path("/tmp/var/log/web.log")

    def alive(self) -> bool:
        return self._alive


@pytest.fixture
def server():
    """A local HTTP server whose /healthz answer the test sets; yields (bind, set_answer)."""
    answer = {"status": 404, "body": b"not here"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(answer["status"] if self.path == "/healthz" else 404)
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", answer
    httpd.shutdown()
    httpd.server_close()


def test_a_web_server_that_answers_healthz_ok_is_ready(server):
    bind, answer = server
    answer.update(status=200, body=json.dumps({"status": "ok"}).encode())
    assert wait_for_web(FakeWeb(), bind, timeout=5) is None


def test_a_web_process_that_exited_is_reported_with_its_log():
    problem = wait_for_web(FakeWeb(alive=False), "127.0.0.1:9", timeout=5)
    assert problem == ("the web server exited at start (is 127.0.0.1:9 already in use?); "
                       "see /tmp/var/log/web.log")


def test_another_server_on_the_address_is_not_taken_for_flowforge(server):
    bind, _answer = server  # answers 404: something else holds the address
    problem = wait_for_web(FakeWeb(), bind, timeout=1)
    assert problem == (f"nothing answered http://{bind}/healthz like FlowForge within 1 s (is {bind} in use?); "
                       "see /tmp/var/log/web.log")
