"""ComfyUI's node contract, declared once per node (docs/nodes.md).

ComfyUI reads a node class's ``CATEGORY``, ``FUNCTION``, ``RETURN_TYPES``, ``RETURN_NAMES``, ``OUTPUT_NODE``
and ``INPUT_TYPES()``, and the name its menu shows from ``NODE_DISPLAY_NAME_MAPPINGS``. A node here subclasses
:class:`Node` and says them in its class line (``class XPULoss(Node, category=..., function="make",
display="Loss", returns={"loss": T.LOSS})``: each output's name beside its type) and its inputs in
``REQUIRED`` / ``OPTIONAL``, written with the helpers below; ``nodes/__init__.py`` lists the nodes. The helpers give
ComfyUI's own input format, ``(type, {"default", "min", "max", ..., "tooltip"})``, with the keys in that
order and the options given as keywords (``step``, ``round``, ``advanced``, ``multiline``) between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

Input = tuple[Any, dict[str, Any]]


def int_input(default: int, lo: int, hi: int, tooltip: str, **options: Any) -> Input:
    """An INT widget from ``lo`` to ``hi``."""
    return ("INT", {"default": default, "min": lo, "max": hi, **options, "tooltip": tooltip})


def float_input(default: float, lo: float, hi: float, step: float, tooltip: str, **options: Any) -> Input:
    """A FLOAT widget from ``lo`` to ``hi`` moving by ``step``."""
    return ("FLOAT", {"default": default, "min": lo, "max": hi, "step": step, **options, "tooltip": tooltip})


def bool_input(default: bool, tooltip: str, **options: Any) -> Input:
    """A BOOLEAN toggle."""
    return ("BOOLEAN", {"default": default, **options, "tooltip": tooltip})


def string_input(default: str, tooltip: str, **options: Any) -> Input:
    """A STRING text box (``multiline=True`` for a text area)."""
    return ("STRING", {"default": default, **options, "tooltip": tooltip})


def choice_input(choices: list[str], default: str, tooltip: str, **options: Any) -> Input:
    """A combo of ``choices`` (a list: ComfyUI validates only lists)."""
    return (choices, {"default": default, **options, "tooltip": tooltip})


def link_input(type_name: str, tooltip: str) -> Input:
    """A socket another node's output of ``type_name`` connects to."""
    return (type_name, {"tooltip": tooltip})


class Node:
    """A ComfyUI node class: the class line's keywords set its contract (see the module docstring); a base
    that declares no ``category`` is a shared base of nodes, not a node."""

    CATEGORY: ClassVar[str]
    FUNCTION: ClassVar[str]
    RETURN_TYPES: ClassVar[tuple[str, ...]]
    RETURN_NAMES: ClassVar[tuple[str, ...]]
    OUTPUT_NODE: ClassVar[bool]
    DISPLAY_NAME: ClassVar[str]  # what ComfyUI's menu shows (NODE_DISPLAY_NAME_MAPPINGS)
    REQUIRED: ClassVar[dict[str, Input]] = {}
    OPTIONAL: ClassVar[dict[str, Input]] = {}

    def __init_subclass__(cls, *, category: str | None = None, function: str = "", display: str = "",
                          returns: Mapping[str, str] | None = None, output: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if category is None:
            return
        if not function or not display or not returns:
            raise TypeError(f"{cls.__name__}: a node names its function, its display name and its outputs")
        cls.CATEGORY, cls.FUNCTION, cls.DISPLAY_NAME, cls.OUTPUT_NODE = category, function, display, output
        cls.RETURN_TYPES, cls.RETURN_NAMES = tuple(returns.values()), tuple(returns)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        """ComfyUI's input table: fresh option dicts each call, so no caller can change the declaration (the
        lists of choices are shared, as they always were: the module constants of nodes/types.py)."""
        sections = {"required": cls.REQUIRED, **({"optional": cls.OPTIONAL} if cls.OPTIONAL else {})}
        return {section: {name: (kind, dict(options)) for name, (kind, options) in inputs.items()}
                for section, inputs in sections.items()}
