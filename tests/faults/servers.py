"""Private PostgreSQL and Redis servers for fault injection.

The fault suite stops, restarts and kills its servers, so it never uses the machine's
shared ones: each scenario gets a throw-away PostgreSQL cluster (initdb, run as the
``postgres`` system user when started as root, since PostgreSQL refuses to run as
root) and a Redis server without persistence, on free ports.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"PostgreSQL's {name} was not found (install the postgresql package)")
    return path


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _wait_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{what} did not start listening on port {port} within {timeout:.0f}s")


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of our own (trust auth, user postgres). Its commits wait for the
    WAL write only with ``synchronous_commit`` (the server default, kept for a crash: what the
    API acknowledged must survive it); otherwise they do not (faster, and a fast restart
    writes everything first). fsync is off: the operating system keeps what was written,
    and only the server process is ever made to fail here."""

    root: Path
    port: int
    synchronous_commit: bool = False

    @classmethod
    def create(cls, *, synchronous_commit: bool = False) -> PrivatePostgres:
        root = Path(tempfile.mkdtemp(prefix="ff-faults-pg-"))
        os.chmod(root, 0o777)
        data = root / "data"
        port = free_port()
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
            check=True, capture_output=True,
        )
        pg = cls(root=root, port=port, synchronous_commit=synchronous_commit)
        pg.start()
        return pg

    @property
    def url_base(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}"

    def _ctl(self, *args: str, check: bool = True) -> None:
        opts = f"-p {self.port} -k {self.root} -c fsync=off -c max_connections=200 -c lc_messages=C"
        if not self.synchronous_commit:
            opts += " -c synchronous_commit=off"
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", str(self.root / "data"), "-o", opts,
                          "-l", str(self.root / "server.log"), "-w", "-t", "60", *args]),
            check=check, capture_output=True,
        )

    def start(self) -> None:
        self._ctl("start")
        _wait_port(self.port, 30, "PostgreSQL")

    def restart(self) -> None:
        """A fast restart: every connection is cut, then the server comes back."""
        self._ctl("restart", "-m", "fast")
        _wait_port(self.port, 30, "PostgreSQL")

    def crash(self) -> None:
        """A crash: every server process is stopped at once (``-m immediate``: no checkpoint,
        the WAL not yet written is lost), then the server comes back through crash recovery."""
        self._ctl("stop", "-m", "immediate")
        self.start()

    def stop(self) -> None:
        self._ctl("stop", "-m", "fast", check=False)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A Redis server of our own that keeps nothing on disk (like the machine's)."""

    root: Path
    port: int
    proc: subprocess.Popen | None = None

    @classmethod
    def create(cls) -> PrivateRedis:
        r = cls(root=Path(tempfile.mkdtemp(prefix="ff-faults-redis-")), port=free_port())
        r.start()
        return r

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, 15, "Redis")

    def stop(self) -> None:
        """Stop it; whatever it held is gone (nothing is persisted)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
