"""A FastAPI app that enqueues jobs, runs them in-process and serves the Awa UI.

    pip install -e '.[ui]' fastapi
    DATABASE_URL=postgresql://localhost/app uvicorn examples.fastapi_app:app

POST /signup?email=a@example.com enqueues a job; GET /jobs/{id} shows it; the
Awa UI is at /awa/. With no $DATABASE_URL the embedded PostgreSQL is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI

import awa
from awa.contrib.fastapi import awa_client, awa_lifespan

client = awa.AsyncClient()


@dataclass
class SendWelcome:
    email: str


@client.task(SendWelcome, queue="email")
async def send_welcome(job: awa.JobContext) -> awa.Output:
    return awa.Output({"sent_to": job.args.email})


# The five lines above the routes are all the wiring: a client, a task, and this.
app = FastAPI(lifespan=awa_lifespan(client, worker=True, ui="/awa", migrate=True))

Awa = Annotated[awa.AsyncClient, Depends(awa_client)]


@app.post("/signup")
async def signup(email: str, jobs: Awa) -> dict[str, Any]:
    job = await jobs.insert(SendWelcome(email))
    return {"job_id": job.id, "queue": job.queue}


@app.get("/jobs/{job_id}")
async def job_status(job_id: int, jobs: Awa) -> dict[str, Any]:
    job = await jobs.get_job(job_id)
    return {"id": job.id, "state": str(job.state), "output": job.output}
