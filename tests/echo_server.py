"""A local HTTP server that answers every request with the request itself — method, path
(query included), headers and body — as JSON, and keeps what it received. The secret
tests send credentials to it: without redaction a task's output would hold them.

``GET /status/<code>`` answers with that status (the echo as body), so a task can fail
with the request in its error too.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Echo:
    """The server's address and the requests it received, [{"method", "path", "headers", "body"}]."""

    url: str
    received: list[dict] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    echo: Echo

    def log_message(self, *args):  # quiet
        pass

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", errors="replace") if length else ""
        seen = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body}
        self.server.echo.received.append(seen)
        status = 200
        if self.path.startswith("/status/"):
            status = int(self.path.split("/")[2].split("?")[0])
        payload = json.dumps(seen).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer


@contextlib.contextmanager
def echo_server() -> Iterator[Echo]:
    """Serve on 127.0.0.1 (a free port) until the block ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.echo = Echo(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.echo
    finally:
        httpd.shutdown()
        httpd.server_close()
