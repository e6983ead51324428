"""Serialization: a job's args and metadata as the JSON Postgres stores.

Core layer (no I/O). One encoder for every insert path: dataclasses, pydantic
models, dates, UUIDs, enums and paths become JSON; NaN, NUL characters, lone
surrogates, nesting deeper than `states.JSON_MAX_DEPTH` and values over the
payload limit are refused with a `ValidationError` before anything is written.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import PurePath
from typing import Any
from uuid import UUID

import blake3

from awa.core import states
from awa.core.errors import ArgsTypeError, SerializationError, ValidationError
from awa.core.validate import check_encodable, check_int

_CAMEL_1 = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def derive_kind(name: str) -> str:
    """CamelCase class name → snake_case kind (``HTMLToPDF`` → ``html_to_pdf``)."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, in order (cached per class)."""
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def kind_of(cls: type) -> str:
    """The kind derived from an args class's name (cached per class)."""
    return derive_kind(cls.__name__)



def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, UUID | Decimal | PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(default=_json_default, ensure_ascii=False, separators=(",", ":"),
                            allow_nan=False)


def _c_encoder() -> Callable[[Any], str] | None:
    # `JSONEncoder.encode` builds a new C encoder on every call (half the cost
    # of encoding a small args dict): build the same one once. No circular-
    # reference markers, so it keeps no state between calls and threads; a
    # failure (a cycle ends in RecursionError) is re-run through `_ENCODER`,
    # which raises the usual error.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (e.g. PyPy)
        return None
    try:
        encoder = make(None, _json_default, json.encoder.encode_basestring, None, ":", ",",
                       False, False, False)
    except TypeError:  # a Python whose C encoder takes other arguments
        return None

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    sample = {"a": [1, 2.5, None, True, "é\n"], "b": {"c": "x"}}
    return encode if encode(sample) == _ENCODER.encode(sample) else None


_C_ENCODE = _c_encoder()


def _encode(value: Any) -> str:
    if _C_ENCODE is not None:
        try:
            return _C_ENCODE(value)
        except Exception:  # the slow path raises the canonical error
            pass
    return _ENCODER.encode(value)


#: PostgreSQL refuses a jsonb value over 255 MiB anyway.
_PAYLOAD_LIMIT_CEILING = 255 * 1024 * 1024


def _limit_from_env() -> int | None:
    raw = os.environ.get("AWA_MAX_PAYLOAD_BYTES", "").strip().lower()
    if not raw:
        return states.PAYLOAD_MAX_BYTES
    if raw in ("0", "none", "unlimited"):
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= _PAYLOAD_LIMIT_CEILING:
        raise ValidationError("AWA_MAX_PAYLOAD_BYTES", "must be a number of bytes "
                              f"(1-{_PAYLOAD_LIMIT_CEILING}), 0 or 'none'")
    return int(raw)


_payload_limit: int | None = _limit_from_env()


def set_max_payload_bytes(limit: int | None) -> None:
    """Largest JSON accepted for args, metadata and payloads in this process (None: no cap).

    The default is `states.PAYLOAD_MAX_BYTES` (1 MiB), or ``$AWA_MAX_PAYLOAD_BYTES``.
    """
    global _payload_limit
    if limit is not None:
        check_int("max_payload_bytes", limit, 1, _PAYLOAD_LIMIT_CEILING)
    _payload_limit = limit


