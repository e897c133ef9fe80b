"""Issue 14, finding 2: the ``http`` task is not an SSRF.

Written as the attack: a member points an http task at the worker's own loopback (in
every numeric and IPv6 spelling, through a host name and through a redirect) or at the
cloud metadata address, and sets a Host header. Every connection attempt is refused before
a byte is read, the refusal names the address and the reason, and the task fails at once.

Traffic goes to loopback only: the servers are started here, on 127.0.0.1, 127.0.0.2 and
::1. Private, link-local, CGNAT and the other ranges are checked as a table against the
address check, with no connection; the metadata run is guarded against any connect.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from engine import egress
from engine.handlers import REGISTRY, ConfigError, PermanentTaskError, TaskContext
from engine.models import TaskRun, WorkflowRun
from engine.worker import heartbeat
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem, bearer
from tests.unit.test_api_workflows import new_api_factory
from tests.unit.test_runtime_inprocess import drive

SECRET_BODY = "flowforge_internal_metric_total 4242 # SECRET-LOOPBACK-BODY"


# --- loopback servers that count the connections they accept --------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        redirect = self.server.redirect_to
        if redirect is not None:
            self.send_response(302)
            self.send_header("Location", redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = SECRET_BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class CountingServer(ThreadingHTTPServer):
    """An HTTP server that counts every TCP connection it accepts (before reading a byte)."""

    daemon_threads = True

    def __init__(self, address, *, family=socket.AF_INET, redirect_to=None):
        self.address_family = family
        self.redirect_to = redirect_to
        self.peers: list[tuple] = []  # (host, port) of each accepted connection, in order
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def get_request(self):
        conn, peer = super().get_request()
        with self._lock:
            self.peers.append(tuple(peer[:2]))
        return conn, peer

    @property
    def port(self) -> int:
        return self.server_address[1]

    def connections_since_barrier(self) -> int:
        """How many connections were accepted since the last call, counted exactly: a
        control connection is made and, since the accept loop takes connections in
        arrival order, every earlier attempt is in ``peers`` once the control one is."""
        with socket.create_connection((self.server_address[0], self.port), timeout=5) as control:
            me = tuple(control.getsockname()[:2])
            deadline = time.monotonic() + 5
            while True:
                with self._lock:
                    if me in self.peers:
                        earlier = self.peers.index(me)
                        del self.peers[:earlier + 1]
                        return earlier
                if time.monotonic() > deadline:
                    raise AssertionError("the control connection was never accepted")
                time.sleep(0.005)


def _serve(server: CountingServer):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server


@pytest.fixture(scope="module")
def loopback():
    """The internal service the attacker wants: 127.0.0.1:P answering SECRET_BODY."""
    server = _serve(CountingServer(("127.0.0.1", 0)))
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def loopback6(loopback):
    """The same on ::1 (its own port), or a skip when this machine has no IPv6 loopback."""
    try:
        server = _serve(CountingServer(("::1", 0), family=socket.AF_INET6))
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here ({exc})")
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def redirector(loopback):
    """An allowed server (127.0.0.2, allowed by CIDR in the tests that use it) whose every
    answer is a 302 to the loopback service's /metrics."""
    try:
        server = _serve(CountingServer(("127.0.0.2", 0), redirect_to=f"http://127.0.0.1:{loopback.port}/metrics"))
    except OSError as exc:
        pytest.skip(f"cannot bind 127.0.0.2 here ({exc})")
    yield server
    server.shutdown()
    server.server_close()


def ctx(config) -> TaskContext:
    return TaskContext(
        task_run_id=uuid.uuid4(), workflow_run_id=uuid.uuid4(), organization_id=uuid.uuid4(), task_key="steal",
        attempt=1, max_attempts=3, fencing_token=1, timeout_seconds=None, config=config, input={}, upstream={},
    )


def run_http(url: str, **config):
    """Run the http handler on ``url`` the way a worker does, with the config validation
    skipped (as for a definition stored before it refused literal addresses): the
    connect-time check is the one under test."""
    cfg = {"method": "GET", "url": url, "headers": {}, "expected_status": [200], "timeout_seconds": 5.0, **config}
    return REGISTRY["http"].run(ctx(cfg))


