"""Database URLs: Awa's own option in them, and passwords kept out of messages.

Awa reads one option of its own from the URL's query string and removes it
before the driver sees the URL: ``pgbouncer=true`` declares a transaction-
pooling PgBouncer (or a pooler like it) between Awa and PostgreSQL;
``pgbouncer=false`` declares a direct connection (skipping detection).
Without it, Awa detects a pooler when it first connects (see `awa.db.pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from awa.core.errors import ValidationError

POOLER_OPTION = "pgbouncer"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

#: ``scheme://user:password@host``: the password is everything up to the last
#: ``@`` of the token (an unencoded ``@`` in a password stays covered).
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/?#@]*:)[^\s]*(@[^\s@]*)")
#: ``password=...`` in a query string or a libpq keyword/value string.
_KEY_PASSWORD = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]+)")
REDACTED = "***"


@dataclass(frozen=True, slots=True)
class Target:
    """A URL split into what the driver receives and Awa's pooler option."""

    dsn: str
    pooler: bool | None  # declared in the URL; None: detect


_SCHEMES = ("postgresql://", "postgres://")
#: ``user:password@host`` with the scheme left out: the password still stays out.
_NO_SCHEME_PASSWORD = re.compile(r"^([^\s:/@]*:)[^\s]*@")
#: What a good URL looks like, in the messages about a bad one.
EXAMPLE_URL = "postgresql://user:password@localhost:5432/dbname"


def check_url(url: str, source: str) -> str:
    """``url`` if it is a PostgreSQL URL; else a `ValidationError` naming where it came
    from (``source``: ``$DATABASE_URL``, ``--database-url``, ``database_url``)."""
    if not isinstance(url, str):
        raise ValidationError(source, f"must be a PostgreSQL URL string, got {type(url).__name__}")
    if not url.strip().lower().startswith(_SCHEMES):
        shown = _NO_SCHEME_PASSWORD.sub(r"\1" + REDACTED + "@", redact(url))
        raise ValidationError(source, f"must be a PostgreSQL URL such as {EXAMPLE_URL} "
                                      f"(got {shown!r})")
    return url


def parse(url: str) -> Target:
    """Split Awa's ``pgbouncer`` option off ``url``; other options pass through."""
    parts = urlsplit(url)
    if not parts.query or POOLER_OPTION not in parts.query:
        return Target(url, None)
    kept: list[tuple[str, str]] = []
    pooler: bool | None = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != POOLER_OPTION:
            kept.append((key, value))
        elif value.lower() in _TRUE:
            pooler = True
        elif value.lower() in _FALSE:
            pooler = False
        else:
            raise ValidationError(POOLER_OPTION, "must be true or false")
    return Target(urlunsplit(parts._replace(query=urlencode(kept))), pooler)


def redact(text: str) -> str:
    """``text`` with every password of a database URL or DSN replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m[1] + REDACTED + m[2], text)
    return _KEY_PASSWORD.sub(lambda m: m[1] + REDACTED, text)
