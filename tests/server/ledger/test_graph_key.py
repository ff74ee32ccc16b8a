"""The runtime-graph key (docs/workers.md, "sharing a card"): each item that counts and each that does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS
from xpufleet.server.ledger.graph_key import KEY_VERSION, graph_key, running_nodes

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
    assert all(k.startswith(f"{KEY_VERSION}-") for k in keys.values())


@pytest.mark.parametrize("bad", [[1, 2], {"1": {"inputs": {}}}, {"1": {"class_type": "X", "inputs": [1]}}])
def test_not_an_api_graph_is_refused(bad):
    with pytest.raises(ValueError, match="graph|node|inputs"):
        graph_key(bad)


# --- linear in the graph's size (issue 19: a 1,000-node chain took 26 s, 5,000 never ended) ----------------

LOOP = {"dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0], "epochs": 1, "device": "auto",
        "precision": "fp32", "tensorboard": False, "strategy": "single"}


def data_nodes() -> dict:
    return {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}},
            "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 16}},
            "3": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "dataset_info": ["1", 2]}},
            "4": {"class_type": "XPUOptimizer", "inputs": {"name": "adam"}},
            "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}}}


def loops_chain(n: int, precision_at: int | None = None) -> dict:
    """n TrainingLoops, each training the previous one's model (the first one the MLP's)."""
    g = data_nodes()
    for i in range(6, n + 6):
        inputs = {**LOOP, "model": ["3" if i == 6 else str(i - 1), 0]}
        if i == precision_at:
            inputs["precision"] = "bf16"
        g[str(i)] = {"class_type": "XPUTrainingLoop", "inputs": inputs}
    return g


def loops_wide(n: int) -> dict:
    g = data_nodes()
    g.update({str(i): {"class_type": "XPUTrainingLoop", "inputs": {**LOOP, "model": ["3", 0]}} for i in range(6, n + 6)})
    return g


def loops_ring(n: int) -> dict:
    """The probe's cycle: node i takes model=[i-1, 0], node 0 takes model=[n-1, 0]."""
    g = {str(i): {"class_type": "XPUTrainingLoop", "inputs": {"model": [str(i - 1), 0]}} for i in range(n)}
    g["0"]["inputs"]["model"] = [str(n - 1), 0]
    return g


def loops_lasso(n: int) -> dict:
    """A chain of n/2 TrainingLoops whose first one reads a ring of n/2 (a cycle, then a long tail)."""
    g = loops_ring(n // 2)
    for i in range(n // 2, n):
        g[str(i)] = {"class_type": "XPUTrainingLoop", "inputs": {"model": [str(i - 1 if i > n // 2 else 0), 0]}}
    return g


SHAPES = {"chain": loops_chain, "wide": loops_wide, "ring": loops_ring, "lasso": loops_lasso}


def digested_chars(graph: dict, monkeypatch) -> int:
    """The work of one key: the characters of every JSON text it hashes (each digest's cost)."""
    import xpufleet.server.ledger.graph_key as gk

    real, total = gk._digest, [0]

    def counting(obj):
        total[0] += len(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        return real(obj)

    with monkeypatch.context() as m:
        m.setattr(gk, "_digest", counting)
        graph_key(graph)
    return total[0]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_key_hashes_work_linear_in_the_graphs_size(shape, monkeypatch):
    """4x the nodes is ~4x the hashed text (linear: 4.0); the old refinement to a fixed point took n/2
    rounds of n digests on a chain (16x for 4x the nodes)."""
    small, large = (digested_chars(SHAPES[shape](n), monkeypatch) for n in (250, 1000))
    assert large / small < 5.0, (shape, small, large)


def test_the_keys_cpu_time_grows_linearly_on_a_chain():
    """A ratio of CPU times at n and 4n in this test (best of 3 each, so another process's load does not
    count): linear is ~4, a quadratic step anywhere (not only in the digests) is ~16; 8 leaves room."""
    import time

    def best(graph: dict) -> float:
        runs = []
        for _ in range(3):
            t0 = time.process_time()
            graph_key(graph)
            runs.append(time.process_time() - t0)
        return min(runs)

    small, large = best(loops_chain(500)), best(loops_chain(2000))
    assert large / max(small, 1e-6) < 8.0, (small, large)


def test_a_long_chain_keeps_each_nodes_place():
    """Linear, and still telling apart where on a 1,000-loop chain the one bf16 loop sits, and the
    chain's length; a renumbered chain keeps its key."""
    keys = {graph_key(loops_chain(1000, precision_at=at)) for at in (10, 11, 500, 1004)}
    assert len(keys) == 4
    assert graph_key(loops_chain(1000)) != graph_key(loops_chain(1001))
    g = loops_chain(1000, precision_at=300)
    mapping = {nid: f"n{int(nid) * 7 % 100003}" for nid in g}
    assert graph_key(renumber(g, mapping)) == graph_key(g)


def test_a_cycle_has_a_key_that_renumbering_keeps():
    """A cycle never runs (validation refuses it), but its key is computed and canonical."""
    g = loops_lasso(400)
    mapping = {nid: f"x{nid[::-1]}" for nid in g}
    assert graph_key(renumber(g, mapping)) == graph_key(g)
    assert graph_key(loops_ring(400)) != graph_key(loops_ring(401))
