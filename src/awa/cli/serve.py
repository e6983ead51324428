"""``awa serve``: the web UI on a local port (uvicorn)."""

from __future__ import annotations

import os
from typing import Any

import click

from awa.cli import main


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="Hide and refuse every mutation.")
@click.option("--token", envvar="AWA_UI_TOKEN", default=None,
              help="Require this access token (default: $AWA_UI_TOKEN).")
@click.pass_obj
def serve(obj: dict[str, Any], host: str, port: int, read_only: bool,
          token: str | None) -> None:
    """Serve the web UI (dashboard, jobs, queues, cron, DLQ, runtime)."""
    try:
        import uvicorn

        from awa.web.ui import ui_app
    except ImportError:
        raise click.ClickException("the web UI needs the 'ui' extra: pip install "
                                   "'awa-queue[ui]' (Awa serves its own dashboard; awa-pg's "
                                   "awa-cli binary is not used)") from None
    if host not in ("127.0.0.1", "localhost", "::1") and token is None and not read_only:
        click.echo("warning: serving mutations on a public address without --token", err=True)
    app = ui_app(obj["url"], read_only=read_only, token=token or None, schema=obj["schema"])
    click.echo(f"Awa UI on http://{host}:{port}/" + (" (read-only)" if read_only else ""),
               err=True)
    uvicorn.run(app, host=host, port=port, log_level=os.environ.get("AWA_LOG_LEVEL", "warning"))
