"""Validation: the rules every value a caller hands Awa must pass.

Core layer (no I/O). Names, texts, ids, seconds, tags, run times, unique
options and callback ids are checked here, each failure a `ValidationError`
naming the field and the rule, before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from awa.core import states
from awa.core.errors import ValidationError

UNIQUE_OPTION_NAMES = frozenset({"by_queue", "by_args", "by_period", "states"})


def check_encodable(field: str, text: str) -> None:
    # PostgreSQL text is UTF-8: a lone surrogate (e.g. from json.loads('"\\ud800"'))
    # would fail in the driver, or inside a follow-up's completion transaction.
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValidationError(field, "must be valid Unicode (no lone surrogates)") from None


def check_text(field: str, value: Any) -> str:
    """A string PostgreSQL can store as text: no NUL bytes, no lone surrogates."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters (null bytes)")
    if not value.isascii():
        check_encodable(field, value)
    return value


def storable_text(text: str, limit: int = states.ERROR_TEXT_MAX) -> str:
    """``text`` made storable, for what Awa records rather than refuses (a
    handler's error message): a NUL becomes the four characters ``\\x00``, a
    lone surrogate its ``\\udcXX`` escape, and text longer than ``limit``
    characters keeps its head and ends with a marker giving the full length."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode()
    if len(text) > limit:
        marker = f"... [cut: {len(text)} characters in all]"
        text = text[:max(0, limit - len(marker))] + marker
    return text


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


def check_parent_id(item: Any, value: Any) -> int:
    """A parent named in ``after``: a job id (an int >= 1 that fits a bigint);
    ``item`` is what the caller passed (a job, a job dict, or the id)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ID_MAX:
        raise ValidationError("after", f"{item!r} is neither a job nor a job id "
                                       f"(ids are 1..{ID_MAX})")
    return value


def check_seconds(field: str, value: Any) -> float:
    """A finite number of seconds in ``0..MAX_SECONDS`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, "must be a number of seconds")
    if not 0 <= value <= MAX_SECONDS:  # also false for NaN
        raise ValidationError(field, f"must be finite, >= 0 and <= {MAX_SECONDS}")
    return float(value)


def check_tags(tags: Any) -> list[str]:
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
        if len(tag) > states.TAG_MAX_LEN:
            raise ValidationError("tags", f"each tag at most {states.TAG_MAX_LEN} characters")
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


def parse_callback_id(callback_id: Any) -> uuid.UUID:
    """The id as a UUID; anything else is malformed (`ValidationError`)."""
    try:
        return callback_id if isinstance(callback_id, uuid.UUID) else uuid.UUID(str(callback_id))
    except ValueError as exc:
        raise ValidationError("callback_id", "must be a UUID") from exc


def check_timeout(timeout_seconds: Any) -> float:
    """A finite, non-negative number of seconds (at most 100 years), else `ValidationError`."""
    return check_seconds("timeout_seconds", timeout_seconds)


def check_concurrency(key: Any, max_in_flight: Any) -> tuple[str | None, int | None]:
    """An insert's ``concurrency_key`` and ``max_in_flight``: a key is a name
    (1-200 characters); a limit is an integer >= 1 and needs a key."""
    if key is not None:
        check_name("concurrency_key", key)
    if max_in_flight is not None:
        check_int("max_in_flight", max_in_flight, states.MAX_IN_FLIGHT_MIN,
                  states.MAX_IN_FLIGHT_MAX)
        if key is None:
            raise ValidationError("max_in_flight", "needs a concurrency_key")
    return key, max_in_flight
