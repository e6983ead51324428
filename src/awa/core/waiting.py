"""Waiting on an ``asyncio.Event`` with a timeout, the same on every Python.

Every loop in the package that sleeps "until signalled, or until the poll
interval" waits here. From Python 3.12, ``asyncio.wait_for`` runs its
awaitable inline, so waiting on an event that is already set returns without
ever suspending: a loop around it that never clears the event spins on the
CPU, and the tasks it started never run. Both helpers always yield to the
event loop at least once.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True if it is set.

    Leaves the event as it is (for a flag such as "stopping"), and always
    suspends at least once, so other tasks run even when it was already set.
    """
    if event.is_set():
        await asyncio.sleep(0)
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def wait_signal(event: asyncio.Event, timeout: float | None) -> bool:
    """`wait_event`, then consume the signal: the event is cleared when it was set,
    and the caller re-reads whatever state the signal was about."""
    if await wait_event(event, timeout):
        event.clear()
        return True
    return False
