"""The runtime-graph key (seed 000, "sharing a card"): each item that counts and each that does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS
from xpufleet.server.ledger.graph_key import graph_key, running_nodes

EXAMPLES = Path(__file__).resolve().parents[3] / "samples"


@pytest.fixture
def g() -> dict:
    return json.loads((EXAMPLES / "cnn_digits.json").read_text())


def changed(graph: dict, node: str, **inputs) -> dict:
    out = copy.deepcopy(graph)
    out[node]["inputs"].update(inputs)
    return out


def renumber(graph: dict, mapping: dict[str, str]) -> dict:
    out = {}
    for nid, node in graph.items():
        inputs = {k: ([mapping[v[0]], v[1]] if isinstance(v, list) and len(v) == 2 and v[0] in mapping else v)
                  for k, v in node["inputs"].items()}
        out[mapping[nid]] = {**node, "inputs": inputs}
    return out


# --- what counts -------------------------------------------------------------------------------------------


def test_node_types_count(g):
    other = copy.deepcopy(g)
    other["4"] = {"class_type": "XPUSequential", "inputs": {"layers": '[{"type": "Flatten"}, {"type": "Linear", '
                                                                     '"in": "auto", "out": 10}]',
                                                            "seed": 0, "dataset_info": ["1", 2]}}
    assert graph_key(other) != graph_key(g)


@pytest.mark.parametrize(("node", "name", "value"), [
    ("2", "batch_size", 32),  # the batch
    ("4", "channels", "16,64"),  # the model's size
    ("4", "fc_hidden", 128),
    ("8", "precision", "bf16"),  # autocast copies
    ("5", "name", "sgd"),  # optimizer state
    ("5", "momentum", 0.5),
    ("8", "strategy", "ddp"),
    ("8", "device", "cpu"),
])
def test_parameters_that_change_memory_count(g, node, name, value):
    assert graph_key(changed(g, node, **{name: value})) != graph_key(g)


def test_dataset_name_counts(g):
    assert graph_key(changed(g, "1", name="synthetic_images")) != graph_key(g)


@pytest.mark.parametrize(("name", "value"), [("val_split", 0.3), ("as_image", False), ("path", "/data/x.csv"),
                                             ("n_samples", 5000), ("normalize", "none")])
def test_parameters_that_select_data_count(g, name, value):
    assert graph_key(changed(g, "1", **{name: value})) != graph_key(g)


def test_connections_count(g):
    # the training loader reads the val split instead of the train split
    assert graph_key(changed(g, "2", dataset=["1", 1])) != graph_key(g)
    # no validation during training
    no_val = copy.deepcopy(g)
    del no_val["8"]["inputs"]["val_dataloader"]
    assert graph_key(no_val) != graph_key(g)


def test_topology_counts():
    """Same nodes, same multiset of labelled edges, different wiring: only the structure differs."""
    def graph(cross: bool) -> dict:
        g = {
            "d": {"class_type": "XPUDataset", "inputs": {"name": "digits"}},
            "la": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["d", 0], "batch_size": 32,
                                                             "shuffle": True, "num_workers": 0}},
            "lb": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["d", 0], "batch_size": 64,
                                                             "shuffle": True, "num_workers": 0}},
            "ma": {"class_type": "XPUMLP", "inputs": {"hidden": "64", "dataset_info": ["d", 2]}},
            "mb": {"class_type": "XPUMLP", "inputs": {"hidden": "128", "dataset_info": ["d", 2]}},
            "o": {"class_type": "XPUOptimizer", "inputs": {"name": "adam"}},
            "l": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
        }
        for t, model, loader in (("t1", "ma", "lb" if cross else "la"), ("t2", "mb", "la" if cross else "lb")):
            g[t] = {"class_type": "XPUTrainingLoop", "inputs": {"model": [model, 0], "dataloader": [loader, 0],
                                                                "optimizer": ["o", 0], "loss": ["l", 0]}}
        return g

    assert graph_key(graph(False)) != graph_key(graph(True))


def test_parameters_of_unknown_node_types_count(g):
    plugin = copy.deepcopy(g)
    plugin["20"] = {"class_type": "SomePluginNode", "inputs": {"model": ["8", 0], "seed": 1, "epochs": 3}}
    key = graph_key(plugin)
    # every parameter of a type this server does not know counts, even ones called seed or epochs
    assert graph_key(changed(plugin, "20", seed=2)) != key
    assert graph_key(changed(plugin, "20", epochs=4)) != key
    assert key != graph_key(g)


# --- what does not count -----------------------------------------------------------------------------------


def test_node_ids_do_not_count(g):
    mapping = {nid: f"n{int(nid) * 7 + 3}" for nid in g}
    assert graph_key(renumber(g, mapping)) == graph_key(g)
    shuffled = dict(reversed(list(g.items())))
    assert graph_key(shuffled) == graph_key(g)


def test_positions_do_not_count(g):
    placed = copy.deepcopy(g)
    for i, node in enumerate(placed.values()):
        node["_meta"] = {**node.get("_meta", {}), "pos": [i * 300, 40]}
        node["is_changed"] = [str(i)]
    assert graph_key(placed) == graph_key(g)


def test_display_labels_do_not_count(g):
    relabelled = copy.deepcopy(g)
    for node in relabelled.values():
        node["_meta"] = {"title": "something else"}
    assert graph_key(relabelled) == graph_key(g)


@pytest.mark.parametrize("node", ["1", "4", "8"])  # the Dataset's split seed, the init seed, the loop's seed
def test_seed_does_not_count(g, node):
    assert graph_key(changed(g, node, seed=1234)) == graph_key(g)


@pytest.mark.parametrize(("node", "name", "value"), [("8", "epochs", 500), ("8", "max_steps", 77),
                                                     ("5", "lr", 0.1)])
def test_how_long_it_runs_does_not_count(g, node, name, value):
    assert graph_key(changed(g, node, **{name: value})) == graph_key(g)


def test_dataloader_worker_processes_do_not_count(g):
    assert graph_key(changed(g, "2", num_workers=8)) == graph_key(g)


def test_same_kind_of_parameter_does_not_count(g):
    """Our node types' other value-only and bookkeeping widgets, as IGNORED_INPUTS lists them."""
    key = graph_key(g)
    assert graph_key(changed(g, "5", beta1=0.8, eps=1e-6)) == key
    assert graph_key(changed(g, "7", name="cosine", pct_start=0.5)) == key
    assert graph_key(changed(g, "8", checkpoint_every_steps=7, tensorboard=False, checkpoint_dir="/tmp/c")) == key
    assert graph_key(changed(g, "10", filename="models/other.pt")) == key


