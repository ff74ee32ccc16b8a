"""Stand-in for ComfyUI's execution.PromptExecutor (0.3.64): how ComfyUI runs a prompt, where it matters
to a custom node.

What it copies from the real one: every node runs inside ``torch.inference_mode()``; before each node
the interrupt flag is checked (``throw_exception_if_processing_interrupted``); node functions run inside
``CurrentNodeContext`` and a progress hook that, like ComfyUI's, raises the interrupt exception when
Cancel was pressed; only output nodes and what they need run; outputs are cached by input signature
(class, constant inputs, ``IS_CHANGED``, the linked nodes' signatures) and the classic cache keeps only
the nodes of the last prompt; ``InterruptProcessingException`` ends the prompt with
``execution_interrupted``, any other exception with ``execution_error`` naming the node.
It does not validate (``server.PromptServer`` answers that in the real host; our executor's
``validate_graph`` is ComfyUI-shaped) and runs no async or list nodes.
"""

from __future__ import annotations

from typing import Any

import comfy.model_management as mm
import comfy.utils
from comfy_execution.utils import CurrentNodeContext, get_executing_context


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


class PromptExecutor:
    """``execute(prompt, prompt_id)`` like ComfyUI's; read ``success``, ``status_messages``,
    ``history_result`` and ``executed`` (node ids run, not served from the cache) afterwards."""

    def __init__(self, node_classes: dict[str, type], server: Any = None) -> None:
        self.node_classes = node_classes
        self.server = server
        self.cache: dict[str, tuple[Any, tuple, dict | None]] = {}  # id -> (signature, outputs, ui)
        self.progress: list[dict[str, Any]] = []
        self.reset_status()

    def reset_status(self) -> None:
        self.status_messages: list[tuple[str, dict[str, Any]]] = []
        self.success = True
        self.history_result: dict[str, Any] = {"outputs": {}}
        self.executed: list[str] = []

    def _hook(self, value: int, total: int, preview: Any, prompt_id: Any = None, node_id: Any = None) -> None:
        ctx = get_executing_context()
        mm.throw_exception_if_processing_interrupted()  # as ComfyUI's hook does, first thing
        self.progress.append({"value": value, "max": total, "node": node_id or (ctx.node_id if ctx else None)})

    def _needed(self, prompt: dict[str, Any], outputs: list[str]) -> list[str]:
        order: list[str] = []
        seen: set[str] = set()

        def visit(nid: str) -> None:
            if nid in seen:
                return
            seen.add(nid)
            for value in prompt[nid]["inputs"].values():
                if _is_link(value):
                    visit(value[0])
            order.append(nid)

        for nid in outputs:
            visit(nid)
        return order

    def _signature(self, prompt: dict[str, Any], nid: str, sigs: dict[str, Any]) -> Any:
        node = prompt[nid]
        cls = self.node_classes[node["class_type"]]
        consts = {k: v for k, v in node["inputs"].items() if not _is_link(v)}
        changed = ""
        if hasattr(cls, "IS_CHANGED"):
            # ComfyUI calls IS_CHANGED with the constant inputs, linked ones as None.
            args = {k: (None if _is_link(v) else v) for k, v in node["inputs"].items()}
            try:
                changed = cls.IS_CHANGED(**args)
            except Exception:
                changed = float("nan")
        links = tuple(sorted((k, sigs[v[0]], v[1]) for k, v in node["inputs"].items() if _is_link(v)))
        return (node["class_type"], changed, tuple(sorted(consts.items(), key=lambda kv: kv[0])), links)

    def execute(self, prompt: dict[str, Any], prompt_id: str = "prompt", execute_outputs: list[str] | None = None
                ) -> None:
        import torch

        mm.interrupt_current_processing(False)
        comfy.utils.set_progress_bar_global_hook(self._hook)
        self.reset_status()
        self.status_messages.append(("execution_start", {"prompt_id": prompt_id}))
        outputs = execute_outputs or [n for n, v in prompt.items()
                                      if getattr(self.node_classes[v["class_type"]], "OUTPUT_NODE", False)]
        with torch.inference_mode():
            order = self._needed(prompt, outputs)
            sigs: dict[str, Any] = {}
            for nid in order:
                sigs[nid] = self._signature(prompt, nid, sigs)
            self.cache = {n: c for n, c in self.cache.items() if n in prompt}  # the classic cache
            cached = [n for n in order if n in self.cache and self.cache[n][0] == sigs[n]]
            self.status_messages.append(("execution_cached", {"nodes": cached, "prompt_id": prompt_id}))
            values = {n: self.cache[n][1] for n in cached}
            for nid in order:
                if nid in values:
                    continue
                node = prompt[nid]
                cls = self.node_classes[node["class_type"]]
                try:
                    mm.throw_exception_if_processing_interrupted()  # nodes.before_node_execution()
                    inputs = {k: (values[v[0]][v[1]] if _is_link(v) else v) for k, v in node["inputs"].items()}
                    with CurrentNodeContext(prompt_id, nid):
                        raw = getattr(cls(), cls.FUNCTION)(**inputs)
                except mm.InterruptProcessingException:
                    self._fail(prompt_id, nid, node, "execution_interrupted")
                    return
                except Exception as ex:
                    self._fail(prompt_id, nid, node, "execution_error", ex)
                    return
                ui = raw.get("ui") if isinstance(raw, dict) else None
                result = tuple(raw["result"]) if isinstance(raw, dict) else tuple(raw)
                values[nid] = result
                self.cache[nid] = (sigs[nid], result, ui)
                self.executed.append(nid)
            self.status_messages.append(("execution_success", {"prompt_id": prompt_id}))
            self.history_result = {"outputs": {n: self.cache[n][2] for n in order if self.cache[n][2]}}

    def _fail(self, prompt_id: str, nid: str, node: dict[str, Any], event: str, ex: Exception | None = None) -> None:
        self.success = False
        message: dict[str, Any] = {"prompt_id": prompt_id, "node_id": nid, "node_type": node["class_type"],
                                   "executed": list(self.executed)}
        if ex is not None:
            message.update(exception_message=f"{ex}\n", exception_type=f"{type(ex).__module__}.{type(ex).__name__}")
        self.status_messages.append((event, message))

    def message(self, event: str) -> dict[str, Any] | None:
        """The payload of the first status message of type ``event``, or None."""
        return next((m for e, m in self.status_messages if e == event), None)
