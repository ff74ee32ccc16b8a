"""``xpufleet export`` (docs/nodes.md): the generated script and its library, checked against the nodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime
from xpufleet.nodes.strategy import EXPORT_REASON
from xpufleet.server.run import export_data as lib
from xpufleet.server.run.executor import GraphValidationError
from xpufleet.server.run.export import ExportError, export_script

EXAMPLES = Path(__file__).resolve().parents[3] / "samples"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def test_a_ddp_loop_exports_single_process_with_the_warning_written_and_printed():
    text, warnings = export_script(example("ddp_digits"), "ddp_digits.json")
    (w,) = warnings
    assert EXPORT_REASON in w and w.startswith("Node 8 (XPUTrainingLoop): strategy ddp")
    doc = text.split('"""')[1]
    assert f"WARNING (ddp_not_available): {w}" in doc
    assert f"warn('ddp_not_available', {w!r})" in text  # printed when the script runs
    assert "import xpufleet" not in text and "from xpufleet" not in text
    _, none = export_script(example("mlp_digits"))
    assert none == []


def test_what_cannot_be_exported_is_refused_by_name(tmp_path):
    g = example("mlp_digits")
    with pytest.raises(GraphValidationError):
        export_script({**g, "99": {"class_type": "NoSuchNode", "inputs": {}}})
    resume = copy.deepcopy(g)
    loop = next(k for k, v in resume.items() if v["class_type"] == "XPUTrainingLoop")
    resume[loop]["inputs"]["resume_from"] = "checkpoints/x.pt"
    with pytest.raises(ExportError, match=f"node {loop} \\(XPUTrainingLoop\\): resume_from is not supported"):
        export_script(resume)
    bad_layers = {"1": {"class_type": "XPUSequential", "inputs": {"layers": '[{"type": "Lineer"}]', "seed": 0}},
                  "2": {"class_type": "XPUModelSaver", "inputs": {"model": ["1", 0], "filename": "m.safetensors",
                                                                  "format": "safetensors", "location": "outputs"}}}
    with pytest.raises(ExportError, match="node 1 \\(XPUSequential\\): layer 1: unknown type 'Lineer'"):
        export_script(bad_layers)


DATASETS = [
    {"name": "digits"}, {"name": "digits", "as_image": True}, {"name": "digits", "image_size": 12},
    {"name": "iris", "normalize": "minmax"}, {"name": "wine", "normalize": "none"}, {"name": "breast_cancer"},
    {"name": "diabetes", "val_split": 0.3, "seed": 4},
    {"name": "synthetic_classification", "n_samples": 300, "n_features": 7, "num_classes": 4, "noise": 0.3},
    {"name": "synthetic_regression", "n_samples": 200, "n_features": 5},
    {"name": "synthetic_images", "n_samples": 120, "num_classes": 3, "channels": 2, "image_size": 6},
    {"name": "synthetic_sequences", "n_samples": 90, "n_features": 3, "seq_len": 10, "num_classes": 3},
]


