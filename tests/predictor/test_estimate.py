"""The static memory estimate (docs/workers.md, "sharing a card"): items, rough reasons, the time limit, shapes,
and the meta-device simulation against PyTorch's own memory tracker."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from xpufleet.nodes import types as T
from xpufleet.predictor import estimate as E
from xpufleet.predictor.estimate import estimate_graph, training_bytes
from xpufleet.predictor.estimate_graph import BUNDLED, dataset_facts, read_graph, split_sizes

EXAMPLES = Path(__file__).resolve().parents[2] / "samples"
MIB = 1024**2


def graph(dataset: dict[str, Any] | None = None, model: tuple[str, dict[str, Any]] | None = None, *,
          batch: Any = 64, val_batch: int | None = None, optimizer: dict[str, Any] | None = None,
          precision: str = "fp32", device: str = "auto") -> dict[str, Any]:
    g: dict[str, Any] = {
        "1": {"class_type": T.DATASET_NODE, "inputs": {"name": "digits", "val_split": 0.2, **(dataset or {})}},
        "2": {"class_type": T.DATALOADER_NODE, "inputs": {"dataset": ["1", 0], "batch_size": batch,
                                                          "shuffle": True, "num_workers": 0}},
        "4": {"class_type": (model or (T.MLP_NODE, {}))[0],
              "inputs": {"dataset_info": ["1", 2], **(model or (None, {"hidden": "64,32"}))[1]}},
        "5": {"class_type": T.OPTIMIZER_NODE, "inputs": {"name": "adam", "lr": 1e-3, "momentum": 0.9,
                                                         **(optimizer or {})}},
        "6": {"class_type": T.LOSS_NODE, "inputs": {"name": "cross_entropy"}},
        "8": {"class_type": T.TRAINING_LOOP_NODE, "inputs": {
            "model": ["4", 0], "dataloader": ["2", 0], "optimizer": ["5", 0], "loss": ["6", 0], "epochs": 1,
            "device": device, "precision": precision}},
    }
    if val_batch is not None:
        g["3"] = {"class_type": T.DATALOADER_NODE, "inputs": {"dataset": ["1", 1], "batch_size": val_batch,
                                                              "shuffle": False, "num_workers": 0}}
        g["8"]["inputs"]["val_dataloader"] = ["3", 0]
    return g


def items(est: E.Estimate) -> dict[str, int]:
    return {i.name: i.bytes for i in est.items}


DIGITS_MLP_PARAMS = (64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10)  # hidden 64,32 on digits' 64 features


# --- itemisation -----------------------------------------------------------------------------------------


def test_items_add_up_and_follow_the_seed():
    est = estimate_graph(graph())
    got = items(est)
    assert list(got) == ["weights", "training", "activations", "allocator", "cuda_libraries"]
    assert got["weights"] == DIGITS_MLP_PARAMS * 4
    assert got["training"] == DIGITS_MLP_PARAMS * 12  # Adam: gradient + two states
    subtotal = got["weights"] + got["training"] + got["activations"]
    assert got["allocator"] == round(subtotal * 0.3)
    assert got["cuda_libraries"] == 72 * MIB
    assert est.total_bytes == sum(got.values())
    assert not est.rough and est.reasons == ()
    assert est.total_gib == pytest.approx(est.total_bytes / 1024**3, abs=0.01) and est.total_gib >= est.total_bytes / 1024**3
    assert est.to_json()["items"][0]["label"] == f"{DIGITS_MLP_PARAMS:,} parameters x 4 B (node 8)"


@pytest.mark.parametrize(("name", "momentum", "per"), [("adam", 0.9, 12), ("adamw", 0.9, 12), ("sgd", 0.9, 4),
                                                       ("sgd_momentum", 0.9, 8), ("rmsprop", 0.9, 12),
                                                       ("rmsprop", 0.0, 8)])
def test_training_item_per_optimizer(name, momentum, per):
    est = estimate_graph(graph(optimizer={"name": name, "momentum": momentum}))
    assert items(est)["training"] == DIGITS_MLP_PARAMS * per
    assert f"x {per} B (gradients and {name} state" in next(i.label for i in est.items if i.name == "training")


def test_training_bytes_table():
    assert training_bytes("rmsprop", momentum=0.9, centered=True) == 16
    assert training_bytes("rmsprop", momentum=0.0, centered=True) == 12


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_adds_two_bytes_per_weight(precision):
    got = items(estimate_graph(graph(precision=precision)))
    assert got["autocast"] == DIGITS_MLP_PARAMS * 2
    assert "autocast" not in items(estimate_graph(graph()))


def test_a_graph_that_only_evaluates_has_no_training_item():
    g = graph()
    g["8"] = {"class_type": T.EVALUATE_NODE, "inputs": {"model": ["4", 0], "dataloader": ["2", 0]}}
    got = items(estimate_graph(g))
    assert "training" not in got and got["weights"] == DIGITS_MLP_PARAMS * 4


# --- activations ---------------------------------------------------------------------------------------------


def test_activations_grow_with_the_batch():
    small = items(estimate_graph(graph({"name": "synthetic_classification", "n_samples": 4000}, batch=64)))
    large = items(estimate_graph(graph({"name": "synthetic_classification", "n_samples": 4000}, batch=1024)))
    assert large["activations"] > 8 * small["activations"] > 0


def test_the_larger_of_training_step_and_evaluation_counts():
    est = estimate_graph(graph(batch=8, val_batch=300))
    label = next(i.label for i in est.items if i.name == "activations")
    assert label.startswith("one evaluation at batch 300 (node 8)")
    est = estimate_graph(graph(batch=512, val_batch=16))
    assert next(i.label for i in est.items if i.name == "activations").startswith("one training step at batch 512")


def test_the_batch_is_no_larger_than_the_split():
    facts = read_graph(graph({"name": "iris"}, batch=256, val_batch=256))
    assert [(u.kind, u.batch) for u in facts.uses] == [("train", 120), ("eval", 30)]  # 150 samples, 20% val


def _tracker_peak(model: Any, x: Any, y: Any, opt: Any, loss_fn: Any) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        for _ in range(2):
            xb, yb = x.clone(), y.clone()  # the batch arrives on the card each step
            value = loss_fn(model(xb), yb)
            value.backward()
            del xb, yb, value
            opt.step()
            opt.zero_grad(set_to_none=True)
            tracker.reset_mod_stats()
    return max(dev["Total"] for dev in tracker.get_tracker_snapshot("peak").values())


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum"])
def test_meta_simulation_matches_pytorch_memory_tracker(opt_name):
    """The simulated training step holds what MemTracker measures for the same step on real CPU tensors."""
    import torch

    from xpufleet.nodes.models import build_model, make_spec
    from xpufleet.nodes.specs import LossSpec, OptimizerSpec
    from xpufleet.predictor import meta_sim

    spec = make_spec("mlp", {"in_features": 256, "out_features": 10, "hidden": [512, 512], "activation": "relu",
                             "dropout": 0.1, "batch_norm": True}, {"task": "classification"}, [256])
    real = build_model(spec, seed=0)
    opt = OptimizerSpec(opt_name).build(list(real.parameters()))
    for group in opt.param_groups:
        group["foreach"] = True
    measured = _tracker_peak(real, torch.randn(128, 256), torch.randint(0, 10, (128,)), opt, LossSpec().build())
    with torch.device("meta"):
        meta = build_model(spec)
    sim = meta_sim.simulate_train(meta, [256], 128, optimizer={"name": opt_name, "momentum": 0.9},
                                  loss={"name": "cross_entropy"}, task="classification")
    assert sim.peak == pytest.approx(measured, rel=0.02)


def test_autocast_emulation_casts_like_cuda_autocast():
    import torch

    from xpufleet.predictor.meta_sim import AutocastSim

    with torch.device("meta"):
        lin, norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)
    x = torch.empty(4, 8, device="meta")
    with AutocastSim(torch.bfloat16) as sim:
        h = lin(x)
        h2 = lin(h)
        n = norm(h2)
        assert len(sim.cache) == 2  # the weight and the bias, cast once per region though used twice
    assert (h.dtype, h2.dtype, n.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    assert lin.weight.dtype == torch.float32 and not sim.cache


# --- rough reasons ---------------------------------------------------------------------------------------------


def test_a_model_node_it_cannot_build_is_rough():
    est = estimate_graph(json.loads((EXAMPLES / "predict_saved.json").read_text()))
    assert est.total_bytes is None and est.rough
    assert est.reasons[0] == "model node 1 (XPUModelLoader) cannot be built here, so its size is not counted"
    g = graph()
    g["4"] = {"class_type": "PluginTransformer", "inputs": {"depth": 12}}
    est = estimate_graph(g)
    assert est.rough and "model node 4 (PluginTransformer) cannot be built here" in est.reasons[1]


def test_a_node_type_it_does_not_know_is_rough():
    g = graph()
    g["20"] = {"class_type": "PluginUpscaler", "inputs": {"model": ["8", 0]}}
    est = estimate_graph(g)
    assert est.rough and est.total_bytes is not None
    assert est.reasons == ("node 20 (PluginUpscaler) is not a node this estimator knows: what it puts on the card is "
                           "not counted",)


def test_no_input_shape_is_rough():
    conv_first = json.dumps([{"type": "Conv2d", "in": 3, "out": 8, "kernel": 3}, {"type": "ReLU"},
                             {"type": "AdaptiveAvgPool2d", "size": 1}, {"type": "Flatten"},
                             {"type": "Linear", "in": 8, "out": 2}])
    g = graph({"name": "csv", "path": "/data/train.csv"}, (T.SEQUENTIAL_NODE, {"layers": conv_first}))
    est = estimate_graph(g)
    assert est.rough and est.total_bytes is not None  # weights and training are known
    assert any("no input shape for model node 4 (Dataset node 1 reads a csv file" in r for r in est.reasons)
    assert items(est)["activations"] == 0


def test_a_first_layer_that_fixes_the_shape_is_enough():
    g = graph({"name": "csv", "path": "/data/train.csv"},
              (T.SEQUENTIAL_NODE, {"layers": '[{"type": "Linear", "in": 30, "out": 2}]'}))
    g["4"]["inputs"].pop("dataset_info")
    est = estimate_graph(g)
    assert not est.rough and items(est)["activations"] > 0


def test_a_size_the_graph_does_not_give_is_a_guess():
    adaptive = json.dumps([{"type": "Conv2d", "in": "auto", "out": 8, "kernel": 3}, {"type": "ReLU"},
                           {"type": "AdaptiveAvgPool2d", "size": 1}, {"type": "Flatten"},
                           {"type": "Linear", "in": 8, "out": 2}])
    g = graph({"name": "synthetic_images", "n_samples": 100}, (T.SEQUENTIAL_NODE, {"layers": adaptive}))
    est = estimate_graph(g)
    assert est.rough and est.reasons == ("Dataset node 1 gives no image_size: the estimate assumes the default 16 px, "
                                         "a guess",)
    given = estimate_graph(graph({"name": "synthetic_images", "n_samples": 100, "image_size": 16},
                                 (T.SEQUENTIAL_NODE, {"layers": adaptive})))
    assert not given.rough and given.total_bytes == est.total_bytes


def test_no_batch_size_is_rough():
    g = graph(batch=["99", 0])  # the batch size comes from another node (a primitive / plugin)
    g["99"] = {"class_type": "PrimitiveInt", "inputs": {"value": 64}}
    est = estimate_graph(g)
    assert est.rough and "node 8: DataLoader node 2 has no batch size, so its activations are not counted" \
        in est.reasons


def test_runs_on_the_cpu_put_nothing_on_the_card():
    est = estimate_graph(graph(device="cpu"))
    assert est.total_bytes is None and "puts no model on the card" in est.reasons[0]


# --- time limit and when it is built ------------------------------------------------------------------------


def test_a_build_over_the_time_limit_gives_no_estimate(monkeypatch):
    release = threading.Event()

    def slow(graph: Any) -> E.Estimate:
        release.wait(30)
        return E.Estimate()

    monkeypatch.setattr(E, "_compute", slow)
    try:
        est = estimate_graph(graph(), timeout_s=0.2)
    finally:
        release.set()
    assert est.total_bytes is None and est.total_gib is None and est.rough
    assert est.reasons == ("building the graph's models on the meta device took longer than 0.2 s, so there is no "
                           "estimate",)
    assert est.elapsed_s >= 0.2


def test_never_built_when_a_measured_peak_exists(monkeypatch):
    monkeypatch.setattr(E, "_compute", lambda graph: pytest.fail("built"))
    est = estimate_graph(graph(), measured_peak_exists=True)
    assert not est.built and est.total_bytes is None


def test_an_error_in_the_build_reaches_the_caller(monkeypatch):
    def broken(graph: Any) -> E.Estimate:
        raise RuntimeError("boom")

    monkeypatch.setattr(E, "_compute", broken)
    with pytest.raises(RuntimeError, match="boom"):
        estimate_graph(graph())
    with pytest.raises(ValueError, match="API-format"):
        estimate_graph([1, 2])


@pytest.mark.parametrize("name", ["mlp_digits", "cnn_digits", "ddp_digits"])
def test_every_training_example_has_a_full_estimate(name):
    est = estimate_graph(json.loads((EXAMPLES / f"{name}.json").read_text()))
    assert not est.rough and est.total_bytes > 72 * MIB
    assert [i.name for i in est.items][0] == "weights"


# --- shapes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_shapes_are_what_the_dataset_node_loads(name):
    from xpufleet.nodes.data import DatasetOptions, load_raw

    shape, classes, n = BUNDLED[name]
    raw = load_raw(DatasetOptions(name=name))
    assert raw.input_shape == shape and raw.x.shape[0] == n
    assert (len(raw.classes) if raw.task == "classification" else 0) == classes


@pytest.mark.parametrize(("n", "val_split"), [(1797, 0.2), (150, 0.2), (10, 0.05), (100, 0.0), (7, 0.5)])
def test_split_sizes_match_the_dataset_node(n, val_split):
    from xpufleet.nodes.data import split_indices

    train, val = split_indices(n, val_split, seed=0)
    assert split_sizes(n, val_split) == (len(train), len(val))


@pytest.mark.parametrize(("inputs", "shape", "guess"), [
    ({"name": "digits"}, [64], False),
    ({"name": "digits", "as_image": True}, [1, 8, 8], False),
    ({"name": "digits", "image_size": 28}, [1, 28, 28], False),
    ({"name": "synthetic_classification", "n_features": 300}, [300], False),
    ({"name": "synthetic_regression"}, [20], False),
    ({"name": "synthetic_images", "channels": 3, "image_size": 32}, [3, 32, 32], False),
    ({"name": "synthetic_images", "channels": 3}, [3, 16, 16], True),
    ({"name": "synthetic_sequences", "seq_len": 50, "n_features": 4}, [50, 4], False),
    ({"name": "synthetic_sequences"}, [32, 20], True),
])
def test_shapes_from_the_data_node(inputs, shape, guess):
    facts = dataset_facts("1", inputs)
    assert facts.info["input_shape"] == shape and (facts.guess is not None) == guess


def test_the_model_is_sized_as_its_node_sizes_it():
    est = estimate_graph(graph({"name": "digits", "image_size": 16},
                               (T.CNN_NODE, {"channels": "8", "kernel_size": 3, "batch_norm": False})))
    # conv 1->8 (3x3) + linear 8*8*8 -> 10 on 16x16 images pooled once
    params = (1 * 8 * 9 + 8) + (8 * 8 * 8 * 10 + 10)
    assert items(est)["weights"] == params * 4


def test_reading_does_not_change_the_graph():
    g = graph(val_batch=256)
    before = copy.deepcopy(g)
    estimate_graph(g)
    assert g == before


# --- bounded on graphs of many TrainingLoops (issue 19) ------------------------------------------------


def loops_chain(n: int) -> dict[str, Any]:
    """The graph() of this file with n-1 more TrainingLoops, each training the previous one's model."""
    g = graph()
    loop = next(nid for nid, node in g.items() if node["class_type"] == T.TRAINING_LOOP_NODE)
    for i in range(n - 1):
        g[f"t{i}"] = copy.deepcopy(g[loop])
        g[f"t{i}"]["inputs"]["model"] = [loop if i == 0 else f"t{i - 1}", 0]
    return g


