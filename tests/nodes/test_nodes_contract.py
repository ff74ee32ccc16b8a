"""The node contract declared once (nodes/contract.py): the helpers write ComfyUI's input format, a node's class
line sets what ComfyUI reads, and the one list of nodes gives both mappings."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from xpufleet.nodes import types as T
from xpufleet.nodes.contract import Node, float_widget, inputs_of, int_widget, option, socket, widget
from xpufleet.nodes.paths import path_input_check


def test_the_helpers_write_comfyuis_format_with_its_key_order():
    odd = int_widget(3, 1, 15, "odd", step=2)
    assert odd == ("INT", {"default": 3, "min": 1, "max": 15, "step": 2, "tooltip": "odd"})
    lr = float_widget(1e-3, 1e-8, 10.0, 1e-4, "learning rate", round=False, advanced=True)
    assert lr == ("FLOAT", {"default": 1e-3, "min": 1e-8, "max": 10.0, "step": 1e-4, "round": False,
                            "advanced": True, "tooltip": "learning rate"})
    assert list(lr[1]) == ["default", "min", "max", "step", "round", "advanced", "tooltip"]
    assert widget("BOOLEAN", True, "on") == ("BOOLEAN", {"default": True, "tooltip": "on"})
    text = widget("STRING", "[]", "layers", multiline=True)
    assert text == ("STRING", {"default": "[]", "multiline": True, "tooltip": "layers"})
    assert list(text[1]) == ["default", "multiline", "tooltip"]
    choices = ["a", "b"]
    combo = widget(choices, "b", "pick")
    assert combo == (choices, {"default": "b", "tooltip": "pick"}) and combo[0] is choices
    assert socket(T.MODEL, "the model") == (T.MODEL, {"tooltip": "the model"})


PROBE_INPUTS = {"required": {"n": ("INT", {"default": 1, "min": 0, "max": 9, "tooltip": "how many"})}}


class _Probe(Node, category=T.CATEGORY_IO, function="run", display="Probe",
             returns={"model": T.MODEL, "summary": "STRING"}, output=True):
    REQUIRED = {"n": int_widget(1, 0, 9, "how many")}

    def run(self, n: int = 1) -> tuple[int]:
        return (n,)


def test_the_class_line_sets_what_comfyui_reads():
    assert (_Probe.CATEGORY, _Probe.FUNCTION, _Probe.DISPLAY_NAME, _Probe.OUTPUT_NODE) == \
        (T.CATEGORY_IO, "run", "Probe", True)
    assert _Probe.RETURN_TYPES == (T.MODEL, "STRING") and _Probe.RETURN_NAMES == ("model", "summary")
    assert _Probe.INPUT_TYPES() == PROBE_INPUTS


def test_input_types_is_a_fresh_copy_each_call():
    first = _Probe.INPUT_TYPES()
    first["required"]["n"][1]["default"] = 7
    first["required"]["extra"] = widget("BOOLEAN", False, "x")
    assert _Probe.INPUT_TYPES() == PROBE_INPUTS


@pytest.mark.parametrize("missing", ["function", "display", "returns"])
def test_a_node_that_leaves_out_part_of_its_contract_is_refused(missing):
    contract = {"category": T.CATEGORY_IO, "function": "run", "display": "Probe", "returns": {"x": T.MODEL}}
    del contract[missing]
    with pytest.raises(TypeError, match="a node names its function, its display name and its outputs"):
        type("Broken", (Node,), {}, **contract)


def test_the_one_list_gives_every_node_type_and_its_display_name():
    node_types = {value for name, value in vars(T).items() if name.endswith("_NODE")}
    assert set(NODE_CLASS_MAPPINGS) == node_types
    assert all(cls.__name__ == name for name, cls in NODE_CLASS_MAPPINGS.items())
    assert list(NODE_DISPLAY_NAME_MAPPINGS) == list(NODE_CLASS_MAPPINGS)
    assert NODE_DISPLAY_NAME_MAPPINGS[T.SEQUENTIAL_NODE] == "Sequential (layer spec)"


def test_a_path_input_is_refused_with_its_name_and_the_advice():
    assert path_input_check("filename", None, "advice") is True
    assert path_input_check("filename", "models/a.pt", "advice") is True
    assert path_input_check("filename", "", "advice") == "filename is empty; advice"
    assert path_input_check("checkpoint_dir", "", "advice", empty_ok=True) is True
    assert path_input_check("filename", 3, "advice") == "filename must be a string"
    climbs = path_input_check("filename", "../x", "go inside")
    assert climbs == "filename climbs out of its folder with '..'; go inside"


def test_an_options_class_gives_a_nodes_inputs_in_field_order():
    @dataclasses.dataclass(frozen=True)
    class Options:
        size: int = option(int_widget(4, 1, 8, "how big"))
        name: str = option(widget("STRING", "a", "what"))
        plain: float = 0.5  # not a widget: no input

    assert Options() == Options(4, "a", 0.5)
    required, optional = inputs_of(Options, required=("name",))
    assert required == {"name": widget("STRING", "a", "what")} and optional == {"size": int_widget(4, 1, 8, "how big")}
    with pytest.raises(TypeError, match="Options has no widget field plain"):
        inputs_of(Options, required=("plain",))


@pytest.mark.parametrize("class_type", sorted(NODE_CLASS_MAPPINGS))
def test_every_default_of_a_nodes_function_is_its_widgets(class_type):
    """``xpufleet export`` fills inputs a graph leaves out from the function's defaults (server/run/export.py),
    ComfyUI from the widgets': they must agree."""
    cls = NODE_CLASS_MAPPINGS[class_type]
    params = inspect.signature(getattr(cls, cls.FUNCTION)).parameters
    table = cls.INPUT_TYPES()
    for name, (_, options) in {**table["required"], **table.get("optional", {})}.items():
        param = params.get(name)
        if param is None:
            assert any(p.kind is p.VAR_KEYWORD for p in params.values()), f"{class_type}.{name} is not taken"
        elif param.default is not param.empty and "default" in options:
            assert param.default == options["default"], f"{class_type}.{name}"
