"""A throwaway database per benchmark trial, dropped again whatever happens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def scratch_database(admin: str, db: str) -> AsyncIterator[str]:
    """Create database ``db`` through ``admin`` (a URL), yield its URL, drop it after."""
    import asyncpg

    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{db}"')
    await conn.close()
    try:
        yield admin.rsplit("/", 1)[0] + "/" + db
    finally:
        conn = await asyncpg.connect(admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await conn.close()
