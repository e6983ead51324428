"""CEL rules of a callback and how `resolve_callback` applies them.

A handler may register a callback with Common Expression Language
expressions over ``payload``: ``filter`` (must be true for the payload to
concern this callback at all), ``on_fail`` (checked first), ``on_complete``
and ``transform`` (rewrites the payload stored on completion). Expressions
are compiled at registration, so a typo fails the handler, not the caller.
Evaluation uses the maintained ``common-expression-language`` package
(the Rust CEL interpreter); it is the ``cel`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from awa.core.errors import ValidationError

RULE_FIELDS = ("filter", "on_complete", "on_fail", "transform")
DEFAULT_ACTIONS = ("ignore", "complete", "fail")
MAX_EXPRESSION_CHARS = 4096

Outcome = Literal["completed", "failed", "ignored"]


def _cel() -> Any:
    try:
        import cel
    except ImportError:
        raise ValidationError("callback rules", "CEL needs the 'cel' extra: "
                              "pip install 'awa-queue[cel]'") from None
    return cel


def compile_rules(**expressions: str | None) -> dict[str, str] | None:
    """Validate the given expressions (None = not set); the rules to store, or None."""
    rules: dict[str, str] = {}
    for field in RULE_FIELDS:
        expr = expressions.get(field)
        if expr is None:
            continue
        if not isinstance(expr, str) or not expr.strip():
            raise ValidationError(field, "must be a non-empty CEL expression string")
        if len(expr) > MAX_EXPRESSION_CHARS or "\x00" in expr:
            raise ValidationError(field, f"must be at most {MAX_EXPRESSION_CHARS} characters "
                                  "without NUL bytes")
        try:
            _cel().compile(expr)
        except ValueError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "syntax error"
            raise ValidationError(field, f"is not valid CEL: {first}") from None
        rules[field] = expr
    return rules or None


def check_default_action(value: Any) -> str:
    """One of ignore / complete / fail, else `ValidationError`."""
    if value not in DEFAULT_ACTIONS:
        raise ValidationError("default_action", "must be 'ignore', 'complete' or 'fail'")
    return str(value)


class _EvalError(Exception):
    """An expression failed at evaluation (or returned the wrong type)."""


def _evaluate(field: str, expr: str, payload: Any, want_bool: bool) -> Any:
    try:
        value = _cel().evaluate(expr, {"payload": payload})
    except Exception as exc:  # the interpreter raises several types (KeyError, ValueError, ...)
        raise _EvalError(f"{field} expression failed: {type(exc).__name__}: {exc}") from None
    if want_bool and not isinstance(value, bool):
        raise _EvalError(f"{field} expression returned {type(value).__name__}, not a bool")
    return value


@dataclass(frozen=True, slots=True)
class Decision:
    """What a resolution does: the outcome, the payload to store and why."""

    outcome: Outcome
    payload: Any
    reason: str | None = None
    error: str | None = None  #: the failure message written to the job's errors


def _default(action: str, payload: Any, reason: str) -> Decision:
    if action == "complete":
        return Decision("completed", payload, reason)
    if action == "fail":
        return Decision("failed", payload, reason, error=f"callback failed: {reason}")
    return Decision("ignored", payload, reason)


def decide(rules: dict[str, str] | None, payload: Any, default_action: str) -> Decision:
    """Apply ``rules`` to ``payload``: filter gates, on_fail before on_complete,
    transform on completion; no match, or an expression error, takes the default."""
    if not rules:
        return _default(default_action, payload,
                        f"no expressions configured; default is {default_action}")
    try:
        if "filter" in rules and not _evaluate("filter", rules["filter"], payload, True):
            return Decision("ignored", payload, "filter expression returned false")
        if "on_fail" in rules and _evaluate("on_fail", rules["on_fail"], payload, True):
            return Decision("failed", payload, "on_fail expression matched",
                            error=f"callback failed: on_fail expression matched "
                                  f"({rules['on_fail']})")
        if "on_complete" in rules and _evaluate("on_complete", rules["on_complete"],
                                                payload, True):
            stored = payload
            if "transform" in rules:
                stored = _evaluate("transform", rules["transform"], payload, False)
            return Decision("completed", stored, "on_complete expression matched")
    except _EvalError as exc:
        return _default(default_action, payload, f"{exc}; default is {default_action}")
    return _default(default_action, payload,
                    f"no expression matched; default is {default_action}")
