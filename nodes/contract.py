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

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

Input = tuple[Any, dict[str, Any]]


def widget(kind: Any, default: Any, tooltip: str, **options: Any) -> Input:
    """A widget without a range: ``"BOOLEAN"``, ``"STRING"`` (``multiline=True`` for a text area) or a combo, whose
    kind is its list of choices (a list: ComfyUI validates only lists)."""
    return (kind, {"default": default, **options, "tooltip": tooltip})


def int_widget(default: int, lo: int, hi: int, tooltip: str, **options: Any) -> Input:
    """An INT widget from ``lo`` to ``hi``."""
    return ("INT", {"default": default, "min": lo, "max": hi, **options, "tooltip": tooltip})


def float_widget(default: float, lo: float, hi: float, step: float, tooltip: str, **options: Any) -> Input:
    """A FLOAT widget from ``lo`` to ``hi`` moving by ``step``."""
    return ("FLOAT", {"default": default, "min": lo, "max": hi, "step": step, **options, "tooltip": tooltip})


def socket(type_name: str, tooltip: str) -> Input:
    """An input another node's output of ``type_name`` connects to."""
    return (type_name, {"tooltip": tooltip})


def option(spec: Input) -> Any:
    """A dataclass field that is also a widget: its default is the widget's, and :func:`inputs_of` reads the
    widget back, so a node's options class and its ``INPUT_TYPES`` are written once."""
    return dataclasses.field(default=spec[1]["default"], metadata={"input": spec})


def inputs_of(options: type, required: tuple[str, ...]) -> tuple[dict[str, Input], dict[str, Input]]:
    """``(REQUIRED, OPTIONAL)`` of a node from the :func:`option` fields of the dataclass ``options``, in field
    order; the names in ``required`` are required, the others optional."""
    fields = {f.name: f.metadata["input"] for f in dataclasses.fields(options) if "input" in f.metadata}
    unknown = set(required) - set(fields)
    if unknown:
        raise TypeError(f"{options.__name__} has no widget field {', '.join(sorted(unknown))}")
    return ({name: spec for name, spec in fields.items() if name in required},
            {name: spec for name, spec in fields.items() if name not in required})


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
