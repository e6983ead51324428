"""Enqueue: from a Python value to a job row, the first step of the pipeline.

`producer` validates and inserts one job or many (large batches by COPY),
`transaction` enqueues inside an Awa transaction, `bridge` inside the
application's own connection (asyncpg, psycopg, SQLAlchemy, Django), and
`partitioned` routes by key across a family of queues. Imports core and db.
"""
