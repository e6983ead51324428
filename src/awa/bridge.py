"""Public path of the bridges: enqueue and resolve callbacks on your own connection.

The enqueue code lives in `awa.enqueue.bridge`, callback resolution in
`awa.worker.callbacks` (the one path the client takes too); this module keeps
``awa.bridge.insert_job`` and the other documented names where users import them.
"""

from awa.enqueue.bridge import insert_job, insert_job_sync
from awa.worker.callbacks import (
    complete_external_in,
    complete_external_in_sync,
    fail_external_in,
    fail_external_in_sync,
    heartbeat_callback_in,
    heartbeat_callback_in_sync,
    resume_external_in,
    resume_external_in_sync,
    retry_external_in,
    retry_external_in_sync,
)

__all__ = [
    "complete_external_in", "complete_external_in_sync", "fail_external_in",
    "fail_external_in_sync", "heartbeat_callback_in", "heartbeat_callback_in_sync",
    "insert_job", "insert_job_sync", "resume_external_in", "resume_external_in_sync",
    "retry_external_in", "retry_external_in_sync",
]
