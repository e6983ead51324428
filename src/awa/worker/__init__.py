"""Worker: claim → execute → complete, the rest of the pipeline.

`runtime` starts and stops everything in a worker process; `dispatcher`
claims batches under per-queue `capacity`; `executor` runs handlers with a
`context`; `completion` and `finalize` record outcomes under the run lease;
`callbacks`, `followups` and `owned` are the outcome variants. `config`,
`tasks`, `presence`, `descriptors`, `overrides` and `health` are what the
runtime publishes or reads about itself. Imports core, db, telemetry,
enqueue and maintenance.
"""
