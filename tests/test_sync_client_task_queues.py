"""A sync producer's jobs go to the queue the worker's task serves (issue 44, item 6)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import awa


@dataclass
class Welcome:
    user_id: int


@dataclass
class Unregistered:
    n: int


def test_a_sync_client_routes_by_the_worker_clients_tasks(database_url: str) -> None:
    worker = awa.AsyncClient(database_url)  # the worker's module: never connected here

    @worker.task(Welcome, queue="mail")
    async def welcome(job: awa.Job) -> None:
        return None

    with awa.Client(database_url, tasks=worker) as producer:
        assert producer.insert(Welcome(1)).queue == "mail"
        assert producer.insert(Welcome(2), queue="urgent").queue == "urgent"  # named wins
        assert producer.insert(Unregistered(3)).queue == "default"
        with producer.transaction() as tx:
            assert tx.insert(Welcome(4)).queue == "mail"
        assert [j.queue for j in producer.insert_many([Welcome(5), Unregistered(6)])] \
            == ["mail", "default"]

        @worker.task(Unregistered, queue="late")  # registered after: still counts
        async def late(job: awa.Job) -> None:
            return None
        assert producer.insert(Unregistered(7)).queue == "late"
    with awa.Client(database_url) as plain:  # without tasks=, as before
        assert plain.insert(Welcome(8)).queue == "default"


def test_tasks_must_be_an_async_client(database_url: str) -> None:
    with pytest.raises(awa.ValidationError, match=r"^tasks: must be an awa\.AsyncClient"):
        awa.Client(database_url, tasks="worker:client")  # type: ignore[arg-type]
