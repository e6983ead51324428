"""How a worker process stops on signals: shared by `awa worker` and Django's `awa_worker`.

The first SIGTERM or SIGINT asks for a graceful stop (handlers finish within
the shutdown timeout, their outcomes are written); a second one exits at once.
A sync handler's thread cannot be stopped, so a process whose threads are
still busy past the timeout exits without them (`exit_now`): their jobs stay
``running`` and heartbeat rescue retries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_now(code: int) -> None:
    """End the process at once (no waiting for handler threads), logs flushed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def stop_on_signals(stop: asyncio.Event, log: logging.Logger,
                    still_running: str) -> Callable[[], None]:
    """Set ``stop`` on the first SIGTERM/SIGINT; exit at once (status 128 + the
    signal) on a second, logging that ``still_running`` are left to rescue.
    Returns the function that removes the handlers again."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():  # the second SIGTERM / SIGINT: stop waiting for anything
            log.warning("second signal: exiting now; %s", still_running)
            exit_now(128 + signum)
        stop.set()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)

    def remove() -> None:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
    return remove
