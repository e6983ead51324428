"""The GRANTs for Awa's database roles (docs/security.md).

Three roles: an *owner* that runs migrations (and so owns every object), a
*runtime* role for workers, producers and admin operations (reads and
writes rows, executes functions, no DDL), and a *reader* for a read-only web
UI or dashboards (SELECT only). `grants_sql` prints what the owner runs once
after migrating; ``awa grants ROLE [--read-only]`` prints the same.
"""

from __future__ import annotations

import re

from awa.core.errors import ValidationError
from awa.db.queries import validate_schema

_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: Partition DDL and the TRUNCATEs of the ring and the rotating records run
#: through these SECURITY DEFINER functions (as the owner);
#: nobody but the runtime role may call them.
DEFINER_FUNCTIONS = ("awa.ensure_done_partitions(timestamptz)",
                     "awa.ensure_done_partitions(timestamptz, timestamptz)",
                     "awa.drop_done_partitions(timestamptz)",
                     "awa.ring_reclaim(text, smallint)",
                     "awa.rotation_tidy(text)")

_RUNTIME = """\
-- Runtime role {role}: workers, producers, admin operations. No DDL.
-- Run as the owner role (the one that ran `awa migrate`), after migrating.
REVOKE EXECUTE ON FUNCTION {definers} FROM PUBLIC;
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema}
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT USAGE, SELECT ON SEQUENCES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT EXECUTE ON FUNCTIONS TO {role};
"""

_READER = """\
-- Read-only role {role}: the web UI in read-only mode, dashboards. SELECT only.
-- Run as the owner role (the one that ran `awa migrate`), after migrating.
REVOKE EXECUTE ON FUNCTION {definers} FROM PUBLIC;
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {role};
"""


def _validate_role(role: str) -> str:
    """Return ``role`` if it is a plain lowercase identifier, else raise."""
    if not _ROLE.match(role):
        raise ValidationError("role", "must match [a-z_][a-z0-9_]{0,62}")
    return role


def grants_sql(role: str, *, read_only: bool = False, schema: str = "awa") -> str:
    """The statements that give ``role`` the runtime (or, ``read_only``, the reader)
    rights on ``schema``; the owner runs them after migrating (idempotent)."""
    schema = validate_schema(schema)
    definers = ",\n    ".join(f.replace("awa.", f"{schema}.", 1) for f in DEFINER_FUNCTIONS)
    template = _READER if read_only else _RUNTIME
    # sql-safe: role and schema are validated identifiers ([a-z_][a-z0-9_]*)
    return template.format(role=_validate_role(role), schema=schema, definers=definers)
