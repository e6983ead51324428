"""The outcome table (`awa.core.outcomes`) is the only one, and every reader uses it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from awa import testing
from awa.core.model import OutcomeKind
from awa.core.outcomes import OUTCOMES
from awa.db.queries import queries
from awa.telemetry import otel
from awa.worker.followups import TRIGGERS

SRC = Path(__file__).resolve().parent.parent / "src" / "awa"
KINDS = set(get_args(OutcomeKind))


def test_every_outcome_kind_has_exactly_one_entry() -> None:
    assert list(OUTCOMES) == list(get_args(OutcomeKind))


def test_the_entries_name_what_exists() -> None:
    names = set(queries().names())
    for kind, spec in OUTCOMES.items():
        assert spec.statement is None or spec.statement in names, kind
        assert spec.trigger is None or spec.trigger in TRIGGERS, kind


def test_the_readers_derive_their_names_from_the_table() -> None:
    assert otel.OUTCOME_NAMES == {k: o.telemetry for k, o in OUTCOMES.items()}
    assert otel._COUNTER_OF_OUTCOME == {k: f"awa.job.{o.telemetry}"
                                        for k, o in OUTCOMES.items() if o.counted}
    assert set(otel._COUNTER_OF_OUTCOME.values()) <= set(otel.COUNTERS)
    assert testing.OUTCOME_NAMES == {k: o.state for k, o in OUTCOMES.items()
                                     if o.state is not None}


def test_no_other_module_maps_outcome_kinds() -> None:
    """A dict literal keyed by several outcome kinds outside the table is a second table."""
    found = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "core" / "outcomes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if len(keys & KINDS) >= 3:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
