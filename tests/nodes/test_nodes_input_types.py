"""Every node's INPUT_TYPES is something ComfyUI's front end can draw (widgets, combos, tooltips)."""

from __future__ import annotations

import json

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from xpufleet.nodes import types as T
from xpufleet.server.run.executor import output_nodes, validate_graph

WIDGETS = {"INT", "FLOAT", "STRING", "BOOLEAN"}
LINK_TYPES = {T.DATASET, T.DATASET_INFO, T.DATALOADER, T.MODEL, T.OPTIMIZER, T.LR_SCHEDULER, T.LOSS, T.METRICS,
              T.TENSOR}


def all_inputs():
    for class_type, cls in NODE_CLASS_MAPPINGS.items():
        spec = cls.INPUT_TYPES()
        assert set(spec) <= {"required", "optional", "hidden"}, class_type
        for section in ("required", "optional"):
            for name, entry in spec.get(section, {}).items():
                yield class_type, name, entry


@pytest.mark.parametrize(("class_type", "name", "entry"), list(all_inputs()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_input_spec_is_valid_for_the_front_end(class_type, name, entry):
    assert isinstance(entry, tuple) and 1 <= len(entry) <= 2
    kind = entry[0]
    opts = entry[1] if len(entry) == 2 else {}
    assert isinstance(opts, dict)
    assert isinstance(opts.get("tooltip"), str) and opts["tooltip"].strip(), "every input has a tooltip"
    json.dumps(entry)  # /object_info serialises it
    if isinstance(kind, list):  # a combo: ComfyUI validates only lists (a tuple would skip the check)
        assert kind and all(isinstance(c, str) for c in kind) and len(set(kind)) == len(kind)
        assert opts.get("default", kind[0]) in kind
        return
    assert isinstance(kind, str), "a type name or a list of choices, never a tuple"
    assert kind in WIDGETS | LINK_TYPES, kind
    if kind in ("INT", "FLOAT"):
        default, lo, hi = opts["default"], opts.get("min"), opts.get("max")
        assert lo is not None and hi is not None and lo <= default <= hi
        if kind == "INT":
            assert all(isinstance(opts[k], int) for k in ("default", "min", "max", "step") if k in opts)
            assert hi <= 2**53  # a JavaScript number holds it exactly
        else:
            assert opts.get("step", 0.1) > 0
    elif kind == "BOOLEAN":
        assert isinstance(opts["default"], bool)
    elif kind == "STRING":
        assert isinstance(opts["default"], str)
    else:
        assert "default" not in opts  # a socket


@pytest.mark.parametrize("class_type", sorted(NODE_CLASS_MAPPINGS))
def test_node_class_attributes(class_type):
    cls = NODE_CLASS_MAPPINGS[class_type]
    assert class_type.startswith("XPU") and NODE_DISPLAY_NAME_MAPPINGS[class_type]
    assert cls.CATEGORY.startswith(T.CATEGORY_ROOT + "/")
    assert isinstance(cls.RETURN_TYPES, tuple) and len(cls.RETURN_NAMES) == len(cls.RETURN_TYPES)
    assert callable(getattr(cls(), cls.FUNCTION)) and cls.DESCRIPTION.strip()
    assert isinstance(cls.OUTPUT_NODE, bool)


def test_a_graph_that_ends_at_the_training_loop_has_an_output():
    graph = {
        "1": {"class_type": T.DATASET_NODE, "inputs": {"name": "iris", "val_split": 0.2, "seed": 0,
                                                       "normalize": "standard"}},
        "2": {"class_type": T.DATALOADER_NODE, "inputs": {"dataset": ["1", 0], "batch_size": 16, "shuffle": True,
                                                          "num_workers": 0, "drop_last": False}},
        "3": {"class_type": T.MLP_NODE, "inputs": {"hidden": "8", "activation": "relu", "dropout": 0.0, "seed": 0,
                                                   "dataset_info": ["1", 2]}},
        "4": {"class_type": T.OPTIMIZER_NODE, "inputs": {"name": "adam", "lr": 0.01, "weight_decay": 0.0,
                                                         "momentum": 0.9}},
        "5": {"class_type": T.LOSS_NODE, "inputs": {"name": "cross_entropy"}},
        "6": {"class_type": T.TRAINING_LOOP_NODE, "inputs": {"model": ["3", 0], "dataloader": ["2", 0],
                                                             "optimizer": ["4", 0], "loss": ["5", 0], "epochs": 1,
                                                             "max_steps": 0, "device": "cuda:7",
                                                             "precision": "fp32"}},
    }
    assert validate_graph(graph) == []
    assert output_nodes(graph, NODE_CLASS_MAPPINGS) == ["6"]
