"""``awa serve``: the web UI on a local port (uvicorn)."""

from __future__ import annotations

import os
from typing import Any

import click

from awa.cli import main
from awa.cli.output import say


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=click.IntRange(0, 65535))
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
        from awa.web.ui.app import LOOPBACK_HOSTS
    except ImportError:
        raise click.ClickException("the web UI needs the 'ui' extra: "
                                   "pip install 'awa[ui]'") from None
    if host not in ("127.0.0.1", "localhost", "::1") and token is None and not read_only:
        say("warning: serving mutations on a public address without --token", err=True)
    hosts: list[str] | None = None  # with a token: any Host, unless names are given
    if allowed_hosts or not token:
        wildcard = host in ("0.0.0.0", "::", "")
        hosts = [*LOOPBACK_HOSTS, *([] if wildcard else [host]), *allowed_hosts]
    app = ui_app(obj["url"], read_only=read_only, token=token or None, schema=obj["schema"],
                 allowed_hosts=hosts)
    say(f"Awa UI on http://{host}:{port}/" + (" (read-only)" if read_only else ""), err=True)
    uvicorn.run(app, host=host, port=port, log_level=os.environ.get("AWA_LOG_LEVEL", "warning"))
