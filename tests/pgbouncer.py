"""A private PgBouncer (transaction pooling) in front of the test server.

Debian's ``pgbouncer`` package provides the binary (.ci/run installs it);
without it the tests that need one are skipped. Each `PgBouncer` listens on
a free local port with its own config in a temporary directory, forwards
every database name to the test server, and is stopped by the test that
started it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

SKIP_REASON = ("pgbouncer is not installed (Debian package 'pgbouncer'; .ci/run installs it): "
               "the transaction-pooler tests need it")


def binary() -> str | None:
    """The pgbouncer executable, if installed (Debian puts it in /usr/sbin)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One pgbouncer process; `url(database_url)` routes a test URL through it."""

    def __init__(self, server_url: str, *, pool_mode: str = "transaction",
                 pool_size: int = 4, ignore_startup_parameters: str = "") -> None:
        exe = binary()
        if exe is None:
            pytest.skip(SKIP_REASON)
        parts = urlsplit(server_url)
        self.port = _free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="awa-pgbouncer-"))
        self._dir.chmod(0o755)  # readable by the unprivileged user it runs as under root
        user = unquote(parts.username or "postgres")
        server = [f"host={parts.hostname or '127.0.0.1'}", f"port={parts.port or 5432}",
                  f"user={user}"]
        if parts.password:
            server.append(f"password={unquote(parts.password)}")
        auth = self._dir / "users.txt"
        auth.write_text(f'"{user}" ""\n')
        config = self._dir / "pgbouncer.ini"
        config.write_text("\n".join([
            "[databases]",
            "* = " + " ".join(server),
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {auth}",
            f"pool_mode = {pool_mode}",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 500",
            "server_check_delay = 0",
            f"ignore_startup_parameters = {ignore_startup_parameters}",
            "",
        ]))
        for f in (auth, config):
            f.chmod(0o644)
        self.log_path = self._dir / "pgbouncer.log"
        self._log = self.log_path.open("wb")
        # PgBouncer refuses to run as root; -u switches to an unprivileged user.
        args = [exe, str(config)] + (["-u", "nobody"] if os.geteuid() == 0 else [])
        self._proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self._user = parts.username
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen: {self.log()}")

    def url(self, database_url: str) -> str:
        """``database_url`` (same database and user) through this pgbouncer."""
        parts = urlsplit(database_url)
        user = parts.username or "postgres"
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}"))

    def log(self) -> str:
        """What pgbouncer logged so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop the process and remove its directory."""
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
