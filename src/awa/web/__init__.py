"""HTTP surfaces: callback ingress, worker health and the web UI.

The UI needs the ``ui`` extra (Starlette); import it from `awa.web.ui`.
"""

from awa.web.callbacks import callback_app

__all__ = ["callback_app"]
