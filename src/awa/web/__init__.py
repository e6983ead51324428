"""HTTP surfaces: callback ingress (and, later, the web UI)."""

from awa.web.callbacks import callback_app

__all__ = ["callback_app"]
