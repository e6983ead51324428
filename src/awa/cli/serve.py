"""``awa serve``: the web UI."""

from __future__ import annotations
