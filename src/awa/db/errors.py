"""Translate driver exceptions into the `awa.errors` tree, at one boundary.

Messages pass through `awa.db.dsn.redact`, so no database password reaches
an Awa error even if a driver message quoted a URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import asyncpg

from awa.core.errors import AwaError, DatabaseError, SchemaNotMigrated, UniqueConflict
from awa.db.dsn import redact
from awa.db.migrations import migrations

UNIQUE_CONSTRAINT = "awa_unique_claim"


def translate(exc: BaseException) -> AwaError | None:
    """The Awa error for a driver error, or None if it is not a driver error."""
    if isinstance(exc, AwaError):
        return exc
    if isinstance(exc, asyncpg.UniqueViolationError):
        if getattr(exc, "constraint_name", None) == UNIQUE_CONSTRAINT:
            detail = getattr(exc, "detail", None) or ""
            holder = int(detail) if detail.isdigit() else None
            suffix = f" (held by job {holder})" if holder is not None else ""
            return UniqueConflict(f"a job with the same unique key already exists{suffix}",
                                  conflicting_job_id=holder)
        return DatabaseError(redact(str(exc)))
    if isinstance(exc, asyncpg.InvalidSchemaNameError) or (
            isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedObjectError
                       | asyncpg.UndefinedFunctionError) and _names_awa_object(str(exc))):
        return SchemaNotMigrated(f"the Awa schema is missing or out of date ({redact(str(exc))}); "
                                 "run `awa migrate` or `client.migrate()`")
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError | OSError):
        return DatabaseError(f"{type(exc).__name__}: {redact(str(exc))}")
    return None


_QUALIFIED = re.compile(r"\b\w+\.(\w+)")


@cache
def _awa_objects() -> frozenset[str]:
    """Names of every table, type and function Awa's migrations create."""
    return frozenset(name for _, _, sql in migrations()
                     for name in re.findall(r"\bawa\.(\w+)", sql))


def _names_awa_object(message: str) -> bool:
    """Whether a "does not exist" message names one of Awa's own objects (so the
    schema is missing or old), rather than one of the application's."""
    return any(name in _awa_objects() for name in _QUALIFIED.findall(message))


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise driver errors raised inside the block as Awa errors."""
    try:
        yield
    except Exception as exc:
        err = translate(exc)
        if err is None or err is exc:
            raise
        raise err from exc
