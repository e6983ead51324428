"""Connections: the asyncpg pool with Awa's codecs, and the default URL."""

from __future__ import annotations

import json
import os
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

#: A connection as Awa code receives it: direct, or borrowed from a pool.
Conn = asyncpg.Connection | PoolConnectionProxy


def _json_text(value: Any) -> bytes:
    # Statements receive JSON already serialized (validated by the producer).
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text.encode()


def _encode_jsonb(value: Any) -> bytes:
    return b"\x01" + _json_text(value)  # binary jsonb: a version byte, then the text


def _decode_jsonb(data: bytes) -> Any:
    return json.loads(data[1:])


async def init_connection(conn: asyncpg.Connection) -> None:
    """Per-connection setup: binary JSON codecs (COPY needs binary) returning Python values."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_encode_jsonb,
                              decoder=_decode_jsonb, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=_json_text,
                              decoder=json.loads, format="binary")


def resolve_database_url(database_url: str | None) -> str:
    """An explicit URL, else ``$DATABASE_URL``, else the embedded server's."""
    if database_url:
        return database_url
    env = os.environ.get("DATABASE_URL")
    if env:
        return env
    from awa.embedded import embedded_database_url

    return embedded_database_url()


class AwaConnection(asyncpg.Connection):
    """Pooled connection that skips asyncpg's reset round trip on release.

    Awa's statements leave no session state behind (no LISTEN, no session
    advisory locks, temp tables are ON COMMIT DROP), so the reset query would
    only cost a round trip per operation. Code using `Transaction` should use
    ``SET LOCAL`` rather than ``SET``.
    """

    def get_reset_query(self) -> str:
        return ""


async def create_pool(database_url: str, *, max_connections: int = 10,
                      application_name: str = "awa",
                      synchronous_commit: bool = True) -> asyncpg.Pool:
    """A pool whose connections all carry Awa's codecs.

    ``synchronous_commit=False`` is only for the claim pool (see
    docs/architecture.md): a claim that a server crash forgets just makes the
    job run again, while every outcome commits synchronously.
    """
    settings = {"application_name": application_name}
    if not synchronous_commit:
        settings["synchronous_commit"] = "off"
    pool = await asyncpg.create_pool(
        database_url, min_size=1, max_size=max_connections, init=init_connection,
        server_settings=settings, connection_class=AwaConnection)
    assert pool is not None
    return pool
