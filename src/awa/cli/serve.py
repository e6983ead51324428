"""``awa serve``: the web UI on a local port (uvicorn).

The port is bound before anything is printed, so a busy port is a one-line
error (exit 1); the URL is printed once the server is accepting connections.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

import click

from awa.cli.output import fail, first_line, say
from awa.cli.root import main
from awa.core.errors import AwaError
from awa.db.pool import resolve_database_url


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port); OSError if not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def _url_of(host: str, sock: socket.socket) -> str:
    """The UI's URL for a socket bound on ``host`` (its real port, also when asked for 0)."""
    port = sock.getsockname()[1]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0: any free port; the URL printed shows which).")
@click.option("--read-only", is_flag=True, help="Hide and refuse every mutation.")
@click.option("--token", envvar="AWA_UI_TOKEN", default=None,
              help="Require this access token (default: $AWA_UI_TOKEN).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer requests for this Host name (repeatable; '*' for any). "
                   "Without a token only loopback names and --host are answered.")
@click.pass_obj
def serve(obj: dict[str, Any], host: str, port: int, read_only: bool,
          token: str | None, allowed_hosts: tuple[str, ...]) -> None:
    """Serve the web UI (dashboard, jobs, queues, cron, DLQ, runtime)."""
    try:
        import uvicorn

        from awa.web.ui import ui_app
        from awa.web.ui.guard import LOOPBACK_HOSTS
    except ImportError:
        raise click.ClickException("the web UI needs the 'ui' extra: pip install "
                                   "'awa-queue[ui]' (Awa serves its own dashboard; awa-pg's "
                                   "awa-cli binary is not used)") from None
    try:
        sock = bind(host, port)
    except OSError as exc:  # in use, not an address of this machine, not allowed
        reason = (exc.strerror or first_line(exc)).split(" (while attempting")[0]
        fail(f"cannot listen on {host}:{port}: {reason}")  # create_server adds the address
    if host not in ("127.0.0.1", "localhost", "::1") and token is None and not read_only:
        say("warning: serving mutations on a public address without --token", err=True)
    hosts: list[str] | None = None  # with a token: any Host, unless names are given
    if allowed_hosts or not token:
        wildcard = host in ("0.0.0.0", "::", "")
        hosts = [*LOOPBACK_HOSTS, *([] if wildcard else [host]), *allowed_hosts]
    url = obj["url"]
    if url is None:  # $DATABASE_URL, else the embedded server: resolved (started) now, so this
        try:         # process uses it from the start and keeps it running while it serves
            url = resolve_database_url(None)
        except AwaError as exc:
            fail(first_line(exc))
    app = ui_app(url, read_only=read_only, token=token or None, schema=obj["schema"],
                 allowed_hosts=hosts)
    announce = _url_of(host, sock) + (" (read-only)" if read_only else "")

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                say(f"Awa UI on {announce}", err=True)

    config = uvicorn.Config(app, log_level=os.environ.get("AWA_LOG_LEVEL", "warning"))
    # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again with the handler it
    # found: make that an exit, so atexit still runs (it hands the embedded server back).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    with sock:
        Server(config).run(sockets=[sock])


def _exit_on_signal(sig: int, _frame: FrameType | None) -> None:
    """Exit with the shell's status for ``sig`` (128 + its number), running atexit."""
    sys.exit(128 + sig)
