"""A local HTTP server that receives webhook POSTs (issue 19's tests): it keeps each request
(path, headers lower-cased, raw body) and answers with ``status`` and ``body`` (after
``delay`` seconds; with a ``Location`` header when ``location`` is set; or, with ``trickle``
seconds, a body of a byte every 0.2 s for that long: a receiver that never finishes), all of
which a test may change while it runs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    """The server's webhook URL, what it received, and how it answers."""

    url: str
    received: list[dict] = field(default_factory=list)
    status: int = 200
    body: bytes = b'{"ok": true}'
    delay: float = 0.0
    location: str = ""
    trickle: float = 0.0


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        receiver: Receiver = self.server.receiver
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        receiver.received.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                  "body": body, "at": time.time()})
        if receiver.delay:
            time.sleep(receiver.delay)
        if receiver.trickle:
            self._trickle(receiver)
            return
        self.send_response(receiver.status)
        if receiver.location:
            self.send_header("Location", receiver.location)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(receiver.body)))
        self.end_headers()
        self.wfile.write(receiver.body)

    def _trickle(self, receiver: Receiver) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        deadline = time.monotonic() + receiver.trickle
        try:
            while time.monotonic() < deadline:
                self.wfile.write(b".")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client hung up
            pass
        self.close_connection = True


@contextlib.contextmanager
def receiver_server(path: str = "/hooks/flowforge?token=abc") -> Iterator[Receiver]:
    """Serve on 127.0.0.1 (a free port) until the block ends; the URL ends with ``path``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.receiver = Receiver(url=f"http://127.0.0.1:{httpd.server_address[1]}{path}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.receiver
    finally:
        httpd.shutdown()
        httpd.server_close()
