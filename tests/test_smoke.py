from dataclasses import dataclass

import awa


@dataclass
class Ping:
    n: int


async def test_insert_and_get(client: awa.AsyncClient) -> None:
    job = await client.insert(Ping(1))
    got = await client.get_job(job.id)
    assert got.kind == "ping" and got.args == {"n": 1}
    assert got.state is awa.JobState.Available
