import asyncio
from dataclasses import dataclass

import awa

client = awa.AsyncClient()  # $DATABASE_URL, else an embedded PostgreSQL
shipped = asyncio.Event()


@dataclass
class ShipOrder:
    order_id: int


@client.task(ShipOrder, queue="shipping")
async def ship(job: awa.JobContext) -> None:
    async with client.transaction() as tx:
        await tx.execute("UPDATE orders SET shipped_at = now() WHERE id = $1", job.args.order_id)
    print(f"order {job.args.order_id} shipped on attempt {job.attempt}")
    shipped.set()


async def main() -> None:
    async with client:
        await client.migrate()  # creates Awa's tables (schema "awa"); safe to repeat
        async with client.transaction() as tx:  # your row and its job commit together
            await tx.execute("CREATE TABLE IF NOT EXISTS orders"
                             " (id serial PRIMARY KEY, shipped_at timestamptz)")
            order = await tx.fetch_one("INSERT INTO orders DEFAULT VALUES RETURNING id")
            await tx.insert(ShipOrder(order["id"]))
        await client.start()  # a worker in this process, serving the "shipping" queue
        await shipped.wait()
        await client.shutdown()


if __name__ == "__main__":
    awa.run(main())
