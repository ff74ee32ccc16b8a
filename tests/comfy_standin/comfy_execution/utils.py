"""Stand-in for comfy_execution.utils: which node ComfyUI is executing (a context variable)."""

from __future__ import annotations

import contextvars
from typing import NamedTuple


class ExecutionContext(NamedTuple):
    prompt_id: str
    node_id: str
    list_index: int | None


current_executing_context: contextvars.ContextVar[ExecutionContext | None] = contextvars.ContextVar(
    "current_executing_context", default=None)


def get_executing_context() -> ExecutionContext | None:
    return current_executing_context.get(None)


class CurrentNodeContext:
    """Sets the executing node for the block, as ComfyUI does around every node function call."""

    def __init__(self, prompt_id: str, node_id: str, list_index: int | None = None) -> None:
        self.context = ExecutionContext(prompt_id, node_id, list_index)
        self.token = None

    def __enter__(self) -> CurrentNodeContext:
        self.token = current_executing_context.set(self.context)
        return self

    def __exit__(self, *exc) -> None:
        current_executing_context.reset(self.token)