def test_a_long_chain_of_training_loops_is_read_linearly_and_too_large_to_estimate():
    """2,000 chained TrainingLoops used to recurse 2,000 levels per loop (RecursionError, or O(n^2));
    each finds its builder through the chain now, and the answer is bounded: too large to estimate."""
    from xpufleet.constants import ESTIMATE_MAX_MODEL_USES
    from xpufleet.predictor.estimate_graph import read_graph

    facts = read_graph(loops_chain(2000))
    assert len(facts.uses) >= 2000 and all(u.model is not None and u.model.class_type == "XPUMLP"
                                           for u in facts.uses if u.kind == "train")
    est = estimate_graph(loops_chain(2000))
    assert est.total_bytes is None and est.rough
    assert est.reasons[0].startswith(f"too large to estimate: the graph runs a model in {len(facts.uses)} places")
    assert est.reasons[0].endswith(f"the estimate builds at most {ESTIMATE_MAX_MODEL_USES}")


def test_a_ring_of_training_loops_is_noted_once():
    ring = {str(i): {"class_type": T.TRAINING_LOOP_NODE, "inputs": {"model": [str(i - 1), 0]}} for i in range(3000)}
    ring["0"]["inputs"]["model"] = ["2999", 0]
    from xpufleet.predictor.estimate_graph import read_graph

    facts = read_graph(ring)
    assert len(facts.uses) == 3000 and all(u.model is None for u in facts.uses)
    assert sum("cannot be built here" in r for r in facts.reasons) == 1  # was one per loop (3,000)


def test_a_model_with_convolutions_adds_its_activations_for_cudnn_workspaces():
    cnn = estimate_graph(graph({"name": "digits", "image_size": 16},
                               (T.CNN_NODE, {"channels": "16,32", "kernel_size": 3, "dropout": 0.0})))
    got = items(cnn)
    assert list(got) == ["weights", "training", "activations", "allocator", "convolution_workspaces",
                         "cuda_libraries"]
    assert got["activations"] > 0 and got["convolution_workspaces"] == round(got["activations"] * 1.0)
    assert cnn.total_bytes == sum(got.values())
    assert "convolution_workspaces" not in items(estimate_graph(graph()))  # an MLP has none