# --- canonical form ----------------------------------------------------------------------------------------


def test_defaults_written_or_omitted_give_one_key(g):
    explicit = changed(g, "4", in_channels=0, image_size=0, out_features=0)  # the node's defaults
    assert graph_key(explicit) == graph_key(g)
    assert graph_key(changed(g, "2", pin_memory=True)) != graph_key(g)


def test_spelling_of_sizes_and_layer_specs_does_not_count(g):
    assert graph_key(changed(g, "4", channels="16, 32")) == graph_key(g)
    seq = {"1": {"class_type": "XPUDataset", "inputs": {"name": "digits"}},
           "4": {"class_type": "XPUSequential", "inputs": {
               "layers": '[{"type": "Flatten"}, {"type": "Linear", "in": "auto", "out": 10}]',
               "dataset_info": ["1", 2]}},
           "9": {"class_type": "XPUModelSaver", "inputs": {"model": ["4", 0], "filename": "m.pt"}}}
    yaml_spelling = changed(seq, "4", layers="- type: flatten\n- {type: nn.Linear, in_features: auto, out_features: 10}\n")
    assert graph_key(yaml_spelling) == graph_key(seq)
    assert graph_key(changed(seq, "4", layers='[{"type": "Linear", "in": 64, "out": 10}]')) != graph_key(seq)


def test_integral_floats_and_ints_are_one_value(g):
    assert graph_key(changed(g, "2", batch_size=64.0)) == graph_key(g)


def test_nodes_that_do_not_run_do_not_count(g):
    extra = copy.deepcopy(g)
    extra["30"] = {"class_type": "XPUMLP", "inputs": {"hidden": "999", "dataset_info": ["1", 2]}}  # feeds nothing
    assert "30" not in running_nodes(extra, NODE_CLASS_MAPPINGS)
    assert graph_key(extra) == graph_key(g)


def test_examples_have_distinct_keys():
    keys = {p.stem: graph_key(json.loads(p.read_text())) for p in EXAMPLES.glob("*.json")
            if not p.name.startswith("serve_")}  # serve_*.json: service specs, not graphs
    assert len(set(keys.values())) == len(keys)
    assert all(k.startswith("g1-") for k in keys.values())


@pytest.mark.parametrize("bad", [[1, 2], {"1": {"inputs": {}}}, {"1": {"class_type": "X", "inputs": [1]}}])
def test_not_an_api_graph_is_refused(bad):
    with pytest.raises(ValueError, match="graph|node|inputs"):
        graph_key(bad)
