"""Worker: claim → execute → complete, the rest of the pipeline.

`runtime` makes the parts and starts and stops them; `dispatcher` claims
batches under per-queue `capacity` and hands each job to `running`'s
`JobRunner`, which runs it (`executor`, with a `context`, held in the
`attempts` table) and records its outcome (`finalize`, `completion`) under
the run lease; `notifications` routes LISTEN wake-ups. `callbacks` (every
surface's one resolution path), `followups` and `owned` are the outcome
variants. `config`, `tasks`, `presence`, `descriptors`, `overrides`,
`health` and `metrics` are what the runtime publishes or reads about itself.
Imports core, db, telemetry, enqueue and maintenance.
"""
