"""The package's version, here so that every layer can read it.

Re-exported as ``awa.__version__``; telemetry's instrumentation scope and a
worker's presence row name it. ``pyproject.toml`` carries the same number
(tests/test_packaging.py checks the built wheel against it).
"""

__version__ = "0.1.0"
