"""Admin: what an operator does to jobs and queues from outside a worker.

Job inspection, cancel and retry (`jobs`), the dead letter queue (`dlq`),
batch operations (`batch`), the CLI's chunked bulk actions with progress
(`bulk`) and the client's delegate for all of them (`ops`). Imports every
layer below it; only the surfaces import it.
"""
