"""An args value JSON cannot hold is named by its path (issue 44, item 9)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

import pytest

import awa


@dataclass
class Address:
    city: str
    since: object


@dataclass
class Signup:
    email: str
    address: Address
    lines: tuple[object, ...] = ()


@pytest.mark.parametrize(("args", "where", "what"), [
    (Signup("a@example.com", Address("Oslo", object())), "args.address.since", "object"),
    (Signup("a@example.com", Address("Oslo", date(2020, 1, 1)), (1, 2, {3})), "args.lines[2]",
     "set"),
    ({"photo": b"\xff"}, "args.photo", "bytes"),
    ({"ratio": float("nan")}, "args.ratio", "Out of range float"),
])
async def test_the_error_names_the_field_json_refuses(client: awa.AsyncClient, args: object,
                                                      where: str, what: str) -> None:
    with pytest.raises(awa.SerializationError) as err:
        await client.insert(args, kind="signup")
    assert str(err.value).startswith(f"{where}: ") and what in str(err.value)
    with pytest.raises(awa.SerializationError, match="^" + re.escape(where) + ": "):
        await client.insert_many_copy([args], kind="signup")
    assert await client.list_jobs() == []
