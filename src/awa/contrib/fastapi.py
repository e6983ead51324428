"""FastAPI spelling of `awa.contrib.starlette` (FastAPI apps are Starlette apps)."""

from awa.contrib.starlette import awa_client, awa_lifespan

__all__ = ["awa_client", "awa_lifespan"]
