"""Code written against the flat layout keeps importing (with a DeprecationWarning)."""

from __future__ import annotations

import importlib
import sys

import pytest

import awa
from awa._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_forwards_to_the_module_that_moved(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    public = [n for n in dir(new) if not n.startswith("_")]
    assert public and all(getattr(module, n) is getattr(new, n) for n in public)


def test_the_documented_imports_of_the_flat_layout_still_work() -> None:
    from awa.config import RuntimeConfig
    from awa.errors import ValidationError
    from awa.states import JobState

    assert ValidationError is awa.ValidationError and JobState is awa.JobState
    assert RuntimeConfig().heartbeat_interval.total_seconds() > 0


def test_unknown_paths_still_fail() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("awa.no_such_module")
