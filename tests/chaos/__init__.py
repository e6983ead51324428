"""Chaos suite: real worker processes under injected faults (see harness.py)."""