# --- the matrix: every spelling of loopback is refused before a connection -------------------------

LOOPBACK_FORMS = [
    ("http://127.0.0.1:{port}/metrics", "127.0.0.1", "loopback"),
    ("http://localhost:{port}/metrics", None, "loopback"),  # a host name resolving to loopback
    ("http://0.0.0.0:{port}/metrics", "0.0.0.0", "unspecified"),
    ("http://2130706433:{port}/metrics", "127.0.0.1", "loopback"),
    ("http://0x7f.1:{port}/metrics", "127.0.0.1", "loopback"),
    ("http://127.1:{port}/metrics", "127.0.0.1", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/metrics", "::ffff:127.0.0.1", "loopback, IPv4-mapped 127.0.0.1"),
]


@pytest.mark.parametrize(("template", "address", "reason"), LOOPBACK_FORMS, ids=[f[0].split("/")[2] for f in LOOPBACK_FORMS])
def test_a_loopback_url_is_refused_before_any_connection(loopback, template, address, reason):
    url = template.format(port=loopback.port)
    with pytest.raises(egress.EgressDenied) as exc:
        run_http(url)
    message = str(exc.value)
    if address is None:  # localhost: whichever of 127.0.0.1 / ::1 the resolver lists first
        assert message.startswith(("egress refused: 127.0.0.1 (loopback)", "egress refused: ::1 (loopback)")), message
        assert "for host 'localhost'" in message
    else:
        assert message.startswith(f"egress refused: {address} ({reason})"), message
    assert "FLOWFORGE_EGRESS_ALLOW" in message
    assert SECRET_BODY not in message
    assert isinstance(exc.value, PermanentTaskError)
    assert loopback.connections_since_barrier() == 0


def test_the_ipv6_loopback_is_refused_before_any_connection(loopback6):
    with pytest.raises(egress.EgressDenied, match=r"^egress refused: ::1 \(loopback\)"):
        run_http(f"http://[::1]:{loopback6.port}/metrics")
    assert loopback6.connections_since_barrier() == 0


def test_a_redirect_to_loopback_is_refused_at_the_hop(loopback, redirector, settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.2/32"]
    with pytest.raises(egress.EgressDenied) as exc:
        run_http(f"http://127.0.0.2:{redirector.port}/start")
    assert str(exc.value).startswith("egress refused: 127.0.0.1 (loopback)"), exc.value
    assert SECRET_BODY not in str(exc.value)
    assert redirector.connections_since_barrier() == 1  # the allowed first hop was made
    assert loopback.connections_since_barrier() == 0  # the redirect's target never was


def test_a_redirect_to_a_name_for_loopback_is_refused_at_the_hop(loopback, redirector, settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.2/32"]
    redirector.redirect_to = f"http://localhost:{loopback.port}/metrics"
    with pytest.raises(egress.EgressDenied, match=r"\(loopback\) for host 'localhost'"):
        run_http(f"http://127.0.0.2:{redirector.port}/start")
    assert loopback.connections_since_barrier() == 0


def test_an_allowed_deployment_cidr_reaches_the_same_server(loopback, settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    out = run_http(f"http://127.0.0.1:{loopback.port}/metrics")
    assert (out["status"], out["body"]) == (200, SECRET_BODY)
    out = run_http(f"http://2130706433:{loopback.port}/metrics")  # the address is what is allowed
    assert out["status"] == 200
    assert loopback.connections_since_barrier() == 2


def test_an_allowed_host_name_reaches_the_server_whatever_it_resolves_to(loopback, settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["LocalHost"]
    out = run_http(f"http://localhost:{loopback.port}/metrics")
    assert (out["status"], out["body"]) == (200, SECRET_BODY)
    with pytest.raises(egress.EgressDenied):  # the name is allowed, not the address
        run_http(f"http://127.0.0.1:{loopback.port}/metrics")
    assert loopback.connections_since_barrier() == 1


def test_the_connection_goes_to_the_address_that_was_checked(loopback, settings, monkeypatch):
    """DNS rebinding: the name answers an allowed address to the check and loopback to any
    later lookup. The connection must go to the checked address (a second server on
    127.0.0.2, same port), never to 127.0.0.1."""
    try:
        checked = _serve(CountingServer(("127.0.0.2", loopback.port)))
    except OSError as exc:
        pytest.skip(f"cannot bind 127.0.0.2:{loopback.port} here ({exc})")
    try:
        settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.2/32"]
        real = socket.getaddrinfo
        answers = iter(["127.0.0.2"])

        def rebinding_dns(host, *args, **kwargs):
            if host == "rebind.test":
                host = next(answers, "127.0.0.1")
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding_dns)
        out = run_http(f"http://rebind.test:{loopback.port}/metrics")
        assert out["status"] == 200
        assert checked.connections_since_barrier() == 1
        assert loopback.connections_since_barrier() == 0
    finally:
        checked.shutdown()
        checked.server_close()


def test_tls_is_started_with_the_url_host_name_not_the_checked_address(loopback, settings):
    """The connection goes to the resolved IP, but SNI and certificate verification use
    the URL's name (httpcore's start_tls server_hostname)."""
    settings.FLOWFORGE_EGRESS_ALLOW = ["localhost"]
    seen = {}

    def trace(event, info):
        if event in ("connection.connect_tcp.started", "connection.start_tls.started"):
            seen[event] = info

    with egress.client(timeout=5) as client, pytest.raises(httpx.ConnectError):
        client.get(f"https://localhost:{loopback.port}/", extensions={"trace": trace})  # plain HTTP answers
    assert seen["connection.connect_tcp.started"]["host"] == "localhost"
    assert seen["connection.start_tls.started"]["server_hostname"] == "localhost"
    assert loopback.connections_since_barrier() == 1


def test_proxy_variables_cannot_route_around_the_policy(loopback, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{loopback.port}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{loopback.port}")
    with pytest.raises(egress.EgressDenied, match=r"^egress refused: 127\.0\.0\.1 \(loopback\)"):
        run_http(f"http://127.0.0.1:{loopback.port}/metrics")
    assert loopback.connections_since_barrier() == 0


# --- the metadata address, with any connection guarded against ------------------------------------


def test_the_cloud_metadata_address_is_refused_without_a_connection(monkeypatch):
    attempts = []

    def refuse(address, *args, **kwargs):
        attempts.append(address)
        raise AssertionError(f"a connection to {address} was attempted")

    real_connect = socket.socket.connect

    def guarded_connect(self, address):
        if address[0] not in ("127.0.0.1", "::1"):
            attempts.append(address)
            raise AssertionError(f"a connection to {address} was attempted")
        return real_connect(self, address)

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    with pytest.raises(egress.EgressDenied) as exc:
        run_http("http://169.254.169.254/latest/meta-data/")
    assert str(exc.value) == (
        "egress refused: 169.254.169.254 (link-local, cloud metadata) — allow it with FLOWFORGE_EGRESS_ALLOW"
    )
    assert attempts == []


# --- the address check as a table (no connection) ---------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "this network"),
        ("::", "unspecified"),
        ("169.254.169.254", "link-local, cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private, CGNAT shared address space"),
        ("100.127.255.254", "private, CGNAT shared address space"),
        ("fc00::1", "private, unique local"),
        ("fd00:ec2::254", "private, unique local"),
        ("fec0::1", "site-local (deprecated)"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("2001:db8::1", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("192.0.0.8", "IETF protocol assignments"),
        ("100::1", "discard-only"),
        ("::ffff:127.0.0.1", "loopback, IPv4-mapped 127.0.0.1"),
        ("::ffff:169.254.169.254", "link-local, cloud metadata, IPv4-mapped 169.254.169.254"),
        ("::ffff:10.0.0.1", "private, IPv4-mapped 10.0.0.1"),
        ("64:ff9b::7f00:1", "loopback, NAT64 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "link-local, cloud metadata, NAT64 169.254.169.254"),
        ("64:ff9b:1::a00:1", "NAT64 local-use"),
        ("2002:7f00:1::1", "loopback, 6to4 127.0.0.1"),
        ("2002:c0a8:101::", "private, 6to4 192.168.1.1"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback, Teredo 127.0.0.1"),
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", "Teredo (not globally routable)"),
        ("::127.0.0.1", "loopback, IPv4-compatible 127.0.0.1"),
        ("::8.8.8.8", "IPv4-compatible (not globally routable)"),
        ("::ffff:0:7f00:1", "loopback, IPv4-translated 127.0.0.1"),
    ],
)
def test_the_address_check_refuses_each_internal_range(address, reason):
    assert egress.denial_reason(address) == reason
    with pytest.raises(egress.EgressDenied) as exc:
        egress.check_address(address, host="internal.example")
    assert str(exc.value) == (
        f"egress refused: {egress.parse_address(address)} ({reason}) for host 'internal.example' "
        "— allow it with FLOWFORGE_EGRESS_ALLOW"
    )


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
                                     "64:ff9b::808:808", "2002:808:808::1", "192.88.99.1"])
def test_the_address_check_lets_public_addresses_through(address):
    assert egress.denial_reason(address) is None
    egress.check_address(address)


def test_allowed_cidrs_and_names_open_only_what_they_name(settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["10.20.0.0/16", " fd00:1::/32 ", "Intranet.Example."]
    egress.check_address("10.20.3.4")
    egress.check_address("::ffff:10.20.3.4")
    egress.check_address("fd00:1::5")
    with pytest.raises(egress.EgressDenied, match=r"10\.21\.0\.1 \(private\)"):
        egress.check_address("10.21.0.1")
    with pytest.raises(egress.EgressDenied, match="169.254.169.254"):
        egress.check_address("169.254.169.254")
    assert egress.host_is_allowed("intranet.example") and egress.host_is_allowed("INTRANET.EXAMPLE.")
    assert not egress.host_is_allowed("evil.intranet.example")


def test_a_malformed_allow_entry_is_an_error_naming_it(settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["10.0.0.0/8", "not a host/32"]
    with pytest.raises(egress.EgressConfigError, match="FLOWFORGE_EGRESS_ALLOW: 'not a host/32' is neither"):
        egress.check_address("10.0.0.1")


def test_a_malformed_allow_entry_stops_the_process_at_start_up():
    env = {**os.environ, "FLOWFORGE_EGRESS_ALLOW": "10.0.0.0/8,intranet example"}
    done = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode != 0
    assert ("ImproperlyConfigured: FLOWFORGE_EGRESS_ALLOW: 'intranet example' is neither a CIDR"
            in done.stderr), done.stderr[-2000:]


# --- validation: literal addresses and reserved headers are refused at apply -----------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8000/metrics", "127.0.0.1 (loopback)"),
        ("http://2130706433/metrics", "127.0.0.1 (loopback) for host '2130706433'"),
        ("http://0x7f.1/", "127.0.0.1 (loopback) for host '0x7f.1'"),
        ("http://0177.0.0.1/", "127.0.0.1 (loopback) for host '0177.0.0.1'"),
        ("http://127.1/", "127.0.0.1 (loopback) for host '127.1'"),
        ("http://0.0.0.0:8000/", "0.0.0.0 (unspecified)"),
        ("http://[::1]/", "::1 (loopback)"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 (loopback, IPv4-mapped 127.0.0.1)"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 (link-local, cloud metadata)"),
        ("https://10.0.0.5/admin", "10.0.0.5 (private)"),
        ("http://[fd00:ec2::254]/", "fd00:ec2::254 (private, unique local)"),
    ],
)
def test_a_literal_internal_address_is_refused_at_validation(url, shown):
    with pytest.raises(ConfigError) as exc:
        REGISTRY["http"].validate_config({"url": url})
    assert str(exc.value) == f"'url': egress refused: {shown} — allow it with FLOWFORGE_EGRESS_ALLOW"


def test_validation_never_resolves_a_host_name(monkeypatch):
    def no_dns(host, *args, flags=0, **kwargs):
        assert flags & socket.AI_NUMERICHOST, f"validation resolved {host!r}"
        raise socket.gaierror(socket.EAI_NONAME, "not numeric")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert REGISTRY["http"].validate_config({"url": "https://internal.example/x"})["url"] == "https://internal.example/x"


def test_a_literal_address_inside_an_allowed_cidr_passes_validation(settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.0/8"]
    assert REGISTRY["http"].validate_config({"url": "http://127.0.0.1:8000/"})["url"] == "http://127.0.0.1:8000/"


@pytest.mark.parametrize("name", ["Host", "HOST", "Connection", "keep-alive", "Proxy-Authorization",
                                  "Proxy-Authenticate", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
                                  "Content-Length"])
def test_reserved_headers_are_refused_at_validation_naming_the_header(name):
    with pytest.raises(ConfigError) as exc:
        REGISTRY["http"].validate_config({"url": "https://example.org/", "headers": {name: "x", "X-Ok": "y"}})
    assert str(exc.value).startswith(f"'headers' may not set {name!r}:"), exc.value


def test_a_stored_config_with_a_host_header_fails_permanently_without_a_request(loopback, settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    with pytest.raises(PermanentTaskError, match=r"'headers' may not set 'Host'"):
        run_http(f"http://127.0.0.1:{loopback.port}/metrics", headers={"Host": "admin.internal"})
    assert loopback.connections_since_barrier() == 0


# --- as a member, through the API and a real task run ---------------------------------------------


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def broker(monkeypatch):
    import dramatiq

    import engine.actors  # noqa: F401  (declares the queues)
    from flowforge.broker import broker as b

    assert dramatiq.get_broker() is b
    # A heartbeater that never beats on its own (no background thread holding a connection).
    monkeypatch.setattr(heartbeat, "_heartbeater", heartbeat.Heartbeater(interval_seconds=3600, lease_seconds=30))
    b.flush_all()
    yield b
    b.flush_all()


def apply(api, tasks):
    return api.client.post("/api/v1/workflows/", json.dumps({"name": "steal", "tasks": tasks}),
                           content_type="application/json", headers=bearer(api.keys[Role.MEMBER]))


@pytest.mark.django_db(transaction=True)
def test_a_member_cannot_read_the_workers_loopback_through_an_http_task(api_factory, loopback, broker):
    api = api_factory()
    created = apply(api, [{"key": "steal", "type": "http", "max_attempts": 3,
                           "config": {"url": f"http://localhost:{loopback.port}/metrics"}}])
    assert created.status_code == 201, created.content
    started = api.client.post("/api/v1/runs/", json.dumps({"workflow": "steal"}), content_type="application/json",
                              headers=bearer(api.keys[Role.MEMBER]))
    assert started.status_code == 201, started.content
    run_id = uuid.UUID(started.json()["id"])

    drive(run_id)

    (task_run,) = TaskRun.objects.for_organization(api.org).filter(workflow_run_id=run_id)
    assert task_run.state == "failed"
    assert (task_run.attempt, task_run.task.max_attempts) == (1, 3)  # refused: no second attempt
    assert task_run.error.startswith("EgressDenied: egress refused: "), task_run.error
    assert "(loopback) for host 'localhost'" in task_run.error
    assert SECRET_BODY not in task_run.error and "SECRET" not in json.dumps(task_run.output)
    assert WorkflowRun.objects.for_organization(api.org).get(pk=run_id).state == "failed"
    detail = api.client.get(f"/api/v1/runs/{run_id}/", headers=bearer(api.keys[Role.MEMBER])).json()
    assert "SECRET" not in json.dumps(detail)
    assert loopback.connections_since_barrier() == 0


@pytest.mark.django_db(transaction=True)
def test_a_member_cannot_apply_an_http_task_to_a_literal_loopback_address(api_factory, loopback):
    api = api_factory()
    body = assert_problem(apply(api, [{"key": "steal", "type": "http",
                                       "config": {"url": f"http://2130706433:{loopback.port}/metrics"}}]), 400)
    assert body["errors"] == [{
        "path": "tasks[steal].config",
        "message": "http task: 'url': egress refused: 127.0.0.1 (loopback) for host '2130706433' "
                   "— allow it with FLOWFORGE_EGRESS_ALLOW",
    }]


@pytest.mark.django_db(transaction=True)
def test_a_member_cannot_set_the_host_header(api_factory):
    api = api_factory()
    body = assert_problem(apply(api, [{"key": "steal", "type": "http", "config": {
        "url": "https://example.org/", "headers": {"hOsT": "admin.internal"}}}]), 400)
    (error,) = body["errors"]
    assert error["path"] == "tasks[steal].config"
    assert error["message"].startswith("http task: 'headers' may not set 'hOsT':"), error