@pytest.mark.parametrize("opts", DATASETS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_the_script_loads_every_dataset_as_the_node_does(opts):
    train, val, info = N["XPUDataset"]().load(**{"val_split": 0.2, "seed": 0, "normalize": "standard", **opts})
    s_train, s_val, s_info = lib.load_dataset(**opts)
    for mine, node in ((s_train, train), (s_val, val)):
        assert torch.equal(mine.tensors[0], node.x) and torch.equal(mine.tensors[1], node.y)
    for key in ("task", "input_shape", "num_features", "num_classes", "classes", "out_features", "n_train", "n_val"):
        assert s_info[key] == info[key], key


def test_the_script_loads_csv_and_safetensors_files_as_the_node_does(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    monkeypatch.setenv("XPUFLEET_DATA_ROOTS", str(tmp_path))  # the node reads only where graphs may

    csv_path = tmp_path / "d.csv"
    rng = np.random.default_rng(0)
    rows = ["a,b,label"] + [f"{rng.normal():.4f},{rng.normal():.4f},{['10', '9', '2'][i % 3]}" for i in range(40)]
    csv_path.write_text("\n".join(rows) + "\n")
    st_path = tmp_path / "d.safetensors"
    save_file({"x": rng.normal(size=(30, 2, 3, 3)).astype(np.float32), "y": (np.arange(30) % 2).astype(np.int64)},
              str(st_path))
    for opts in ({"name": "csv", "path": str(csv_path), "target_column": "label"},
                 {"name": "csv", "path": str(csv_path), "target_column": "label", "task": "regression"},
                 {"name": "safetensors", "path": str(st_path)}):
        train, val, info = N["XPUDataset"]().load(**{"val_split": 0.25, "seed": 1, "normalize": "standard", **opts})
        s_train, s_val, s_info = lib.load_dataset(val_split=0.25, seed=1, **opts)
        assert torch.equal(s_train.tensors[0], train.x) and torch.equal(s_val.tensors[1], val.y)
        assert s_info["classes"] == info["classes"] and s_info["out_features"] == info["out_features"]


def test_the_script_builds_the_same_models():
    lib.RUN_SEED = None
    _, _, info = N["XPUDataset"]().load("digits", as_image=True)
    _, _, flat = N["XPUDataset"]().load("digits")
    (node_mlp,) = N["XPUMLP"]().build("32,16", "gelu", 0.2, 5, dataset_info=flat, batch_norm=True)
    (node_cnn,) = N["XPUCNN"]().build("8,16", 3, "relu", 0.1, 2, dataset_info=info, fc_hidden=12)
    layers = '[{"type": "Conv2d", "in": "auto", "out": 4, "kernel": 3}, {"type": "ReLU"}, {"type": "Flatten"},' \
             ' {"type": "Linear", "in": "auto", "out": 10}]'
    (node_seq,) = N["XPUSequential"]().build(layers, 9, dataset_info=info)
    from xpufleet.server.run.export import _Node, _sequential_layers

    seq_node = _Node("1", {"class_type": "XPUSequential", "inputs": {"layers": layers, "seed": 9}},
                     N["XPUSequential"], {}, N)
    mine = [lib.mlp(flat, [32, 16], "gelu", 0.2, 5, batch_norm=True),
            lib.cnn(info, [8, 16], 3, "relu", 0.1, 2, fc_hidden=12),
            lib.sequential(info, _sequential_layers(seq_node), 9)]
    for built, node in zip(mine, (node_mlp, node_cnn, node_seq), strict=True):
        assert built.xpu_spec == node.xpu_spec
        a, b = built.state_dict(), node.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lib.RUN_SEED = 3  # --seed overrides the node's seed, as a run's seed does
    ctx = runtime.RunContext(emit=lambda t, p: None, seed=3)
    with runtime.use(ctx):
        (seeded,) = N["XPUMLP"]().build("8", dataset_info=flat, seed=5)
    assert torch.equal(lib.mlp(flat, [8], seed=5)[1].weight, seeded[1].weight)
    lib.RUN_SEED = None


def test_a_chosen_momentum_of_zero_exports_as_zero():
    from xpufleet.server.run.export import _lib_source

    graph = example("mlp_digits")
    (nid,) = [k for k, n in graph.items() if n["class_type"] == "XPUOptimizer"]
    graph[nid]["inputs"].update(name="sgd_momentum", momentum=0.0, nesterov=False)
    text, _ = export_script(graph)
    assert "make_optimizer(params, name='sgd_momentum', lr=0.002, weight_decay=0.0, momentum=0.0," in text
    # the script's own optimizer factory, run: torch's SGD gets momentum 0.0, not a default
    factory = text[text.index(f"    def n{nid}_optimizer(params):"):].split("\n")[:2]
    space: dict = {}
    exec(compile(_lib_source() + "\n".join(line[4:] for line in factory), "<script>", "exec"), space)
    opt = space[f"n{nid}_optimizer"]([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.0
