"""Task registration: which handler runs which kind, and how args are rebuilt."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from awa.core.errors import ValidationError
from awa.core.serialize import derive_kind
from awa.core.states import DEFAULT_QUEUE
from awa.core.validate import check_name
from awa.worker.followups import rebuild_args

Handler = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A registered handler."""

    kind: str
    queue: str
    args_type: type | None
    handler: Handler
    is_async: bool
    completion: str = "runtime"  #: "caller": see `awa.owned`

    def build_args(self, data: dict[str, Any]) -> Any:
        """Rebuild the args as the registered type; raises on undecodable args."""
        return rebuild_args(self.args_type, data)


def make_spec(args_type: Any, handler: Handler, *, kind: str | None, queue: str,
              completion: str = "runtime") -> TaskSpec:
    """Validate a registration and build its `TaskSpec`."""
    if not callable(handler):
        raise TypeError("a task handler must be callable")
    if completion not in ("runtime", "caller"):
        raise ValidationError("completion", "must be 'runtime' or 'caller'")
    if completion == "caller" and not inspect.iscoroutinefunction(handler):
        raise ValidationError("completion", "'caller' needs an async def handler "
                              "(it runs in the handler's database transaction)")
    if isinstance(args_type, str):  # @client.task("send_email"): the kind, args as a dict
        if kind is not None and kind != args_type:
            raise ValidationError("kind", f"given twice: {args_type!r} and {kind!r}")
        kind, args_type = args_type, None
    if kind is None:
        if args_type is None or args_type is dict or not isinstance(args_type, type):
            raise ValidationError("kind", "required when the args type is not a class")
        kind = derive_kind(args_type.__name__)
    check_name("kind", kind)
    check_name("queue", queue)
    return TaskSpec(kind=kind, queue=queue, args_type=args_type, handler=handler,
                    is_async=inspect.iscoroutinefunction(handler), completion=completion)


class Registry:
    """Kinds to handlers, for one client."""

    def __init__(self) -> None:
        self._by_kind: dict[str, TaskSpec] = {}

    def add(self, spec: TaskSpec) -> None:
        if spec.kind in self._by_kind:
            raise ValueError(f"a handler for kind {spec.kind!r} is already registered")
        self._by_kind[spec.kind] = spec

    def get(self, kind: str) -> TaskSpec | None:
        return self._by_kind.get(kind)

    def queue_for(self, kind: str) -> str:
        """The queue ``kind``'s task serves: where an insert naming no queue goes."""
        spec = self._by_kind.get(kind)
        return spec.queue if spec is not None else DEFAULT_QUEUE

    def kinds(self) -> list[str]:
        """Every registered kind."""
        return list(self._by_kind)

    def queues(self) -> list[str]:
        """Queues that have at least one task, in registration order."""
        return list(dict.fromkeys(s.queue for s in self._by_kind.values())) or [DEFAULT_QUEUE]

    def __len__(self) -> int:
        return len(self._by_kind)
