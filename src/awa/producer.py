"""Producer: validate and serialize a job, then insert it (one, many, or COPY).

First stop of the pipeline (producer → Postgres → dispatcher → executor →
completion). Everything a job carries is checked here, before any write, with
a `ValidationError` naming the field and the rule; the schema repeats the
checks as a second line. No SQL is built from user input: values travel only
as bind parameters or COPY data.
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
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import PurePath
from typing import Any
from uuid import UUID

import blake3

from awa import states, telemetry
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.errors import ArgsTypeError, SerializationError, ValidationError
from awa.model import Job
from awa.states import JobState

_CAMEL_1 = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")
UNIQUE_OPTION_NAMES = frozenset({"by_queue", "by_args", "by_period", "states"})


def derive_kind(name: str) -> str:
    """CamelCase class name → snake_case kind (``HTMLToPDF`` → ``html_to_pdf``)."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _kind_of(cls: type) -> str:
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


def dumps(value: Any, field: str, *, sized: bool = True) -> str:
    """Serialize to compact JSON or raise `SerializationError` naming ``field``.

    Also refuses, with a `ValidationError`, JSON nested deeper than
    `states.JSON_MAX_DEPTH` and (when ``sized``) JSON larger than the payload cap.
    """
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise ValidationError(field, f"nested deeper than {states.JSON_MAX_DEPTH} "
                                     "levels of lists and objects") from None
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{field}: {exc}") from exc
    if "\\u0000" in text and _contains_nul(value):
        raise ValidationError(field, "must not contain NUL characters (null bytes)")
    ascii_only = text.isascii()
    if not ascii_only:
        _check_encodable(field, text)
    limit = _payload_limit if sized else None
    if limit is not None and len(text) > limit // 4 and (
            len(text) > limit or (not ascii_only and len(text.encode()) > limit)):
        raise ValidationError(field, f"at most {limit} bytes of JSON (AWA_MAX_PAYLOAD_BYTES / "
                                     "awa.set_max_payload_bytes)")
    if text.count("[") + text.count("{") > states.JSON_MAX_DEPTH \
            and _json_depth(text) > states.JSON_MAX_DEPTH:
        raise ValidationError(field, f"nested deeper than {states.JSON_MAX_DEPTH} "
                                     "levels of lists and objects")
    return text


def _check_encodable(field: str, text: str) -> None:
    # PostgreSQL text is UTF-8: a lone surrogate (e.g. from json.loads('"\\ud800"'))
    # would fail in the driver, or inside a follow-up's completion transaction.
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValidationError(field, "must be valid Unicode (no lone surrogates)") from None


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
        return _kind_of(cls), {f: getattr(args, f) for f in _field_names(cls)}
    if isinstance(args, Mapping):
        return None, dict(args)
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        # Top-level fields only: nested values are converted when serialized.
        return _kind_of(type(args)), {f: getattr(args, f) for f in _field_names(type(args))}
    if hasattr(args, "model_dump") and not isinstance(args, type):
        try:
            dumped = args.model_dump(mode="json")
        except Exception as exc:
            raise SerializationError(f"args: {exc}") from exc
        model: type = type(args)
        return _kind_of(model), dumped
    raise ArgsTypeError(
        f"args: expected a dataclass, a pydantic model or a dict, got {type(args).__name__}")


def check_text(field: str, value: Any) -> str:
    """A string PostgreSQL can store as text: no NUL bytes, no lone surrogates."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters (null bytes)")
    if not value.isascii():
        _check_encodable(field, value)
    return value


def check_name(field: str, value: Any) -> str:
    """A kind, queue or other name: 1-200 characters of storable text."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    if not 1 <= len(value) <= states.NAME_MAX_LEN:
        raise ValidationError(field, f"must be 1-{states.NAME_MAX_LEN} characters")
    return check_text(field, value)


