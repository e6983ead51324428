"""LISTEN routing: who a notification (or a lost lease) concerns, and waking them.

The `awa.db.listener.Listener` hands every ``NOTIFY`` here: ``awa_jobs``
wakes the dispatcher of that queue, ``awa_cancel`` cancels the attempt (or
drops the job claimed ahead), ``awa_callback`` wakes the handler waiting on
its callback. The heartbeat reports lost leases the same way, and a flushed
completion batch (or a listener that reconnected) wakes every dispatcher.
"""

from __future__ import annotations

from collections.abc import Mapping

from awa.worker.attempts import Attempts
from awa.worker.dispatcher import Dispatcher


class Notifications:
    """Routes wake-ups to the dispatchers and the running attempts."""

    def __init__(self, dispatchers: Mapping[str, Dispatcher], attempts: Attempts) -> None:
        self._dispatchers = dispatchers
        self._attempts = attempts

    def on_notify(self, channel: str, payload: str) -> None:
        """A notification from the `Listener`: wake a queue, drop an attempt, or wake a waiter."""
        if channel == "awa_jobs":
            d = self._dispatchers.get(payload)
            if d is not None:
                d.wake()
        elif channel == "awa_cancel" and payload.isdigit():
            self.lost(int(payload))
        elif channel == "awa_callback" and payload.isdigit():
            self._attempts.notify(int(payload))

    def wake_all(self) -> None:
        """Every dispatcher claims again now (capacity or the backlog moved)."""
        for d in self._dispatchers.values():
            d.wake()

    def lost(self, job_id: int) -> None:
        """The attempt is no longer this process's: cancel its handler, or drop it
        from the jobs claimed ahead."""
        if self._attempts.cancel(job_id):
            return
        for d in self._dispatchers.values():
            if d.forget(job_id):
                return