def max_payload_bytes() -> int | None:
    """The cap `set_max_payload_bytes` set (None: no cap)."""
    return _payload_limit


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def _json_depth(text: str) -> int:
    """Deepest nesting of a JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    for ch in re.sub(r"[^\[\]{}]", "", _STRINGS.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def nested_too_deeply(text: str | bytes) -> bool:
    """Whether JSON text nests lists and objects deeper than `states.JSON_MAX_DEPTH`.

    Every JSON input is held to this before it is parsed, so the rule is the
    same on every Python (3.13's decoder follows far deeper than 3.11's before
    a RecursionError). Cheap for ordinary values: only text with more brackets
    than the limit is scanned.
    """
    limit = states.JSON_MAX_DEPTH
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        text = text.decode("utf-8", "replace")
    elif text.count("[") + text.count("{") <= limit:
        return False
    return _json_depth(text) > limit


#: The rules `loads` names: JSON input nested too deeply, or not JSON at all.
JSON_TOO_DEEP = "is nested too deeply"
NOT_JSON = "must be JSON"


def loads(text: str | bytes, field: str) -> Any:
    """Parse JSON input (a request body, a command-line value) or raise a
    `ValidationError` naming ``field``: `JSON_TOO_DEEP` past `states.JSON_MAX_DEPTH`
    (checked before parsing, so every Python agrees), else `NOT_JSON` (the decoder's
    error as its cause)."""
    if nested_too_deeply(text):
        raise ValidationError(field, JSON_TOO_DEEP)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(field, NOT_JSON) from exc


def dumps(value: Any, field: str, *, sized: bool = True) -> str:
    """Serialize to compact JSON or raise `SerializationError` naming ``field``.

    Also refuses, with a `ValidationError`, JSON nested deeper than
    `states.JSON_MAX_DEPTH` and (when ``sized``) JSON larger than the payload cap.
    """
    try:
        text = _encode(value)
    except RecursionError:
        raise ValidationError(field, f"nested deeper than {states.JSON_MAX_DEPTH} "
                                     "levels of lists and objects") from None
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{_where(value, field)}: {exc}") from exc
    if "\\u0000" in text and _contains_nul(value):
        raise ValidationError(field, "must not contain NUL characters (null bytes)")
    ascii_only = text.isascii()
    if not ascii_only:
        check_encodable(field, text)
    limit = _payload_limit if sized else None
    if limit is not None and len(text) > limit // 4 and (
            len(text) > limit or (not ascii_only and len(text.encode()) > limit)):
        raise ValidationError(field, f"at most {limit} bytes of JSON (AWA_MAX_PAYLOAD_BYTES / "
                                     "awa.set_max_payload_bytes)")
    if nested_too_deeply(text):
        raise ValidationError(field, f"nested deeper than {states.JSON_MAX_DEPTH} "
                                     "levels of lists and objects")
    return text


def _where(value: Any, field: str, depth: int = 0) -> str:
    """The path of the first value JSON refuses inside ``value`` (``args.address.since``,
    ``args.lines[2]``), for the error message; ``field`` if none is found."""
    if depth > states.JSON_MAX_DEPTH:
        return field
    try:
        if isinstance(value, dict):
            items: list[tuple[str, Any]] = [
                (f"{field}.{k}" if isinstance(k, str) else f"{field}[{k!r}]", v)
                for k, v in value.items()]
            for k in value:
                if not isinstance(k, str | int | float | bool) and k is not None:
                    return f"{field}[{k!r}]"
        elif isinstance(value, list | tuple):
            items = [(f"{field}[{i}]", v) for i, v in enumerate(value)]
        elif value is None or isinstance(value, str | int | float | bool):
            return field
        else:
            return _where(_json_default(value), field, depth + 1)
    except (TypeError, ValueError):
        return field
    for path, item in items:
        try:
            _ENCODER.encode(item)
        except (TypeError, ValueError, RecursionError):
            return _where(item, path, depth + 1)
    return field


def dumps_many(values: Sequence[Any], field: str) -> list[str]:
    """`dumps` of each value (the same text, the same errors), for bulk inserts:
    a value whose text is short, ASCII, with no escaped NUL and few brackets
    passes every check as it is, so only the others go through `dumps`."""
    encode = _C_ENCODE
    if encode is None:
        return [dumps(value, field) for value in values]
    short = _payload_limit // 4 if _payload_limit is not None else _PAYLOAD_LIMIT_CEILING
    depth = states.JSON_MAX_DEPTH
    out: list[str] = []
    append = out.append
    for value in values:
        try:
            text = encode(value)
        except Exception:  # dumps raises the canonical error
            text = dumps(value, field)
        else:
            if not (len(text) <= short and text.isascii() and "\\u0000" not in text
                    and text.count("[") + text.count("{") <= depth):
                text = dumps(value, field)
        append(text)
    return out


def _canonical_float(x: float) -> str:
    # The reference SDK's float text: shortest round-trip digits, decimal
    # notation from 1e-5 up to 1e16, otherwise an exponent without padding.
    text = repr(x)
    if "e" not in text:
        return text
    mantissa, exp = text.split("e")
    if int(exp) == -5:
        return format(Decimal(text), "f")
    return f"{mantissa}e{'+' if int(exp) > 0 else '-'}{abs(int(exp))}"


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, raw UTF-8, reference float text: the unique-key input."""
    if isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}"
                              for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, float) and not isinstance(value, bool):
        return _canonical_float(value)
    if isinstance(value, str | int | bool) or value is None:
        return json.dumps(value, ensure_ascii=False)
    return canonical_json(json.loads(dumps(value, "args")))


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_contains_nul(v) for v in value)
    return False


def args_to_dict(args: Any) -> tuple[str | None, dict[str, Any]]:
    """A job's args as a JSON-ready dict, plus the kind derived from its type."""
    cls: type = type(args)
    if cls is dict:
        return None, dict(args)
    if hasattr(cls, "__dataclass_fields__") and not isinstance(args, type):
        return kind_of(cls), {f: getattr(args, f) for f in field_names(cls)}
    if isinstance(args, Mapping):
        return None, dict(args)
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        # Top-level fields only: nested values are converted when serialized.
        return kind_of(type(args)), {f: getattr(args, f) for f in field_names(type(args))}
    if hasattr(args, "model_dump") and not isinstance(args, type):
        try:
            dumped = args.model_dump(mode="json")
        except Exception as exc:
            raise SerializationError(f"args: {exc}") from exc
        model: type = type(args)
        return kind_of(model), dumped
    raise ArgsTypeError(
        f"args: expected a dataclass, a pydantic model or a dict, got {type(args).__name__}")


def unique_key(kind: str, queue: str, args: Mapping[str, Any], by_queue: bool, by_args: bool,
               by_period: int | None) -> bytes:
    """First 16 bytes of BLAKE3(kind [NUL queue] [NUL canonical args] [NUL period])."""
    hasher = blake3.blake3(kind.encode())
    if by_queue:
        hasher.update(b"\x00" + queue.encode())
    if by_args:
        hasher.update(b"\x00" + canonical_json(args).encode())
    if by_period is not None:
        hasher.update(b"\x00" + struct.pack("<q", by_period))
    return hasher.digest(length=16)
