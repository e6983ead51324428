"""Integrations with web frameworks: `awa.contrib.django` and `awa.contrib.starlette`."""