def check_int(field: str, value: Any, low: int, high: int) -> int:
    """An int (not a bool) within ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, "must be an integer")
    if not low <= value <= high:
        raise ValidationError(field, f"must be between {low} and {high}")
    return value


#: Job ids are PostgreSQL bigints.
ID_MIN, ID_MAX = -(2**63), 2**63 - 1
#: The longest delay or timeout accepted (RetryAfter, Snooze, callback timeouts).
MAX_SECONDS = 100 * 365 * 86400


def check_id(field: str, value: Any) -> int:
    """A job id: an int (not a bool or float) that fits a bigint."""
    return check_int(field, value, ID_MIN, ID_MAX)


def check_seconds(field: str, value: Any) -> float:
    """A finite number of seconds in ``0..MAX_SECONDS`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, "must be a number of seconds")
    if not 0 <= value <= MAX_SECONDS:  # also false for NaN
        raise ValidationError(field, f"must be finite, >= 0 and <= {MAX_SECONDS}")
    return float(value)


def _check_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise ValidationError("tags", "must be a list of strings")
    if len(tags) > states.TAGS_MAX:
        raise ValidationError("tags", f"at most {states.TAGS_MAX} tags")
    for tag in tags:
        if not isinstance(tag, str):
            raise ValidationError("tags", "must be a list of strings")
        check_text("tags", tag)
    return list(tags)


def as_utc(value: datetime, field: str) -> datetime:
    """``value`` in UTC; a naive datetime is local time, as `datetime.timestamp` reads it.
    A time that UTC cannot hold (year 1 east of Greenwich, say) is a `ValidationError`."""
    try:
        converted: datetime = value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValidationError(field, "is out of range") from None
    return converted


def check_run_at(run_at: Any, field: str = "run_at") -> datetime | None:
    """A time to run at, as aware UTC, within `states.RUN_AT_MIN`..`RUN_AT_MAX` (or None).
    Also an RFC 3339 string with a date, a time and an offset (as `awa-pg` takes)."""
    if run_at is None:
        return None
    if isinstance(run_at, str):
        run_at = _parse_rfc3339(run_at, field)
    if not isinstance(run_at, datetime):
        raise ValidationError(field, "must be a datetime or an RFC 3339 string")
    out_of_range = ValidationError(field, f"must be between {states.RUN_AT_MIN.date().isoformat()}"
                                          f" and {states.RUN_AT_MAX.date().isoformat()} (UTC)")
    try:
        converted = as_utc(run_at, field)
    except ValidationError:  # beyond what Python can represent in UTC
        raise out_of_range from None
    if not states.RUN_AT_MIN <= converted <= states.RUN_AT_MAX:
        raise out_of_range
    return converted


def _parse_rfc3339(text: str, field: str) -> datetime:
    """An RFC 3339 timestamp (``Z`` or ``±hh:mm``; a bare date or no offset is refused)."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or "T" not in text.upper():
        raise ValidationError(field, "must be a datetime or an RFC 3339 string with an offset, "
                                     "e.g. 2030-01-02T03:04:05+00:00")
    return parsed


def parse_unique_opts(opts: Any) -> tuple[bool, bool, int | None, int] | None:
    """Validate unique options → ``(by_queue, by_args, by_period, states)``."""
    if opts is None:
        return None
    if not isinstance(opts, Mapping):
        raise ValidationError("unique_opts", "must be a dict")
    unknown = set(opts) - UNIQUE_OPTION_NAMES
    if unknown:
        raise ValidationError("unique_opts", f"unknown option(s) {sorted(unknown)}")
    by_queue, by_args = opts.get("by_queue", False), opts.get("by_args", True)
    for name, flag in (("by_queue", by_queue), ("by_args", by_args)):
        if not isinstance(flag, bool):
            raise ValidationError(f"unique_opts.{name}", "must be a bool")
    period = opts.get("by_period")
    if period is not None:
        check_int("unique_opts.by_period", period, -(2**63), 2**63 - 1)
    mask = check_int("unique_opts.states", opts.get("states", states.UNIQUE_STATES_DEFAULT),
                      1, states.UNIQUE_STATES_MAX)
    return by_queue, by_args, period, mask


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


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedJob:
    """A validated, serialized job, ready for any insert path."""

    kind: str
    queue: str
    args: dict[str, Any]
    args_json: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    tags: list[str]
    metadata_json: str
    unique_key: bytes | None
    unique_states: int | None
    ordering_key: str | None

    def insert_params(self) -> tuple[Any, ...]:
        """Bind parameters of the ``job_insert`` statement, in order."""
        return (self.kind, self.queue, self.args_json, self.run_at, self.priority,
                self.max_attempts, self.tags, self.metadata_json, self.unique_key,
                self.unique_states, self.ordering_key)

    def initial_state(self, now: datetime) -> JobState:
        """Where the job starts: available unless ``run_at`` is in the future."""
        return JobState.Scheduled if self.run_at and self.run_at > now else JobState.Available


#: A client's registered queue for a kind, for inserts that name no queue.
Router = Callable[[str], str]


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    """Validated insert options, shared by every job of a bulk insert."""

    kind: str | None
    queue: str | None  #: None: the kind's registered queue (`Router`), else "default"
    priority: int
    max_attempts: int
    tags: list[str]
    metadata_json: str
    run_at: datetime | None
    unique: tuple[bool, bool, int | None, int] | None
    ordering_key: str | None
    router: Router | None = None


def _options(kind: str | None = None, queue: str | None = None,
             priority: int = states.PRIORITY_DEFAULT,
             max_attempts: int = states.MAX_ATTEMPTS_DEFAULT, tags: Sequence[str] | None = None,
             metadata: Mapping[str, Any] | None = None, run_at: datetime | str | None = None,
             unique_opts: Mapping[str, Any] | None = None,
             ordering_key: str | bytes | None = None, router: Router | None = None
             ) -> _Options:
    if kind is not None:
        check_name("kind", kind)
    if queue is not None:
        check_name("queue", queue)
    check_int("priority", priority, states.PRIORITY_MIN, states.PRIORITY_MAX)
    check_int("max_attempts", max_attempts, states.MAX_ATTEMPTS_MIN, states.MAX_ATTEMPTS_MAX)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValidationError("metadata", "must be a dict")
    if isinstance(ordering_key, bytes | bytearray | memoryview):  # awa-pg's bytes keys
        try:
            ordering_key = bytes(ordering_key).decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError("ordering_key", "bytes must be UTF-8 text") from None
    if ordering_key is not None:
        check_name("ordering_key", ordering_key)
    metadata = telemetry.with_traceparent(metadata)  # once per call, not per job
    return _Options(kind=kind, queue=queue, priority=priority, max_attempts=max_attempts,
                    tags=_check_tags(tags), metadata_json=dumps(dict(metadata or {}), "metadata"),
                    run_at=check_run_at(run_at), unique=parse_unique_opts(unique_opts),
                    ordering_key=ordering_key, router=router)


def _with_args(o: _Options, args: Any) -> PreparedJob:
    derived, args_dict = args_to_dict(args)
    kind = o.kind if o.kind is not None else derived
    if kind is None:
        raise ValidationError("kind", "required when args is a dict")
    if o.kind is None:
        check_name("kind", kind)
    unique = o.unique
    args_json = dumps(args_dict, "args")  # validates before the key hashes the args
    queue = o.queue if o.queue is not None else (
        o.router(kind) if o.router is not None else states.DEFAULT_QUEUE)
    key = unique_key(kind, queue, args_dict, *unique[:3]) if unique else None
    return PreparedJob(
        kind=kind, queue=queue, args=args_dict, args_json=args_json,
        priority=o.priority, max_attempts=o.max_attempts, run_at=o.run_at, tags=o.tags,
        metadata_json=o.metadata_json, unique_key=key,
        unique_states=unique[3] if unique else None, ordering_key=o.ordering_key)


def prepare(args: Any, *, kind: str | None = None, queue: str | None = None,
            priority: int = states.PRIORITY_DEFAULT,
            max_attempts: int = states.MAX_ATTEMPTS_DEFAULT, tags: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None, run_at: datetime | str | None = None,
            unique_opts: Mapping[str, Any] | None = None,
            ordering_key: str | bytes | None = None,
            router: Router | None = None) -> PreparedJob:
    """Validate and serialize one job; raises before anything is written.

    With no ``queue``, the job goes to ``router(kind)`` (the queue its task is
    registered on) when a router is given, else to ``"default"``."""
    options = _options(kind, queue, priority, max_attempts, tags, metadata, run_at,
                       unique_opts, ordering_key, router)
    return _with_args(options, args)


def prepare_many(jobs: Sequence[Any], opts: Sequence[Mapping[str, Any] | None] | None,
                 defaults: Mapping[str, Any], router: Router | None = None) -> list[PreparedJob]:
    """Prepare a batch; ``opts[i]`` overrides ``defaults`` for job ``i``."""
    if opts is not None and len(opts) != len(jobs):
        raise ValidationError("opts", "must have one entry per job")
    try:
        shared = _options(**defaults, router=router)
    except TypeError as exc:
        raise TypeError(f"insert options: {exc}") from exc
    prepared = []
    for i, args in enumerate(jobs):
        own = opts[i] if opts is not None else None
        if not own:
            prepared.append(_with_args(shared, args))
            continue
        try:
            prepared.append(prepare(args, **{**defaults, **own}, router=router))
        except TypeError as exc:
            raise TypeError(f"opts[{i}]: {exc}") from exc
    return prepared


async def insert_one(conn: Conn, q: Queries, job: PreparedJob) -> Job:
    """Insert one prepared job; raises `UniqueConflict` on a duplicate key."""
    with translated():
        row = await conn.fetchrow(q["job_insert"], *job.insert_params())
    telemetry.inserted(job.kind, job.queue)
    return Job.from_row(row)


_COPY_COLUMNS = ("kind", "queue", "args", "run_at", "priority", "max_attempts", "tags",
                 "metadata", "unique_key", "unique_states", "ordering_key")


def _copy_records(jobs: Sequence[PreparedJob]) -> list[tuple[Any, ...]]:
    return [j.insert_params() for j in jobs]


async def insert_many(conn: Conn, q: Queries,
                      jobs: Sequence[PreparedJob]) -> list[Job]:
    """COPY into a staging table, then insert, skipping duplicate unique keys."""
    if not jobs:
        return []
    with translated():
        async with conn.transaction():
            await conn.execute(q["job_staging_create"])
            await conn.copy_records_to_table("awa_job_staging", records=_copy_records(jobs),
                                             columns=_COPY_COLUMNS)
            rows = await conn.fetch(q["job_insert_from_staging"])
    inserted = [Job.from_row(r) for r in rows]
    telemetry.inserted_jobs(inserted)
    return inserted


async def copy_many(conn: Conn, q: Queries, jobs: Sequence[PreparedJob]) -> int:
    """The fastest bulk path: binary COPY straight into the jobs table."""
    if any(j.unique_key is not None for j in jobs):
        return len(await insert_many(conn, q, jobs))
    if not jobs:
        return 0
    now = datetime.now(UTC)
    records = [(j.kind, j.queue, j.args_json, j.initial_state(now).value, j.run_at or now,
                j.priority, j.max_attempts, j.tags, j.metadata_json, j.ordering_key)
               for j in jobs]
    with translated():
        await conn.copy_records_to_table(
            "jobs", schema_name=q.schema, records=records,
            columns=("kind", "queue", "args", "state", "run_at", "priority", "max_attempts",
                     "tags", "metadata", "ordering_key"))
    telemetry.inserted_jobs(jobs)
    return len(records)
