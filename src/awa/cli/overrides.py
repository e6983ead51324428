"""``awa queue overrides set|show|clear`` and ``awa descriptors``."""

from __future__ import annotations

from typing import Any

import click

from awa.cli.operations import create_option, queue, require_queue
from awa.cli.output import confirm, emit, full_option, json_option, run_with_client, say, yes_option
from awa.cli.root import main
from awa.worker.overrides import FIELDS

OVERRIDE_COLUMNS = ("queue", "poll_interval_ms", "claim_batch_size", "rate_limit",
                    "deadline_ms", "updated_by", "updated_at")


@queue.group()
def overrides() -> None:
    """Live overrides of a queue's settings, applied by running workers within seconds."""


@overrides.command("set")
@click.argument("name")
@click.option("--poll-interval-ms", type=int, default=None)
@click.option("--claim-batch-size", type=int, default=None)
@click.option("--rate-limit", default=None, metavar="RATE[/BURST]", help="Jobs per second.")
@click.option("--deadline-ms", type=int, default=None, help="Hard deadline; 0 = none.")
@click.option("--by", "updated_by", default=None, help="Who is changing it (recorded).")
@create_option
@yes_option
@json_option
@click.pass_obj
def overrides_set(obj: dict[str, Any], name: str, poll_interval_ms: int | None,
                  claim_batch_size: int | None, rate_limit: str | None,
                  deadline_ms: int | None, updated_by: str | None, create: bool, yes: bool,
                  as_json: bool) -> None:
    """Override some settings of queue NAME (the others keep their value)."""
    if not create:
        require_queue(obj, name, "override")
    confirm(yes, f"Change the settings of queue {name} on every running worker?")
    row = run_with_client(obj, lambda c: c.set_queue_override(
        name, poll_interval_ms=poll_interval_ms, claim_batch_size=claim_batch_size,
        rate_limit=rate_limit, deadline_ms=deadline_ms, updated_by=updated_by))
    emit([row], as_json, OVERRIDE_COLUMNS, title="overrides")


@overrides.command("show")
@click.argument("name", required=False)
@full_option
@json_option
@click.pass_obj
def overrides_show(obj: dict[str, Any], name: str | None, full: bool, as_json: bool) -> None:
    """Current overrides (of queue NAME, or all)."""
    rows = run_with_client(obj, lambda c: c.queue_overrides(name))
    emit(rows, as_json, OVERRIDE_COLUMNS, title="overrides", full=full)


@overrides.command("clear")
@click.argument("name")
@click.option("--field", "fields", multiple=True, type=click.Choice(FIELDS),
              help="Clear only this setting (repeatable; default: all).")
@yes_option
@click.pass_obj
def overrides_clear(obj: dict[str, Any], name: str, fields: tuple[str, ...], yes: bool) -> None:
    """Drop overrides of queue NAME: workers return to their start() settings."""
    confirm(yes, f"Clear overrides of queue {name}?")
    found = run_with_client(obj, lambda c: c.clear_queue_override(name, list(fields) or None))
    say(f"cleared overrides of {name}" if found else f"{name} had no overrides")


@main.command()
@click.option("--scope", type=click.Choice(["queue", "kind"]), default=None)
@full_option
@json_option
@click.pass_obj
def descriptors(obj: dict[str, Any], scope: str | None, full: bool, as_json: bool) -> None:
    """Declared queue and job-kind descriptors: live, stale or drifted."""
    rows = run_with_client(obj, lambda c: c.list_descriptors(scope))  # type: ignore[arg-type]
    flat = [{"scope": r["scope"], "name": r["name"], "status": r["status"],
             "live_workers": r["live_instances"],
             "display_name": r["descriptor"].get("display_name"),
             "owner": r["descriptor"].get("owner"), "docs_url": r["descriptor"].get("docs_url"),
             "descriptor": r["descriptor"]} for r in rows]
    emit(flat, as_json, ("scope", "name", "status", "live_workers", "display_name", "owner",
                         "docs_url"), title="descriptors", full=full)
