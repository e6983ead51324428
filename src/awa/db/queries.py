"""Named SQL statements, loaded once from the ``sql/*.sql`` files.

Each file holds blocks introduced by ``-- name: noun_verb``; a piece of SQL
that several statements share is a ``-- fragment: name`` block, written once
and included where ``{{name}}`` stands (at load time, from the package's own
files only; a fragment may include fragments that include none). Statements
are written against the schema ``awa``; `Queries` binds another schema name
(a validated identifier, never user text) in this one place.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from awa.core.errors import ValidationError

_NAME = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")
# ``awa.defer_notify`` is a setting, not a schema object: its name stays as is
# (a quoted schema in a setting name is invalid, and the trigger must read the
# name the completion transactions set).
_SCHEMA_REF = re.compile(r"(?<![\w\"])awa\.(?!defer_notify\b)")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
DEFAULT_SCHEMA = "awa"


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a plain lowercase identifier, else raise."""
    if not _IDENTIFIER.match(schema):
        raise ValidationError("schema", "must match [a-z_][a-z0-9_]{0,62}")
    return schema


def bind_schema(sql: str, schema: str) -> str:
    """Rewrite ``awa.`` references to ``schema`` (validated) in ``sql``."""
    if schema == DEFAULT_SCHEMA:
        return sql
    return _SCHEMA_REF.sub(f'"{validate_schema(schema)}".', sql)


def _parse(text: str) -> list[tuple[str, str, str]]:
    """``(kind, name, body)`` of every block; kind is ``name`` or ``fragment``."""
    parts = _NAME.split(text)
    return [(kind, name, body.strip())
            for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)]


def _expand(name: str, body: str, fragments: dict[str, str]) -> str:
    def include(match: re.Match[str]) -> str:
        if match.group(1) not in fragments:
            raise RuntimeError(f"SQL statement {name!r} includes unknown fragment {match[0]}")
        return fragments[match.group(1)]
    return _INCLUDE.sub(include, body)


@cache
def _all_statements() -> dict[str, str]:
    blocks: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for entry in sorted(resources.files("awa.db").joinpath("sql").iterdir(), key=str):
        if entry.name.endswith(".sql"):
            for kind, name, body in _parse(entry.read_text()):
                if name in blocks["name"] or name in blocks["fragment"]:
                    raise RuntimeError(f"duplicate SQL block name {name!r}")
                if kind == "fragment":  # its own comments stay in the .sql file
                    body = "\n".join(line for line in body.splitlines()
                                      if not line.lstrip().startswith("--"))
                blocks[kind][name] = body
    # A fragment may include other fragments (one level: those must not).
    fragments = {name: _expand(name, body, blocks["fragment"])
                 for name, body in blocks["fragment"].items()}
    return {name: _expand(name, body, fragments) for name, body in blocks["name"].items()}


class Queries:
    """The named statements bound to one schema: ``q["job_insert"]``."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = validate_schema(schema)
        self._bound = {k: bind_schema(v, schema) for k, v in _all_statements().items()}

    def __getitem__(self, name: str) -> str:
        return self._bound[name]

    def names(self) -> list[str]:
        """Every statement name, sorted: an index of what Awa does to the database."""
        return sorted(self._bound)


def rows_affected(status: str) -> int:
    """The row count in a command status such as ``DELETE 3`` (0 when it has none)."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


@cache
def queries(schema: str = DEFAULT_SCHEMA) -> Queries:
    """The shared `Queries` for ``schema``."""
    return Queries(schema)
