"""The module paths of the flat layout (before 0.2) keep importing, with a warning.

``import awa.producer`` or ``from awa.errors import ValidationError`` in code
written against the flat package still works: a finder on ``sys.meta_path``
answers each old path with a module that forwards to where the code lives now,
and warns once (`DeprecationWarning`) with the new path. The public names are
in ``awa`` itself (`awa.__all__`); import them from there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

#: Old path → new path, for every module the layered layout moved.
MOVED: dict[str, str] = {
    "awa.errors": "awa.core.errors", "awa.states": "awa.core.states",
    "awa.options": "awa.core.options", "awa.model": "awa.core.model",
    "awa.callback_rules": "awa.core.callback_rules",
    "awa.embedded": "awa.db.embedded", "awa.listener": "awa.db.listener",
    "awa.joblog": "awa.telemetry.joblog",
    "awa.producer": "awa.enqueue.producer", "awa.bulk": "awa.admin.bulk",
    "awa.transaction": "awa.enqueue.transaction", "awa.partitioned": "awa.enqueue.partitioned",
    "awa.cron": "awa.maintenance.cron",
    "awa.runtime": "awa.worker.runtime", "awa.dispatcher": "awa.worker.dispatcher",
    "awa.capacity": "awa.worker.capacity", "awa.executor": "awa.worker.executor",
    "awa.context": "awa.worker.context", "awa.completion": "awa.worker.completion",
    "awa.finalize": "awa.worker.finalize", "awa.callbacks": "awa.worker.callbacks",
    "awa.followups": "awa.worker.followups", "awa.owned": "awa.worker.owned",
    "awa.tasks": "awa.worker.tasks", "awa.config": "awa.worker.config",
    "awa.presence": "awa.worker.presence", "awa.descriptors": "awa.worker.descriptors",
    "awa.overrides": "awa.worker.overrides", "awa.web.health": "awa.worker.health",
    "awa.client_ops": "awa.admin.ops",
    "awa.dlq": "awa.admin.dlq", "awa.batch": "awa.admin.batch",
}


class _Forward(types.ModuleType):
    """Stands at an old path; every attribute is read from the module at the new one."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self.__dict__["_target"] = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_target"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_target"])


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import public names from awa",
                      DeprecationWarning, stacklevel=2)
        return _Forward(spec.name, importlib.import_module(new))

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module forwards to one already imported."""


def install() -> None:
    """Answer the old paths (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
