"""The web UI: `ui_app` (mountable ASGI app) served by ``awa serve``."""

from awa.web.ui.app import ui_app

__all__ = ["ui_app"]
